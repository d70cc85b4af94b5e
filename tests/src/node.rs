//! One blipless node for a test: a config file in a temporary folder, the
//! ingress and device-plane processes, and `blipless-ctl` against them.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{binary, free_port, wait_until};

/// A started daemon; killed (SIGKILL) when dropped if still running.
#[derive(Debug)]
pub struct Daemon {
    /// The process.
    pub child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Daemon {
    /// Its process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Sends a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(self.pid(), signal);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to exit; None if it did not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (up to 90 s) for an old daemon that was replaced to exit, and
    /// asserts it exited 0; `what` names it in the failure.
    pub fn exits_cleanly(&mut self, what: &str) {
        let status = self
            .wait_exit(Duration::from_secs(90))
            .unwrap_or_else(|| panic!("the old {what} did not exit: {}", self.log_text()));
        assert!(
            status.success(),
            "the old {what} exited with {status}: {}",
            self.log_text()
        );
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Proxy URLs with credentials for one client.
#[derive(Debug, Clone)]
pub struct ClientUrls {
    /// The client's name.
    pub name: String,
    /// Its secret.
    pub secret: String,
    /// socks5h://name:secret@host:port
    pub socks: String,
    /// http://name:secret@host:port
    pub http: String,
    /// https://name:secret@host:port, when the node has an HTTPS listener.
    pub https: Option<String>,
}

impl ClientUrls {
    /// From `blipless-ctl --json client add`'s answer (missing fields empty).
    pub fn from_json(answer: &serde_json::Value) -> Self {
        let field = |key: &str| answer[key].as_str().unwrap_or_default().to_owned();
        Self {
            name: field("name"),
            secret: field("secret"),
            socks: field("socks5_url"),
            http: field("http_url"),
            https: answer["https_url"].as_str().map(str::to_owned),
        }
    }
}

/// A node's files and addresses.
#[derive(Debug)]
pub struct Node {
    /// The temporary folder (removed on drop).
    pub dir: tempfile::TempDir,
    /// The config file.
    pub config: PathBuf,
    /// SOCKS5 listener.
    pub socks: SocketAddr,
    /// HTTP proxy listener.
    pub http: SocketAddr,
    /// Status listener.
    pub status: SocketAddr,
    /// The network namespace the daemons run in (None: the test's own).
    pub netns: Option<String>,
    daemons: usize,
}

impl Node {
    /// A node whose egress allows 127.0.0.1 (where test origins listen),
    /// with `extra` TOML appended to its config (sections other than
    /// [node], [listen] and [egress]).
    pub fn new(extra: &str) -> Self {
        Self::custom("test", "", extra)
    }

    /// A node named `host`, with `egress` lines added to its [egress] table
    /// and `extra` TOML appended.
    pub fn custom(host: &str, egress: &str, extra: &str) -> Self {
        crate::raise_fd_limit();
        let dir = tempfile::Builder::new()
            .prefix("blip")
            .tempdir()
            .expect("temporary folder");
        let (socks, http, status) = (free_port(), free_port(), free_port());
        let config = dir.path().join("blipless.toml");
        let text = format!(
            "[node]\nhost = \"{host}\"\nruntime_dir = \"{run}\"\nstate_dir = \"{state}\"\n\n\
             [listen]\nsocks = \"127.0.0.1:{socks}\"\nhttp = \"127.0.0.1:{http}\"\nstatus = \"127.0.0.1:{status}\"\nwg = \"127.0.0.1:0\"\n\n\
             [egress]\nallow = [\"127.0.0.1/32\"]\n{egress}\n\n{extra}\n",
            run = dir.path().join("run").display(),
            state = dir.path().join("state").display(),
        );
        std::fs::write(&config, text).expect("writing the config");
        let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
        Self {
            dir,
            config,
            socks: at(socks),
            http: at(http),
            status: at(status),
            netns: None,
            daemons: 0,
        }
    }

    /// A node whose daemons run inside the network namespace `netns` (which
    /// has a loopback of its own, so the listeners take their default ports),
    /// with WireGuard on `0.0.0.0:51820`, `egress` lines added to its [egress]
    /// table and `extra` TOML appended. `blipless-ctl` runs in the test's own
    /// namespace: it needs only the Unix sockets and the store.
    pub fn in_netns(netns: &str, egress: &str, extra: &str) -> Self {
        crate::raise_fd_limit();
        let dir = tempfile::Builder::new()
            .prefix("blipns")
            .tempdir()
            .expect("temporary folder");
        let config = dir.path().join("blipless.toml");
        let text = format!(
            "[node]\nhost = \"{netns}\"\nruntime_dir = \"{run}\"\nstate_dir = \"{state}\"\n\n\
             [listen]\nwg = \"0.0.0.0:51820\"\n\n\
             [egress]\n{egress}\n\n{extra}\n",
            run = dir.path().join("run").display(),
            state = dir.path().join("state").display(),
        );
        std::fs::write(&config, text).expect("writing the config");
        let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
        Self {
            dir,
            config,
            socks: at(1080),
            http: at(8080),
            status: at(9180),
            netns: Some(netns.to_owned()),
            daemons: 0,
        }
    }

    /// Turns the HTTPS proxy listener on (a free port on 127.0.0.1) with the
    /// certificate chain and key at these paths; call before starting the
    /// ingress. Returns its address.
    pub fn enable_https(&mut self, certificate: &Path, key: &Path) -> SocketAddr {
        let port = free_port();
        let text = std::fs::read_to_string(&self.config).expect("reading the config");
        let text = text.replacen(
            "[listen]\n",
            &format!("[listen]\nhttps = \"127.0.0.1:{port}\"\n"),
            1,
        ) + &format!(
            "\n[tls]\ncertificate = \"{}\"\nkey = \"{}\"\n",
            certificate.display(),
            key.display()
        );
        std::fs::write(&self.config, text).expect("writing the config");
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A command for `program`, inside the node's namespace if it has one.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// The node's folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self, binary_name: &str, args: &[&str]) -> Daemon {
        self.spawn_with_env(binary_name, args, &[])
    }

    fn spawn_with_env(&mut self, binary_name: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        self.spawn_under(&[], binary_name, args, env)
    }

    /// Starts a device plane whose open-file limit is `limit` (soft and hard,
    /// through `prlimit`, which execs it: the child is the daemon).
    pub fn start_device_with_fd_limit(&mut self, limit: u64) -> Daemon {
        let nofile = format!("--nofile={limit}:{limit}");
        self.spawn_under(&["prlimit", &nofile, "--"], "blipless-device", &[], &[])
    }

    fn spawn_under(
        &mut self,
        wrapper: &[&str],
        binary_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        self.daemons += 1;
        let log = self
            .path()
            .join(format!("{}-{}.log", binary_name, self.daemons));
        let stderr = File::create(&log).expect("log file");
        // `ip netns exec` execs the daemon in place: the child is the daemon.
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = self.command(program);
                command.args(rest).arg(binary(binary_name));
                command
            }
            None => self.command(binary(binary_name)),
        };
        let child = command
            .arg("--config")
            .arg(&self.config)
            .args(args)
            // BLIPLESS_TEST_LOG overrides the daemons' log filter (the bench uses "info").
            .env(
                "BLIPLESS_LOG",
                std::env::var("BLIPLESS_TEST_LOG")
                    .unwrap_or_else(|_| "info,blipless_device=debug".into()),
            )
            // Tests need no lame-duck period before listeners close.
            .env("BLIPLESS_DRAIN_LAME_DUCK", "100ms")
            // `wg show`'s socket in the node's folder, not the host's
            // /run/wireguard (tests/tests/wg_show.rs shows it to `wg`).
            .env("BLIPLESS_WIREGUARD_UAPI_DIR", self.path().join("wg"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting a daemon");
        Daemon { child, log }
    }

    /// Starts an ingress and waits until its status listener answers.
    pub fn start_ingress(&mut self) -> Daemon {
        let daemon = self.spawn("blipless-ingress", &[]);
        let status = self.status;
        if self.netns.is_some() {
            wait_until(
                Duration::from_secs(20),
                "the ingress's status listener",
                || self.status().0 != 0,
            );
        } else {
            wait_until(
                Duration::from_secs(20),
                "the ingress's status listener",
                || std::net::TcpStream::connect(status).is_ok(),
            );
        }
        daemon
    }

    /// Starts a device plane (does not wait).
    pub fn start_device(&mut self) -> Daemon {
        self.spawn("blipless-device", &[])
    }

    /// Starts a device plane with extra environment variables.
    pub fn start_device_with_env(&mut self, env: &[(&str, &str)]) -> Daemon {
        self.spawn_with_env("blipless-device", &[], env)
    }

    /// `blipless-ctl --json status`, parsed.
    pub fn status_json(&self) -> serde_json::Value {
        let output = self.ctl(&["--json", "status"]);
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// The generation of the active device plane, if any.
    pub fn active_generation(&self) -> Option<u64> {
        self.status_json()["device_planes"]
            .as_array()?
            .iter()
            .find(|p| p["state"] == "active")?["generation"]
            .as_u64()
    }

    /// Deploys: starts a new device plane, waits until it is active and the
    /// `old` one has exited; returns the new one and how long the old took.
    pub fn deploy(&mut self, old: &mut Daemon) -> (Daemon, Duration) {
        self.deploy_with_env(old, &[])
    }

    /// [`Node::deploy`] to a device plane with extra environment variables.
    pub fn deploy_with_env(
        &mut self,
        old: &mut Daemon,
        env: &[(&str, &str)],
    ) -> (Daemon, Duration) {
        let before = self.active_generation();
        let started = Instant::now();
        let new = self.start_device_with_env(env);
        wait_until(
            Duration::from_secs(60),
            "the new device plane to be active",
            || self.active_generation().is_some_and(|g| Some(g) != before),
        );
        old.exits_cleanly("device plane");
        (new, started.elapsed())
    }

    /// Restarts the ingress by handoff: starts a new one beside `old`, waits
    /// until `old` has exited (status 0); returns the new one and how long the
    /// old one took to leave.
    pub fn hand_off(&mut self, old: &mut Daemon) -> (Daemon, Duration) {
        let started = Instant::now();
        let new = self.spawn("blipless-ingress", &[]);
        old.exits_cleanly("ingress");
        (new, started.elapsed())
    }

    /// Starts an ingress without waiting for anything.
    pub fn spawn_ingress(&mut self) -> Daemon {
        self.spawn("blipless-ingress", &[])
    }

    /// Starts an ingress with extra arguments (e.g. `--set`), without waiting.
    pub fn spawn_ingress_with(&mut self, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        self.spawn_with_env("blipless-ingress", args, env)
    }

    /// `/status`: (HTTP code, body); (0, "") when unreachable.
    pub fn status(&self) -> (u16, String) {
        let output = self.status_get("/status");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.trim().to_string())
    }

    /// `/metrics` as text ("" when unreachable).
    pub fn metrics(&self) -> String {
        let output = self.status_get("/metrics");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.rsplit_once('\n')
            .map(|(body, _)| body.to_string())
            .unwrap_or_default()
    }

    /// The value of one metric line (`name{labels}` exactly as exposed), 0 if absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().ok())?
            })
            .unwrap_or(0.0)
    }

    fn status_get(&self, path: &str) -> std::process::Output {
        let args = [
            "--silent",
            "--max-time",
            "5",
            "-w",
            "\n%{http_code}",
            &format!("http://{}{path}", self.status),
        ];
        if self.netns.is_some() {
            return self
                .command("curl")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|error| panic!("running curl in the node's namespace: {error}"));
        }
        crate::curl::curl(&args)
    }

    /// Waits until `/status` answers 200 ok.
    pub fn wait_ready(&self) {
        wait_until(Duration::from_secs(30), "/status to answer 200", || {
            self.status().0 == 200
        });
    }

    /// Runs blipless-ctl with this node's config.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(binary("blipless-ctl"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running blipless-ctl")
    }

    /// Adds a client and returns its proxy URLs.
    pub fn add_client(&self, name: &str) -> ClientUrls {
        let output = self.ctl(&["--json", "client", "add", name]);
        assert!(
            output.status.success(),
            "client add failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let value: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("client add --json");
        let urls = ClientUrls::from_json(&value);
        assert!(
            !urls.secret.is_empty(),
            "client add --json without a secret: {value}"
        );
        urls
    }

    /// Starts an ingress and a device plane, waits until ready, adds a client.
    pub fn start(&mut self) -> (Daemon, Daemon, ClientUrls) {
        let ingress = self.start_ingress();
        let client = self.add_client("alice");
        let device = self.start_device();
        self.wait_ready();
        // The device plane loaded the client at start: it was added before.
        (ingress, device, client)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A failing test shows what the daemons said.
        if !std::thread::panicking() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.path()) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                eprintln!("==== {} (last {} lines)", path.display(), tail.len());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
