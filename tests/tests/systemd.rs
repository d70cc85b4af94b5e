//! The package under a real systemd. This machine boots no systemd, so the
//! test boots one: `systemd-nspawn --boot` starts systemd as PID 1 of a
//! container whose root is an overlay over this machine's own root (lower:
//! `/`, upper: a folder under /var/tmp the test removes), with a private
//! network namespace (loopback only) and a target of basic.target and
//! nothing else. Every write, systemd-tmpfiles' boot clean-up of `/tmp` and
//! `/var/tmp` included, lands in the overlay's upper folder or the
//! container's own tmpfs mounts, never on this machine's files.
//!
//! In it, as an operator would: an uplink with a default route, `dpkg -i`
//! (postinst creates the user and starts blipless-net, masquerading out of
//! the default route's interface, the ingress and the device plane),
//! `client add`, then under load (batches of short requests and two long
//! streaming tunnels, curl run in the container's network namespace) a
//! `systemctl restart` of the device plane, of the ingress, of the ingress
//! twice in a row (the second waits for its turn), and `dpkg -i` again (an
//! upgrade: postinst restarts both), with zero failed requests and the
//! tunnels' bytes exact; an upgrade over a config the new version refuses,
//! which restarts nothing and says why; `wg show blipless` (through the
//! package's link, another WireGuard's socket in /run/wireguard left root's); a crashed ingress (SIGKILL) restarted by
//! systemd with its listening sockets from the fd store; `systemctl reload`
//! without an HTTPS listener and with one (a key that does not match fails
//! it, and the certificate in use keeps serving); `systemctl stop`
//! leaving no process behind. The container is then shut down.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::load::{finish_echoes, steady_load_at, streaming_echo_at, CurlAt};
use blipless_tests::netns::Background;

const MACHINE: &str = "blipless-systemd-test";
/// The test origin, in the container's network namespace.
const ORIGIN: &str = "127.0.0.1:18080";
/// Where nspawn keeps its own state on this machine; removed afterwards if
/// this test created it.
const NSPAWN_RUN: &str = "/run/systemd/nspawn";

/// A container booted with systemd; shut down and removed when dropped.
struct Machine {
    dir: tempfile::TempDir,
    nspawn: Option<Child>,
    leader: u32,
    nspawn_run_was_there: bool,
}

impl Machine {
    /// Mounts the overlay, puts `deb` in it and boots it; returns once
    /// `systemctl is-system-running --wait` has answered.
    fn boot(deb: &Path) -> Self {
        let nspawn_run_was_there = Path::new(NSPAWN_RUN).exists();
        let dir = tempfile::Builder::new()
            .prefix("blipless-systemd-")
            .tempdir_in("/var/tmp")
            .expect("a folder under /var/tmp");
        let root = dir.path().join("root");
        for folder in ["upper", "work", "root"] {
            std::fs::create_dir(dir.path().join(folder)).expect("overlay folder");
        }
        let options = format!(
            "lowerdir=/,upperdir={},workdir={}",
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        must(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &options])
                .arg(&root),
        );
        // From here on, the guard unmounts and removes whatever fails next.
        let mut machine = Self {
            dir,
            nspawn: None,
            leader: 0,
            nspawn_run_was_there,
        };
        let target = root.join("etc/systemd/system/blipless-test.target");
        std::fs::create_dir_all(target.parent().expect("parent")).expect("unit folder");
        std::fs::write(
            &target,
            "[Unit]\nDescription=blipless test: basic.target and nothing else\n\
             Requires=basic.target\nAfter=basic.target\nAllowIsolate=yes\n",
        )
        .expect("the test target");
        std::fs::copy(deb, root.join("root/blipless.deb")).expect("the package into the overlay");
        // This machine's /dev/net/tun is 0600; a Debian server's (udev) is
        // 0666, which the device plane, running as the service user, needs.
        let tun = machine.dir.path().join("tun");
        must(Command::new("mknod").arg(&tun).args(["c", "10", "200"]));
        std::fs::set_permissions(&tun, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let log = std::fs::File::create(machine.dir.path().join("console.log")).expect("log");
        let nspawn = Command::new("systemd-nspawn")
            .arg("--directory")
            .arg(&root)
            .args([
                "--boot",
                "--private-network",
                "--machine",
                MACHINE,
                "--register=no",
                "--keep-unit",
                "--link-journal=no",
                "--console=read-only",
            ])
            .arg(format!("--bind={}:/dev/net/tun", tun.display()))
            .args(["--", "systemd.unit=blipless-test.target"])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("systemd-nspawn (Debian systemd-container)");
        let nspawn_pid = nspawn.id();
        machine.nspawn = Some(nspawn);
        let started = Instant::now();
        machine.leader = loop {
            if let Some(leader) = first_child(nspawn_pid) {
                machine.leader = leader;
                if machine.run("true").status.success() {
                    break leader;
                }
            }
            let exited = machine
                .nspawn
                .as_mut()
                .and_then(|n| n.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!("systemd-nspawn exited ({status}): {}", machine.console());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the container did not start: {}",
                machine.console()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        // Until systemd answers on its socket, and then until it has booted.
        let state = loop {
            let asked = machine.run("timeout 120 systemctl is-system-running --wait");
            let state = String::from_utf8_lossy(&asked.stdout).trim().to_owned();
            // Empty or "offline": systemd is not up far enough to answer yet.
            let answered = !state.is_empty() && state != "offline";
            if answered || started.elapsed() > Duration::from_secs(120) {
                break state;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            state == "running" || state == "degraded",
            "the container's systemd is {state:?}: {}\n{}",
            machine.console(),
            String::from_utf8_lossy(&machine.run("systemctl --failed --no-pager").stdout)
        );
        machine
    }

    /// `sh -c script` inside the container (all its namespaces).
    fn run(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("nsenter")
    }

    /// [`Machine::run`], which must succeed; its stdout.
    fn ok(&self, script: &str) -> String {
        let output = self.run(script);
        assert!(
            output.status.success(),
            "in the container, `{script}` failed ({}): {}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.journal()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The container's network namespace, for curl and the origin.
    fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.leader))
    }

    /// The blipless units' journal, for failure messages.
    fn journal(&self) -> String {
        let output = self.run(
            "journalctl --no-pager -n 200 -u blipless-net -u blipless-ingress -u blipless-device",
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What systemd printed on the container's console.
    fn console(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default()
    }

    /// The journal since `cursor` (from [`Machine::cursor`]).
    fn journal_since(&self, cursor: &str) -> String {
        self.ok(&format!(
            "journalctl --no-pager -o cat --after-cursor='{cursor}' -u blipless-ingress -u blipless-device"
        ))
    }

    /// The journal's current position.
    fn cursor(&self) -> String {
        let out = self.ok("journalctl -n 0 --show-cursor --no-pager");
        out.lines()
            .find_map(|line| line.strip_prefix("-- cursor: "))
            .expect("a cursor")
            .to_owned()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let running = self
            .nspawn
            .as_mut()
            .is_some_and(|n| matches!(n.try_wait(), Ok(None)));
        if let (true, Some(nspawn)) = (running, self.nspawn.as_mut()) {
            // SIGTERM to nspawn: it asks the container's systemd to power off.
            if let Ok(pid) = i32::try_from(nspawn.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(nspawn.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
        let root = self.dir.path().join("root");
        let unmounted = Command::new("umount").arg(&root).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&root).status();
        }
        let _ = std::fs::remove_dir_all(Path::new(NSPAWN_RUN).join("propagate").join(MACHINE));
        if !self.nspawn_run_was_there {
            let _ = std::fs::remove_dir_all(NSPAWN_RUN);
        }
    }
}

/// The first child of `pid` (nspawn's child is the container's PID 1).
fn first_child(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.filter_map(Result::ok).find_map(|task| {
        std::fs::read_to_string(task.path().join("children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

fn must(command: &mut Command) {
    let output = command.output().expect("running a setup command");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits until `script` succeeds in the container.
fn eventually(machine: &Machine, script: &str, within: Duration) {
    let started = Instant::now();
    while !machine.run(script).status.success() {
        assert!(
            started.elapsed() < within,
            "`{script}` did not succeed within {within:?}\n{}",
            machine.journal()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pids of blipless daemons in the container.
fn daemons(machine: &Machine) -> Vec<String> {
    let out = machine.run("pgrep -x 'blipless-ingres|blipless-device' || true");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_package_runs_under_systemd_and_restarts_under_load_without_a_failure() {
    blipless_tests::netns::require_root();
    let out = tempfile::tempdir().expect("tempdir");
    let deb = blipless_tests::package::build_deb(out.path());
    let machine = Machine::boot(&deb);

    // An uplink with the default route, as any host has: blipless-net
    // masquerades out of the default route's interface (and fails without
    // one).
    machine.ok(
        "ip link add eth0 type veth peer name eth0-peer && ip addr add 192.0.2.2/24 dev eth0 \
         && ip link set eth0 up && ip link set eth0-peer up && ip route add default via 192.0.2.1",
    );
    // Another WireGuard's control socket, as a root wireguard-go keeps it
    // (a file stands in for the socket): the ingress's unit must leave it
    // and its directory root's.
    machine.ok(
        "install -d -m 0755 /run/wireguard && install -m 0600 /dev/null /run/wireguard/wg0.sock",
    );
    // Install: postinst creates the user and starts the three units.
    machine.ok("dpkg -i /root/blipless.deb");
    for unit in ["blipless-net", "blipless-ingress", "blipless-device"] {
        let state = machine.run(&format!("systemctl is-active {unit}"));
        assert_eq!(
            String::from_utf8_lossy(&state.stdout).trim(),
            "active",
            "{unit} after dpkg -i\n{}",
            machine.journal()
        );
    }
    assert!(machine.ok("ip tuntap show").contains("blip0"));
    assert!(machine
        .ok("nft list table inet blipless")
        .contains("oifname \"eth0\" masquerade"));

    // The origin listens on the container's loopback, which the shipped
    // config's egress denies like every loopback: allow it, check the
    // config as the shipped file tells operators to, and deploy it.
    machine
        .ok("printf '\\n[egress]\\nallow = [\"127.0.0.1/32\"]\\n' >> /etc/blipless/blipless.toml");
    assert!(machine
        .ok("blipless-ctl --config /etc/blipless/blipless.toml config check")
        .contains("configuration sound"));
    machine.ok("systemctl restart blipless-device");
    let _origin = Background::spawn(
        {
            let mut command = Command::new("nsenter");
            command
                .arg(format!("--net={}", machine.netns().display()))
                .arg(blipless_tests::binary("blipless-test-origin"))
                .args(["--listen", ORIGIN]);
            command
        },
        Some("listening on"),
        Duration::from_secs(10),
    )
    .expect("the origin in the container's network namespace");

    let added = machine.ok("blipless-ctl --json client add alice");
    let client: serde_json::Value = serde_json::from_str(&added).expect("client add --json");
    let socks = client["socks5_url"]
        .as_str()
        .expect("socks5_url")
        .to_owned();
    let http = client["http_url"].as_str().expect("http_url").to_owned();
    let at = CurlAt::Netns(machine.netns());
    let probe = at
        .command()
        .args(["-s", "--max-time", "20", "--proxy", &socks])
        .arg(format!("http://{ORIGIN}/bytes/5"))
        .output()
        .expect("curl");
    assert_eq!(
        probe.stdout,
        blipless_tests::pattern(5),
        "one request through the packaged node: {}\n{}",
        String::from_utf8_lossy(&probe.stderr),
        machine.journal()
    );
    assert!(machine
        .ok("wg show blipless")
        .contains("listening port: 51820"));
    assert_eq!(
        machine.ok("stat -c '%U %a' /run/wireguard /run/wireguard/wg0.sock"),
        "root 755\nroot 600\n",
        "another WireGuard's directory and socket are still root's"
    );

    // Load across restarts: short requests without pause, and one SOCKS5
    // and one HTTP CONNECT tunnel streaming both ways the whole time.
    let size = 24 * 1024 * 1024;
    let upload = out.path().join("upload");
    std::fs::write(&upload, blipless_tests::pattern(size)).expect("upload file");
    let echo = format!("http://{ORIGIN}/echo");
    let socks_out = out.path().join("socks.out");
    let http_out = out.path().join("http.out");
    let mut socks_tunnel = streaming_echo_at(&at, &socks, &echo, &upload, &socks_out, false);
    let mut http_tunnel = streaming_echo_at(&at, &http, &echo, &upload, &http_out, true);
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load_at(
        at.clone(),
        socks.clone(),
        format!("http://{ORIGIN}/bytes/1000"),
        4,
        stop.clone(),
    );
    let before = machine.cursor();
    std::thread::sleep(Duration::from_secs(1));
    for restart in [
        "systemctl restart blipless-device",
        "systemctl restart blipless-ingress",
        "systemctl restart blipless-device",
        // Two in a row: the second ingress waits for the first handoff to
        // finish (its predecessor still overlaps), then takes its turn.
        "systemctl restart blipless-ingress && systemctl restart blipless-ingress",
        // A package upgrade: postinst restarts both at once.
        "dpkg -i /root/blipless.deb",
    ] {
        let restarting = Instant::now();
        machine.ok(restart);
        let restarted = restarting.elapsed();
        // Until the old daemons have handed over and exited: one of each.
        eventually(
            &machine,
            "[ \"$(pgrep -cf '^/usr/bin/blipless-ingress --config')\" = 1 ] \
             && [ \"$(pgrep -cf '^/usr/bin/blipless-device --config')\" = 1 ]",
            Duration::from_secs(60),
        );
        eprintln!(
            "{restart}: {restarted:?}, old daemons gone after {:?}",
            restarting.elapsed()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::SeqCst);
    let (requests, failures) = load.join().expect("load");
    finish_echoes(
        [
            (&mut socks_tunnel, &socks_out, "SOCKS5"),
            (&mut http_tunnel, &http_out, "HTTP CONNECT"),
        ],
        size,
        "six systemctl restarts",
    );
    assert!(
        failures.is_empty(),
        "{} of {requests} requests failed across the restarts: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(10)],
        machine.journal()
    );
    assert!(requests >= 20, "only {requests} requests ran");
    eprintln!("{requests} requests across the restarts, none failed");
    let during = machine.journal_since(&before);
    assert!(
        during
            .matches("a successor ingress serves; stepping aside")
            .count()
            >= 4,
        "four ingress handoffs: {during}"
    );

    // An upgrade with a config the new version refuses: postinst says why
    // and leaves the running daemons alone.
    let main_pid = |unit: &str| machine.ok(&format!("systemctl show -P MainPID {unit}"));
    let before_pids = (main_pid("blipless-ingress"), main_pid("blipless-device"));
    machine.ok("cp /etc/blipless/blipless.toml /root/good.toml");
    machine.ok("printf 'no_such_key = 1\\n' >> /etc/blipless/blipless.toml");
    let upgrade = machine.run("dpkg -i /root/blipless.deb");
    let said = String::from_utf8_lossy(&upgrade.stderr).into_owned();
    assert!(upgrade.status.success(), "{said}");
    assert!(
        said.contains("does not pass the new version's check"),
        "{said}"
    );
    assert!(said.contains("no_such_key"), "{said}");
    assert_eq!(
        (main_pid("blipless-ingress"), main_pid("blipless-device")),
        before_pids,
        "not restarted"
    );
    machine.ok("cp /root/good.toml /etc/blipless/blipless.toml");

    // A crash: systemd restarts the ingress, which takes its listening
    // sockets back from the fd store.
    let before = machine.cursor();
    machine.ok("systemctl kill --signal=SIGKILL blipless-ingress");
    eventually(
        &machine,
        "systemctl is-active blipless-ingress && [ \"$(systemctl show -P NRestarts blipless-ingress)\" -ge 1 ]",
        Duration::from_secs(60),
    );
    let after_crash = machine.journal_since(&before);
    assert!(
        after_crash.contains("using the socket kept by the service manager"),
        "{after_crash}"
    );
    let probe = at
        .command()
        .args([
            "-s",
            "--max-time",
            "20",
            "--retry",
            "20",
            "--retry-connrefused",
        ])
        .args(["--retry-delay", "1", "--proxy", &http])
        .arg(format!("http://{ORIGIN}/bytes/7"))
        .output()
        .expect("curl");
    assert_eq!(probe.stdout, blipless_tests::pattern(7), "after the crash");

    // `systemctl reload`: without an HTTPS listener there is nothing to
    // reload, and the reload succeeds.
    machine.ok("systemctl reload blipless-ingress");
    // With one (a restart takes the new listener up), a reload reports its
    // outcome: a key that is not the certificate's fails it, and the
    // certificate in use keeps serving.
    machine.ok(
        "cd /etc/blipless && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
         -nodes -days 2 -subj /CN=blipless-test -addext subjectAltName=IP:127.0.0.1 \
         -keyout proxy.key -out proxy.crt 2>/dev/null \
         && chown root:blipless proxy.key proxy.crt && chmod 0640 proxy.key proxy.crt \
         && sed -i 's|^wg = \"127.0.0.1:51820\"$|&\\nhttps = \"127.0.0.1:8443\"|' blipless.toml \
         && printf '\\n[tls]\\ncertificate = \"/etc/blipless/proxy.crt\"\\nkey = \"/etc/blipless/proxy.key\"\\n' >> blipless.toml \
         && systemctl restart blipless-ingress",
    );
    machine.ok("systemctl reload blipless-ingress");
    machine.ok("cp /etc/blipless/proxy.key /root/proxy.key");
    machine.ok(
        "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out /etc/blipless/proxy.key \
         && chown root:blipless /etc/blipless/proxy.key",
    );
    let reload = machine.run("systemctl reload blipless-ingress");
    assert!(
        !reload.status.success(),
        "a reload with a key that is not the certificate's succeeded\n{}",
        machine.journal()
    );
    let ca = out.path().join("proxy.crt");
    std::fs::write(&ca, machine.ok("cat /etc/blipless/proxy.crt")).expect("the certificate");
    let https = http
        .replacen("http://", "https://", 1)
        .replacen(":8080", ":8443", 1);
    let probe = at
        .command()
        .args([
            "-s",
            "--max-time",
            "20",
            "--proxy",
            &https,
            "--proxy-cacert",
        ])
        .arg(&ca)
        .arg(format!("http://{ORIGIN}/bytes/9"))
        .output()
        .expect("curl");
    assert_eq!(
        probe.stdout,
        blipless_tests::pattern(9),
        "through the HTTPS listener after the failed reload: {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    machine.ok("cp /root/proxy.key /etc/blipless/proxy.key && systemctl reload blipless-ingress");

    // The packaged device plane gave up CAP_NET_ADMIN (its TUN device is the
    // service user's, there is no WireGuard exit and it manages nothing);
    // its stand-in, which starts the next plane, keeps it to pass on.
    let plane = machine.ok("pgrep -f '^/usr/bin/blipless-device --config'");
    let status = machine.ok(&format!("cat /proc/{}/status", plane.trim()));
    let permitted = status
        .lines()
        .find_map(|line| line.strip_prefix("CapPrm:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).expect("hex"))
        .expect("CapPrm");
    const CAP_NET_ADMIN: u64 = 1 << 12;
    let journal = machine.ok("journalctl --no-pager -o cat -u blipless-device");
    let said: Vec<&str> = journal
        .lines()
        .filter(|line| line.contains("CAP_NET_ADMIN"))
        .collect();
    assert_eq!(permitted & CAP_NET_ADMIN, 0, "{said:?}\n{status}");
    assert!(
        said.iter()
            .all(|line| line.contains("dropped CAP_NET_ADMIN"))
            && !said.is_empty(),
        "{said:?}"
    );
    // Without it, the planes still attached the TUN queues (the device is
    // theirs) and handed them on at every deploy.
    assert!(
        journal.contains("TUN queues attached: WireGuard egress ready")
            && journal.contains("TUN queues inherited from the predecessor")
            && !journal.contains("WireGuard egress unavailable"),
        "{journal}"
    );

    // Removed (`apt remove`: config kept) and installed again: dpkg calls
    // that an upgrade from the removed version, and the units, stopped by
    // the removal, are started again, as at a first install.
    machine.ok("dpkg -r blipless");
    eventually(
        &machine,
        "! pgrep -x 'blipless-ingres|blipless-device'",
        Duration::from_secs(30),
    );
    machine.ok("dpkg -i /root/blipless.deb");
    eventually(
        &machine,
        "systemctl is-active blipless-ingress && systemctl is-active blipless-device",
        Duration::from_secs(60),
    );

    // Stop: both units inactive, no daemon left.
    machine.ok("systemctl stop blipless-device blipless-ingress");
    for unit in ["blipless-ingress", "blipless-device"] {
        let state = machine.run(&format!("systemctl is-active {unit}"));
        assert_eq!(
            String::from_utf8_lossy(&state.stdout).trim(),
            "inactive",
            "{unit}"
        );
    }
    eventually(
        &machine,
        "! pgrep -x 'blipless-ingres|blipless-device'",
        Duration::from_secs(30),
    );
    assert!(daemons(&machine).is_empty());
}
