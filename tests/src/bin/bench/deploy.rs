//! Section 4: device-plane deploys while tunnels are open.
//!
//! On a node of its own, for each size N the bench opens N SOCKS5 tunnels
//! (at most [`IN_FLIGHT`] setting up at once) through the real ingress and
//! device plane to an echo server (a child process of the bench), each checked with one echo.
//! A subset spread evenly over the set keeps ping-ponging (16 bytes out,
//! the same 16 back, one round trip per tick of a fixed cadence) before and
//! through the deploy; the rest stay idle. Then a second `blipless-device`
//! starts with the same config; the bench times it from the spawn to the
//! old plane's exit, and from the new plane being active (the ingress's
//! `/metrics` shows the old one draining) to that exit. Afterwards every
//! tunnel carries one more echo, checked byte for byte.
//!
//! Every wait is bounded; the daemons' logs are copied out of the node's
//! temporary folder at the end so a slow or failed deploy can be read.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::node::{Daemon, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::client::{self, Mode, Proxies};
use crate::procfs::rss_kib;

/// Tunnels being set up (or checked) at once.
pub const IN_FLIGHT: usize = 256;
/// Limit on one echo (setup check, ping, final check).
const ECHO_BOUND: Duration = Duration::from_secs(10);
/// Limit on opening all tunnels of one run.
const OPEN_BOUND: Duration = Duration::from_secs(40);
/// Limit on one deploy, spawn to the old plane's exit.
const DEPLOY_BOUND: Duration = Duration::from_secs(30);
/// How often the old plane's exit is looked for.
const EXIT_POLL: Duration = Duration::from_millis(1);
/// How often `/metrics` is read while waiting for the new plane to be active.
const METRICS_POLL: Duration = Duration::from_millis(2);

/// How much the section does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Open tunnels per deploy, smallest first.
    pub sizes: [usize; 3],
    /// Deploys per size.
    pub runs: usize,
    /// Tunnels that ping-pong through the deploy (fewer if N is smaller).
    pub active: usize,
    /// One round trip per active tunnel per this long.
    pub cadence: Duration,
    /// Ping-pong measured before the deploy starts.
    pub baseline: Duration,
    /// Ping-pong kept up after the old plane's exit.
    pub tail: Duration,
    /// Runs that would start after this much time in the section are skipped.
    pub section_bound: Duration,
    /// Use the sizes as given even where the open-file limit cannot hold them.
    pub force_sizes: bool,
}

/// Gaps between consecutive completed round trips in one window.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gaps {
    /// Round trips completed.
    pub count: usize,
    /// 99th percentile gap (nearest rank).
    pub p99: Option<Duration>,
    /// Longest gap.
    pub max: Option<Duration>,
    /// Longest single round trip (write until the echo was back).
    pub max_round_trip: Option<Duration>,
    /// Tunnels with at least one gap of [`crate::report::STALL_TARGET`] or more.
    pub tunnels_stalled: usize,
}

/// What one deploy measured.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Tunnels asked for.
    pub tunnels: usize,
    /// Which run of this size (from 1).
    pub index: usize,
    /// Tunnels open and echoing before the deploy.
    pub opened: usize,
    /// Tunnels that ping-ponged through the deploy.
    pub active: usize,
    /// Spawn of the new plane until the old plane's exit.
    pub start_to_exit: Option<Duration>,
    /// Spawn until `/metrics` first showed the old plane draining.
    pub start_to_active: Option<Duration>,
    /// The ingress's log: the new plane's Ready until the old plane detached.
    pub ingress_ready_to_detached: Option<Duration>,
    /// `blipless_tunnels_migrated_total` grew by this much.
    pub migrated: Option<u64>,
    /// The old plane's exit status, as text ("timeout" if it did not exit).
    pub old_exit: String,
    /// Whether the old plane exited 0.
    pub old_exit_ok: bool,
    /// Device-plane RSS: the old one just before the deploy, KiB.
    pub rss_old_before: Option<u64>,
    /// Device-plane RSS: the new one after the deploy, KiB.
    pub rss_new_after: Option<u64>,
    /// Ping-pong before the deploy.
    pub before: Gaps,
    /// Ping-pong gaps overlapping the deploy (spawn to old exit).
    pub during: Gaps,
    /// Echoes that came back different from what was sent.
    pub mismatched: usize,
    /// Active tunnels whose ping-pong failed (error or timeout).
    pub ping_failures: usize,
    /// Tunnels that failed the check after the deploy (of `opened`).
    pub failed_after: usize,
    /// The first failure of any kind, for the report.
    pub first_error: Option<String>,
}

impl Run {
    /// The migration's length: the longer of active → old exit (the
    /// bench's clock) and Ready → old plane detached (the ingress's log,
    /// which ends once the ingress has forwarded the last Migrate).
    pub fn migration(&self) -> Option<Duration> {
        match (self.active_to_exit(), self.ingress_ready_to_detached) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Active → old exit from the bench's clock.
    pub fn active_to_exit(&self) -> Option<Duration> {
        Some(self.start_to_exit?.saturating_sub(self.start_to_active?))
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
    /// The hard open-file limit every process here runs under.
    pub fd_limit: Option<u64>,
    /// A size the limit could not hold, and the size run instead.
    pub capped: Option<(usize, usize)>,
    /// One entry per deploy.
    pub runs: Vec<Run>,
    /// Why the section stopped early, if it did.
    pub aborted: Option<String>,
    /// Where the daemons' logs were copied.
    pub logs: Option<PathBuf>,
    /// Warnings and errors the section's daemons logged.
    pub daemon_warnings: usize,
}

/// A device plane holds two sockets per tunnel, besides a dozen fds of its
/// own (store, device channel, runtime); this much is left for those.
const FD_HEADROOM: u64 = 64;

/// The most tunnels one device plane can hold under the hard open-file
/// limit (what the daemons raise their soft limit to without
/// CAP_SYS_RESOURCE), in tens.
fn tunnels_that_fit() -> (Option<u64>, usize) {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((_, hard)) => {
            let fit = hard.saturating_sub(FD_HEADROOM) / 2 / 10 * 10;
            (Some(hard), usize::try_from(fit).unwrap_or(usize::MAX))
        }
        Err(_) => (None, usize::MAX),
    }
}

/// Runs the section on a node of its own.
pub fn run(plan: Plan) -> Section {
    let mut section = Section {
        plan: Some(plan),
        ..Section::default()
    };
    let (fd_limit, fit) = tunnels_that_fit();
    section.fd_limit = fd_limit;
    let mut sizes = plan.sizes;
    if !plan.force_sizes {
        for size in &mut sizes {
            if *size > fit {
                eprintln!(
                    "  {size} tunnels need {} fds in one device plane; the hard open-file limit is {}: running {fit}",
                    2 * *size as u64 + FD_HEADROOM,
                    fd_limit.unwrap_or(0)
                );
                section.capped = Some((*size, fit));
                *size = fit;
            }
        }
    }
    let echo = match EchoServer::start() {
        Ok(echo) => echo,
        Err(error) => {
            section.aborted = Some(format!("starting the echo server: {error}"));
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
            section.aborted = Some(format!("starting a runtime: {error}"));
            return section;
        }
    };
    let mut node = Node::new("");
    let (ingress, device, client) = node.start();
    let proxies = Proxies::of(&node, &client);
    let mut devices = vec![device];
    let started = Instant::now();
    'sizes: for size in sizes {
        for index in 1..=plan.runs {
            if started.elapsed() > plan.section_bound {
                section.aborted = Some(format!(
                    "the section's time bound ({:?}) was reached; later runs skipped",
                    plan.section_bound
                ));
                break 'sizes;
            }
            eprintln!("  deploy with {size} open tunnels, run {index}");
            let outcome = one_deploy(
                &runtime,
                &mut node,
                &ingress,
                &mut devices,
                &proxies,
                echo.address,
                plan,
                size,
                index,
            );
            let fatal = outcome.fatal.clone();
            let run = outcome.run;
            eprintln!(
                "    opened {} · spawn→exit {} · active→exit {} · ingress ready→detached {} · migrated {} · exit {} · gap max before {} during {} · failed after {} · mismatched {}",
                run.opened,
                ms(run.start_to_exit),
                ms(run.active_to_exit()),
                ms(run.ingress_ready_to_detached),
                run.migrated.map_or("?".into(), |m| m.to_string()),
                run.old_exit,
                ms(run.before.max),
                ms(run.during.max),
                run.failed_after,
                run.mismatched,
            );
            if let Some(error) = &run.first_error {
                eprintln!("    first error: {error}");
            }
            section.runs.push(run);
            if let Some(fatal) = fatal {
                section.aborted = Some(fatal);
                break 'sizes;
            }
        }
    }
    section.daemon_warnings = std::iter::once(&ingress)
        .chain(&devices)
        .map(|d| {
            d.log_text()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .count()
        })
        .sum();
    section.logs = keep_logs(node.path());
    if let Some(logs) = &section.logs {
        eprintln!("  daemon logs of this section copied to {}", logs.display());
    }
    drop(runtime);
    drop(echo);
    section
}

fn ms(value: Option<Duration>) -> String {
    value.map_or("—".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
}

/// One run's figures, and why the section must stop if it must.
struct Outcome {
    run: Run,
    fatal: Option<String>,
}

#[allow(clippy::too_many_arguments)]
fn one_deploy(
    runtime: &tokio::runtime::Runtime,
    node: &mut Node,
    ingress: &Daemon,
    devices: &mut Vec<Daemon>,
    proxies: &Proxies,
    echo: SocketAddr,
    plan: Plan,
    size: usize,
    index: usize,
) -> Outcome {
    let mut run = Run {
        tunnels: size,
        index,
        ..Run::default()
    };
    let status = node.status;
    // Nothing left over from the previous run: no plane draining, no tunnel held.
    // (`blipless_connections_open`; ingresses before the devices change called it devices_live.)
    let settled = wait_metrics(status, Duration::from_secs(15), |text| {
        let open = metric(text, "blipless_connections_open")
            .or_else(|| metric(text, "blipless_devices_live"));
        metric(text, "blipless_device_planes{state=\"draining\"}") == Some(0.0) && open == Some(0.0)
    });
    if !settled {
        run.note("the node did not settle (a plane draining or tunnels held) before the run");
    }

    // Open the tunnels.
    let (mut tunnels, open_errors, open_error) =
        runtime.block_on(open_all(proxies, echo, size, OPEN_BOUND));
    run.opened = tunnels.iter().filter(|t| t.is_some()).count();
    if open_errors > 0 {
        run.note(format!(
            "{open_errors} tunnel(s) failed to open: {}",
            open_error.unwrap_or_default()
        ));
    }

    // Start the ping-pong on a spread-out subset.
    let stop = Arc::new(AtomicBool::new(false));
    let active = plan.active.min(run.opened);
    let chosen = spread(&tunnels, active);
    run.active = chosen.len();
    let mut pingers = tokio::task::JoinSet::new();
    for (order, &slot) in chosen.iter().enumerate() {
        let Some(stream) = tunnels[slot].take() else {
            continue;
        };
        let offset = plan
            .cadence
            .mul_f64(order as f64 / chosen.len().max(1) as f64);
        pingers.spawn_on(
            pinger(slot, stream, plan.cadence, offset, stop.clone()),
            runtime.handle(),
        );
    }
    std::thread::sleep(plan.baseline + plan.cadence);

    // Deploy.
    let Some(old) = devices.last_mut() else {
        run.note("no device plane");
        return Outcome {
            fatal: Some("no device plane".into()),
            run,
        };
    };
    run.rss_old_before = rss_kib(old.pid().as_raw());
    let migrated_before = read_metric(status, "blipless_tunnels_migrated_total");
    let log_offset = std::fs::metadata(&ingress.log).map_or(0, |m| m.len());
    let (new, timing) = deploy(node, old, status, migrated_before.unwrap_or(0.0));
    run.start_to_exit = timing.exited.map(|t| t - timing.started);
    run.start_to_active = timing.active.map(|t| t - timing.started);
    run.old_exit = match timing.status {
        Some(status) => status.to_string(),
        None => format!("did not exit within {DEPLOY_BOUND:?}"),
    };
    run.old_exit_ok = timing.status.is_some_and(|s| s.success());
    let mut fatal = None;
    if timing.status.is_none() {
        let text = format!(
            "the old device plane (pid {}) did not exit within {DEPLOY_BOUND:?} of the new one's start",
            old.pid()
        );
        run.note(text.clone());
        fatal = Some(text);
        old.kill();
    } else if !run.old_exit_ok {
        run.note(format!("the old device plane exited with {}", run.old_exit));
    }
    devices.push(new);

    // Keep the ping-pong going a little, then stop it and collect.
    std::thread::sleep(plan.tail);
    stop.store(true, Ordering::SeqCst);
    let ended = runtime.block_on(async {
        let mut ended = Vec::new();
        let deadline = tokio::time::Instant::now() + ECHO_BOUND + Duration::from_secs(5);
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, pingers.join_next()).await {
            if let Ok(end) = joined {
                ended.push(end);
            }
        }
        pingers.abort_all();
        ended
    });
    let mut samples = Vec::new();
    for end in ended {
        if let Some(error) = end.error {
            if error.kind() == std::io::ErrorKind::InvalidData {
                run.mismatched += 1;
            }
            run.ping_failures += 1;
            run.note(format!("tunnel {} ping-pong: {error}", end.slot));
        }
        tunnels[end.slot] = end.stream;
        samples.extend(end.samples);
    }
    if timing.status.is_some() {
        let deploy_start = timing.started;
        let deploy_end = timing.exited.unwrap_or(deploy_start);
        let baseline_start = deploy_start.checked_sub(plan.baseline);
        run.before =
            gaps(samples.iter().filter(|s| {
                s.end < deploy_start && baseline_start.is_none_or(|b| s.end - s.gap >= b)
            }));
        run.during = gaps(
            samples
                .iter()
                .filter(|s| s.end >= deploy_start && s.end - s.gap <= deploy_end),
        );
    }
    run.migrated = read_metric(status, "blipless_tunnels_migrated_total")
        .zip(migrated_before)
        .map(|(after, before)| (after - before).max(0.0) as u64);
    run.ingress_ready_to_detached = ingress_interval(&ingress.log, log_offset);
    run.rss_new_after = devices.last().and_then(|d| rss_kib(d.pid().as_raw()));

    // Every tunnel that was open carries one more echo.
    let (failed, check_error) = runtime.block_on(check_all(&mut tunnels));
    // Tunnels that were open but lost by a failed ping-pong count too.
    run.failed_after = failed + run.opened.saturating_sub(tunnels.iter().flatten().count());
    if let Some(error) = check_error {
        run.note(format!("after the deploy: {error}"));
    }
    runtime.block_on(async move { drop(tunnels) });
    Outcome { run, fatal }
}

/// `count` slots spread evenly over the open tunnels.
fn spread(tunnels: &[Option<TcpStream>], count: usize) -> Vec<usize> {
    let open: Vec<usize> = (0..tunnels.len())
        .filter(|&i| tunnels[i].is_some())
        .collect();
    if count == 0 || open.is_empty() {
        return Vec::new();
    }
    let step = open.len() as f64 / count as f64;
    let mut chosen: Vec<usize> = (0..count)
        .map(|k| open[((k as f64 + 0.5) * step) as usize % open.len()])
        .collect();
    chosen.dedup();
    chosen
}

/// When things happened in one deploy, on the bench's clock.
struct Timing {
    started: Instant,
    active: Option<Instant>,
    exited: Option<Instant>,
    status: Option<ExitStatus>,
}

/// Spawns the new plane and waits (bounded) for the old one's exit, while
/// a second thread reads `/metrics` until the old plane shows as draining
/// (or a tunnel has migrated): the moment the new plane is active.
fn deploy(
    node: &mut Node,
    old: &mut Daemon,
    status: SocketAddr,
    migrated_before: f64,
) -> (Daemon, Timing) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_activation(status, migrated_before, &stop));
        let started = Instant::now();
        let new = node.start_device();
        let deadline = started + DEPLOY_BOUND;
        let (exit, exited) = loop {
            if let Ok(Some(exit)) = old.child.try_wait() {
                break (Some(exit), Some(Instant::now()));
            }
            if Instant::now() >= deadline {
                break (None, None);
            }
            std::thread::sleep(EXIT_POLL);
        };
        stop.store(true, Ordering::SeqCst);
        let active = watcher.join().ok().flatten();
        (
            new,
            Timing {
                started,
                active,
                exited,
                status: exit,
            },
        )
    })
}

fn watch_activation(
    status: SocketAddr,
    migrated_before: f64,
    stop: &AtomicBool,
) -> Option<Instant> {
    let mut client = MetricsClient::new(status);
    let deadline = Instant::now() + DEPLOY_BOUND;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        if let Ok(text) = client.get() {
            let draining = metric(&text, "blipless_device_planes{state=\"draining\"}");
            let migrated = metric(&text, "blipless_tunnels_migrated_total");
            if draining.is_some_and(|d| d >= 1.0) || migrated.is_some_and(|m| m > migrated_before) {
                return Some(Instant::now());
            }
        }
        std::thread::sleep(METRICS_POLL);
    }
    None
}

/// The ingress's own account, from its log: the first "device plane ready"
/// after `offset`, to the first "device plane detached" (or disconnected) after it.
fn ingress_interval(log: &Path, offset: u64) -> Option<Duration> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(offset as usize..)?).into_owned();
    let mut ready = None;
    for line in text.lines().map(strip_ansi) {
        if ready.is_none() && line.contains("device plane ready") {
            ready = seconds_of_day(&line);
        } else if let Some(ready) = ready {
            if line.contains("device plane detached") || line.contains("device plane disconnected")
            {
                let detached = seconds_of_day(&line)?;
                let seconds = (detached - ready).rem_euclid(86_400.0);
                return Some(Duration::from_secs_f64(seconds));
            }
        }
    }
    None
}

/// The line without its terminal colour codes.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// "2026-11-30T12:27:01.123456Z ..." → seconds since midnight.
pub fn seconds_of_day(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.splitn(3, ':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

/// Copies the node's logs to a folder that outlives it.
fn keep_logs(dir: &Path) -> Option<PathBuf> {
    let target = std::env::temp_dir().join("blipless-bench-deploy-logs");
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).ok()?;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::copy(&path, target.join(entry.file_name()));
        }
    }
    Some(target)
}

// ---- tunnels ----

/// The 16 bytes a tunnel sends for round trip `seq`: its slot, the
/// sequence number and a check word, so a misplaced or stale echo shows.
fn message(slot: usize, seq: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    let slot = slot as u32;
    out[..4].copy_from_slice(&slot.to_be_bytes());
    out[4..12].copy_from_slice(&seq.to_be_bytes());
    let check = (u64::from(slot).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq.rotate_left(17)) as u32;
    out[12..].copy_from_slice(&check.to_be_bytes());
    out
}

/// One round trip, checked byte for byte (a difference is `InvalidData`).
async fn echo_once(stream: &mut TcpStream, slot: usize, seq: u64) -> std::io::Result<()> {
    let sent = message(slot, seq);
    let exchange = async {
        stream.write_all(&sent).await?;
        let mut got = [0u8; 16];
        stream.read_exact(&mut got).await?;
        Ok::<_, std::io::Error>(got)
    };
    let got = match tokio::time::timeout(ECHO_BOUND, exchange).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no echo within {ECHO_BOUND:?}"),
            ))
        }
    };
    if got != sent {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("echo differs: sent {sent:02x?}, got {got:02x?}"),
        ));
    }
    Ok(())
}

async fn open_one(proxies: &Proxies, echo: SocketAddr, slot: usize) -> std::io::Result<TcpStream> {
    let mut stream = client::open(proxies, Mode::Socks5, echo).await?.stream;
    echo_once(&mut stream, slot, 0).await?;
    Ok(stream)
}

/// Opens `count` tunnels, [`IN_FLIGHT`] at a time, within `bound`; returns
/// them by slot, the failures and the first failure's text.
async fn open_all(
    proxies: &Proxies,
    echo: SocketAddr,
    count: usize,
    bound: Duration,
) -> (Vec<Option<TcpStream>>, usize, Option<String>) {
    let deadline = tokio::time::Instant::now() + bound;
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut opening = tokio::task::JoinSet::new();
    for slot in 0..count {
        let (proxies, gate) = (proxies.clone(), gate.clone());
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let opened = tokio::time::timeout_at(deadline, open_one(&proxies, echo, slot)).await;
            let opened = opened.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "tunnel setup timed out",
                ))
            });
            (slot, opened)
        });
    }
    let mut tunnels: Vec<Option<TcpStream>> = (0..count).map(|_| None).collect();
    let (mut errors, mut first) = (0, None);
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok((slot, Ok(stream))) => tunnels[slot] = Some(stream),
            Ok((_, Err(error))) => {
                errors += 1;
                first.get_or_insert(error.to_string());
            }
            Err(error) => {
                errors += 1;
                first.get_or_insert(error.to_string());
            }
        }
    }
    (tunnels, errors, first)
}

/// One more echo on every open tunnel, [`IN_FLIGHT`] at a time; returns the
/// failures (those tunnels are closed) and the first failure's text.
async fn check_all(tunnels: &mut [Option<TcpStream>]) -> (usize, Option<String>) {
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut checking = tokio::task::JoinSet::new();
    for (slot, tunnel) in tunnels.iter_mut().enumerate() {
        let Some(mut stream) = tunnel.take() else {
            continue;
        };
        let gate = gate.clone();
        checking.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let checked = echo_once(&mut stream, slot, u64::MAX).await;
            (slot, stream, checked)
        });
    }
    let (mut failed, mut first) = (0, None);
    while let Some(joined) = checking.join_next().await {
        match joined {
            Ok((slot, stream, Ok(()))) => tunnels[slot] = Some(stream),
            Ok((slot, _, Err(error))) => {
                failed += 1;
                first.get_or_insert(format!("tunnel {slot}: {error}"));
            }
            Err(error) => {
                failed += 1;
                first.get_or_insert(error.to_string());
            }
        }
    }
    (failed, first)
}

/// One completed round trip of an active tunnel.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// The tunnel.
    slot: usize,
    /// When the echo was back.
    end: Instant,
    /// Since the tunnel's previous echo was back.
    gap: Duration,
    /// Since this round trip's write started.
    round_trip: Duration,
}

struct PingerEnd {
    slot: usize,
    stream: Option<TcpStream>,
    samples: Vec<Sample>,
    error: Option<std::io::Error>,
}

/// Ping-pongs on one tunnel, one round trip per `cadence` tick (a late
/// round trip delays the next tick rather than bunching), until `stop`.
async fn pinger(
    slot: usize,
    mut stream: TcpStream,
    cadence: Duration,
    offset: Duration,
    stop: Arc<AtomicBool>,
) -> PingerEnd {
    tokio::time::sleep(offset).await;
    let mut tick = tokio::time::interval(cadence);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples = Vec::with_capacity(1024);
    let mut last: Option<Instant> = None;
    let mut seq = 1u64;
    loop {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sent = Instant::now();
        if let Err(error) = echo_once(&mut stream, slot, seq).await {
            return PingerEnd {
                slot,
                stream: None,
                samples,
                error: Some(error),
            };
        }
        let end = Instant::now();
        if let Some(last) = last {
            samples.push(Sample {
                slot,
                end,
                gap: end - last,
                round_trip: end - sent,
            });
        }
        last = Some(end);
        seq += 1;
    }
    PingerEnd {
        slot,
        stream: Some(stream),
        samples,
        error: None,
    }
}

fn gaps<'a>(samples: impl Iterator<Item = &'a Sample>) -> Gaps {
    let mut gaps = Vec::new();
    let mut max_round_trip: Option<Duration> = None;
    let mut stalled = std::collections::HashSet::new();
    for sample in samples {
        gaps.push(sample.gap);
        if sample.gap >= crate::report::STALL_TARGET {
            stalled.insert(sample.slot);
        }
        max_round_trip =
            Some(max_round_trip.map_or(sample.round_trip, |m| m.max(sample.round_trip)));
    }
    gaps.sort_unstable();
    let p99 = (!gaps.is_empty()).then(|| {
        let rank = ((0.99 * gaps.len() as f64).ceil() as usize).clamp(1, gaps.len());
        gaps[rank - 1]
    });
    Gaps {
        count: gaps.len(),
        p99,
        max: gaps.last().copied(),
        max_round_trip,
        tunnels_stalled: stalled.len(),
    }
}

// ---- the echo server ----

/// The argument that makes the bench binary an echo server (see [`serve_echo`]).
pub const ECHO_SERVER_ARG: &str = "--echo-server";

/// Echoes whatever each connection sends. It is a child process (this same
/// binary, [`ECHO_SERVER_ARG`]): its sockets count against its own
/// open-file limit, not the bench's, and its CPU is its own. Killed when dropped.
#[derive(Debug)]
pub struct EchoServer {
    /// Where it listens.
    pub address: SocketAddr,
    child: std::process::Child,
}

impl EchoServer {
    /// Starts the child process and reads its address.
    pub fn start() -> std::io::Result<Self> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg(ECHO_SERVER_ARG)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let mut reader = std::io::BufReader::new(stdout);
            let _ = std::io::BufRead::read_line(&mut reader, &mut line);
        }
        match line.trim().parse::<SocketAddr>() {
            Ok(address) => Ok(Self { address, child }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(std::io::Error::other(format!(
                    "the echo server said {line:?} instead of its address"
                )))
            }
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The echo server's process: binds 127.0.0.1, prints its address, echoes
/// until its stdin closes (the bench ended, however it ended).
pub fn serve_echo() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("echo server: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let listener = match runtime.block_on(TcpListener::bind("127.0.0.1:0")) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("echo server: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let Ok(address) = listener.local_addr() else {
        return std::process::ExitCode::FAILURE;
    };
    runtime.spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(echo(stream));
                }
                // Out of fds, most likely: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    println!("{address}");
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    runtime.shutdown_background();
    std::process::ExitCode::SUCCESS
}

async fn echo(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

// ---- /metrics ----

/// A keep-alive HTTP/1.1 client for the ingress's `/metrics` (blocking,
/// for the deploy's watcher thread).
struct MetricsClient {
    address: SocketAddr,
    stream: Option<std::net::TcpStream>,
}

impl MetricsClient {
    fn new(address: SocketAddr) -> Self {
        Self {
            address,
            stream: None,
        }
    }

    fn get(&mut self) -> std::io::Result<String> {
        let result = self.try_get();
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn try_get(&mut self) -> std::io::Result<String> {
        if self.stream.is_none() {
            let stream =
                std::net::TcpStream::connect_timeout(&self.address, Duration::from_secs(2))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.set_write_timeout(Some(Duration::from_secs(2)))?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        let mut buffer = Vec::with_capacity(8 * 1024);
        let mut chunk = [0u8; 8 * 1024];
        let (head_len, body_len) = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]);
                let length = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, value)| value.trim().parse::<usize>().ok())
                    .ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "/metrics without Content-Length",
                        )
                    })?;
                break (end + 4, length);
            }
            if buffer.len() > 64 * 1024 {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        while buffer.len() < head_len + body_len {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&buffer[head_len..head_len + body_len]).into_owned())
    }
}

/// The value of `name` (with its labels, as exposed) in a metrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// One read of `/metrics`: the value of `name`.
pub fn read_metric(status: SocketAddr, name: &str) -> Option<f64> {
    metric(&MetricsClient::new(status).get().ok()?, name)
}

/// Reads `/metrics` every 20 ms until `condition` holds or `bound` passes.
fn wait_metrics(status: SocketAddr, bound: Duration, condition: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + bound;
    let mut client = MetricsClient::new(status);
    loop {
        if client.get().is_ok_and(|text| condition(&text)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
