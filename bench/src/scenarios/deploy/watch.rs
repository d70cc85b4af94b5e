//! Section 4's deploy itself, timed: spawning the new plane, polling for
//! the old one's exit, watching `/metrics` for the moment the new plane is
//! active, and the ingress's own account of the migration from its log.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blipless_tests::node::{Daemon, Node};

use super::DEPLOY_BOUND;
use crate::logs::{log_time, read_from, strip_ansi};
use crate::metrics::{self, MetricsClient};

/// How often the old plane's exit is looked for.
const EXIT_POLL: Duration = Duration::from_millis(1);
/// How often `/metrics` is read while waiting for the new plane to be active.
const METRICS_POLL: Duration = Duration::from_millis(2);

/// When things happened in one deploy, on the bench's clock.
pub(super) struct Timing {
    /// The new plane's spawn.
    pub started: Instant,
    /// `/metrics` first showed the old plane draining (or a tunnel migrated).
    pub active: Option<Instant>,
    /// The old plane's exit was seen.
    pub exited: Option<Instant>,
    /// The old plane's exit status (None: it did not exit in time).
    pub status: Option<ExitStatus>,
}

/// Spawns the new plane and waits (bounded) for the old one's exit, while
/// a second thread reads `/metrics` until the old plane shows as draining
/// (or a tunnel has migrated): the moment the new plane is active.
pub(super) fn deploy(
    node: &mut Node,
    old: &mut Daemon,
    status: SocketAddr,
    migrated_before: f64,
) -> (Daemon, Timing) {
    deploy_with(node, old, status, migrated_before, &|| {})
}

/// [`deploy`], calling `on_active` (on the watching thread) the moment the
/// new plane is seen active.
pub(super) fn deploy_with(
    node: &mut Node,
    old: &mut Daemon,
    status: SocketAddr,
    migrated_before: f64,
    on_active: &(dyn Fn() + Sync),
) -> (Daemon, Timing) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let active = watch_activation(status, migrated_before, &stop);
            if active.is_some() {
                on_active();
            }
            active
        });
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
            let draining = metrics::value(&text, "blipless_device_planes{state=\"draining\"}");
            let migrated = metrics::value(&text, "blipless_tunnels_migrated_total");
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
pub(super) fn ingress_interval(log: &Path, offset: u64) -> Option<Duration> {
    let text = read_from(log, offset);
    let mut ready = None;
    for line in text.lines().map(strip_ansi) {
        if ready.is_none() && line.contains("device plane ready") {
            ready = log_time(&line);
        } else if let Some(ready) = ready {
            if line.contains("device plane detached") || line.contains("device plane disconnected")
            {
                let detached = log_time(&line)?;
                let seconds = (detached - ready).rem_euclid(86_400.0);
                return Some(Duration::from_secs_f64(seconds));
            }
        }
    }
    None
}
