//! Real Redis topologies for the store's contract suite and the end-to-end tests: a
//! [`RedisCluster`] (three masters, three replicas) and a [`RedisSentinel`] (a master, a
//! replica, three sentinels), each node a `redis-server` of the test's own on free
//! loopback ports, without persistence, in its own temp dir. Dropping a topology
//! SIGKILLs and reaps every process it started and deletes the dirs, even when the test
//! panics midway.
//!
//! A missing `redis-server` (or `redis-cli`) fails the test, never skips it: `make test`
//! installs them (package redis-server). Everything binds and addresses 127.0.0.1 only.
//!
//! The shared pieces are here: [`free_port`], [`Node`] (one server or sentinel), and
//! [`cli`] (one `redis-cli` command, from `redis_cli`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;
mod redis_cli;
pub mod sentinel;

pub use self::cluster::RedisCluster;
pub use self::redis_cli::{cli, cli_script, try_cli};
pub(crate) use self::redis_cli::{cli_json, info_field, run_cli};
pub use self::sentinel::RedisSentinel;

/// How long a new server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How often to try another port when one was taken meanwhile.
const START_ATTEMPTS: usize = 5;
/// How long a topology may take to settle (formed, failed over).
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often to look again while waiting for a topology.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How much of a node's log goes into a panic message.
const LOG_TAIL_LINES: usize = 30;

/// A loopback port that was free a moment ago (the kernel's pick for 127.0.0.1:0).
/// Someone may take it before it is used: [`Node::start`] retries with another.
/// A plain proxy client record named `name` (its secret is its name; no
/// WireGuard key; egress `any`), for tests and benches that store clients.
pub fn client_record(name: &str) -> crate::ClientRecord {
    crate::ClientRecord {
        name: name.to_owned(),
        secret_hash: crate::credentials::hash_secret(name),
        created_at: 1_700_000_000,
        wg_public_key: None,
        wg_address: None,
        egress: crate::EgressPolicy::Any,
        limits: crate::ClientLimits::default(),
    }
}

pub fn free_port() -> u16 {
    let mut last_error = None;
    for _ in 0..10 {
        match TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()) {
            Ok(addr) => return addr.port(),
            Err(err) => last_error = Some(err),
        }
    }
    panic!("no free loopback port: {last_error:?}");
}

/// What a [`Node`] runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A data node: `redis-server <conf>`.
    Server,
    /// A sentinel: `redis-server <conf> --sentinel`.
    Sentinel,
}

/// One `redis-server` (or sentinel) on a loopback port, with its config, data and log in
/// a temp dir of its own. Killed (SIGKILL, then reaped) and its dir deleted on drop.
#[derive(Debug)]
pub struct Node {
    port: u16,
    mode: Mode,
    child: Option<Child>,
    // Dropped after `child` is killed (see `Drop`).
    dir: tempfile::TempDir,
}

impl Node {
    /// Starts a node on a free port and waits until it answers PING. Its config file is
    /// `port`, `bind 127.0.0.1`, no persistence, `dir`/`logfile` in its temp dir and
    /// `protected-mode no`, then `extra(port)` (called again, on a fresh dir, for each
    /// port tried if one was taken meanwhile).
    pub fn start(mode: Mode, extra: impl Fn(u16) -> String) -> Self {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::tempdir().expect("a temp dir for redis-server");
            let port = free_port();
            let conf = format!(
                "port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir \"{dir}\"\n\
                 logfile \"{dir}/redis.log\"\nprotected-mode no\n{extra}\n",
                dir = dir.path().display(),
                extra = extra(port),
            );
            std::fs::write(dir.path().join(Self::conf_name(mode)), conf)
                .expect("writing the redis-server config into its temp dir");
            let mut node = Self {
                port,
                mode,
                child: None,
                dir,
            };
            match node.spawn() {
                Ok(()) => return node,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "redis-server ({mode:?}) did not start in {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    fn conf_name(mode: Mode) -> &'static str {
        match mode {
            Mode::Server => "redis.conf",
            Mode::Sentinel => "sentinel.conf",
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its temp dir (config, data, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<i32> {
        i32::try_from(self.child.as_ref()?.id()).ok()
    }

    /// Whether it runs (was started and not killed since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills it (SIGKILL, as a crash would) and waits for it to exit; nothing if it is
    /// not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, dir and config file (as the server last
    /// rewrote it), and waits until it answers PING.
    pub fn restart(&mut self) {
        if let Err(failure) = self.spawn() {
            panic!("redis-server did not restart: {failure}");
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    /// Starts the process and waits until it answers; what went wrong if it does not.
    fn spawn(&mut self) -> Result<(), String> {
        assert!(
            self.child.is_none(),
            "redis-server on port {} already running",
            self.port
        );
        let mut command = Command::new("redis-server");
        command.arg(self.dir.path().join(Self::conf_name(self.mode)));
        if self.mode == Mode::Sentinel {
            command.arg("--sentinel");
        }
        let spawned = command
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => self.child = Some(child),
            Err(err) => panic!(
                "cannot start redis-server ({err}): the Redis tests need it; \
                 run `make test`, which installs it (package redis-server)"
            ),
        }
        let deadline = Instant::now() + START_TIMEOUT;
        while !answers_ping(self.port) {
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "redis-server ({:?}) on port {} did not answer PING ({exited:?}); its log:\n{}",
                    self.mode,
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something on 127.0.0.1:`port` answers an inline `PING` with `+PONG`.
pub fn answers_ping(port: u16) -> bool {
    let ping = || -> std::io::Result<bool> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        stream.write_all(b"PING\r\n")?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply)?;
        Ok(&reply == b"+PONG\r\n")
    };
    ping().unwrap_or(false)
}

/// Calls `check` every [`POLL_EVERY`] until it succeeds, for up to `budget`; then panics
/// with `what`, the last failure and `logs()`.
pub(crate) fn wait_until<T>(
    budget: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
    logs: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + budget;
    loop {
        match check() {
            Ok(value) => return value,
            Err(failure) if Instant::now() > deadline => {
                panic!("{what} not within {budget:?}: {failure}\n{}", logs())
            }
            Err(_) => std::thread::sleep(POLL_EVERY),
        }
    }
}

/// The log tails of `nodes`, each under a header naming it.
pub(crate) fn logs<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> String {
    nodes
        .into_iter()
        .map(|node| {
            let state = if node.is_running() {
                "running"
            } else {
                "killed"
            };
            format!(
                "--- {:?} on port {} ({state}), its log:\n{}",
                node.mode,
                node.port,
                node.log_tail()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
