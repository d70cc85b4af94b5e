//! The chaos soak (`blipless-soak`, issue 14 item 7): mixed load on one
//! node while deploys, handoffs and SIGKILLs happen at random (seeded)
//! moments; then the checks, into docs/RELIABILITY.md.
//!
//! - The node (`world.rs`): one ingress, one device plane on a Redis of its
//!   own (persistent), an origin; with WireGuard (as root) inside the node
//!   namespace of a [`Topology`], the soak's own thread having entered it.
//! - The load (`load.rs`, `stream.rs`): short requests over SOCKS5, HTTP
//!   and HTTPS absolute-form, each failure with its time; long byte-checked
//!   echo tunnels over SOCKS5, HTTP CONNECT and HTTPS CONNECT; with
//!   WireGuard, a ping every 20 ms through the tunnel (`wg.rs`).
//! - The faults (`faults.rs`, `churn.rs`): deploy, handoff, SIGKILL of the
//!   device plane, of the ingress, of Redis, and client add/remove, one at a
//!   time with a random pause (every kind once per round, rounds shuffled),
//!   all drawn from one seed (`rng.rs`).
//! - What a killed process owns, the figures and the checks
//!   (`analysis.rs`, `checks.rs`); the document (`report.rs`).
//!
//! Before the faults a short warm-up load runs and stops; the daemons' fd
//! counts and RSS taken at rest after it are the baseline; the same figures
//! at rest after the load has stopped must be near it.

mod analysis;
mod checks;
mod churn;
mod faults;
mod load;
mod report;
mod rng;
mod stream;
mod wg;
mod world;

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::topology::Topology;
use blipless_tests::wg_peer::in_netns;

pub use analysis::{Check, Summary};
pub use checks::checks;
pub use report::render;
pub use rng::clock_seed;

use faults::{Fault, Stage};
use load::{Load, Records, StatusWatch};
use rng::{mix, Rng};
use wg::{Ping, Pings};
use world::{Figures, World};

/// The subnet number S of the soak's namespaces (10.S.1.0/24, 10.S.2.0/24).
const SUBNET: u8 = 93;
/// The warm-up load runs this long before the baseline.
const WARM_UP: Duration = Duration::from_secs(5);
/// Quiet before each set of fd and RSS figures.
const AT_REST: Duration = Duration::from_secs(3);
/// The pause before each fault, seconds (drawn from the range).
const GAP: (f64, f64) = (2.0, 6.0);
/// No fault starts later than this before the load ends.
const LAST_FAULT: f64 = 8.0;
/// Each echo tunnel's rate, bytes per second each way.
const STREAM_RATE: u64 = 512 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds of load and faults.
    pub seconds: u64,
    /// Seeds the schedule and the load.
    pub seed: u64,
    /// Whether to run the WireGuard stream (root); why not, if not.
    pub wireguard: Result<(), String>,
    /// Where to keep the daemons' logs.
    pub logs: PathBuf,
}

/// Seconds since the soak started, and the wall clock then (ping's and the
/// logs' timestamps go on the same axis).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    unix: f64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// Starts now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            unix: crate::logs::unix_now(),
        }
    }

    /// Now.
    pub fn now(&self) -> f64 {
        self.at(Instant::now())
    }

    /// An instant on this clock.
    pub fn at(&self, instant: Instant) -> f64 {
        match instant.checked_duration_since(self.start) {
            Some(after) => after.as_secs_f64(),
            None => -self.start.duration_since(instant).as_secs_f64(),
        }
    }

    /// A Unix time on this clock.
    pub fn from_unix(&self, unix: f64) -> f64 {
        unix - self.unix
    }

    /// A time on this clock as Unix time.
    pub fn to_unix(&self, at: f64) -> f64 {
        at + self.unix
    }
}

/// What the soak saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The load's plan (for the report).
    pub plan: Option<load::Plan>,
    /// Every fault, in order.
    pub faults: Vec<Fault>,
    /// The load's records, warm-up included.
    pub records: Records,
    /// The WireGuard ping (None without WireGuard, or when it failed).
    pub pings: Option<Pings>,
    /// `/status` every 100 ms during the load.
    pub status: Vec<(f64, bool)>,
    /// The daemons at rest after the warm-up.
    pub baseline: Vec<Figures>,
    /// The daemons at rest after the load.
    pub end: Vec<Figures>,
    /// Seconds the load and faults ran.
    pub soaked: f64,
    /// Warning and error lines in the daemons' logs.
    pub warnings: usize,
    /// Why the run stopped early, or a part of it failed.
    pub errors: Vec<String>,
}

/// Attributes the run's failures and works out its figures.
pub fn summarise(outcome: &Outcome) -> Summary {
    analysis::summarise(
        &outcome.faults,
        &outcome.records,
        outcome.pings.as_ref(),
        &outcome.status,
    )
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Runs the soak. With WireGuard it builds the namespaces and runs on a
/// thread inside the node's; they are removed when it ends, however it
/// ends, from this thread.
pub fn run(options: &Options) -> Result<Outcome, String> {
    let options = options.clone();
    if options.wireguard.is_err() {
        return std::panic::catch_unwind(AssertUnwindSafe(|| soak(options, None)))
            .map_err(panic_text)?;
    }
    let net = std::panic::catch_unwind(|| Topology::new(SUBNET))
        .map_err(|p| format!("building the namespaces: {}", panic_text(p)))?;
    let net = Arc::new(net);
    let node_ns = net.node_ns.name().to_string();
    let inside = net.clone();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        in_netns(&node_ns, move || soak(options, Some(inside)))
    }))
    .map_err(panic_text);
    // The last reference: the namespaces go from here, the host's namespace
    // (from inside the node's, `ip netns pids` would list itself).
    drop(net);
    outcome?
}

fn soak(options: Options, net: Option<Arc<Topology>>) -> Result<Outcome, String> {
    let clock = Clock::new();
    let runtime = crate::runtime(2).map_err(|e| format!("a runtime: {e}"))?;
    eprintln!("blipless-soak: starting the node");
    let mut world = World::build(net)?;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        drive(&mut world, runtime.handle(), &options, clock)
    }));
    world.keep_logs(&options.logs);
    eprintln!(
        "blipless-soak: the daemons' logs are in {}",
        options.logs.display()
    );
    runtime.shutdown_timeout(Duration::from_secs(2));
    result.map_err(panic_text)
}

fn drive(
    world: &mut World,
    runtime: &tokio::runtime::Handle,
    options: &Options,
    clock: Clock,
) -> Outcome {
    let mut outcome = Outcome::default();
    let proxies = world.proxies();
    let load_seed = mix(options.seed ^ 0x5eed);
    eprintln!("blipless-soak: warm-up ({WARM_UP:?})");
    let warm = load::Plan {
        workers: 2,
        pause: Duration::from_millis(20),
        streams: 1,
        rate: STREAM_RATE,
        stream_seconds: (2.0, 3.0),
        until: clock.now() + WARM_UP.as_secs_f64(),
        seed: load_seed,
    };
    let warming = Load::start(runtime, &proxies, world.origin, warm, clock);
    std::thread::sleep(WARM_UP);
    outcome.records = warming.finish(runtime, Duration::from_secs(30));
    std::thread::sleep(AT_REST);
    outcome.baseline = world.figures();

    let started = clock.now();
    let until = started + options.seconds as f64;
    let plan = load::Plan {
        workers: 3,
        pause: Duration::from_millis(25),
        streams: 2,
        rate: STREAM_RATE,
        stream_seconds: (15.0, 60.0),
        until,
        seed: load_seed,
    };
    outcome.plan = Some(plan);
    eprintln!(
        "blipless-soak: {} s of load and faults (seed {})",
        options.seconds, options.seed
    );
    let status = StatusWatch::start(runtime, world.status(), clock);
    let ping = match &world.net {
        Some(net) => match Ping::start(net, world.node.path(), clock) {
            Ok(ping) => Some(ping),
            Err(error) => {
                outcome.errors.push(format!("WireGuard ping: {error}"));
                None
            }
        },
        None => None,
    };
    let running = Load::start(runtime, &proxies, world.origin, plan, clock);
    let mut stage = Stage {
        world,
        runtime,
        clock,
    };
    outcome.faults = faults::schedule(
        &mut stage,
        &mut Rng::new(options.seed),
        GAP,
        until,
        LAST_FAULT,
    );
    let world = stage.world;
    if outcome.faults.last().is_some_and(|f| f.ok_at.is_none()) {
        outcome
            .errors
            .push("the node stopped answering /status with 200: the run stopped early".into());
    } else {
        let left = until - clock.now();
        if left > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(left));
        }
    }
    outcome.soaked = clock.now() - started;
    eprintln!("blipless-soak: stopping the load");
    outcome
        .records
        .extend(running.finish(runtime, Duration::from_secs(60)));
    outcome.status = status.finish(runtime);
    if let Some(ping) = ping {
        match ping.finish(clock) {
            Ok(pings) => {
                for fault in &mut outcome.faults {
                    let Some(killed) = fault.killed else { continue };
                    if let Some(after) = pings.answered_after(killed) {
                        if !fault.detail.is_empty() {
                            fault.detail.push_str("; ");
                        }
                        fault.detail.push_str(&format!(
                            "WireGuard answered {} after the kill",
                            crate::format::short_seconds(after)
                        ));
                    }
                }
                outcome.pings = Some(pings);
            }
            Err(error) => outcome.errors.push(format!("WireGuard ping: {error}")),
        }
    }
    std::thread::sleep(AT_REST);
    outcome.end = world.figures();
    outcome.warnings = crate::logs::warning_lines(world.node.path()).len();
    outcome
}
