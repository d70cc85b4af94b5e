//! The scale of one node (`blipless-bench-scale`): a store filled with
//! 10,000 and then 100,000 clients, each also a WireGuard peer, on the
//! embedded SQLite store and on one Redis; at each size (and at a handful,
//! the baseline that the per-client memory figures exclude) a fresh ingress
//! and device plane start on it, and the bench measures:
//!
//! - the way to Ready: the device plane's spawn to its "store opened" and
//!   "ready" log lines, to the first `/status` 200 (polled every 2 ms), and
//!   from its Ready to the ingress's "WireGuard peer set applied";
//! - the resident memory (VmRSS) of both daemons once idle with everything
//!   loaded; per client (per peer) = (RSS at N − RSS at the baseline) /
//!   (N − baseline clients);
//! - `blipless-ctl client add` at that size: the command's own time (it
//!   returns once the node applied the change), then until the new client
//!   logs in over SOCKS5 and a request with its credentials (curl through
//!   the SOCKS5 listener to a local origin) succeeds; `client add --wg`, then
//!   until the ingress counts the new peer (`blipless_wg_peers`);
//! - an ingress handoff at that size: a second ingress spawned beside the
//!   first, until the old one exits; the successor's log of the handoff
//!   snapshot (the peer set it took over) and its own start.
//!
//! Its section of docs/BENCHMARKS.md lies between `<!-- scale:begin -->` and
//! `<!-- scale:end -->`; [`render`] writes it.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use blipless_store::{credentials, ClientLimits, ClientRecord, EgressPolicy, Store};
use blipless_tests::node::{ClientUrls, Daemon, Node};
use blipless_tests::origin::Origin;
use blipless_tests::redis::Redis;

use crate::format::{count, short_seconds, verdict};
use crate::logs::{self, field, timed_lines, unix_now};
use crate::procfs::rss_kib;
use crate::report::{Machine, Markers};
use crate::stats::{max_f64, median_f64};

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- scale:begin -->",
    end: "<!-- scale:end -->",
};

/// `wireguard.pool` of the bench's nodes: room for 262,142 clients.
pub const POOL: &str = "10.64.0.0/14";

/// The filled clients' tunnel addresses start here (10.65.0.0), above the
/// ones `client add --wg` hands out (the lowest free, from 10.64.0.2).
const FIRST_FILLED: u32 = 0x0a41_0000;

/// Concurrent adds while filling the store.
const FILL_WORKERS: usize = 16;

/// How long anything the bench waits for may take before it gives up.
const BOUND: Duration = Duration::from_secs(180);

/// The one WARN line every plane logs here: no TUN device (not needed).
const EXPECTED_WARNING: &str = "WireGuard egress unavailable";

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Clients in the baseline store.
    pub baseline: usize,
    /// The sizes measured, smallest first.
    pub sizes: [usize; 2],
    /// Starts (a fresh ingress and device plane each) per size.
    pub runs: usize,
    /// How long the daemons idle before their memory is read.
    pub settle: Duration,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            baseline: 10,
            sizes: [10_000, 100_000],
            runs: 3,
            settle: Duration::from_secs(2),
        }
    }

    /// Checks the bench itself.
    pub fn quick() -> Self {
        Self {
            baseline: 10,
            sizes: [1_000, 10_000],
            runs: 1,
            settle: Duration::from_secs(1),
        }
    }
}

/// The stores measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The embedded store: a SQLite file.
    Sqlite,
    /// One `redis-server` of the bench's own.
    Redis,
}

impl Kind {
    /// Both, in the order measured.
    pub const ALL: [Kind; 2] = [Kind::Sqlite, Kind::Redis];

    /// As the section names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "SQLite (embedded)",
            Kind::Redis => "Redis (one server)",
        }
    }
}

/// Filling the store from one size to the next.
#[derive(Debug, Clone)]
pub struct Fill {
    /// Clients added.
    pub added: usize,
    /// How long the adds took, seconds.
    pub seconds: f64,
}

/// One start of an ingress and a device plane on the store. Times in
/// seconds from the device plane's spawn (NaN: not seen).
#[derive(Debug, Clone)]
pub struct Start {
    /// The plane's "store opened" log line (store open, clients loaded).
    pub store_opened: f64,
    /// The plane's "ready" log line.
    pub ready: f64,
    /// The first `/status` 200.
    pub status: f64,
    /// From the plane's "ready" to the ingress's "WireGuard peer set applied".
    pub peers_after_ready: f64,
    /// Clients the plane said it loaded.
    pub loaded: Option<usize>,
    /// Peers the ingress said it applied.
    pub peers: Option<usize>,
    /// The ingress's VmRSS before the plane attached, KiB.
    pub ingress_alone_kib: u64,
    /// The ingress's VmRSS idle with the peers, KiB.
    pub ingress_kib: u64,
    /// The plane's VmRSS idle with the clients, KiB.
    pub device_kib: u64,
}

/// `client add` on a node with that many clients. Seconds.
#[derive(Debug, Clone)]
pub struct Added {
    /// `blipless-ctl client add` (stored and applied on the node).
    pub ctl: f64,
    /// From its return until the client logged in over SOCKS5.
    pub login: f64,
    /// From its return until a curl through SOCKS5 with its credentials succeeded.
    pub request: f64,
    /// `blipless-ctl client add --wg`.
    pub ctl_wg: f64,
    /// From its return until the ingress counted the peer.
    pub peer: f64,
}

/// An ingress handoff on a node with that many peers. Seconds from the
/// successor's spawn (NaN: not seen).
#[derive(Debug, Clone)]
pub struct Handoff {
    /// Until the old ingress exited (polled every 10 ms).
    pub old_exit: f64,
    /// From the old ingress's "a successor ingress asks to take over" to the
    /// successor's "taking over" (the offer, the peer set and the endpoint
    /// snapshot sent and received).
    pub snapshot: f64,
    /// The successor's "ingress serving" line (its listeners taken over,
    /// the peers seeded).
    pub serving: f64,
    /// The successor's "WireGuard peer set applied" (the device plane
    /// rejoined it and sent its full set).
    pub peers_applied: f64,
    /// Peers the successor said it took over.
    pub peers: Option<usize>,
    /// The successor's VmRSS once idle, KiB.
    pub successor_kib: u64,
}

/// Everything measured at one size.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Clients in the store when the daemons started, every one a peer
    /// (`client add` adds two, removed again after the stage).
    pub clients: usize,
    /// WireGuard peers among them.
    pub peers: usize,
    /// The store's size: the SQLite file with its WAL, or Redis's `used_memory`.
    pub store_bytes: Option<u64>,
    /// Each start.
    pub starts: Vec<Start>,
    /// `client add` on the last start's node.
    pub added: Added,
    /// The handoff of the last start's ingress.
    pub handoff: Handoff,
    /// WARN and ERROR lines in the daemons' logs, besides the expected one
    /// about the missing TUN device.
    pub warnings: Vec<String>,
}

impl Stage {
    /// The median of one start figure.
    pub fn median(&self, figure: impl Fn(&Start) -> f64) -> f64 {
        median_f64(self.starts.iter().map(figure))
    }

    /// The largest of one start figure.
    pub fn max(&self, figure: impl Fn(&Start) -> f64) -> f64 {
        max_f64(self.starts.iter().map(figure))
    }

    /// The median of one memory figure, KiB.
    pub fn median_kib(&self, figure: impl Fn(&Start) -> u64) -> f64 {
        self.median(|start| figure(start) as f64)
    }
}

/// One store's run.
#[derive(Debug, Clone)]
pub struct StoreRun {
    /// Which store.
    pub kind: Kind,
    /// Filling it: to the baseline, then to each size.
    pub fills: Vec<Fill>,
    /// The baseline, then each size.
    pub stages: Vec<Stage>,
}

impl StoreRun {
    /// Bytes per unit between the baseline and `stage`: (median RSS at the
    /// stage − median at the baseline) / (units there − units at the baseline).
    pub fn per_unit(
        &self,
        stage: &Stage,
        figure: impl Fn(&Start) -> u64,
        units: impl Fn(&Stage) -> usize,
    ) -> Option<f64> {
        let base = self.stages.first()?;
        let extra = units(stage).checked_sub(units(base)).filter(|n| *n > 0)?;
        let grown = stage.median_kib(&figure) - base.median_kib(&figure);
        Some(grown * 1024.0 / extra as f64)
    }
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct Results {
    /// One per store.
    pub stores: Vec<StoreRun>,
}

/// A filled client: `scaleNNNNNN`, secret hash of its name (nobody logs in as
/// it), a public key of 32 pseudo-random bytes (any 32 bytes are a
/// Curve25519 public key) and the `index`th address from 10.65.0.0.
pub fn record(index: usize, created_at: i64) -> ClientRecord {
    let name = format!("scale{index:06}");
    let offset = u32::try_from(index).expect("an index that fits the pool");
    ClientRecord {
        secret_hash: credentials::hash_secret(&name),
        name,
        created_at,
        wg_public_key: Some(public_key(index as u64)),
        wg_address: Some(IpAddr::V4(Ipv4Addr::from(FIRST_FILLED + offset))),
        egress: EgressPolicy::Any,
        limits: ClientLimits::default(),
    }
}

/// 32 bytes of SplitMix64 seeded with `seed`, standard base64 (as `wg`
/// writes keys). Distinct seeds give distinct keys (the first eight bytes
/// are a bijection of the seed).
pub fn public_key(seed: u64) -> String {
    let mut state = seed;
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Adds clients `from..to` ([`record`]) through [`Store::add_client`],
/// [`FILL_WORKERS`] at once; how long it took.
pub async fn fill(store: Arc<dyn Store>, from: usize, to: usize) -> Duration {
    let created_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let next = Arc::new(AtomicUsize::new(from));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..FILL_WORKERS {
        let (store, next) = (store.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= to {
                    return;
                }
                if let Err(error) = store.add_client(record(index, created_at)).await {
                    panic!("adding client {index}: {error}");
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.expect("a fill worker");
    }
    started.elapsed()
}

/// One store while measured: where it is, a handle of the bench's own, and
/// what it holds.
struct Bed {
    kind: Kind,
    url: String,
    store: Arc<dyn Store>,
    /// The SQLite file's folder, or the Redis server.
    _dir: Option<tempfile::TempDir>,
    redis: Option<Redis>,
    sqlite_path: Option<std::path::PathBuf>,
    /// Clients filled so far (indices 0..filled), every one a peer.
    filled: usize,
}

impl Bed {
    fn open(kind: Kind, runtime: &tokio::runtime::Runtime) -> Self {
        let (url, dir, redis, sqlite_path) = match kind {
            Kind::Sqlite => {
                let dir = tempfile::Builder::new()
                    .prefix("blipscale")
                    .tempdir()
                    .expect("a temporary folder");
                let path = dir.path().join("state.db");
                (
                    format!("sqlite://{}", path.display()),
                    Some(dir),
                    None,
                    Some(path),
                )
            }
            Kind::Redis => {
                let redis = Redis::start(false);
                (redis.url(), None, Some(redis), None)
            }
        };
        let store = runtime
            .block_on(blipless_store::open(&url))
            .unwrap_or_else(|error| panic!("opening the store {url}: {error}"));
        Self {
            kind,
            url,
            store,
            _dir: dir,
            redis,
            sqlite_path,
            filled: 0,
        }
    }

    /// Removes the clients `client add` made, through the bench's handle.
    fn remove(&self, runtime: &tokio::runtime::Runtime, names: &[String]) {
        for name in names {
            let removed = runtime
                .block_on(self.store.remove_client(name))
                .unwrap_or_else(|error| panic!("removing client {name}: {error}"));
            assert!(removed, "client {name} was not in the store");
        }
    }

    /// Fills the store up to `size` filled clients.
    fn fill_to(&mut self, runtime: &tokio::runtime::Runtime, size: usize) -> Fill {
        let from = self.filled;
        let took = runtime.block_on(fill(self.store.clone(), from, size.max(from)));
        self.filled = size.max(from);
        eprintln!(
            "scale bench: {}: {} clients added in {:.1} s",
            self.kind.name(),
            self.filled - from,
            took.as_secs_f64()
        );
        Fill {
            added: self.filled - from,
            seconds: took.as_secs_f64(),
        }
    }

    /// The store's size now.
    fn bytes(&self) -> Option<u64> {
        if let Some(path) = &self.sqlite_path {
            let size = |suffix: &str| {
                let mut name = path.as_os_str().to_owned();
                name.push(suffix);
                std::fs::metadata(name).map_or(0, |m| m.len())
            };
            return Some(size("") + size("-wal"));
        }
        let output = self.redis.as_ref()?.cli(&["info", "memory"]);
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("used_memory:"))
            .and_then(|value| value.trim().parse().ok())
    }

    /// A node on this store, not started.
    fn node(&self) -> Node {
        Node::new(&format!(
            "[store]\nurl = \"{}\"\n\n[wireguard]\npool = \"{POOL}\"\nendpoint = \"127.0.0.1:51820\"\n",
            self.url
        ))
    }
}

/// GET `path` from `address` over HTTP/1.0: (status code, body), or None
/// when nothing answered.
fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((code, body.to_owned()))
}

/// `/status`'s code (0 when nothing answered).
fn status_code(node: &Node) -> u16 {
    http_get(node.status, "/status").map_or(0, |(code, _)| code)
}

/// `blipless_wg_peers` as `/metrics` shows it.
fn peer_gauge(node: &Node) -> Option<usize> {
    let (_, body) = http_get(node.status, "/metrics")?;
    body.lines()
        .find_map(|line| line.strip_prefix("blipless_wg_peers "))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls `condition` every `every` until it holds; panics after [`BOUND`]
/// or when `daemon` exits first.
fn wait_for(
    what: &str,
    every: Duration,
    daemons: &mut [&mut Daemon],
    mut condition: impl FnMut() -> bool,
) {
    let started = Instant::now();
    while !condition() {
        for daemon in daemons.iter_mut() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!(
                    "a daemon exited ({status}) while waiting for {what}: {}",
                    daemon.log_text()
                );
            }
        }
        assert!(
            started.elapsed() < BOUND,
            "timed out after {BOUND:?} waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// The first line of `log` containing `needle`: (Unix time, the line).
fn log_line(log: &Path, needle: &str) -> Option<(f64, String)> {
    timed_lines(&std::fs::read_to_string(log).unwrap_or_default())
        .into_iter()
        .find(|(_, line)| line.contains(needle))
}

/// Waits for [`log_line`].
fn wait_line(daemon: &mut Daemon, needle: &str) -> (f64, String) {
    let log = daemon.log.clone();
    let mut found = None;
    wait_for(
        &format!("{needle:?} in {}", log.display()),
        Duration::from_millis(10),
        &mut [daemon],
        || {
            found = log_line(&log, needle);
            found.is_some()
        },
    );
    found.unwrap_or_default()
}

/// A `name=N` field of a line as a count.
fn count_field(line: &str, name: &str) -> Option<usize> {
    field(line, name).and_then(|value| value.parse().ok())
}

/// Starts an ingress and a device plane on the store and measures the way
/// to Ready and their memory; returns them running.
fn start(bed: &Bed, settle: Duration) -> (Node, Daemon, Daemon, Start) {
    let mut node = bed.node();
    let mut ingress = node.start_ingress();
    std::thread::sleep(Duration::from_millis(300));
    let ingress_alone_kib = rss_kib(ingress.pid().as_raw()).unwrap_or(0);
    let spawned = unix_now();
    let mut device = node.start_device();
    let mut status_at = f64::NAN;
    wait_for(
        "/status to answer 200",
        Duration::from_millis(2),
        &mut [&mut ingress, &mut device],
        || {
            let ok = status_code(&node) == 200;
            if ok {
                status_at = unix_now();
            }
            ok
        },
    );
    let (ready_at, _) = wait_line(&mut device, "blipless_device::plane: ready");
    let (opened_at, opened) = wait_line(&mut device, "store opened");
    let (applied_at, applied) = wait_line(&mut ingress, "WireGuard peer set applied");
    std::thread::sleep(settle);
    let start = Start {
        store_opened: opened_at - spawned,
        ready: ready_at - spawned,
        status: status_at - spawned,
        peers_after_ready: applied_at - ready_at,
        loaded: count_field(&opened, "clients"),
        peers: count_field(&applied, "peers"),
        ingress_alone_kib,
        ingress_kib: rss_kib(ingress.pid().as_raw()).unwrap_or(0),
        device_kib: rss_kib(device.pid().as_raw()).unwrap_or(0),
    };
    eprintln!(
        "scale bench: {} with {} clients: spawn → ready {:.3} s, → /status 200 {:.3} s, peers {:.3} s after ready; RSS ingress {} KiB, device {} KiB",
        bed.kind.name(),
        bed.filled,
        start.ready,
        start.status,
        start.peers_after_ready,
        start.ingress_kib,
        start.device_kib
    );
    (node, ingress, device, start)
}

/// `blipless-ctl` with `args`, asserted to succeed; its JSON answer.
fn ctl_json(node: &Node, args: &[&str]) -> serde_json::Value {
    let output = node.ctl(args);
    assert!(
        output.status.success(),
        "blipless-ctl {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("blipless-ctl {args:?} --json: {error}"))
}

/// One request through the SOCKS5 listener with `client`'s credentials.
fn request(client: &ClientUrls, url: &str) -> bool {
    Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            "10",
            "--fail",
            "--proxy",
        ])
        .arg(&client.socks)
        .arg(url)
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// `client add` and `client add --wg` on the running node; with the names
/// of the clients added.
fn add_clients(
    bed: &Bed,
    node: &Node,
    ingress: &mut Daemon,
    device: &mut Daemon,
    origin: &Origin,
) -> (Added, Vec<String>) {
    let name = "added".to_owned();
    let started = Instant::now();
    let client = ClientUrls::from_json(&ctl_json(node, &["--json", "client", "add", &name]));
    let ctl = started.elapsed().as_secs_f64();
    let returned = Instant::now();
    wait_for(
        "the new client to log in",
        Duration::from_millis(2),
        &mut [&mut *ingress, &mut *device],
        || blipless_tests::fleet::login_once(node, &client.name, &client.secret) == 0,
    );
    let login = returned.elapsed().as_secs_f64();
    let url = origin.url("/");
    wait_for(
        "a request of the new client",
        Duration::from_millis(2),
        &mut [&mut *ingress, &mut *device],
        || request(&client, &url),
    );
    let request = returned.elapsed().as_secs_f64();

    let wg_name = "addedwg".to_owned();
    let started = Instant::now();
    ctl_json(node, &["--json", "client", "add", "--wg", &wg_name]);
    let ctl_wg = started.elapsed().as_secs_f64();
    let returned = Instant::now();
    let peers = bed.filled + 1;
    wait_for(
        "the ingress to count the new peer",
        Duration::from_millis(2),
        &mut [&mut *ingress, &mut *device],
        || peer_gauge(node) == Some(peers),
    );
    let peer = returned.elapsed().as_secs_f64();
    eprintln!(
        "scale bench: client add {:.3} s, login {:.4} s after, request {:.4} s after; client add --wg {:.3} s, peer {:.4} s after",
        ctl, login, request, ctl_wg, peer
    );
    let added = Added {
        ctl,
        login,
        request,
        ctl_wg,
        peer,
    };
    (added, vec![name, wg_name])
}

/// Hands the ingress off to a second one and reads the successor's log.
fn hand_off(
    node: &mut Node,
    ingress: &mut Daemon,
    device: &mut Daemon,
    settle: Duration,
) -> (Daemon, Handoff) {
    let spawned = unix_now();
    let (mut successor, took) = node.hand_off(ingress);
    let old_exit = took.as_secs_f64();
    let asked = log_line(&ingress.log, "a successor ingress asks to take over");
    let (taking_at, taking) = wait_line(&mut successor, "taking over from the running ingress");
    let (serving_at, _) = wait_line(&mut successor, "ingress serving");
    let (applied_at, _) = wait_line(&mut successor, "WireGuard peer set applied");
    wait_for(
        "/status 200 from the successor",
        Duration::from_millis(2),
        &mut [&mut successor, &mut *device],
        || status_code(node) == 200,
    );
    std::thread::sleep(settle);
    let handoff = Handoff {
        old_exit,
        snapshot: asked.map_or(f64::NAN, |(at, _)| taking_at - at),
        serving: serving_at - spawned,
        peers_applied: applied_at - spawned,
        peers: count_field(&taking, "peers"),
        successor_kib: rss_kib(successor.pid().as_raw()).unwrap_or(0),
    };
    eprintln!(
        "scale bench: handoff: old exit {:.3} s, snapshot {:.3} s, successor serving {:.3} s, peers applied {:.3} s; successor RSS {} KiB",
        handoff.old_exit, handoff.snapshot, handoff.serving, handoff.peers_applied, handoff.successor_kib
    );
    (successor, handoff)
}

/// WARN and ERROR lines in the node's logs but the expected one.
fn warnings(node: &Node) -> Vec<String> {
    logs::warning_lines(node.path())
        .into_iter()
        .filter(|line| !line.contains(EXPECTED_WARNING))
        .collect()
}

/// Every measurement at the store's present size.
fn stage(bed: &Bed, runtime: &tokio::runtime::Runtime, plan: Plan, origin: &Origin) -> Stage {
    let (clients, peers, store_bytes) = (bed.filled, bed.filled, bed.bytes());
    let mut starts = Vec::new();
    let mut found = Vec::new();
    let mut last = None;
    for run in 0..plan.runs {
        let (node, ingress, device, start) = start(bed, plan.settle);
        assert_eq!(
            start.loaded,
            Some(clients),
            "the device plane loaded another count of clients"
        );
        assert_eq!(
            start.peers,
            Some(peers),
            "the ingress applied another count of peers"
        );
        starts.push(start);
        if run + 1 < plan.runs {
            drop((device, ingress));
            found.extend(warnings(&node));
        } else {
            last = Some((node, ingress, device));
        }
    }
    let (mut node, mut ingress, mut device) = last.expect("at least one run");
    let (added, names) = add_clients(bed, &node, &mut ingress, &mut device, origin);
    let (successor, handoff) = hand_off(&mut node, &mut ingress, &mut device, plan.settle);
    drop((device, successor, ingress));
    // The next size starts from the filled clients alone.
    bed.remove(runtime, &names);
    found.extend(warnings(&node));
    for line in &found {
        eprintln!("scale bench: daemon warning: {line}");
    }
    Stage {
        clients,
        peers,
        store_bytes,
        starts,
        added,
        handoff,
        warnings: found,
    }
}

/// Runs every measurement (panics on what it cannot set up; every process
/// it started is killed as the panic unwinds).
pub fn measure(plan: Plan) -> Results {
    let runtime = crate::runtime(2).expect("a tokio runtime");
    let origin = Origin::start();
    let mut stores = Vec::new();
    for kind in Kind::ALL {
        let mut bed = Bed::open(kind, &runtime);
        let mut run = StoreRun {
            kind,
            fills: Vec::new(),
            stages: Vec::new(),
        };
        for size in std::iter::once(plan.baseline).chain(plan.sizes) {
            run.fills.push(bed.fill_to(&runtime, size));
            run.stages.push(stage(&bed, &runtime, plan, &origin));
        }
        stores.push(run);
    }
    Results { stores }
}

/// "1.23 s (max 1.40 s)" over the runs, or the one figure.
fn timing(stage: &Stage, figure: impl Fn(&Start) -> f64 + Copy) -> String {
    let median = short_seconds(stage.median(figure));
    if stage.starts.len() > 1 {
        format!("{median} (max {})", short_seconds(stage.max(figure)))
    } else {
        median
    }
}

/// KiB as MiB, one decimal.
fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

/// Bytes as MiB, one decimal.
fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Bytes per unit as "1.23 KiB", or a dash.
fn per_unit(bytes: Option<f64>) -> String {
    bytes.map_or("—".into(), |b| format!("{:.2} KiB", b / 1024.0))
}

/// The section, markers included.
pub fn render(machine: &Machine, plan: Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", MARKERS.begin);
    let _ = writeln!(
        out,
        "## Node scale: {} and {} clients\n",
        count(plan.sizes[0]),
        count(plan.sizes[1])
    );
    let _ = writeln!(
        out,
        "One node on loopback with a store of {} and then {} clients, every one also a WireGuard peer (a distinct \
         tunnel address in `wireguard.pool = \"{POOL}\"` and a public key: the *clients* columns count the peers \
         too), on the embedded SQLite store and on one \
         `redis-server` of the bench's own; and with {} clients, the baseline whose memory the per-client figures \
         exclude. The store is filled through `Store::add_client` ({FILL_WORKERS} adds at once), as `blipless-ctl` \
         stores a client; the keys are 32 pseudo-random bytes each (any 32 bytes are a Curve25519 public key: the \
         ingress's work per peer is the same). At each size a fresh ingress starts, then a device plane (its \
         WireGuard listener on 127.0.0.1, no TUN device: the plane logs that packet egress is unavailable, which \
         is all it skips). Produced by `blipless-bench-scale` (`make bench` runs it from `scripts/bench.sh`).\n",
        count(plan.sizes[0]),
        count(plan.sizes[1]),
        plan.baseline
    );
    out.push_str(
        "- *store size*: the SQLite file with its write-ahead log, or Redis's `used_memory`, as the daemons \
         started.\n\
         - *spawn → store opened / Ready*: from spawning `blipless-device` to its own log lines \"store opened\" \
         (store open, every client loaded) and \"ready\" (pre-warm done, Ready sent to the ingress).\n\
         - *spawn → `/status` 200*: `/status` polled every 2 ms; it answers 200 once a plane is active and the \
         ingress has applied the WireGuard peer set.\n\
         - *Ready → peer set applied*: from the plane's \"ready\" to the ingress's \"WireGuard peer set applied\" \
         (log timestamps): the ingress activates the plane, the plane sends the whole peer set, the ingress builds \
         its peer table (a WireGuard state per peer).\n\
         - *RSS*: VmRSS from /proc/PID/status once both have idled for ",
    );
    let _ = writeln!(
        out,
        "{} s; the ingress's *alone* is before the plane attached. *Per client* (device plane) and *per peer* \
         (ingress) = (RSS at that size − RSS at the baseline) / (clients or peers there − at the baseline), \
         medians of the runs.",
        plan.settle.as_secs_f64()
    );
    out.push_str(
        "- *`client add`*: `blipless-ctl client add` with that many clients stored; the command returns once the \
         node's device plane applied the change. Then *login*: until the new client's SOCKS5 login (RFC 1929) is \
         accepted (tried every 2 ms), and *request*: until curl with its credentials through the SOCKS5 listener \
         fetched a page from a local origin. `client add --wg` picks the lowest free address among every stored \
         client's, then *peer*: until the ingress's `blipless_wg_peers` counts it.\n\
         - *Handoff*: a second `blipless-ingress` spawned beside the running one (`Node::hand_off`); *old exit*: \
         until the old one exited; *snapshot*: from the old ingress's \"a successor ingress asks to take over\" to \
         the successor's \"taking over\" (the offer, the peer set and the endpoint snapshot sent over the handoff \
         socket and received); *serving*: the successor's \"ingress serving\" (listeners taken over, peers seeded); \
         *peers again*: the successor's \"WireGuard peer set applied\", once the device plane rejoined it and sent \
         its full set.\n\n",
    );
    machine.header(&mut out);
    let _ = writeln!(
        out,
        "| runs | {} start(s) per size (a fresh ingress and device plane each; median, max); `client add` and the \
         handoff once, on the last |",
        plan.runs
    );
    for run in &results.stores {
        let fills: Vec<String> = run
            .fills
            .iter()
            .filter(|fill| fill.added > 0)
            .map(|fill| {
                format!(
                    "{} in {} ({:.0}/s)",
                    count(fill.added),
                    short_seconds(fill.seconds),
                    fill.added as f64 / fill.seconds.max(1e-9)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| filling {} | {} |",
            run.kind.name(),
            fills.join("; ")
        );
    }
    out.push('\n');

    for run in &results.stores {
        let _ = writeln!(out, "### {}\n", run.kind.name());
        out.push_str(
            "| clients | store size | spawn → store opened | spawn → Ready | spawn → `/status` 200 | Ready → peer set applied | device plane RSS | per client | ingress RSS alone → with peers | per peer |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for stage in &run.stages {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} → {} | {} |",
                count(stage.clients),
                stage.store_bytes.map_or("—".into(), size),
                timing(stage, |s| s.store_opened),
                timing(stage, |s| s.ready),
                timing(stage, |s| s.status),
                timing(stage, |s| s.peers_after_ready),
                mib(stage.median_kib(|s| s.device_kib)),
                per_unit(run.per_unit(stage, |s| s.device_kib, |s| s.clients)),
                mib(stage.median_kib(|s| s.ingress_alone_kib)),
                mib(stage.median_kib(|s| s.ingress_kib)),
                per_unit(run.per_unit(stage, |s| s.ingress_kib, |s| s.peers)),
            );
        }
        out.push_str(
            "\n| clients | `client add` | → login | → request | `client add --wg` | → peer in the ingress | handoff: old exit | snapshot | successor serving | peers again | successor RSS |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for stage in &run.stages {
            let (added, handoff) = (&stage.added, &stage.handoff);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                count(stage.clients),
                short_seconds(added.ctl),
                precise(added.login),
                precise(added.request),
                short_seconds(added.ctl_wg),
                precise(added.peer),
                short_seconds(handoff.old_exit),
                format_snapshot(handoff),
                short_seconds(handoff.serving),
                short_seconds(handoff.peers_applied),
                mib(handoff.successor_kib as f64),
            );
        }
        let warnings: usize = run.stages.iter().map(|stage| stage.warnings.len()).sum();
        let _ = writeln!(
            out,
            "\nWarnings and errors in the daemons' logs, besides each plane's \"{EXPECTED_WARNING}\": {warnings}.\n"
        );
    }
    targets(&mut out, plan, results);
    let _ = writeln!(out, "{}", MARKERS.end);
    out
}

/// A short time in milliseconds with one decimal.
fn precise(seconds: f64) -> String {
    if seconds.is_nan() {
        "—".into()
    } else {
        format!("{:.1} ms", seconds * 1e3)
    }
}

/// The snapshot's time with the peers it carried.
fn format_snapshot(handoff: &Handoff) -> String {
    match handoff.peers {
        Some(peers) => format!(
            "{} ({} peers)",
            short_seconds(handoff.snapshot),
            count(peers)
        ),
        None => short_seconds(handoff.snapshot),
    }
}

/// The Targets table.
fn targets(out: &mut String, plan: Plan, results: &Results) {
    let large = plan.sizes[1];
    let at = if large == 100_000 {
        String::new()
    } else {
        format!(" (measured at {}: `--quick`)", count(large))
    };
    out.push_str("### Targets\n\n| target | store | measured | met |\n|---|---|---:|---|\n");
    for run in &results.stores {
        let Some(stage) = run.stages.iter().find(|s| s.clients >= large) else {
            continue;
        };
        let ready = stage.max(|s| s.ready);
        let _ = writeln!(
            out,
            "| 100,000 clients: device-plane spawn → Ready < 3 s, slowest run{at} | {} | {} | {} |",
            run.kind.name(),
            short_seconds(ready),
            verdict(ready < 3.0)
        );
        let ingress = run.per_unit(stage, |s| s.ingress_kib, |s| s.peers);
        let _ = writeln!(
            out,
            "| 100,000 peers: ingress memory ≤ 4 KiB per peer{at} | {} | {} | {} |",
            run.kind.name(),
            per_unit(ingress),
            verdict(ingress.is_some_and(|b| b <= 4096.0))
        );
        let device = run.per_unit(stage, |s| s.device_kib, |s| s.clients);
        let _ = writeln!(
            out,
            "| 100,000 clients: device-plane memory ≤ 2 KiB per client{at} | {} | {} | {} |",
            run.kind.name(),
            per_unit(device),
            verdict(device.is_some_and(|b| b <= 2048.0))
        );
        let added = &stage.added;
        let _ = writeln!(
            out,
            "| 100,000 clients: `client add` visible at once: a request with its credentials succeeds within 100 ms of the command's return{at} | {} | `client add` {}; request {} after | {} |",
            run.kind.name(),
            short_seconds(added.ctl),
            precise(added.request),
            verdict(added.request <= 0.1)
        );
        let _ = writeln!(
            out,
            "| 100,000 peers: peer set sync (Ready → applied, median) and the handoff snapshot measured{at} | {} | sync {}; snapshot {} | measured |",
            run.kind.name(),
            short_seconds(stage.median(|s| s.peers_after_ready)),
            format_snapshot(&stage.handoff)
        );
    }
    for run in &results.stores {
        let Some(stage) = run.stages.iter().find(|s| s.clients >= 10_000) else {
            continue;
        };
        let status = stage.max(|s| s.status);
        let _ = writeln!(
            out,
            "| 10,000 clients: device-plane spawn → `/status` 200 < 200 ms, slowest run ({} clients) | {} | {} | {} |",
            count(stage.clients),
            run.kind.name(),
            short_seconds(status),
            verdict(status < 0.2)
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_records_are_distinct_and_valid() {
        let a = record(0, 1);
        let b = record(99_999, 1);
        assert_eq!(a.name, "scale000000");
        assert_eq!(b.name, "scale099999");
        assert_eq!(a.wg_address, Some(IpAddr::V4(Ipv4Addr::new(10, 65, 0, 0))));
        assert_eq!(
            b.wg_address,
            Some(IpAddr::V4(Ipv4Addr::new(10, 66, 134, 159)))
        );
        // 196,607 addresses from 10.65.0.0 up to the pool's broadcast address
        // (10.67.255.255): room for 150,000 filled clients.
        assert_eq!(
            record(150_000, 1).wg_address,
            Some(IpAddr::V4(Ipv4Addr::new(10, 67, 73, 240)))
        );
        let keys: std::collections::HashSet<String> = (0..10_000).map(public_key).collect();
        assert_eq!(keys.len(), 10_000);
        let key = base64::engine::general_purpose::STANDARD
            .decode(public_key(7))
            .expect("base64");
        assert_eq!(key.len(), 32);
    }
}
