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
//!
//! Then, on the same node, deploys under one busy tunnel: a download in
//! full flow across the deploy (`busy.rs`).
//!
//! This file runs the section and each deploy; `tunnels.rs` opens, checks and
//! ping-pongs the tunnels, `watch.rs` times the deploy itself, `report.rs`
//! writes the section.

mod busy;
mod report;
mod tunnels;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::node::{Daemon, Node};
use tokio::net::TcpStream;

use crate::client::Proxies;
use crate::echo::EchoServer;
use crate::format::millis as ms;
use crate::metrics;
use crate::procfs::rss_kib;

pub use busy::BusyRun;
pub use report::render;
pub use tunnels::IN_FLIGHT;

/// Tunnels the deploy target is stated for.
pub const MIGRATE_TUNNELS: usize = 10_000;
/// Those tunnels migrated within this long.
pub const MIGRATE_TARGET: Duration = Duration::from_secs(1);
/// No tunnel stalls longer than this across a deploy.
pub const STALL_TARGET: Duration = Duration::from_millis(100);
/// Limit on opening all tunnels of one run.
const OPEN_BOUND: Duration = Duration::from_secs(40);
/// Limit on one deploy, spawn to the old plane's exit.
const DEPLOY_BOUND: Duration = Duration::from_secs(30);

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
    /// Deploys under one busy tunnel (a download across each).
    pub busy_runs: usize,
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
    /// Tunnels with at least one gap of [`STALL_TARGET`] or more.
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
    /// One entry per deploy under a busy tunnel.
    pub busy: Vec<BusyRun>,
    /// Why the section stopped early, if it did.
    pub aborted: Option<String>,
    /// Where the daemons' logs were copied.
    pub logs: Option<PathBuf>,
    /// Warnings and errors the section's daemons logged.
    pub daemon_warnings: usize,
}

/// A device plane holds two sockets per tunnel, besides a few dozen fds of
/// its own (store, device channel, runtime) and the 64 its fd budget keeps
/// back from new connections (`device-plane/src/conn/fd_budget.rs`,
/// `RESERVE`); this much is left for those.
const FD_HEADROOM: u64 = 160;

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
    let runtime = match crate::runtime(2) {
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
    // Run even when the sizes stopped at the section's time bound.
    section.busy = busy::run(
        &runtime,
        &mut node,
        &ingress,
        &mut devices,
        &proxies,
        plan.busy_runs,
    );
    section.daemon_warnings = crate::logs::warning_count(std::iter::once(&ingress).chain(&devices));
    section.logs = keep_logs(node.path());
    if let Some(logs) = &section.logs {
        eprintln!("  daemon logs of this section copied to {}", logs.display());
    }
    drop(runtime);
    drop(echo);
    section
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
    let settled = metrics::wait_for(status, Duration::from_secs(15), |text| {
        let open = metrics::value(text, "blipless_connections_open")
            .or_else(|| metrics::value(text, "blipless_devices_live"));
        metrics::value(text, "blipless_device_planes{state=\"draining\"}") == Some(0.0)
            && open == Some(0.0)
    });
    if !settled {
        run.note("the node did not settle (a plane draining or tunnels held) before the run");
    }

    // Open the tunnels.
    let (mut tunnels, open_errors, open_error) =
        runtime.block_on(tunnels::open_all(proxies, echo, size, OPEN_BOUND));
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
            tunnels::pinger(slot, stream, plan.cadence, offset, stop.clone()),
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
    let migrated_before = metrics::read(status, "blipless_tunnels_migrated_total");
    let log_offset = crate::logs::offset(&ingress.log);
    let (new, timing) = watch::deploy(node, old, status, migrated_before.unwrap_or(0.0));
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
        let deadline = tokio::time::Instant::now() + tunnels::ECHO_BOUND + Duration::from_secs(5);
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
            tunnels::gaps(samples.iter().filter(|s| {
                s.end < deploy_start && baseline_start.is_none_or(|b| s.end - s.gap >= b)
            }));
        run.during = tunnels::gaps(
            samples
                .iter()
                .filter(|s| s.end >= deploy_start && s.end - s.gap <= deploy_end),
        );
    }
    run.migrated = metrics::read(status, "blipless_tunnels_migrated_total")
        .zip(migrated_before)
        .map(|(after, before)| (after - before).max(0.0) as u64);
    run.ingress_ready_to_detached = watch::ingress_interval(&ingress.log, log_offset);
    run.rss_new_after = devices.last().and_then(|d| rss_kib(d.pid().as_raw()));

    // Every tunnel that was open carries one more echo.
    let (failed, check_error) = runtime.block_on(tunnels::check_all(&mut tunnels));
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

/// Copies the node's logs to a folder that outlives it.
fn keep_logs(dir: &Path) -> Option<PathBuf> {
    let target = std::env::temp_dir().join("blipless-bench-deploy-logs");
    let _ = std::fs::remove_dir_all(&target);
    crate::logs::copy_logs(dir, &target, false).ok()?;
    Some(target)
}
