//! Side by side: blipless beside Debian's dante (SOCKS5), microsocks
//! (SOCKS5), tinyproxy (HTTP CONNECT), haproxy and nginx (plain TCP
//! forwarders), all on 127.0.0.1 to the bench's own origins, driven by the
//! one load client of [`crate::client`], interleaved run by run.
//!
//! Per path and run: the connection rate of 32 workers (each connection
//! new, with the proxy's handshake and credentials and one tiny `GET /`, as
//! in [`crate::scenarios::rate`]), the round trip's p50/p99, the proxy's
//! CPU per connection; then one connection's download (as in
//! [`crate::scenarios::bulk`]) and the proxy's CPU per GiB. The median run
//! counts. The proxy's CPU is utime + stime from /proc: of the ingress and
//! the device plane for blipless, of every process in the peer's process
//! group (children it reaped included) for the others.
//!
//! Each peer runs in the foreground with its config in a temporary folder,
//! on a free port, in a process group of its own, and is killed (its group,
//! and only it) when dropped. Dante runs through the end-to-end harness
//! (`blipless_tests::dante`), which needs root for its system user.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::dante::Dante;
use blipless_tests::node::{Daemon, Node};
use blipless_tests::origin::Origin;

use crate::client::{self, Mode, Proxies};
use crate::format::{micros, verdict};
use crate::procfs::Pids;
use crate::report::{Machine, Markers};
use crate::scenarios::bulk::{self, StreamOrigin};
use crate::scenarios::rate::{self, Bounds};
use crate::stats::{upper_median, Percentiles};

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- peers:begin -->",
    end: "<!-- peers:end -->",
};

/// Issue 13 item 1: each proxy protocol with credentials at this share of
/// the direct connection rate or more ...
pub const RATE_TARGET: f64 = 0.6;
/// ... with at most this much proxy CPU per connection, µs.
pub const CPU_PER_CONNECTION_TARGET_US: f64 = 100.0;
/// Issue 13 item 3: one tunnel at this share of direct throughput or more ...
pub const BULK_TARGET: f64 = 0.5;
/// ... at most this much proxy CPU per GiB, seconds.
pub const CPU_PER_GIB_TARGET_S: f64 = 0.5;

/// The Debian packages of the peers (package, program).
pub const PACKAGES: [(&str, &str); 6] = [
    ("dante-server", "danted"),
    ("microsocks", "microsocks"),
    ("tinyproxy", "tinyproxy"),
    ("haproxy", "haproxy"),
    ("nginx", "nginx"),
    ("libnginx-mod-stream", "ngx_stream_module.so"),
];

/// Debian's dynamic stream module for nginx.
const NGINX_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Runs per path (the median counts).
    pub runs: usize,
    /// Workers of the connection-rate phase.
    pub workers: usize,
    /// How long each connection-rate phase lasts.
    pub rate_time: Duration,
    /// Bytes of each download.
    pub bulk_bytes: u64,
    /// Time bound of each download.
    pub bulk_bound: Duration,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            runs: 3,
            workers: 32,
            rate_time: Duration::from_secs(3),
            bulk_bytes: 1 << 30,
            bulk_bound: Duration::from_secs(10),
        }
    }

    /// Checks the bench itself.
    pub fn quick() -> Self {
        Self {
            runs: 1,
            workers: 32,
            rate_time: Duration::from_millis(500),
            bulk_bytes: 64 << 20,
            bulk_bound: Duration::from_secs(5),
        }
    }
}

/// Whose CPU time counts as the proxy's.
#[derive(Debug, Clone)]
enum CpuOf {
    /// No proxy (direct).
    Nothing,
    /// These processes (blipless: ingress and device plane).
    Processes(Vec<i32>),
    /// Every process in this process group, and the children they reaped.
    Group(i32),
}

impl CpuOf {
    /// CPU seconds so far; None for direct.
    fn seconds(&self) -> Option<f64> {
        match self {
            CpuOf::Nothing => None,
            CpuOf::Processes(pids) => Some(
                pids.iter()
                    .filter_map(|pid| crate::procfs::cpu_seconds(&pid.to_string()))
                    .sum(),
            ),
            CpuOf::Group(group) => Some(group_cpu_seconds(*group)),
        }
    }
}

/// utime + stime + cutime + cstime of every process whose process group is
/// `group` (a child that exited and was reaped counts in its parent's
/// cutime/cstime; a live one only in its own utime/stime).
pub fn group_cpu_seconds(group: i32) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((pgrp, used)) = parse_group_stat(&stat) {
            if pgrp == group {
                ticks += used;
            }
        }
    }
    // USER_HZ is 100 on Linux.
    ticks as f64 / 100.0
}

/// The process group and utime + stime + cutime + cstime (ticks) of a
/// /proc/PID/stat line.
fn parse_group_stat(stat: &str) -> Option<(i32, u64)> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let pgrp = fields.get(2)?.parse().ok()?;
    let mut used = 0u64;
    for index in 11..=14 {
        // cutime and cstime are signed in the kernel's format.
        used += fields.get(index)?.parse::<i64>().ok()?.max(0) as u64;
    }
    Some((pgrp, used))
}

/// Whether a /proc/PID/stat line is a zombie's (state `Z`).
fn is_zombie(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|end| stat.get(end + 2..end + 3))
        .is_some_and(|state| state == "Z")
}

/// The live processes (zombies aside) left in process group `group`.
fn group_members(group: i32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            name.to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .filter(|stat| !is_zombie(stat))
                .and_then(|stat| parse_group_stat(&stat))
                .is_some_and(|(pgrp, _)| pgrp == group)
        })
        .count()
}

/// A peer started by this bench: the foreground process, leader of a process
/// group of its own; the whole group is killed when dropped.
#[derive(Debug)]
struct Peer {
    name: &'static str,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Peer {
    /// Starts `program` with `args` in the foreground (stdout and stderr
    /// into `output.log` in `dir`), in a process group of its own, and waits
    /// until every address of `listens` accepts connections.
    fn start(
        name: &'static str,
        program: &Path,
        args: &[OsString],
        dir: tempfile::TempDir,
        listens: &[SocketAddr],
    ) -> Result<Peer, String> {
        let log = dir.path().join("output.log");
        let stdout = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let mut peer = Peer {
            name,
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(Ok(Some(status))) = peer.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{name} exited ({status}) before listening: {}",
                    peer.output()
                ));
            }
            if listens
                .iter()
                .all(|a| TcpStream::connect_timeout(a, Duration::from_millis(300)).is_ok())
            {
                return Ok(peer);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{name} did not listen on {listens:?} within 15 s: {}",
                    peer.output()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process group (the leader's pid).
    fn group(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The last lines it printed.
    fn output(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("output.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM to its group, SIGKILL to what is left after 3 s; reaps the
    /// leader. Returns what it did, for the report.
    fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        use nix::sys::signal::{killpg, Signal};
        let group = child.id() as i32;
        let pgid = nix::unistd::Pid::from_raw(group);
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut killed = false;
        loop {
            let _ = child.try_wait();
            if group_members(group) == 0 {
                break;
            }
            if Instant::now() >= deadline {
                let _ = killpg(pgid, Signal::SIGKILL);
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        format!(
            "{}: SIGTERM{} to process group {group}",
            self.name,
            if killed { " then SIGKILL" } else { "" }
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A program on PATH or in the sbin folders.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A Debian package's installed version, or "not installed".
pub fn package_version(package: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", package])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "not installed".into())
}

fn temp_dir(name: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(&format!("blipless-peers-{name}"))
        .tempdir()
        .map_err(|e| format!("a temporary folder: {e}"))
}

fn free_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], blipless_tests::free_port()))
}

/// The username and password the peers that take credentials are given.
const PEER_USER: &str = "bench";

fn peer_password() -> String {
    let mut bytes = [0u8; 12];
    let _ = std::io::Read::read_exact(
        &mut File::open("/dev/urandom").expect("/dev/urandom"),
        &mut bytes,
    );
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where each origin is: the tiny one (connection rate) and the streaming
/// one (bulk).
#[derive(Debug, Clone, Copy)]
struct Targets {
    tiny: SocketAddr,
    stream: SocketAddr,
}

fn start_microsocks(password: &str) -> Result<(Peer, SocketAddr), String> {
    let binary = program("microsocks").ok_or("microsocks is not installed")?;
    let address = free_address();
    let args: Vec<OsString> = [
        "-i",
        "127.0.0.1",
        "-p",
        &address.port().to_string(),
        "-u",
        PEER_USER,
        "-P",
        password,
    ]
    .map(OsString::from)
    .to_vec();
    let peer = Peer::start(
        "microsocks",
        &binary,
        &args,
        temp_dir("microsocks")?,
        &[address],
    )?;
    Ok((peer, address))
}

fn start_tinyproxy(password: &str, targets: Targets) -> Result<(Peer, SocketAddr), String> {
    let binary = program("tinyproxy").ok_or("tinyproxy is not installed")?;
    let dir = temp_dir("tinyproxy")?;
    let address = free_address();
    let config = dir.path().join("tinyproxy.conf");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         User nobody\n\
         Group nogroup\n\
         Port {port}\n\
         Listen 127.0.0.1\n\
         Timeout 60\n\
         MaxClients 1024\n\
         LogLevel Error\n\
         DisableViaHeader Yes\n\
         BasicAuth {PEER_USER} {password}\n\
         ConnectPort {tiny}\n\
         ConnectPort {stream}\n",
        port = address.port(),
        tiny = targets.tiny.port(),
        stream = targets.stream.port(),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![OsString::from("-d"), OsString::from("-c"), config.into()];
    let peer = Peer::start("tinyproxy", &binary, &args, dir, &[address])?;
    Ok((peer, address))
}

/// haproxy in TCP mode: two frontends, one per origin.
fn start_haproxy(targets: Targets) -> Result<(Peer, Targets), String> {
    let binary = program("haproxy").ok_or("haproxy is not installed")?;
    let dir = temp_dir("haproxy")?;
    let listen = Targets {
        tiny: free_address(),
        stream: free_address(),
    };
    let config = dir.path().join("haproxy.cfg");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         global\n    maxconn 4096\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n\
         listen tiny\n    bind {}\n    server origin {}\n\
         listen stream\n    bind {}\n    server origin {}\n",
        listen.tiny, targets.tiny, listen.stream, targets.stream
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![OsString::from("-db"), OsString::from("-f"), config.into()];
    let peer = Peer::start(
        "haproxy",
        &binary,
        &args,
        dir,
        &[listen.tiny, listen.stream],
    )?;
    Ok((peer, listen))
}

/// nginx with its stream module: two servers, one per origin.
fn start_nginx(targets: Targets) -> Result<(Peer, Targets), String> {
    let binary = program("nginx").ok_or("nginx is not installed")?;
    if !Path::new(NGINX_STREAM_MODULE).is_file() {
        return Err(format!(
            "{NGINX_STREAM_MODULE} is missing (install libnginx-mod-stream)"
        ));
    }
    let dir = temp_dir("nginx")?;
    let listen = Targets {
        tiny: free_address(),
        stream: free_address(),
    };
    let config = dir.path().join("nginx.conf");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         load_module {NGINX_STREAM_MODULE};\n\
         daemon off;\n\
         user nobody nogroup;\n\
         worker_processes auto;\n\
         pid {pid};\n\
         error_log {log} warn;\n\
         events {{ worker_connections 8192; }}\n\
         stream {{\n\
         \x20   server {{ listen {}; proxy_pass {}; }}\n\
         \x20   server {{ listen {}; proxy_pass {}; }}\n\
         }}\n",
        listen.tiny,
        targets.tiny,
        listen.stream,
        targets.stream,
        pid = dir.path().join("nginx.pid").display(),
        log = dir.path().join("error.log").display(),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![
        OsString::from("-p"),
        dir.path().as_os_str().to_owned(),
        OsString::from("-e"),
        dir.path().join("error.log").into_os_string(),
        OsString::from("-c"),
        config.into_os_string(),
    ];
    let peer = Peer::start("nginx", &binary, &args, dir, &[listen.tiny, listen.stream])?;
    Ok((peer, listen))
}

/// One way to reach the origins.
#[derive(Debug, Clone)]
pub struct PathInfo {
    /// The server ("direct", "blipless", "dante", ...).
    pub server: &'static str,
    /// What the client speaks to it, with credentials.
    pub protocol: &'static str,
    /// Whether the client sends credentials.
    pub credentials: bool,
}

/// One connection-rate run.
#[derive(Debug, Clone)]
pub struct RateRun {
    /// Connections per second.
    pub rate: f64,
    /// Connections completed.
    pub completed: u64,
    /// Connections failed.
    pub errors: u64,
    /// Round trip percentiles.
    pub round_trip: Percentiles,
    /// Proxy CPU per completed connection, µs (None for direct).
    pub cpu_us: Option<f64>,
    /// The bench's own CPU per completed connection, µs: the load client
    /// and the origins, which run in this process.
    pub client_us: Option<f64>,
}

/// One download.
#[derive(Debug, Clone)]
pub struct BulkRun {
    /// MB/s (10^6 bytes per second).
    pub mb_s: f64,
    /// Body bytes received.
    pub bytes: u64,
    /// Whether the whole body arrived within the bound.
    pub complete: bool,
    /// Proxy CPU per GiB received, s (None for direct).
    pub cpu_s_per_gib: Option<f64>,
}

/// Everything one path measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Which path.
    pub info: PathInfo,
    /// Each connection-rate run, in order.
    pub rate: Vec<RateRun>,
    /// Each download, in order.
    pub bulk: Vec<BulkRun>,
    /// Whether a connection with a wrong password was refused (None: no credentials).
    pub refuses_wrong_credentials: Option<bool>,
    /// The first failure seen.
    pub first_error: Option<String>,
}

impl Measured {
    /// The rate run with the median rate.
    pub fn median_rate(&self) -> Option<&RateRun> {
        let mut runs: Vec<&RateRun> = self.rate.iter().collect();
        runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        upper_median(&runs)
    }

    /// The download with the median MB/s.
    pub fn median_bulk(&self) -> Option<&BulkRun> {
        let mut runs: Vec<&BulkRun> = self.bulk.iter().collect();
        runs.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
        upper_median(&runs)
    }
}

/// A peer that could not be measured, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The peer.
    pub server: &'static str,
    /// Why.
    pub reason: String,
}

/// Everything the bench found.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Per path, in table order.
    pub paths: Vec<Measured>,
    /// Peers left out.
    pub skipped: Vec<Skipped>,
    /// Installed versions (package, version).
    pub versions: Vec<(String, String)>,
    /// How the peers were stopped.
    pub stopped: Vec<String>,
    /// dante's user's password hash scheme (its `username` method checks it per connection).
    pub dante_hash: Option<String>,
}

/// A path as the measuring loop drives it.
struct Driven {
    info: PathInfo,
    mode: Mode,
    proxies: Proxies,
    targets: Targets,
    cpu: CpuOf,
}

/// The password hash scheme of a system user, from /etc/shadow (`$y$`: yescrypt).
fn hash_scheme(user: &str) -> Option<String> {
    let shadow = std::fs::read_to_string("/etc/shadow").ok()?;
    let hash = shadow
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{user}:")))?
        .split(':')
        .next()?;
    let id = hash.strip_prefix('$')?.split('$').next()?;
    Some(
        match id {
            "y" => "yescrypt ($y$)",
            "6" => "SHA-512 crypt ($6$)",
            "5" => "SHA-256 crypt ($5$)",
            "1" => "MD5 crypt ($1$)",
            "2b" | "2y" => "bcrypt",
            other => return Some(format!("${other}$")),
        }
        .to_string(),
    )
}

/// Runs the whole comparison.
/// `only`: the servers to measure (`direct` among them for the ratios);
/// empty: all of them.
pub fn measure(plan: Plan, only: &[String]) -> Results {
    let mut results = Results {
        versions: PACKAGES
            .iter()
            .map(|(package, _)| (package.to_string(), package_version(package)))
            .collect(),
        ..Results::default()
    };
    let runtime = crate::runtime(2).expect("a runtime");
    let origin = Origin::start();
    let stream = runtime
        .block_on(StreamOrigin::start())
        .expect("the streaming origin");
    let targets = Targets {
        tiny: origin.address,
        stream: stream.address,
    };
    let mut node = Node::new("");
    let (ingress, device, client): (Daemon, Daemon, _) = node.start();
    let blipless = Proxies::of(&node, &client);
    let blipless_cpu = CpuOf::Processes(vec![ingress.pid().as_raw(), device.pid().as_raw()]);
    let password = peer_password();

    let mut paths = vec![
        Driven {
            info: PathInfo {
                server: "direct",
                protocol: "TCP straight to the origin (the baseline)",
                credentials: false,
            },
            mode: Mode::Direct,
            proxies: blipless.clone(),
            targets,
            cpu: CpuOf::Nothing,
        },
        Driven {
            info: PathInfo {
                server: "blipless",
                protocol: "SOCKS5 + RFC 1929",
                credentials: true,
            },
            mode: Mode::Socks5,
            proxies: blipless.clone(),
            targets,
            cpu: blipless_cpu.clone(),
        },
        Driven {
            info: PathInfo {
                server: "blipless",
                protocol: "HTTP CONNECT + Basic",
                credentials: true,
            },
            mode: Mode::HttpConnect,
            proxies: blipless.clone(),
            targets,
            cpu: blipless_cpu,
        },
    ];
    let peer_proxies = |address: SocketAddr, user: &str, secret: &str| Proxies {
        socks: address,
        http: address,
        https: None,
        user: user.to_string(),
        secret: secret.to_string(),
    };
    let mut peers: Vec<Peer> = Vec::new();

    // dante, through the tests' harness (a system user of its own: root).
    let mut dante = None;
    if !nix::unistd::geteuid().is_root() {
        results.skipped.push(Skipped {
            server: "dante",
            reason: "needs root (its RFC 1929 check uses a system user the harness creates); run as root".into(),
        });
    } else if program("danted").is_none() && program("sockd").is_none() {
        results.skipped.push(Skipped {
            server: "dante",
            reason: "dante-server is not installed".into(),
        });
    } else {
        match std::panic::catch_unwind(|| Dante::start(Ipv4Addr::LOCALHOST)) {
            Ok(started) => {
                results.dante_hash = hash_scheme(&started.username);
                paths.push(Driven {
                    info: PathInfo {
                        server: "dante",
                        protocol: "SOCKS5 + RFC 1929",
                        credentials: true,
                    },
                    mode: Mode::Socks5,
                    proxies: peer_proxies(started.address, &started.username, &started.password),
                    targets,
                    cpu: CpuOf::Group(started.pid() as i32),
                });
                dante = Some(started);
            }
            Err(_) => results.skipped.push(Skipped {
                server: "dante",
                reason: "did not start (see the bench's stderr)".into(),
            }),
        }
    }
    match start_microsocks(&password) {
        Ok((peer, address)) => {
            paths.push(Driven {
                info: PathInfo {
                    server: "microsocks",
                    protocol: "SOCKS5 + RFC 1929",
                    credentials: true,
                },
                mode: Mode::Socks5,
                proxies: peer_proxies(address, PEER_USER, &password),
                targets,
                cpu: CpuOf::Group(peer.group()),
            });
            peers.push(peer);
        }
        Err(reason) => results.skipped.push(Skipped {
            server: "microsocks",
            reason,
        }),
    }
    match start_tinyproxy(&password, targets) {
        Ok((peer, address)) => {
            paths.push(Driven {
                info: PathInfo {
                    server: "tinyproxy",
                    protocol: "HTTP CONNECT + Basic",
                    credentials: true,
                },
                mode: Mode::HttpConnect,
                proxies: peer_proxies(address, PEER_USER, &password),
                targets,
                cpu: CpuOf::Group(peer.group()),
            });
            peers.push(peer);
        }
        Err(reason) => results.skipped.push(Skipped {
            server: "tinyproxy",
            reason,
        }),
    }
    for (server, started) in [
        ("haproxy", start_haproxy(targets)),
        ("nginx", start_nginx(targets)),
    ] {
        match started {
            Ok((peer, listen)) => {
                paths.push(Driven {
                    info: PathInfo {
                        server,
                        protocol: "plain TCP forward (no handshake, no credentials)",
                        credentials: false,
                    },
                    mode: Mode::Direct,
                    proxies: blipless.clone(),
                    targets: listen,
                    cpu: CpuOf::Group(peer.group()),
                });
                peers.push(peer);
            }
            Err(reason) => results.skipped.push(Skipped { server, reason }),
        }
    }
    for skipped in &results.skipped {
        eprintln!("peers: leaving out {}: {}", skipped.server, skipped.reason);
    }
    if !only.is_empty() {
        paths.retain(|path| only.iter().any(|server| server == path.info.server));
    }

    let mut measured: Vec<Measured> = paths
        .iter()
        .map(|path| Measured {
            info: path.info.clone(),
            rate: Vec::new(),
            bulk: Vec::new(),
            refuses_wrong_credentials: None,
            first_error: None,
        })
        .collect();
    let no_pids = Pids {
        ingress: 0,
        device: 0,
    };

    // Credentials are checked, and every path warmed up once.
    for (path, entry) in paths.iter().zip(&mut measured) {
        if path.info.credentials {
            let mut wrong = path.proxies.clone();
            wrong.secret = format!("{}x", wrong.secret);
            let attempt = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), async {
                    let mut opened = client::open(&wrong, path.mode, path.targets.tiny).await?;
                    client::tiny_exchange(&mut opened, &wrong, path.mode, path.targets.tiny).await
                })
                .await
            });
            entry.refuses_wrong_credentials = Some(!matches!(attempt, Ok(Ok(_))));
        }
        let warm = Bounds {
            workers: plan.workers,
            connections: 512,
            time: Duration::from_secs(1),
        };
        let phase = runtime.block_on(rate::phase(
            &path.proxies,
            path.mode,
            path.targets.tiny,
            warm,
        ));
        if let Some(error) = phase.first_error {
            entry.first_error.get_or_insert(format!("warm-up: {error}"));
        }
        let download = runtime.block_on(bulk::download(
            &path.proxies,
            no_pids,
            path.mode,
            path.targets.stream,
            64 << 20,
            plan.bulk_bound,
        ));
        if let Err(error) = download {
            entry
                .first_error
                .get_or_insert(format!("warm-up download: {error}"));
        }
        eprintln!(
            "peers: {} {}: warmed up{}",
            path.info.server,
            path.info.protocol,
            match entry.refuses_wrong_credentials {
                Some(true) => ", a wrong password is refused",
                Some(false) => ", A WRONG PASSWORD IS ACCEPTED",
                None => "",
            }
        );
    }

    let count = paths.len();
    for run in 0..plan.runs {
        // Each run starts one path further on.
        let order: Vec<usize> = (0..count).map(|i| (i + run) % count).collect();
        for &index in &order {
            let (path, entry) = (&paths[index], &mut measured[index]);
            let bounds = Bounds {
                workers: plan.workers,
                connections: u64::MAX / 2,
                time: plan.rate_time,
            };
            let before = path.cpu.seconds();
            let client_before = crate::procfs::cpu_seconds("self");
            let phase = runtime.block_on(rate::phase(
                &path.proxies,
                path.mode,
                path.targets.tiny,
                bounds,
            ));
            let after = path.cpu.seconds();
            let per_connection = |(b, a): (f64, f64)| (a - b) * 1e6 / phase.completed.max(1) as f64;
            let cpu_us = before.zip(after).map(per_connection);
            let client_us = client_before
                .zip(crate::procfs::cpu_seconds("self"))
                .map(per_connection);
            eprintln!(
                "peers: run {} {:<10} {:<22} {:>6.0} conn/s, p50 {}, p99 {}, proxy CPU {} µs/conn, {} errors",
                run + 1,
                path.info.server,
                short_protocol(&path.info),
                phase.rate(),
                micros(phase.round_trip.p50),
                micros(phase.round_trip.p99),
                cpu_us.map_or("—".into(), |us| format!("{us:.0}")),
                phase.errors
            );
            if let Some(error) = &phase.first_error {
                entry.first_error.get_or_insert(error.clone());
            }
            entry.rate.push(RateRun {
                rate: phase.rate(),
                completed: phase.completed,
                errors: phase.errors,
                round_trip: phase.round_trip,
                cpu_us,
                client_us,
            });
        }
        for &index in &order {
            let (path, entry) = (&paths[index], &mut measured[index]);
            let before = path.cpu.seconds();
            let download = runtime.block_on(bulk::download(
                &path.proxies,
                no_pids,
                path.mode,
                path.targets.stream,
                plan.bulk_bytes,
                plan.bulk_bound,
            ));
            let after = path.cpu.seconds();
            match download {
                Ok(done) => {
                    let gib = done.bytes as f64 / f64::from(1u32 << 30);
                    let cpu_s_per_gib = before.zip(after).map(|(b, a)| (a - b) / gib.max(1e-9));
                    eprintln!(
                        "peers: run {} {:<10} {:<22} {:>6.0} MB/s ({} MiB in {:.2?}{}), proxy CPU {} s/GiB",
                        run + 1,
                        path.info.server,
                        short_protocol(&path.info),
                        done.megabytes_per_second(),
                        done.bytes >> 20,
                        done.elapsed,
                        if done.complete { "" } else { ", time bound hit" },
                        cpu_s_per_gib.map_or("—".into(), |s| format!("{s:.2}")),
                    );
                    entry.bulk.push(BulkRun {
                        mb_s: done.megabytes_per_second(),
                        bytes: done.bytes,
                        complete: done.complete,
                        cpu_s_per_gib,
                    });
                }
                Err(error) => {
                    eprintln!(
                        "peers: run {} {} {}: download failed: {error}",
                        run + 1,
                        path.info.server,
                        short_protocol(&path.info)
                    );
                    entry
                        .first_error
                        .get_or_insert(format!("download: {error}"));
                }
            }
        }
    }

    for mut peer in peers {
        results.stopped.push(peer.stop());
    }
    if let Some(mut dante) = dante {
        let group = dante.pid() as i32;
        dante.kill();
        results.stopped.push(format!(
            "dante: SIGKILL to process group {group} (the harness's kill), its system user removed"
        ));
        drop(dante);
    }
    drop((ingress, device));
    drop(stream);
    drop(runtime);
    results.paths = measured;
    results
}

fn short_protocol(info: &PathInfo) -> &'static str {
    if info.server == "direct" {
        "(baseline)"
    } else if info.credentials {
        info.protocol
    } else {
        "TCP forward"
    }
}

// ---- the report ----

fn ratio(value: f64, direct: Option<f64>) -> Option<f64> {
    direct.filter(|d| *d > 0.0).map(|d| value / d)
}

/// A ratio: two decimals, three below 0.1, none from 10 up; a dash when missing.
fn times(value: Option<f64>) -> String {
    match value {
        None => "—".into(),
        Some(r) if r >= 10.0 => format!("{r:.0}"),
        Some(r) if r < 0.1 => format!("{r:.3}"),
        Some(r) => format!("{r:.2}"),
    }
}

fn runs_of(values: impl Iterator<Item = f64>) -> String {
    values
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The section, markers included.
pub fn render(machine: &Machine, plan: Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", MARKERS.begin);
    out.push_str(
        "## Side by side: blipless beside dante, microsocks, tinyproxy, haproxy and nginx\n\n",
    );
    out.push_str(
        "The same load from the same client (`bench/src/client.rs`) through blipless and through \
         Debian's proxies, in one run, on 127.0.0.1 to the bench's own origins, interleaved run by run \
         (the path order rotates each run). Credentials on both sides where the peer takes them: \
         SOCKS5 with RFC 1929 username/password, HTTP CONNECT with `Proxy-Authorization: Basic`. \
         haproxy and nginx (its stream module) are plain TCP forwarders, no PROXY protocol: the client \
         connects to them as to the origin (its direct mode, at the forwarder's address), so they do \
         no handshake and check no credentials, less work than a proxy does.\n\n",
    );
    machine.header(&mut out);
    for (package, version) in &results.versions {
        let _ = writeln!(out, "| {package} (`dpkg-query -W`) | {version} |");
    }
    let _ = writeln!(
        out,
        "| runs | {} per path, the median run counts; connection rate: {} workers for {} each run; \
         bulk: one connection downloading {} MiB, bounded at {} s |",
        plan.runs,
        plan.workers,
        crate::format::seconds(plan.rate_time),
        plan.bulk_bytes >> 20,
        plan.bulk_bound.as_secs()
    );
    let _ = writeln!(
        out,
        "| blipless | release build (`BLIPLESS_PROFILE={}`), default configuration, embedded store, logging at `{}` |",
        machine.profile,
        std::env::var("BLIPLESS_TEST_LOG").unwrap_or_else(|_| "info".into())
    );
    if machine.compilers {
        out.push_str(
            "| warning | cargo or rustc ran on the machine during the run: figures disturbed |\n",
        );
    }
    out.push('\n');
    out.push_str(
        "*conn/s*: new connections completed per second by the workers, each a TCP connect, the \
         proxy's handshake with credentials and one tiny `GET /` (answer `hello`, `Connection: close`). \
         *Round trip*: from the start of the TCP connect until the answer's last byte, p50/p99 over \
         every connection of the median run. *Proxy CPU*: utime + stime from /proc during the phase \
         (blipless: ingress + device plane; a peer: every process of its process group, reaped \
         children included), per completed connection, or per GiB received; 10 ms clock ticks. \
         haproxy's and nginx's CPU shows what relaying two loopback TCP connections costs a process in \
         the middle with no proxy protocol at all (the kernel's share, in stime, included). *Client + \
         origin CPU*: the bench process's own utime + stime over the phase (the load client and the \
         origins run in it), per completed connection. \
         *MB/s* is 10^6 bytes per second, one connection, from sending the request until the last byte. \
         All of it on the same CPUs as the client and the origins, so the absolute figures are a \
         loopback's, and a proxy's ratio also pays for the CPU it takes from the client and the origin.\n\n",
    );
    let direct = results.paths.iter().find(|m| m.info.server == "direct");
    let direct_rate = direct.and_then(Measured::median_rate).map(|r| r.rate);
    let direct_p50 = direct
        .and_then(Measured::median_rate)
        .and_then(|r| r.round_trip.p50)
        .map(|d| d.as_secs_f64());
    let direct_bulk = direct.and_then(Measured::median_bulk).map(|b| b.mb_s);
    out.push_str(
        "| server | protocol | conn/s (runs) | conn/s vs direct | round trip p50 (vs direct) | p99 | proxy CPU per connection | client + origin CPU per connection | MB/s (runs) | MB/s vs direct | proxy CPU per GiB | wrong password refused |\n\
         |---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|\n",
    );
    for measured in &results.paths {
        let rate = measured.median_rate();
        let bulk = measured.median_bulk();
        let p50 = rate.and_then(|r| r.round_trip.p50);
        let p50_ratio = p50
            .map(|d| d.as_secs_f64())
            .and_then(|v| ratio(v, direct_p50));
        let incomplete = measured.bulk.iter().filter(|b| !b.complete).count();
        let errors: u64 = measured.rate.iter().map(|r| r.errors).sum();
        let _ = writeln!(
            out,
            "| {} | {} | {}{} | {} | {} ({}×) | {} | {} | {} | {}{} | {} | {} | {} |",
            measured.info.server,
            measured.info.protocol,
            runs_of(measured.rate.iter().map(|r| r.rate)),
            if errors > 0 {
                format!(" ({errors} failed)")
            } else {
                String::new()
            },
            times(rate.and_then(|r| ratio(r.rate, direct_rate))),
            micros(p50),
            times(p50_ratio),
            micros(rate.and_then(|r| r.round_trip.p99)),
            rate.and_then(|r| r.cpu_us)
                .map_or("—".into(), |us| format!("{us:.0} µs")),
            rate.and_then(|r| r.client_us)
                .map_or("—".into(), |us| format!("{us:.0} µs")),
            runs_of(measured.bulk.iter().map(|b| b.mb_s)),
            if incomplete > 0 {
                format!(
                    " ({incomplete} hit the {} s bound)",
                    plan.bulk_bound.as_secs()
                )
            } else {
                String::new()
            },
            times(bulk.and_then(|b| ratio(b.mb_s, direct_bulk))),
            bulk.and_then(|b| b.cpu_s_per_gib)
                .map_or("—".into(), |s| format!("{s:.2} s")),
            match measured.refuses_wrong_credentials {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "n/a",
            },
        );
    }
    for measured in results.paths.iter().filter(|m| m.first_error.is_some()) {
        let _ = writeln!(
            out,
            "\nFirst {} ({}) error: `{}`",
            measured.info.server,
            measured.info.protocol,
            measured.first_error.as_deref().unwrap_or("")
        );
    }
    if !results.skipped.is_empty() {
        out.push_str("\nLeft out:\n\n");
        for skipped in &results.skipped {
            let _ = writeln!(out, "- {}: {}", skipped.server, skipped.reason);
        }
    }
    out.push_str("\nHow each peer ran (foreground, config in a temporary folder, a free port, a process group of its own, killed at the end):\n\n");
    out.push_str(
        "- dante: `danted -f sockd.conf -N 1` through the tests' harness (`tests/src/dante.rs`): `socksmethod: username`, \
         which checks the password against the system's accounts (a system user the harness creates and removes)",
    );
    match &results.dante_hash {
        Some(scheme) => {
            let _ = writeln!(
                out,
                "; its password hash is {scheme}, computed for every connection."
            );
        }
        None => out.push_str(".\n"),
    }
    out.push_str(
        "- microsocks: `microsocks -i 127.0.0.1 -p PORT -u USER -P PASS` (a thread per connection).\n\
         - tinyproxy: `tinyproxy -d -c FILE` with `BasicAuth USER PASS`, `ConnectPort` of the two origins, `MaxClients 1024`, `LogLevel Error`.\n\
         - haproxy: `haproxy -db -f FILE`, `mode tcp`, one `listen` per origin, default threads.\n\
         - nginx: `nginx -c FILE` with `daemon off`, `load_module` of Debian's `ngx_stream_module.so`, `worker_processes auto`, one stream `server` per origin.\n",
    );

    out.push_str("\n### Targets (issue 13 items 1 and 3), as measured here\n\n");
    out.push_str("| target | path | measured (median run) | met |\n|---|---|---|---|\n");
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let rate = measured.median_rate();
        let share = rate.and_then(|r| ratio(r.rate, direct_rate));
        let cpu = rate.and_then(|r| r.cpu_us);
        let met = share
            .zip(cpu)
            .map(|(s, c)| verdict(s >= RATE_TARGET && c <= CPU_PER_CONNECTION_TARGET_US))
            .unwrap_or("—");
        let _ = writeln!(
            out,
            "| item 1: ≥ {RATE_TARGET} of the direct connection rate, ≤ {CPU_PER_CONNECTION_TARGET_US:.0} µs of proxy CPU per connection | blipless {} | {} of direct, {} per connection | {met} |",
            measured.info.protocol,
            times(share),
            cpu.map_or("—".into(), |us| format!("{us:.0} µs")),
        );
    }
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let bulk = measured.median_bulk();
        let share = bulk.and_then(|b| ratio(b.mb_s, direct_bulk));
        let cpu = bulk.and_then(|b| b.cpu_s_per_gib);
        let met = share
            .zip(cpu)
            .map(|(s, c)| verdict(s >= BULK_TARGET && c <= CPU_PER_GIB_TARGET_S))
            .unwrap_or("—");
        let _ = writeln!(
            out,
            "| item 3: one tunnel ≥ {BULK_TARGET} of direct at ≤ {CPU_PER_GIB_TARGET_S} s of CPU per GiB | blipless {} | {} of direct, {} per GiB | {met} |",
            measured.info.protocol,
            times(share),
            cpu.map_or("—".into(), |s| format!("{s:.2} s")),
        );
    }
    out.push_str(
        "\nThe same yardsticks beside the peers are in the table above; the targets are blipless's own. \
         On this machine the client and the origins share the CPUs with the proxy, so a proxy's share of \
         the direct rate is bounded by the CPU it leaves them.\n",
    );
    let direct_client = direct
        .and_then(Measured::median_rate)
        .and_then(|r| r.client_us);
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let client = measured.median_rate().and_then(|r| r.client_us);
        if let (Some(through), Some(alone)) = (client, direct_client) {
            let _ = writeln!(
                out,
                "\nThrough blipless {}, the client and the origin spent {through:.0} µs of CPU per connection, \
                 against {alone:.0} µs direct (the handshake's extra writes, reads and wake-ups are the client's): \
                 on these shared cores, a proxy that cost no CPU at all would leave them at most {} of the direct rate.",
                measured.info.protocol,
                times(ratio(alone, Some(through))),
            );
        }
    }
    let _ = writeln!(out, "{}", MARKERS.end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(times(None), "—");
        assert_eq!(times(Some(0.003)), "0.003");
        assert_eq!(times(Some(0.67)), "0.67");
        assert_eq!(times(Some(347.8)), "348");
    }

    #[test]
    fn reads_the_group_and_all_four_times() {
        let line = "1234 (nginx: worker (x)) S 1 77 4 5 6 7 8 9 10 11 250 75 3 2 20 0 4 0 100\n";
        assert_eq!(parse_group_stat(line), Some((77, 330)));
        assert_eq!(parse_group_stat("1234 (x) S 1 2"), None);
        assert!(!is_zombie(line));
        assert!(is_zombie("99 (nginx) Z 1 2 77"));
        let own = nix::unistd::getpgrp().as_raw();
        assert!(group_members(own) >= 1);
    }
}
