//! Section 5: pre-warm, the first request of a client after a deploy.
//!
//! A device (a client's egress state on a device plane) opens on the
//! client's first connection: the plane takes the client's egress identity
//! from the store (Redis GETDEL / SQLite), allocates a source address if
//! there was none and writes the snapshot back, two store round trips before
//! the egress connect. A new plane pre-warms, before it says Ready, the
//! devices of the clients active on the node within `prewarm.window`.
//!
//! For each store (a `redis-server` of the run's own, then the embedded
//! SQLite file), a few rounds, each on a node of its own with four source
//! addresses in `egress.sources`: N clients are added; the first plane carries one
//! request for every other client (the *pre-warmed* half) and none for the
//! rest (*cold*); a deploy follows (the new plane finds the activity set
//! still empty: the old plane writes its activity when it drains, after the
//! new one is Ready), then a second deploy whose plane pre-warms the half
//! that was active. On that plane, after one warm-up request by a client of
//! neither half, every client makes its first request, pre-warmed and cold
//! alternating, one at a time: a new SOCKS5 connection, the handshake, a
//! CONNECT to an echo server, 16 bytes out, timed from the start of the TCP
//! connect until the first echoed byte. Then each makes a second request
//! the same way (its device open either way).
//!
//! Every wait is bounded; a failed store run is reported, not fatal.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use blipless_tests::node::{Daemon, Node};
use blipless_tests::redis::Redis;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, Mode, Proxies};
use crate::deploy::{self, EchoServer};

/// Source addresses the nodes allocate from (all on loopback).
pub const SOURCES: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
/// Limit on one deploy, spawn to the old plane's exit.
const DEPLOY_BOUND: Duration = Duration::from_secs(30);
/// Limit on one request.
const REQUEST_BOUND: Duration = Duration::from_secs(10);
/// What each request sends and expects back.
const PAYLOAD: [u8; 16] = *b"pre-warm bench!\n";
/// Redis PINGs timed for the store round trip.
pub const PINGS: usize = 200;
/// `prewarm.concurrency` on the nodes here (the default).
pub const CONCURRENCY: usize = 8;
/// `prewarm.window` on the nodes here (the default).
pub const WINDOW: &str = "10m";

/// How much the section does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Clients per round, half of them pre-warmed.
    pub clients: usize,
    /// Rounds per store, each on a fresh node (and `redis-server`).
    pub rounds: usize,
    /// A store run that would start after this long in the section is skipped.
    pub section_bound: Duration,
}

/// Which store a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A `redis-server` of the run's own, on loopback.
    Redis,
    /// The embedded SQLite file (the default).
    Sqlite,
}

impl Store {
    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Store::Redis => "Redis (loopback)",
            Store::Sqlite => "SQLite (embedded)",
        }
    }
}

/// The new plane's pre-warm, from its own log line ("pre-warm done").
#[derive(Debug, Clone, Copy, Default)]
pub struct PrewarmLog {
    /// Clients active within the window.
    pub candidates: u64,
    /// Devices opened.
    pub opened: u64,
    /// Devices skipped.
    pub skipped: u64,
    /// How long the pre-warm took.
    pub took: Option<Duration>,
}

/// One deploy's way to Ready.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ready {
    /// From the spawn until the ingress logged "device plane ready".
    pub spawn_to_ready: Option<Duration>,
    /// From the ingress's "attached (standby)" to its "device plane ready":
    /// the new plane's warm-up (store, clients, pre-warm).
    pub attached_to_ready: Option<Duration>,
    /// What the pre-warm did.
    pub prewarm: Option<PrewarmLog>,
}

/// One round's deploys and figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Round {
    /// The deploy whose plane found no activity.
    pub without: Ready,
    /// The deploy whose plane pre-warmed the active half.
    pub with: Ready,
    /// `blipless_prewarmed_devices` with the pre-warmed plane active.
    pub metric: Option<f64>,
    /// Redis only: p50 of a PING round trip from the bench.
    pub ping: Option<Duration>,
}

/// What one store's rounds measured.
#[derive(Debug, Clone)]
pub struct StoreRun {
    /// The store.
    pub store: Store,
    /// First request of each pre-warmed client, every round.
    pub warm: Vec<Duration>,
    /// First request of each cold client.
    pub cold: Vec<Duration>,
    /// Second request of every client.
    pub second: Vec<Duration>,
    /// Requests that failed (of first and second ones).
    pub failures: usize,
    /// The rounds that completed their deploys.
    pub rounds: Vec<Round>,
    /// The first failure of any kind.
    pub first_error: Option<String>,
    /// Warnings and errors in the run's daemon logs.
    pub daemon_warnings: usize,
}

impl StoreRun {
    fn new(store: Store) -> Self {
        Self {
            store,
            warm: Vec::new(),
            cold: Vec::new(),
            second: Vec::new(),
            failures: 0,
            rounds: Vec::new(),
            first_error: None,
            daemon_warnings: 0,
        }
    }

    fn note(&mut self, error: impl Into<String>) {
        if self.first_error.is_none() {
            self.first_error = Some(error.into());
        }
    }
}

/// The whole section.
#[derive(Debug, Default)]
pub struct Section {
    /// What it was asked to do.
    pub plan: Option<Plan>,
    /// One entry per store.
    pub runs: Vec<StoreRun>,
    /// Store runs that did not complete, with why.
    pub aborted: Vec<String>,
    /// Warnings and errors the section's daemons logged.
    pub daemon_warnings: usize,
}

/// Runs the section: Redis, then SQLite.
pub fn run(plan: Plan) -> Section {
    let mut section = Section {
        plan: Some(plan),
        ..Section::default()
    };
    let echo = match EchoServer::start() {
        Ok(echo) => echo,
        Err(error) => {
            section
                .aborted
                .push(format!("starting the echo server: {error}"));
            return section;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            section.aborted.push(format!("starting a runtime: {error}"));
            return section;
        }
    };
    let started = Instant::now();
    for store in [Store::Redis, Store::Sqlite] {
        let mut run = StoreRun::new(store);
        for round in 1..=plan.rounds {
            if started.elapsed() > plan.section_bound {
                section.aborted.push(format!(
                    "{} round {round}: skipped, the section's time bound ({:?}) was reached",
                    store.label(),
                    plan.section_bound
                ));
                break;
            }
            eprintln!(
                "  {} round {round}: {} clients, half pre-warmed",
                store.label(),
                plan.clients
            );
            let began = Instant::now();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                store_round(&runtime, store, plan.clients, echo.address, &mut run)
            }));
            match outcome {
                Ok(Some(done)) => {
                    eprintln!(
                        "    spawn→Ready {} without, {} with · pre-warm {} · prewarmed metric {} · {:.1} s",
                        millis(done.without.spawn_to_ready),
                        millis(done.with.spawn_to_ready),
                        millis(done.with.prewarm.and_then(|p| p.took)),
                        done.metric.map_or("—".into(), |m| m.to_string()),
                        began.elapsed().as_secs_f64(),
                    );
                    run.rounds.push(done);
                }
                Ok(None) => eprintln!("    failed: {}", run.first_error.as_deref().unwrap_or("?")),
                Err(panic) => {
                    let text = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    eprintln!("    failed: {text}");
                    section
                        .aborted
                        .push(format!("{} round {round}: failed: {text}", store.label()));
                }
            }
        }
        eprintln!(
            "  {}: first request p50 pre-warmed {} · cold {} · second {} · {} failed requests",
            store.label(),
            micros(p50(&run.warm)),
            micros(p50(&run.cold)),
            micros(p50(&run.second)),
            run.failures,
        );
        if let Some(error) = &run.first_error {
            eprintln!("    first error: {error}");
        }
        section.daemon_warnings += run.daemon_warnings;
        section.runs.push(run);
    }
    drop(runtime);
    drop(echo);
    section
}

/// One round on a node of its own: adds its samples to `run`; the round's
/// deploys, unless one failed (noted in `run`).
fn store_round(
    runtime: &tokio::runtime::Runtime,
    store: Store,
    clients: usize,
    echo: SocketAddr,
    run: &mut StoreRun,
) -> Option<Round> {
    let mut round = Round::default();
    let redis = (store == Store::Redis).then(|| Redis::start(false));
    let store_table = redis
        .as_ref()
        .map(|r| format!("[store]\nurl = \"{}\"\n\n", r.url()))
        .unwrap_or_default();
    let extra =
        format!("{store_table}[prewarm]\nwindow = \"{WINDOW}\"\nconcurrency = {CONCURRENCY}\n");
    let sources = SOURCES
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut node = Node::custom("prewarm", &format!("sources = [{sources}]"), &extra);
    let ingress = node.start_ingress();
    let probe = Proxies::of(&node, &node.add_client("probe"));
    // Even positions are the pre-warmed half, odd ones the cold half.
    let all: Vec<Proxies> = (0..clients)
        .map(|i| Proxies::of(&node, &node.add_client(&format!("pw{i:03}"))))
        .collect();
    let mut planes = vec![node.start_device()];
    node.wait_ready();

    // The first plane carries one request for each client of the pre-warmed half.
    for client in all.iter().step_by(2) {
        if let Err(error) = runtime.block_on(request(client, echo)) {
            run.failures += 1;
            run.note(format!("seeding request of {}: {error}", client.user));
        }
    }
    // A deploy: the new plane finds no activity yet (the old one writes it when it drains).
    match deploy(&mut node, &ingress, &mut planes) {
        Ok(ready) => round.without = ready,
        Err(error) => {
            run.note(error);
            finish(run, &mut round, &ingress, &planes, redis.as_ref());
            return None;
        }
    }
    // Another: this plane pre-warms the half that was active.
    match deploy(&mut node, &ingress, &mut planes) {
        Ok(ready) => round.with = ready,
        Err(error) => {
            run.note(error);
            finish(run, &mut round, &ingress, &planes, redis.as_ref());
            return None;
        }
    }

    // One warm-up request (its first pays for a device of its own) on the new plane.
    for _ in 0..3 {
        if let Err(error) = runtime.block_on(request(&probe, echo)) {
            run.note(format!("warm-up request: {error}"));
        }
    }
    // First requests, pre-warmed and cold alternating, then the second ones.
    for (index, client) in all.iter().enumerate() {
        match runtime.block_on(request(client, echo)) {
            Ok(took) if index % 2 == 0 => run.warm.push(took),
            Ok(took) => run.cold.push(took),
            Err(error) => {
                run.failures += 1;
                run.note(format!("first request of {}: {error}", client.user));
            }
        }
    }
    for client in &all {
        match runtime.block_on(request(client, echo)) {
            Ok(took) => run.second.push(took),
            Err(error) => {
                run.failures += 1;
                run.note(format!("second request of {}: {error}", client.user));
            }
        }
    }
    // The plane reports every second, the first time as it becomes Ready.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        round.metric = deploy::read_metric(node.status, "blipless_prewarmed_devices");
        if round.metric.is_some_and(|m| m > 0.0) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    finish(run, &mut round, &ingress, &planes, redis.as_ref());
    Some(round)
}

/// Times Redis and counts the round's daemon warnings.
fn finish(
    run: &mut StoreRun,
    round: &mut Round,
    ingress: &Daemon,
    planes: &[Daemon],
    redis: Option<&Redis>,
) {
    if let Some(redis) = redis {
        match ping(redis.port) {
            Ok(p50) => round.ping = Some(p50),
            Err(error) => run.note(format!("timing Redis PING: {error}")),
        }
    }
    run.daemon_warnings += std::iter::once(ingress)
        .chain(planes)
        .map(|d| {
            d.log_text()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .count()
        })
        .sum::<usize>();
}

/// Starts a new plane and waits (bounded) for the old one's exit; reads
/// the way to Ready from the ingress's and the new plane's logs.
fn deploy(node: &mut Node, ingress: &Daemon, planes: &mut Vec<Daemon>) -> Result<Ready, String> {
    let offset = std::fs::metadata(&ingress.log).map_or(0, |m| m.len());
    let spawned = wall_seconds_of_day();
    let new = node.start_device();
    let old = planes.last_mut().ok_or("no device plane")?;
    let exit = old.wait_exit(DEPLOY_BOUND);
    planes.push(new);
    match exit {
        None => {
            let text = format!("the old device plane did not exit within {DEPLOY_BOUND:?}");
            if let Some(old) = planes.iter_mut().rev().nth(1) {
                old.kill();
            }
            return Err(text);
        }
        Some(status) if !status.success() => {
            return Err(format!("the old device plane exited with {status}"))
        }
        Some(_) => {}
    }
    // The ingress logs Ready before it drains the old plane; allow for a late write.
    let mut ready = Ready::default();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (attached, ready_at) = ingress_times(&ingress.log, offset);
        if let Some(ready_at) = ready_at {
            ready.spawn_to_ready = Some(since(spawned, ready_at));
            ready.attached_to_ready = attached.map(|a| since(a, ready_at));
        }
        if ready.spawn_to_ready.is_some() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ready.prewarm = planes.last().and_then(|p| prewarm_log(&p.log));
    Ok(ready)
}

/// Seconds from `from` to `to`, both seconds of the UTC day.
fn since(from: f64, to: f64) -> Duration {
    Duration::from_secs_f64((to - from).rem_euclid(86_400.0))
}

fn wall_seconds_of_day() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
        .rem_euclid(86_400.0)
}

/// The first "attached (standby)" and "device plane ready" after `offset`.
fn ingress_times(log: &Path, offset: u64) -> (Option<f64>, Option<f64>) {
    let Ok(bytes) = std::fs::read(log) else {
        return (None, None);
    };
    let text = String::from_utf8_lossy(bytes.get(offset as usize..).unwrap_or_default());
    let (mut attached, mut ready) = (None, None);
    for line in text.lines().map(deploy::strip_ansi) {
        if attached.is_none() && line.contains("device plane attached (standby)") {
            attached = deploy::seconds_of_day(&line);
        } else if ready.is_none() && line.contains("device plane ready") {
            ready = deploy::seconds_of_day(&line);
        }
    }
    (attached, ready)
}

/// The "pre-warm done" line of a device plane's log.
fn prewarm_log(log: &Path) -> Option<PrewarmLog> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .map(deploy::strip_ansi)
        .find(|l| l.contains("pre-warm done"))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    let count = |key: &str| field(key).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(PrewarmLog {
        candidates: count("candidates"),
        opened: count("opened"),
        skipped: count("skipped"),
        took: field("took").as_deref().and_then(parse_debug_duration),
    })
}

/// A `Duration`'s Debug text ("35.44ms", "1.2s", "950µs", "12ns").
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" | "us" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// One request on a new connection: SOCKS5 handshake and CONNECT to the
/// echo server, 16 bytes out; the time from the start of the TCP connect
/// until the first echoed byte. The whole echo is checked.
async fn request(proxies: &Proxies, echo: SocketAddr) -> std::io::Result<Duration> {
    let exchange = async {
        let mut opened = client::open(proxies, Mode::Socks5, echo).await?;
        opened.stream.write_all(&PAYLOAD).await?;
        let mut got = [0u8; PAYLOAD.len()];
        let n = opened.stream.read(&mut got).await?;
        let took = opened.started.elapsed();
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the tunnel closed before the echo",
            ));
        }
        opened.stream.read_exact(&mut got[n..]).await?;
        if got != PAYLOAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("echo differs: got {got:02x?}"),
            ));
        }
        Ok(took)
    };
    match tokio::time::timeout(REQUEST_BOUND, exchange).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no echo within {REQUEST_BOUND:?}"),
        )),
    }
}

/// p50 of a Redis PING round trip (RESP inline command) on one connection.
fn ping(port: u16) -> std::io::Result<Duration> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut samples = Vec::with_capacity(PINGS);
    let mut reply = [0u8; 7];
    for _ in 0..PINGS + 20 {
        let started = Instant::now();
        stream.write_all(b"PING\r\n")?;
        stream.read_exact(&mut reply)?;
        samples.push(started.elapsed());
        if &reply != b"+PONG\r\n" {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "PING answered something else",
            ));
        }
    }
    // The first few warm the connection up.
    let mut samples = samples.split_off(20);
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

/// Median (nearest rank).
pub fn p50(samples: &[Duration]) -> Option<Duration> {
    crate::stats::Percentiles::of(samples.to_vec()).p50
}

/// Median of some optional durations (nearest rank), over those present.
pub fn p50_of(values: impl Iterator<Item = Option<Duration>>) -> Option<Duration> {
    p50(&values.flatten().collect::<Vec<_>>())
}

/// Longest.
pub fn max(samples: &[Duration]) -> Option<Duration> {
    samples.iter().max().copied()
}

fn micros(value: Option<Duration>) -> String {
    crate::stats::micros(value)
}

fn millis(value: Option<Duration>) -> String {
    value.map_or("—".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
}
