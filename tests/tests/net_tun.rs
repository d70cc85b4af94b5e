//! Packet egress plumbing, for real: `blipless-ctl net setup|teardown` and
//! `TunQueue` against the kernel. Needs root (CAP_NET_ADMIN) and fails,
//! not skips, without it. Every test works inside a network namespace it
//! creates and always deletes (a Drop guard), so the host's own network is
//! never touched. Local trust: the TUN device's owner, and the nftables
//! rules that keep clients off the host and off each other.

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use blipless_device::wg::tun::{attach_queues, TunQueue};
use tokio::time::Instant;

/// The TUN device's name inside the test namespaces.
const TUN: &str = "blt0";
/// The client pool the tests configure; the node's address is its first host.
const POOL: &str = "10.77.0.0/16";
const NODE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// Another client of the pool.
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
/// The unprivileged service user of the owner tests.
const NOBODY: u32 = 65534;
/// How long any one wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

type TestResult = Result<(), String>;

/// A network namespace that lives as long as this value.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        assert!(
            nix::unistd::geteuid().is_root(),
            "these tests need root (CAP_NET_ADMIN) to create network namespaces and TUN devices"
        );
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "bl-{tag}-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let output = run(Command::new("ip").args(["netns", "add", &name]));
        assert!(
            output.status.success(),
            "ip netns add {name}: {}",
            text(&output.stderr)
        );
        let netns = Netns { name };
        // The uplink the tests masquerade out of (`net setup` refuses an
        // interface the host does not have): one end of a veth pair.
        ok(
            &netns.exec(
                "ip",
                &[
                    "link",
                    "add",
                    "eth9",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth9-peer",
                ],
            ),
            "adding the uplink eth9",
        );
        netns
    }

    /// `ip netns exec NAME program args...`
    fn exec(&self, program: &str, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args))
    }

    /// `blipless-ctl` inside the namespace, configured for the test pool.
    fn ctl(&self, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(blipless_tests::binary("blipless-ctl"))
            .args([
                "--set",
                &format!("egress.tun.name={TUN}"),
                "--set",
                "egress.tun.out_interface=eth9",
                "--set",
                &format!("wireguard.pool={POOL}"),
            ])
            .args(args)
            .env_remove("BLIPLESS_CONFIG"))
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// The TUN device's owner and group, from sysfs inside the namespace
    /// (-1: none).
    fn tun_owner(&self) -> (String, String) {
        let read = |file: &str| {
            ok(
                &self.exec("cat", &[&format!("/sys/class/net/{TUN}/{file}")]),
                "reading the TUN device's owner",
            )
            .trim()
            .to_string()
        };
        (read("owner"), read("group"))
    }
}

/// Runs `work` on a thread inside the namespace at `path` (setns affects
/// only the calling thread), with a current-thread runtime.
fn in_namespace<T: Send + 'static>(
    path: String,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    std::thread::spawn(move || {
        let namespace = File::open(&path).map_err(|e| format!("opening {path}: {e}"))?;
        nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns {path}: {e}"))?;
        work()
    })
}

impl Drop for Netns {
    fn drop(&mut self) {
        let output = run(Command::new("ip").args(["netns", "del", &self.name]));
        if !output.status.success() {
            eprintln!(
                "warning: ip netns del {}: {}",
                self.name,
                text(&output.stderr)
            );
        }
    }
}

fn run(command: &mut Command) -> Output {
    match command.output() {
        Ok(output) => output,
        Err(error) => panic!("running {command:?}: {error}"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

#[test]
fn net_setup_and_teardown_are_idempotent() {
    let ns = Netns::new("net");

    // Twice: the second run finds everything in place and changes nothing.
    let first = ok(&ns.ctl(&["net", "setup"]), "net setup");
    assert!(first.contains("host set up"), "{first}");
    let json = ok(&ns.ctl(&["--json", "net", "setup"]), "net setup --json");
    let value: serde_json::Value = match serde_json::from_str(json.trim()) {
        Ok(value) => value,
        Err(error) => panic!("net setup --json printed {json:?}: {error}"),
    };
    assert_eq!(value["net"], "setup");
    assert_eq!(value["tun"], TUN);
    assert_eq!(value["address"], "10.77.0.1/16");
    assert_eq!(value["pool"], POOL);

    let link = ok(&ns.exec("ip", &["-d", "link", "show", TUN]), "ip link show");
    assert!(link.contains("multi_queue"), "{link}");
    assert!(link.contains("persist on"), "{link}");
    assert!(link.contains(",UP"), "the TUN device is not up: {link}");
    let addresses = ok(
        &ns.exec("ip", &["-4", "addr", "show", "dev", TUN]),
        "ip addr",
    );
    assert!(addresses.contains("inet 10.77.0.1/16"), "{addresses}");
    assert_eq!(
        addresses.matches("inet ").count(),
        1,
        "setting up twice added a second address: {addresses}"
    );
    let routes = ok(&ns.exec("ip", &["-4", "route", "show"]), "ip route");
    assert!(
        routes.contains(&format!("10.77.0.0/16 dev {TUN}")),
        "{routes}"
    );
    let forwarding = ok(
        &ns.exec("cat", &["/proc/sys/net/ipv4/ip_forward"]),
        "reading ip_forward",
    );
    assert_eq!(forwarding.trim(), "1");
    let table = ok(
        &ns.exec("nft", &["list", "table", "inet", "blipless"]),
        "nft list table",
    );
    assert!(
        table.contains("ip saddr 10.77.0.0/16 oifname \"eth9\" masquerade"),
        "{table}"
    );
    // Clients off the host (input) and off each other (forward).
    assert!(table.contains("chain input"), "{table}");
    assert!(
        table.contains(&format!(
            "iifname \"{TUN}\" ct state established,related accept"
        )),
        "{table}"
    );
    assert!(
        table.contains(&format!("iifname \"{TUN}\" drop")),
        "{table}"
    );
    assert!(
        table.contains(&format!("iifname \"{TUN}\" ip daddr 10.77.0.0/16 drop")),
        "{table}"
    );
    // Owned by whoever ran setup (root here), not by no one.
    assert_eq!(ns.tun_owner(), ("0".to_string(), "0".to_string()));
    let link = ok(&ns.exec("ip", &["-d", "link", "show", TUN]), "ip link show");
    assert!(link.contains("user root group root"), "{link}");
    assert!(
        table.contains("ct state invalid meta l4proto tcp reject with tcp reset"),
        "{table}"
    );
    assert!(table.contains("ct state invalid drop"), "{table}");
    assert_eq!(
        table.matches("masquerade").count(),
        1,
        "setting up twice duplicated rules: {table}"
    );

    // Teardown twice: the second finds nothing to remove and succeeds.
    let gone = ok(&ns.ctl(&["net", "teardown"]), "net teardown");
    assert!(gone.contains("removed"), "{gone}");
    let json = ok(
        &ns.ctl(&["--json", "net", "teardown"]),
        "net teardown --json",
    );
    assert!(json.contains("\"teardown\""), "{json}");
    let link = ns.exec("ip", &["link", "show", TUN]);
    assert!(
        !link.status.success(),
        "{TUN} is still there after teardown"
    );
    let table = ns.exec("nft", &["list", "table", "inet", "blipless"]);
    assert!(
        !table.status.success(),
        "the nftables table is still there after teardown: {}",
        text(&table.stdout)
    );
}

/// A WireGuard exit's wg-quick file: what `net setup` reads of it is the
/// address and the MTU (nothing dials the endpoint here).
const EXIT_FILE: &str = "[Interface]\nPrivateKey = qCThW8u7dNwomgEQAR6sy8x3O/5RJE/eHJsDgPFlnH8=\n\
Address = 10.99.0.2/32\n\n[Peer]\nPublicKey = JD+Qh20CBOltwrsUN0C43QkBj/QYo6gtnoEAPTE7nCs=\n\
Endpoint = 192.0.2.1:51820\nAllowedIPs = 0.0.0.0/0\n";
/// The exit's TUN device (the first exit's default name).
const EXIT_TUN: &str = "blx0";
/// How `ip rule show` names the first exit's routing table (FIRST_MARK).
const EXIT_TABLE: &str = "lookup 186537216";

/// Teardown removes what setup made even where the configuration no longer
/// says so: the clients' device renamed and an exit removed since, or a
/// configuration that does not load at all (`apt remove` after the exit's
/// wg-quick file was deleted: exit 64 listing the problem, and nothing left
/// behind).
#[test]
fn teardown_finds_what_setup_made_when_the_configuration_changed_or_broke() {
    let ns = Netns::new("left");
    let dir = tempfile::tempdir().expect("tempdir");
    let exit_file = dir.path().join("exit.conf");
    let config = dir.path().join("blipless.toml");
    std::fs::write(
        &config,
        format!(
            "[[egress.upstream]]\nname = \"de-1\"\nkind = \"wireguard\"\nconfig = \"{}\"\n",
            exit_file.display()
        ),
    )
    .expect("writing the configuration");
    let config = config.to_str().expect("a UTF-8 path");
    let has_link = |name: &str| {
        ns.exec("ip", &["link", "show", "dev", name])
            .status
            .success()
    };
    let rules = || ok(&ns.exec("ip", &["rule", "show"]), "ip rule show");
    let has_table = |table: &str| {
        ns.exec("nft", &["list", "table", "inet", table])
            .status
            .success()
    };
    let set_up = || {
        std::fs::write(&exit_file, EXIT_FILE).expect("writing the exit's file");
        ok(
            &ns.ctl(&["--config", config, "net", "setup"]),
            "net setup with an exit",
        );
        assert!(
            has_link(TUN) && has_link(EXIT_TUN),
            "setup made both devices"
        );
        let alias = ok(
            &ns.exec("ip", &["link", "show", "dev", EXIT_TUN]),
            "ip link show",
        );
        assert!(alias.contains("alias blipless exit de-1"), "{alias}");
        let rules = rules();
        assert_eq!(rules.matches(EXIT_TABLE).count(), 2, "{rules}");
        assert!(has_table("blipless") && has_table("blipless_steer"));
    };
    // What is not ours: a TUN device without our alias, one with another
    // program's, and a rule of another routing table. Teardown leaves them.
    for (name, alias) in [("tun-plain", None), ("tun-other", Some("vpnd egress"))] {
        ok(
            &ns.exec("ip", &["tuntap", "add", "dev", name, "mode", "tun"]),
            "adding a foreign TUN device",
        );
        if let Some(alias) = alias {
            ok(
                &ns.exec("ip", &["link", "set", "dev", name, "alias", alias]),
                "aliasing it",
            );
        }
    }
    ok(
        &ns.exec("ip", &["rule", "add", "fwmark", "0x64", "lookup", "100"]),
        "adding a foreign rule",
    );
    let nothing_left = |when: &str| {
        for name in [TUN, EXIT_TUN] {
            assert!(!has_link(name), "{when}: {name} is still there");
        }
        assert!(
            has_link("tun-plain") && has_link("tun-other"),
            "{when}: a TUN device that is not ours was deleted"
        );
        assert!(
            rules().contains("lookup 100"),
            "{when}: a rule that is not ours was deleted"
        );
        let rules = rules();
        assert!(
            !rules.contains(EXIT_TABLE),
            "{when}: the exit's rules are still there: {rules}"
        );
        assert!(
            !has_table("blipless") && !has_table("blipless_steer"),
            "{when}: an nftables table is still there"
        );
    };

    // The clients' device renamed and the exit gone from the configuration:
    // what it removed is said.
    set_up();
    let output = ns.ctl(&[
        "--json",
        "--set",
        "egress.tun.name=blt-renamed",
        "net",
        "teardown",
    ]);
    let json: serde_json::Value =
        serde_json::from_str(ok(&output, "net teardown").trim()).expect("--json answers in JSON");
    assert_eq!(
        json["removed"]["tuns"],
        serde_json::json!([TUN, EXIT_TUN]),
        "{json}"
    );
    assert_eq!(json["removed"]["rules"], 2, "{json}");
    nothing_left("after a teardown by a changed configuration");

    // A configuration that loads but that a plan refuses (the TUN owner is
    // gone): the marked rest is removed, and the problem reported (exit 1).
    set_up();
    let output = ns.ctl(&[
        "--set",
        "egress.tun.user=no-such-user-here",
        "net",
        "teardown",
    ]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("no-such-user-here"), "{said}");
    nothing_left("after a teardown whose plan was refused");

    // A configuration that no longer loads.
    set_up();
    std::fs::remove_file(&exit_file).expect("removing the exit's file");
    let output = ns.ctl(&["--config", config, "net", "teardown"]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{said}");
    assert!(said.contains("exit.conf"), "the problem is named: {said}");
    assert!(said.contains("removed what setup made anyway"), "{said}");
    nothing_left("after a teardown without a usable configuration");
    set_up();
    std::fs::remove_file(&exit_file).expect("removing the exit's file");
    let output = ns.ctl(&["--json", "--config", config, "net", "teardown"]);
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("--json answers in JSON");
    assert_eq!(json["teardown"]["ok"], true, "{json}");
    assert_eq!(
        json["teardown"]["removed"]["tuns"],
        serde_json::json!([TUN, EXIT_TUN]),
        "{json}"
    );
    assert!(
        json["problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("exit.conf")),
        "{json}"
    );
    assert_eq!(output.status.code(), Some(64));
    nothing_left("after a teardown without a usable configuration, under --json");
}

#[test]
fn net_setup_makes_the_tun_owned_by_the_service_user() {
    let ns = Netns::new("own");
    let nobody = NOBODY.to_string();
    let as_nobody = [
        "--set",
        "egress.tun.user=65534",
        "--set",
        "egress.tun.group=65534",
        "net",
        "setup",
    ];
    ok(&ns.ctl(&as_nobody), "net setup for uid 65534");
    assert_eq!(ns.tun_owner(), (nobody.clone(), nobody.clone()));
    let link = ok(&ns.exec("ip", &["-d", "link", "show", TUN]), "ip link show");
    assert!(
        link.contains("user nobody") || link.contains("user 65534"),
        "{link}"
    );
    // Again: nothing changes.
    ok(&ns.ctl(&as_nobody), "net setup again");
    assert_eq!(ns.tun_owner(), (nobody.clone(), nobody.clone()));

    // Another owner while a queue is attached: refused, the device is kept.
    let (attached_tx, attached_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = in_namespace(ns.path(), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let queue = runtime
            .block_on(async { TunQueue::attach(TUN, false) })
            .map_err(|e| format!("attach: {e}"))?;
        let _ = attached_tx.send(());
        let _ = release_rx.recv_timeout(PATIENCE);
        drop(queue);
        Ok(())
    });
    attached_rx
        .recv_timeout(PATIENCE)
        .expect("the queue holder attached");
    let refused = ns.ctl(&["net", "setup"]);
    let _ = release_tx.send(());
    match holder.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => panic!("{error}"),
        Err(_) => panic!("the queue holder panicked"),
    }
    assert!(
        !refused.status.success(),
        "net setup changed the owner of a device in use"
    );
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("queue(s) are attached") && stderr.contains("nobody"),
        "{stderr}"
    );
    assert_eq!(ns.tun_owner(), (nobody.clone(), nobody));

    // Unused now: setup recreates it with the new owner (root, who runs it)
    // and its address.
    ok(&ns.ctl(&["net", "setup"]), "net setup for root");
    assert_eq!(ns.tun_owner(), ("0".to_string(), "0".to_string()));
    let addresses = ok(
        &ns.exec("ip", &["-4", "addr", "show", "dev", TUN]),
        "ip addr",
    );
    assert!(addresses.contains("inet 10.77.0.1/16"), "{addresses}");
}

#[test]
fn net_setup_refuses_an_uplink_the_host_lacks_and_finds_the_default_routes() {
    let ns = Netns::new("uplink");
    let output = ns.ctl(&["--set", "egress.tun.out_interface=eth8", "net", "setup"]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("eth8") && stderr.contains("no such network interface"),
        "{stderr}"
    );
    assert!(stderr.contains("no IPv4 default route"), "{stderr}");
    let link = ns.exec("ip", &["link", "show", TUN]);
    assert!(!link.status.success(), "a refused setup created {TUN}");
    // Empty: the default route's interface, which there is none of yet.
    let output = ns.ctl(&["--set", "egress.tun.out_interface=", "net", "setup"]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("no IPv4 default route"), "{stderr}");
    // With a default route out of eth9, the named eth8 is refused with
    // advice, and empty finds eth9.
    for command in [
        &["addr", "add", "10.200.0.2/24", "dev", "eth9"][..],
        &["link", "set", "eth9", "up"],
        &["link", "set", "eth9-peer", "up"],
        &[
            "route",
            "add",
            "default",
            "via",
            "10.200.0.1",
            "dev",
            "eth9",
        ],
    ] {
        ok(&ns.exec("ip", command), "routing out of eth9");
    }
    let output = ns.ctl(&["--set", "egress.tun.out_interface=eth8", "net", "setup"]);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("the default route leaves by eth9"),
        "{stderr}"
    );
    let output = ns.ctl(&["--set", "egress.tun.out_interface=", "net", "setup"]);
    let said = ok(&output, "net setup out of the default route's interface");
    assert!(said.contains("out of eth9"), "{said}");
    let rules = ok(
        &ns.exec("nft", &["list", "table", "inet", "blipless"]),
        "nft list",
    );
    assert!(rules.contains("oifname \"eth9\" masquerade"), "{rules}");
    ok(&ns.ctl(&["net", "teardown"]), "net teardown");
}

#[test]
fn net_setup_refuses_an_ipv6_pool_and_changes_nothing() {
    let ns = Netns::new("v6");
    let output = ns.ctl(&["--set", "wireguard.pool=fd00:77::/64", "net", "setup"]);
    assert_eq!(output.status.code(), Some(64), "a configuration error");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("wireguard.pool") && stderr.contains("an IPv4 network"),
        "{stderr}"
    );
    let link = ns.exec("ip", &["link", "show", TUN]);
    assert!(!link.status.success(), "a refused setup created {TUN}");
}

#[test]
fn tun_queues_carry_packets_and_detach() {
    let ns = Netns::new("tun");
    ok(&ns.ctl(&["net", "setup"]), "net setup");
    // A TUN device without multi_queue, to see attach refuse it clearly.
    ok(
        &ns.exec("ip", &["tuntap", "add", "dev", "single0", "mode", "tun"]),
        "ip tuntap add single0",
    );
    let path = ns.path();
    // setns affects only the calling thread, so everything that needs the
    // namespace (the TUN queues, the UDP sockets) lives on this thread.
    let worker = in_namespace(path, move || -> TestResult {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        runtime.block_on(exercise_queues())
    });
    match worker.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => panic!("{error}"),
        Err(_) => panic!("the namespace thread panicked"),
    }
}

async fn exercise_queues() -> TestResult {
    // Clear errors for the wrong devices.
    let missing = TunQueue::attach("nosuch0", false)
        .err()
        .ok_or("attached nosuch0")?;
    if missing.kind() != std::io::ErrorKind::NotFound
        || !missing.to_string().contains("blipless-ctl net setup")
    {
        return Err(format!("attaching a missing device said: {missing}"));
    }
    let single = TunQueue::attach("single0", false)
        .err()
        .ok_or("attached single0")?;
    if single.kind() != std::io::ErrorKind::InvalidInput
        || !single.to_string().contains("multi-queue")
    {
        return Err(format!("attaching a single-queue device said: {single}"));
    }

    let queues = attach_queues(TUN, 2, false).map_err(|e| format!("attach_queues: {e}"))?;
    let [a, b] = <[TunQueue; 2]>::try_from(queues).map_err(|_| "not two queues")?;

    // Out: a datagram sent to a client address leaves through a queue as a
    // raw IPv4 packet.
    let socket = tokio::net::UdpSocket::bind((NODE, 0))
        .await
        .map_err(|e| format!("binding {NODE}: {e}"))?;
    let local_port = socket.local_addr().map_err(|e| e.to_string())?.port();
    // The device gets its carrier when its first queue attaches, and the
    // kernel drops what is sent before it has noticed (linkwatch runs
    // asynchronously), so repeat the datagram until one comes out.
    let deadline = Instant::now() + PATIENCE;
    let seen = loop {
        socket
            .send_to(b"blipless-out", (CLIENT, 9000))
            .await
            .map_err(|e| format!("sending to {CLIENT}: {e}"))?;
        match collect(&a, &b, b"blipless-out", 1, Duration::from_millis(250)).await {
            Ok(seen) => break seen,
            Err(error) if Instant::now() > deadline => return Err(error),
            Err(_) => continue,
        }
    };
    let (_, packet) = &seen[0];
    let udp = parse_udp(packet).ok_or("not an IPv4 UDP packet")?;
    if udp.source != (NODE, local_port) || udp.destination != (CLIENT, 9000) {
        return Err(format!("unexpected addresses in {udp:?}"));
    }

    // In: a packet written into a queue is delivered to the socket.
    let injected = udp_packet((CLIENT, 9000), (NODE, local_port), b"blipless-in");
    a.send(&injected)
        .await
        .map_err(|e| format!("writing into the queue: {e}"))?;
    let mut buffer = [0u8; 2048];
    let (length, from) = tokio::time::timeout(PATIENCE, socket.recv_from(&mut buffer))
        .await
        .map_err(|_| "the injected packet never reached the socket")?
        .map_err(|e| format!("receiving: {e}"))?;
    if &buffer[..length] != b"blipless-in" || from != (CLIENT, 9000).into() {
        return Err(format!(
            "the socket got {:?} from {from}",
            &buffer[..length]
        ));
    }

    // But a client cannot open a flow to a service of the host (the input
    // chain drops what is not a reply)...
    let service = tokio::net::UdpSocket::bind((NODE, 0))
        .await
        .map_err(|e| format!("binding {NODE}: {e}"))?;
    let service_port = service.local_addr().map_err(|e| e.to_string())?.port();
    let knock = udp_packet((CLIENT, 9002), (NODE, service_port), b"to-the-host");
    a.send(&knock)
        .await
        .map_err(|e| format!("writing into the queue: {e}"))?;
    if let Ok(received) =
        tokio::time::timeout(Duration::from_secs(1), service.recv_from(&mut buffer)).await
    {
        return Err(format!(
            "a client's new flow reached a host service: {received:?}"
        ));
    }
    // ...nor reach another client (forwarding back into the pool is dropped).
    let across = udp_packet((CLIENT, 9003), (OTHER_CLIENT, 9004), b"client-to-client");
    a.send(&across)
        .await
        .map_err(|e| format!("writing into the queue: {e}"))?;
    if let Ok(seen) = collect(&a, &b, b"client-to-client", 1, Duration::from_secs(1)).await {
        return Err(format!(
            "a packet from one client was forwarded to another: {:?}",
            parse_udp(&seen[0].1)
        ));
    }

    // Both queues attached: the kernel spreads flows over both.
    let spread = send_flows(b"spread").await?;
    let seen = collect(&a, &b, b"spread", spread, PATIENCE).await?;
    let on_a = seen.iter().filter(|(queue, _)| *queue == 0).count();
    if on_a == 0 || on_a == spread {
        return Err(format!(
            "{spread} flows all went to one queue ({on_a} on the first) while both were attached"
        ));
    }

    // Detached: the kernel steers every new packet to the other queue.
    a.detach().map_err(|e| format!("detach: {e}"))?;
    a.detach().map_err(|e| format!("detaching twice: {e}"))?;
    if !a.is_detached() {
        return Err("is_detached says no after detach".into());
    }
    let flows = send_flows(b"after-detach").await?;
    let seen = collect(&a, &b, b"after-detach", flows, PATIENCE).await?;
    if let Some((_, packet)) = seen.iter().find(|(queue, _)| *queue == 0) {
        return Err(format!(
            "a detached queue got a packet: {:?}",
            parse_udp(packet)
        ));
    }
    // And nothing is left waiting on it.
    let mut leftover = [0u8; 2048];
    while let Some(length) = a
        .try_recv(&mut leftover)
        .map_err(|e| format!("try_recv on a detached queue: {e}"))?
    {
        if payload_has(&leftover[..length], b"after-detach") {
            return Err("a detached queue held a packet sent after the detach".into());
        }
    }

    // Attached again: both queues are used again.
    a.reattach().map_err(|e| format!("reattach: {e}"))?;
    let flows = send_flows(b"reattached").await?;
    let seen = collect(&a, &b, b"reattached", flows, PATIENCE).await?;
    if !seen.iter().any(|(queue, _)| *queue == 0) {
        return Err(format!(
            "after reattach, none of {flows} flows reached the queue"
        ));
    }
    if a.offload() || b.offload() {
        return Err("queues attached without offload carry virtio-net headers".into());
    }
    drop((a, b));
    offload_is_the_first_queues_choice().await
}

/// The virtio-net header mode is the device's, chosen by the first queue of
/// a device with none attached; later queues get it whatever they ask.
async fn offload_is_the_first_queues_choice() -> TestResult {
    let first = TunQueue::attach(TUN, true).map_err(|e| format!("attach, offload: {e}"))?;
    let second = TunQueue::attach(TUN, false).map_err(|e| format!("attach: {e}"))?;
    if !first.offload() || !second.offload() {
        return Err(format!(
            "first queue offload {}, second {}: both should carry headers",
            first.offload(),
            second.offload()
        ));
    }
    // Out through an offload queue: a header, then the packet.
    let socket = tokio::net::UdpSocket::bind((NODE, 0))
        .await
        .map_err(|e| format!("binding {NODE}: {e}"))?;
    let local_port = socket.local_addr().map_err(|e| e.to_string())?.port();
    let deadline = Instant::now() + PATIENCE;
    let mut buffer = vec![0u8; 70_000];
    let packet = 'seen: loop {
        socket
            .send_to(b"offload-out", (CLIENT, 9000))
            .await
            .map_err(|e| format!("sending to {CLIENT}: {e}"))?;
        let wait = Instant::now() + Duration::from_millis(250);
        while Instant::now() < wait {
            for queue in [&first, &second] {
                if let Some(length) = queue.try_recv(&mut buffer).map_err(|e| e.to_string())? {
                    let read = &buffer[..length];
                    let after_header = read.get(blipless_protocol::offload::HEADER_LEN..);
                    if after_header.is_some_and(|packet| payload_has(packet, b"offload-out")) {
                        break 'seen read.to_vec();
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if Instant::now() > deadline {
            return Err("nothing came out of the offload queues".into());
        }
    };
    let header =
        blipless_protocol::offload::VnetHeader::decode(&packet).map_err(|e| format!("{e}"))?;
    let udp = parse_udp(&packet[blipless_protocol::offload::HEADER_LEN..]);
    if header.gso_type != 0
        || udp
            .as_ref()
            .is_none_or(|udp| udp.destination != (CLIENT, 9000))
    {
        return Err(format!("an offload read was {header:?} then {udp:?}"));
    }
    // In: `send` puts the header in front by itself.
    let injected = udp_packet((CLIENT, 9000), (NODE, local_port), b"offload-in");
    first
        .send(&injected)
        .await
        .map_err(|e| format!("writing into an offload queue: {e}"))?;
    let (length, _) = tokio::time::timeout(PATIENCE, socket.recv_from(&mut buffer))
        .await
        .map_err(|_| "the packet written to an offload queue never arrived")?
        .map_err(|e| format!("receiving: {e}"))?;
    if &buffer[..length] != b"offload-in" {
        return Err(format!("the socket got {:?}", &buffer[..length]));
    }
    drop((first, second));
    // All queues gone: the next first queue chooses again.
    let plain = TunQueue::attach(TUN, false).map_err(|e| format!("attach: {e}"))?;
    if plain.offload() {
        return Err("a fresh first queue without offload still carries headers".into());
    }
    Ok(())
}

/// Sends one datagram from each of many sockets (so many flows, each with
/// its own hash) to the client; returns how many.
async fn send_flows(marker: &[u8]) -> Result<usize, String> {
    const FLOWS: usize = 24;
    for flow in 0..FLOWS {
        let socket = tokio::net::UdpSocket::bind((NODE, 0))
            .await
            .map_err(|e| format!("binding {NODE}: {e}"))?;
        let mut payload = marker.to_vec();
        payload.extend_from_slice(format!("-{flow}").as_bytes());
        socket
            .send_to(&payload, (CLIENT, 9001 + flow as u16))
            .await
            .map_err(|e| format!("sending flow {flow}: {e}"))?;
    }
    Ok(FLOWS)
}

/// Reads both queues until `want` UDP packets whose payload starts with
/// `marker` arrived (others, such as IPv6 router solicitations, are
/// skipped), for at most `patience`; returns them with the index of the
/// queue each came from.
async fn collect(
    a: &TunQueue,
    b: &TunQueue,
    marker: &[u8],
    want: usize,
    patience: Duration,
) -> Result<Vec<(usize, Vec<u8>)>, String> {
    let deadline = Instant::now() + patience;
    let mut seen = Vec::new();
    let mut buffer_a = vec![0u8; 65535];
    let mut buffer_b = vec![0u8; 65535];
    while seen.len() < want {
        let (queue, packet) = tokio::select! {
            read = a.recv(&mut buffer_a) => {
                let length = read.map_err(|e| format!("reading the first queue: {e}"))?;
                (0, buffer_a[..length].to_vec())
            }
            read = b.recv(&mut buffer_b) => {
                let length = read.map_err(|e| format!("reading the second queue: {e}"))?;
                (1, buffer_b[..length].to_vec())
            }
            () = tokio::time::sleep_until(deadline) => {
                return Err(format!(
                    "only {} of {want} {:?} packets came out of the TUN queues",
                    seen.len(),
                    String::from_utf8_lossy(marker)
                ));
            }
        };
        if payload_has(&packet, marker) {
            seen.push((queue, packet));
        }
    }
    Ok(seen)
}

#[derive(Debug)]
struct Udp {
    source: (Ipv4Addr, u16),
    destination: (Ipv4Addr, u16),
    payload: Vec<u8>,
}

fn parse_udp(packet: &[u8]) -> Option<Udp> {
    if packet.len() < 20 || packet[0] >> 4 != 4 || packet[9] != 17 {
        return None;
    }
    let header = usize::from(packet[0] & 0x0f) * 4;
    let udp = packet.get(header..)?;
    if udp.len() < 8 {
        return None;
    }
    let address =
        |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
    let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
    Some(Udp {
        source: (address(12), port(0)),
        destination: (address(16), port(2)),
        payload: udp[8..].to_vec(),
    })
}

fn payload_has(packet: &[u8], marker: &[u8]) -> bool {
    parse_udp(packet).is_some_and(|udp| udp.payload.starts_with(marker))
}

/// An IPv4 UDP packet (UDP checksum 0: none, which IPv4 allows).
fn udp_packet(from: (Ipv4Addr, u16), to: (Ipv4Addr, u16), payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut packet = Vec::with_capacity(total);
    packet.extend_from_slice(&[0x45, 0]);
    packet.extend_from_slice(&(total as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0, 0x40, 0]); // id 0, don't fragment
    packet.extend_from_slice(&[64, 17, 0, 0]); // TTL, UDP, checksum (below)
    packet.extend_from_slice(&from.0.octets());
    packet.extend_from_slice(&to.0.octets());
    let checksum = ipv4_checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
    packet.extend_from_slice(&from.1.to_be_bytes());
    packet.extend_from_slice(&to.1.to_be_bytes());
    packet.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(payload);
    packet
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
