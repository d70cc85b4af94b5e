//! Section 3 of the egress bench: an inner TCP flow of the WireGuard client
//! through the exit across device-plane deploys. This binary, re-executed
//! in the customer namespace (`--inside paced`), reads a paced stream from
//! the bench's origin (CHUNK bytes of the harness pattern every TICK, so
//! the sender never idles and a gap at the reader is a stall of the path)
//! through the wireguard-go client → blipless (steered to the exit by the
//! client's policy) → the wireguard-go exit → the origin, while the device
//! plane is deployed [`super::Plan::deploys`] times (`Node::deploy`: a new
//! plane, Ready, the old one exits 0). The reader records every gap between
//! two reads with data over 50 ms and checks every byte; at the end it
//! half-closes, the origin stops and says how much it wrote, and the reader
//! takes the rest: bytes lost = written − received.

use std::io::Read as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use blipless_tests::exit_world::LeakCounter;
use serde_json::Value;

use super::world::{inside_command, World};
use super::Plan;
use crate::logs::unix_now;

/// The origin writes CHUNK bytes every TICK: 8 KiB / 5 ms = 1.6 MB/s.
pub(super) const TICK: Duration = Duration::from_millis(5);
/// See [`TICK`].
pub(super) const CHUNK: usize = 8 * 1024;
/// The stream runs this long before the first deploy.
pub(super) const WARM_UP: Duration = Duration::from_secs(2);
/// Between one deploy's end and the next one's start, and after the last.
pub(super) const BETWEEN: Duration = Duration::from_secs(2);
/// A deploy's window runs from its spawn until this long after the old
/// plane exited: gaps are counted against the deploy within it.
pub(super) const WINDOW_AFTER: f64 = 1.0;
/// The reader lists gaps over this long.
pub(super) const LISTED: f64 = super::inside::LISTED_GAP;

/// One deploy.
#[derive(Debug, Clone)]
pub(super) struct Deploy {
    /// Its start, seconds after the stream's first byte.
    pub at: f64,
    /// Spawn of the new plane until the old one exited.
    pub took: f64,
    /// Wall clock at its start and end.
    pub start_unix: f64,
    pub end_unix: f64,
    /// The longest gap overlapping its window (None: none listed, i.e.
    /// under [`LISTED`]).
    pub longest_gap: Option<f64>,
}

/// What the stream saw.
#[derive(Debug, Clone, Default)]
pub(super) struct Stall {
    /// The deploys, in order.
    pub deploys: Vec<Deploy>,
    /// The longest gap of the whole stream.
    pub longest_gap: f64,
    /// Its end, seconds after the stream's first byte.
    pub longest_gap_at: f64,
    /// The longest listed gap outside every deploy window (None: none).
    pub baseline_gap: Option<f64>,
    /// Listed gaps: (end, seconds after the first byte; length).
    pub gaps: Vec<(f64, f64)>,
    /// Bytes the reader received.
    pub received: u64,
    /// Bytes the origin wrote (None: it did not say).
    pub written: Option<u64>,
    /// The first byte that differed from the pattern.
    pub mismatch_at: Option<u64>,
    /// Reads with data.
    pub reads: u64,
    /// First to last byte, seconds.
    pub duration: f64,
    /// The stream ended as asked (half-close, the rest, end).
    pub clean: bool,
    /// What went wrong (the reader's, or the origin's).
    pub error: Option<String>,
    /// Packets of the WireGuard client pool that left the node directly
    /// (out of its uplink) during the run: steering misses.
    pub leaked: u64,
    /// Bytes the exit sent the node during the run (`wg show` on the exit),
    /// None when it cannot be read: the stream went through the exit.
    pub exit_sent: Option<u64>,
    /// What the origin saw from the customer before and after.
    pub seen_before: String,
    pub seen_after: String,
}

impl Stall {
    /// Bytes lost: written and not received (None: unknown).
    pub fn lost(&self) -> Option<u64> {
        self.written.map(|w| w.saturating_sub(self.received))
    }
}

/// The last `paced_written` line of the origin's output after `lines`
/// such lines were already there.
fn written_line(output: &str, skip: usize) -> Option<Value> {
    output
        .lines()
        .filter(|l| l.contains("paced_written"))
        .skip(skip)
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
}

/// Polls every 200 ms until the customer's `/whoami` is the exit's address
/// (the steering is refreshed every second); what it last saw.
fn wait_exit(world: &World, timeout: Duration) -> String {
    let started = Instant::now();
    loop {
        let seen = world.whoami_customer().unwrap_or_else(|e| e);
        if seen == world.net.exit_public || started.elapsed() >= timeout {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the stream across the deploys.
pub(super) fn measure(world: &mut World, plan: Plan) -> Result<Stall, String> {
    let seen_before = wait_exit(world, Duration::from_secs(15));
    if seen_before != world.net.exit_public {
        return Err(format!(
            "the WireGuard client does not leave through the exit: the origin saw {seen_before}\n{}",
            world.diagnostics()
        ));
    }
    let leaks = LeakCounter::install(&world.net);
    let leaked_before = leaks.packets();
    let exit_sent = || world.exit.node_peer().map(|peer| peer.tx_bytes);
    let exit_before = exit_sent();
    let origin = world.bench_origin()?;
    let lines_before = world
        .origin
        .output()
        .lines()
        .filter(|l| l.contains("paced_written"))
        .count();
    let mut reader = inside_command(
        &world.net.net.customer,
        "paced",
        &[
            "--origin".into(),
            origin.to_string(),
            "--tick-us".into(),
            TICK.as_micros().to_string(),
            "--chunk".into(),
            CHUNK.to_string(),
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .map_err(|e| format!("starting the paced reader: {e}"))?;
    let stream_start = unix_now();
    std::thread::sleep(WARM_UP);
    let mut deploys = Vec::new();
    for round in 1..=plan.deploys {
        if let Ok(Some(status)) = reader.try_wait() {
            return Err(format!(
                "the paced reader ended ({status}) before deploy {round}\n{}",
                world.diagnostics()
            ));
        }
        let start_unix = unix_now();
        let (device, took) = world.node.node.deploy(&mut world.node.device);
        let end_unix = unix_now();
        world.node.device = device;
        eprintln!(
            "  deploy {round}: {:.2} s after the start, took {took:.2?}",
            start_unix - stream_start
        );
        deploys.push(Deploy {
            at: start_unix - stream_start,
            took: took.as_secs_f64(),
            start_unix,
            end_unix,
            longest_gap: None,
        });
        std::thread::sleep(BETWEEN);
    }
    // Closing stdin tells the reader to half-close and take the rest.
    drop(reader.stdin.take());
    let mut stdout = String::new();
    if let Some(mut pipe) = reader.stdout.take() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = reader.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = reader
        .wait()
        .map_err(|e| format!("waiting for the paced reader: {e}"))?;
    if !status.success() {
        return Err(format!(
            "the paced reader failed ({status}): {}\n{}",
            stderr.trim(),
            world.diagnostics()
        ));
    }
    let value: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("the paced reader printed {stdout:?}: {e}"))?;
    // The origin prints what it wrote once the stream is over.
    let deadline = Instant::now() + Duration::from_secs(5);
    let written = loop {
        if let Some(line) = written_line(&world.origin.output(), lines_before) {
            break Some(line);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let first = value["first_unix"].as_f64().unwrap_or(stream_start);
    let gaps: Vec<(f64, f64)> = value["gaps"]
        .as_array()
        .map(|gaps| {
            gaps.iter()
                .filter_map(|g| Some((g[0].as_f64()?, g[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let overlaps = |(end, length): (f64, f64), deploy: &Deploy| {
        end - length < deploy.end_unix + WINDOW_AFTER && end > deploy.start_unix
    };
    for deploy in &mut deploys {
        deploy.longest_gap = gaps
            .iter()
            .filter(|&&g| overlaps(g, deploy))
            .map(|&(_, length)| length)
            .reduce(f64::max);
    }
    let baseline_gap = gaps
        .iter()
        .filter(|&&g| !deploys.iter().any(|d| overlaps(g, d)))
        .map(|&(_, length)| length)
        .reduce(f64::max);
    let mut error = value["error"].as_str().map(str::to_string);
    let origin_error = written
        .as_ref()
        .and_then(|w| w["error"].as_str().map(str::to_string));
    if error.is_none() {
        error = origin_error.map(|e| format!("the origin: {e}"));
    }
    let exit_after = exit_sent();
    let seen_after = world.whoami_customer().unwrap_or_else(|e| e);
    let stall = Stall {
        longest_gap: value["longest_gap_s"].as_f64().unwrap_or(f64::NAN),
        longest_gap_at: value["longest_gap_end_unix"]
            .as_f64()
            .map_or(f64::NAN, |end| end - first),
        baseline_gap,
        gaps: gaps.iter().map(|&(end, len)| (end - first, len)).collect(),
        received: value["received"].as_u64().unwrap_or(0),
        written: written.and_then(|w| w["paced_written"].as_u64()),
        mismatch_at: value["mismatch_at"].as_u64(),
        reads: value["reads"].as_u64().unwrap_or(0),
        duration: value["last_unix"].as_f64().unwrap_or(first) - first,
        clean: value["clean"].as_bool().unwrap_or(false),
        error,
        leaked: leaks.packets().saturating_sub(leaked_before),
        exit_sent: exit_before
            .zip(exit_after)
            .map(|(before, after)| after.saturating_sub(before)),
        deploys,
        seen_before,
        seen_after,
    };
    eprintln!(
        "  longest gap {:.0} ms; {} bytes received of {:?} written; {} packets left directly",
        stall.longest_gap * 1000.0,
        stall.received,
        stall.written,
        stall.leaked
    );
    Ok(stall)
}
