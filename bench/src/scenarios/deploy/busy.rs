//! Section 4's deploy under one busy tunnel: a 256 MiB download through one
//! SOCKS5 tunnel, with a device-plane deploy in the middle of it. The old
//! plane must hand the tunnel over mid-stream (up to a full relay buffer
//! pending) and exit; the figure is the new plane's activation → the old
//! plane's exit. The reader checks every byte against the streaming origin's
//! pattern and records the longest gap between two reads that returned data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::node::{Daemon, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::watch;
use crate::client::{self, Mode, Proxies};
use crate::metrics;
use crate::scenarios::bulk::{StreamOrigin, CHUNK};

/// The download's size.
pub const DOWNLOAD: u64 = 256 << 20;
/// The deploy starts once this much of the body has arrived.
const DEPLOY_AFTER: u64 = 16 << 20;
/// Limit on the whole download.
const DOWNLOAD_BOUND: Duration = Duration::from_secs(60);
/// The target: the new plane's activation → the old plane's exit.
pub const EXIT_TARGET: Duration = Duration::from_millis(100);

/// One deploy under the download.
#[derive(Debug, Clone, Default)]
pub struct BusyRun {
    /// Which run (from 1).
    pub index: usize,
    /// Spawn of the new plane until the old plane's exit.
    pub start_to_exit: Option<Duration>,
    /// Spawn until `/metrics` first showed the old plane draining.
    pub start_to_active: Option<Duration>,
    /// The ingress's log: the new plane's Ready until the old plane detached.
    pub ingress_ready_to_detached: Option<Duration>,
    /// Whether the old plane exited 0.
    pub old_exit_ok: bool,
    /// Body bytes that had arrived when the new plane was active.
    pub received_at_active: Option<u64>,
    /// Body bytes received in all.
    pub received: u64,
    /// Body bytes that differed from the origin's pattern.
    pub mismatched: u64,
    /// Longest gap between two reads that returned data, over the deploy
    /// (spawn to the old plane's exit, plus the read that ended the gap).
    pub gap_during: Option<Duration>,
    /// Longest gap outside the deploy.
    pub gap_outside: Option<Duration>,
    /// The download's MB/s, request to last byte.
    pub megabytes_per_second: Option<f64>,
    /// The first failure, if any.
    pub error: Option<String>,
}

impl BusyRun {
    /// Active → old exit, the longer of the bench's clock and the ingress's log.
    pub fn exit_after_activation(&self) -> Option<Duration> {
        let bench = self
            .start_to_exit
            .zip(self.start_to_active)
            .map(|(exit, active)| exit.saturating_sub(active));
        match (bench, self.ingress_ready_to_detached) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The download was still running when the new plane became active.
    pub fn was_busy(&self) -> bool {
        self.received_at_active.is_some_and(|n| n < DOWNLOAD)
    }
}

/// What the reader saw.
struct Reading {
    received: u64,
    mismatched: u64,
    /// (when a read returned data, the gap since the previous one).
    reads: Vec<(Instant, Duration)>,
    elapsed: Duration,
    error: Option<String>,
}

/// The byte at body offset `at` of the streaming origin's body.
fn expected(at: u64) -> u8 {
    ((at % CHUNK as u64) as usize * 131 % 251) as u8
}

async fn read_download(
    proxies: Proxies,
    origin: std::net::SocketAddr,
    received: Arc<AtomicU64>,
) -> Reading {
    let mut reading = Reading {
        received: 0,
        mismatched: 0,
        reads: Vec::with_capacity(8192),
        elapsed: Duration::ZERO,
        error: None,
    };
    let started = Instant::now();
    let outcome = async {
        let mut opened = client::open(&proxies, Mode::Socks5, origin).await?;
        let stream = &mut opened.stream;
        let request = client::request(
            &proxies,
            Mode::Socks5,
            origin,
            &format!("/stream/{DOWNLOAD}"),
        );
        stream.write_all(request.as_bytes()).await?;
        let mut buffer = Vec::with_capacity(4096);
        let head = client::read_head(stream, &mut buffer).await?;
        let pattern: Vec<u8> = (0..CHUNK as u64).map(expected).collect();
        let check = |mut bytes: &[u8], reading: &mut Reading| {
            while !bytes.is_empty() {
                let at = (reading.received % CHUNK as u64) as usize;
                let run = bytes.len().min(CHUNK - at);
                if bytes[..run] != pattern[at..at + run] {
                    let differing = bytes[..run]
                        .iter()
                        .zip(&pattern[at..])
                        .filter(|(a, b)| a != b);
                    reading.mismatched += differing.count() as u64;
                }
                reading.received += run as u64;
                bytes = &bytes[run..];
            }
            received.store(reading.received, Ordering::Relaxed);
        };
        check(&buffer[head.len..], &mut reading);
        let mut last = Instant::now();
        let mut chunk = vec![0u8; 256 * 1024];
        while reading.received < head.body {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            let now = Instant::now();
            reading.reads.push((now, now - last));
            last = now;
            check(&chunk[..n], &mut reading);
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(DOWNLOAD_BOUND, outcome).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => reading.error = Some(error.to_string()),
        Err(_) => reading.error = Some(format!("not done within {DOWNLOAD_BOUND:?}")),
    }
    reading.elapsed = started.elapsed();
    reading
}

/// Runs `runs` deploys, each under a download of its own, on the node's
/// current device plane (`devices.last()`), pushing each new plane.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    node: &mut Node,
    ingress: &Daemon,
    devices: &mut Vec<Daemon>,
    proxies: &Proxies,
    runs: usize,
) -> Vec<BusyRun> {
    let origin = match runtime.block_on(StreamOrigin::start()) {
        Ok(origin) => origin,
        Err(error) => {
            return vec![BusyRun {
                index: 1,
                error: Some(format!("starting the streaming origin: {error}")),
                ..BusyRun::default()
            }]
        }
    };
    let mut results = Vec::new();
    for index in 1..=runs {
        eprintln!("  deploy under one busy tunnel, run {index}");
        let mut run = BusyRun {
            index,
            ..BusyRun::default()
        };
        let status = node.status;
        let settled = metrics::wait_for(status, Duration::from_secs(15), |text| {
            metrics::value(text, "blipless_device_planes{state=\"draining\"}") == Some(0.0)
        });
        if !settled {
            run.error = Some("a device plane was still draining before the run".into());
        }
        let received = Arc::new(AtomicU64::new(0));
        let reader = runtime.spawn(read_download(
            proxies.clone(),
            origin.address,
            received.clone(),
        ));
        let waiting = Instant::now();
        while received.load(Ordering::Relaxed) < DEPLOY_AFTER
            && !reader.is_finished()
            && waiting.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let Some(old) = devices.last_mut() else {
            run.error = Some("no device plane".into());
            results.push(run);
            break;
        };
        let migrated_before = metrics::read(status, "blipless_tunnels_migrated_total");
        let log_offset = crate::logs::offset(&ingress.log);
        let seen_active = AtomicBool::new(false);
        let at_active = AtomicU64::new(0);
        let (new, timing) =
            watch::deploy_with(node, old, status, migrated_before.unwrap_or(0.0), &|| {
                if !seen_active.swap(true, Ordering::SeqCst) {
                    at_active.store(received.load(Ordering::Relaxed), Ordering::SeqCst);
                }
            });
        devices.push(new);
        run.start_to_exit = timing.exited.map(|t| t - timing.started);
        run.start_to_active = timing.active.map(|t| t - timing.started);
        run.old_exit_ok = timing.status.is_some_and(|s| s.success());
        if seen_active.load(Ordering::SeqCst) {
            run.received_at_active = Some(at_active.load(Ordering::SeqCst));
        }
        run.ingress_ready_to_detached = watch::ingress_interval(&ingress.log, log_offset);
        let reading = runtime.block_on(reader).ok();
        if let Some(reading) = reading {
            let window_end = timing.exited.unwrap_or(timing.started);
            let during =
                |at: Instant, gap: Duration| at >= timing.started && at - gap <= window_end;
            run.gap_during = reading
                .reads
                .iter()
                .filter(|(at, gap)| during(*at, *gap))
                .map(|r| r.1)
                .max();
            run.gap_outside = reading
                .reads
                .iter()
                .filter(|(at, gap)| !during(*at, *gap))
                .map(|r| r.1)
                .max();
            run.received = reading.received;
            run.mismatched = reading.mismatched;
            run.megabytes_per_second =
                Some(reading.received as f64 / reading.elapsed.as_secs_f64().max(1e-9) / 1e6);
            if run.error.is_none() {
                run.error = reading.error;
            }
        } else if run.error.is_none() {
            run.error = Some("the reader task failed".into());
        }
        if run.error.is_none() && !run.old_exit_ok {
            run.error = Some("the old device plane did not exit 0".into());
        }
        eprintln!(
            "    at active {} of {DOWNLOAD} · spawn→active {} · spawn→exit {} · ingress ready→detached {} · received {} · mismatched {} · gap during {}",
            run.received_at_active.map_or("?".into(), |n| n.to_string()),
            crate::format::millis(run.start_to_active),
            crate::format::millis(run.start_to_exit),
            crate::format::millis(run.ingress_ready_to_detached),
            run.received,
            run.mismatched,
            crate::format::millis(run.gap_during),
        );
        results.push(run);
    }
    runtime.block_on(async move { drop(origin) });
    results
}

/// The subsection: how it was measured and each run.
pub(super) fn render(out: &mut String, runs: &[BusyRun]) {
    use crate::format::{count, millis as ms};
    use std::fmt::Write as _;
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n### Deploy under one busy tunnel\n\n\
         On the same node, {} deploy(s), each in the middle of a download of {} MiB through one SOCKS5 tunnel \
         (`GET /stream/{DOWNLOAD}` from the bench's streaming origin, `bench/src/scenarios/bulk.rs`; the reader takes \
         256 KiB per read at full speed and checks every byte against the origin's pattern). The new `blipless-device` \
         is spawned once {} MiB of the body has arrived, so the relay is moving bytes both ways of its buffer when it is \
         told to hand over. *active → old exit* is the longer of the bench's clock (the first `/metrics` answer showing \
         a plane draining, to the old plane's exit) and the ingress's log (the new plane's Ready to the old one's \
         detach); *gap*: the longest time between two reads that returned data, over the deploy (spawn to the old \
         plane's exit) and outside it.\n",
        runs.len(),
        DOWNLOAD >> 20,
        DEPLOY_AFTER >> 20,
    );
    out.push_str("| run | body received when active | spawn → active | active → old exit | ingress: Ready → detached | bytes received | bytes differing | longest gap during / outside | download MB/s | old plane's exit |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n");
    for run in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
            run.index,
            run.received_at_active
                .map_or("—".into(), |n| format!("{:.1} MiB", n as f64 / 1048576.0)),
            ms(run.start_to_active),
            ms(run
                .start_to_exit
                .zip(run.start_to_active)
                .map(|(e, a)| e.saturating_sub(a))),
            ms(run.ingress_ready_to_detached),
            count(run.received as usize),
            count(run.mismatched as usize),
            ms(run.gap_during),
            ms(run.gap_outside),
            run.megabytes_per_second
                .map_or("—".into(), |m| format!("{m:.0}")),
            if run.old_exit_ok { "0" } else { "**not 0**" },
        );
    }
    for run in runs.iter().filter(|r| r.error.is_some()) {
        let _ = writeln!(
            out,
            "\nBusy run {}: `{}`",
            run.index,
            run.error.as_deref().unwrap_or("")
        );
    }
}

/// The subsection's row in the section's targets.
pub(super) fn target_row(out: &mut String, runs: &[BusyRun]) {
    use crate::format::{millis as ms, verdict, whole_millis};
    use std::fmt::Write as _;
    if runs.is_empty() {
        return;
    }
    let worst = runs
        .iter()
        .map(BusyRun::exit_after_activation)
        .collect::<Option<Vec<_>>>()
        .and_then(|all| all.into_iter().max());
    let sound = runs
        .iter()
        .all(|r| r.error.is_none() && r.was_busy() && r.mismatched == 0 && r.received == DOWNLOAD);
    let _ = writeln!(
        out,
        "| one busy tunnel (a {} MiB download across the deploy): the old plane exits within {} of the new one's activation, the download byte-exact | {} ({} of {} runs busy at activation, all bytes exact: {}) | {} |",
        DOWNLOAD >> 20,
        whole_millis(EXIT_TARGET),
        ms(worst),
        runs.iter().filter(|r| r.was_busy()).count(),
        runs.len(),
        if runs.iter().all(|r| r.mismatched == 0 && r.received == DOWNLOAD) { "yes" } else { "**no**" },
        if sound { worst.map(|w| verdict(w <= EXIT_TARGET)).unwrap_or("—") } else { "—" },
    );
}
