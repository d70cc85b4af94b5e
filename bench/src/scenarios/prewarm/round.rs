//! One round of section 5 on a node of its own (and a `redis-server` of its
//! own for Redis): the clients, the two deploys and their way to Ready from
//! the daemons' logs, the first and second requests, and the bare Redis
//! round trip.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use blipless_tests::node::{Daemon, Node};
use blipless_tests::redis::Redis;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{PrewarmLog, Ready, Round, Store, StoreRun, CONCURRENCY, PINGS, SOURCES, WINDOW};
use crate::client::{self, Mode, Proxies};
use crate::logs::{self, debug_duration, log_time, read_from, strip_ansi};
use crate::metrics;
use crate::stats::upper_median;

/// Limit on one deploy, spawn to the old plane's exit.
const DEPLOY_BOUND: Duration = Duration::from_secs(30);
/// Limit on one request.
const REQUEST_BOUND: Duration = Duration::from_secs(10);
/// What each request sends and expects back.
const PAYLOAD: [u8; 16] = *b"pre-warm bench!\n";

/// One round on a node of its own: adds its samples to `run`; the round's
/// deploys, unless one failed (noted in `run`).
pub(super) fn store_round(
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
        round.metric = metrics::read(node.status, "blipless_prewarmed_devices");
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
    run.daemon_warnings += logs::warning_count(std::iter::once(ingress).chain(planes));
}

/// Starts a new plane and waits (bounded) for the old one's exit; reads
/// the way to Ready from the ingress's and the new plane's logs.
fn deploy(node: &mut Node, ingress: &Daemon, planes: &mut Vec<Daemon>) -> Result<Ready, String> {
    let offset = logs::offset(&ingress.log);
    let spawned = logs::unix_now();
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

/// Seconds from `from` to `to` (Unix seconds), within a day.
fn since(from: f64, to: f64) -> Duration {
    Duration::from_secs_f64((to - from).rem_euclid(86_400.0))
}

/// The first "attached (standby)" and "device plane ready" after `offset`.
fn ingress_times(log: &Path, offset: u64) -> (Option<f64>, Option<f64>) {
    let text = read_from(log, offset);
    let (mut attached, mut ready) = (None, None);
    for line in text.lines().map(strip_ansi) {
        if attached.is_none() && line.contains("device plane attached (standby)") {
            attached = log_time(&line);
        } else if ready.is_none() && line.contains("device plane ready") {
            ready = log_time(&line);
        }
    }
    (attached, ready)
}

/// The "pre-warm done" line of a device plane's log.
fn prewarm_log(log: &Path) -> Option<PrewarmLog> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .map(strip_ansi)
        .find(|l| l.contains("pre-warm done"))?;
    let count = |key: &str| {
        logs::field(&line, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(PrewarmLog {
        candidates: count("candidates"),
        opened: count("opened"),
        skipped: count("skipped"),
        took: logs::field(&line, "took")
            .and_then(debug_duration)
            .map(Duration::from_secs_f64),
    })
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
    upper_median(&samples).ok_or_else(|| std::io::Error::other("no PING timed"))
}
