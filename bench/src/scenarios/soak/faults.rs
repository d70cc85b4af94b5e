//! The soak's faults, one at a time at random (seeded) moments: a
//! device-plane deploy, an ingress handoff, a SIGKILL of the device plane,
//! of the ingress or of Redis (each followed by a new one, at once), and a
//! churn client added, used at once, removed and checked refused at once.
//! After each, `/status` is polled every 20 ms for the time until it
//! answers 200, from the fault's start (from the new ingress's start after
//! the ingress is killed; after the device plane is killed, a 200 counts
//! once the new plane is the active one).

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::churn::churn;
use super::load::first_ok;
use super::rng::Rng;
use super::world::{active_plane_pid, World};
use super::Clock;

/// How long each step of a fault may take before it counts as failed.
const STEP_BOUND: Duration = Duration::from_secs(60);
/// How long `/status` may take to answer 200 before the node counts as
/// lost (and the schedule stops).
const OK_BOUND: Duration = Duration::from_secs(30);
/// Redis stays down this long (seconds, drawn from the range).
const REDIS_DOWN: (f64, f64) = (0.5, 3.0);

/// What kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new device plane started beside the running one.
    Deploy,
    /// A new ingress started beside the running one.
    Handoff,
    /// SIGKILL of the device plane, then a new one.
    KillDevice,
    /// SIGKILL of the ingress, then a new one.
    KillIngress,
    /// SIGKILL of redis-server, then a restart.
    KillRedis,
    /// A client added, used, removed and refused.
    Churn,
}

impl Kind {
    /// Every kind, in the report's order.
    pub const ALL: [Kind; 6] = [
        Kind::Deploy,
        Kind::Handoff,
        Kind::KillDevice,
        Kind::KillIngress,
        Kind::KillRedis,
        Kind::Churn,
    ];

    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Deploy => "device-plane deploy",
            Kind::Handoff => "ingress handoff",
            Kind::KillDevice => "SIGKILL of the device plane",
            Kind::KillIngress => "SIGKILL of the ingress",
            Kind::KillRedis => "SIGKILL of Redis",
            Kind::Churn => "client add, use, remove",
        }
    }
}

/// One fault as it happened; times are clock seconds.
#[derive(Debug, Clone)]
pub struct Fault {
    /// What kind.
    pub kind: Kind,
    /// Its number in the run, from 1.
    pub number: usize,
    /// When it started.
    pub start: f64,
    /// When the SIGKILL was sent (kills only).
    pub killed: Option<f64>,
    /// The time to `/status` 200 is measured from here.
    pub reference: f64,
    /// The first `/status` 200 at or after `reference`.
    pub ok_at: Option<f64>,
    /// When it was over: the old process gone, the new one serving.
    pub end: f64,
    /// What happened, for the timeline.
    pub detail: String,
    /// What went wrong (empty: it did what it should).
    pub problems: Vec<String>,
}

impl Fault {
    /// Seconds from `reference` to the first 200.
    pub fn time_to_ok(&self) -> Option<f64> {
        self.ok_at.map(|at| (at - self.reference).max(0.0))
    }
}

/// What the faults act on and with.
#[derive(Debug)]
pub struct Stage<'a> {
    /// The node.
    pub world: &'a mut World,
    /// The load's runtime (for `/status` polls and the churn client's requests).
    pub runtime: &'a Handle,
    /// The run's clock.
    pub clock: Clock,
}

/// Runs faults at random moments until `until` (none starts later than
/// `margin` before it), or until the node no longer answers 200; prints a
/// line for each.
pub fn schedule(
    stage: &mut Stage<'_>,
    rng: &mut Rng,
    gap: (f64, f64),
    until: f64,
    margin: f64,
) -> Vec<Fault> {
    let mut faults: Vec<Fault> = Vec::new();
    let mut bag: Vec<Kind> = Vec::new();
    loop {
        let wait = rng.between(gap.0, gap.1);
        if stage.clock.now() + wait + margin > until {
            break;
        }
        std::thread::sleep(Duration::from_secs_f64(wait));
        if bag.is_empty() {
            // Every kind once per round, in a random order.
            bag = Kind::ALL.to_vec();
            rng.shuffle(&mut bag);
        }
        let Some(kind) = bag.pop() else { break };
        let fault = run(stage, rng, kind, faults.len() + 1);
        eprintln!(
            "  {:>6.1} s  #{:<3} {:<28} /status 200 after {}{}{}",
            fault.start,
            fault.number,
            kind.label(),
            fault
                .time_to_ok()
                .map_or("never".into(), crate::format::short_seconds),
            if fault.detail.is_empty() { "" } else { "; " },
            fault.detail
        );
        for problem in &fault.problems {
            eprintln!("          problem: {problem}");
        }
        let lost = fault.ok_at.is_none();
        faults.push(fault);
        if lost {
            eprintln!("blipless-soak: the node did not answer 200 again: stopping the faults");
            break;
        }
    }
    faults
}

/// One fault.
pub fn run(stage: &mut Stage<'_>, rng: &mut Rng, kind: Kind, number: usize) -> Fault {
    let now = stage.clock.now();
    let mut fault = Fault {
        kind,
        number,
        start: now,
        killed: None,
        reference: now,
        ok_at: None,
        end: now,
        detail: String::new(),
        problems: Vec::new(),
    };
    let status = stage.world.status();
    let clock = stage.clock;
    let watch = |runtime: &Handle| runtime.spawn(first_ok(status, clock, OK_BOUND));
    let ok = match kind {
        Kind::Deploy => {
            let ok = watch(stage.runtime);
            deploy(stage, &mut fault);
            ok
        }
        Kind::Handoff => {
            let ok = watch(stage.runtime);
            hand_off(stage, &mut fault);
            ok
        }
        Kind::KillDevice => {
            fault.killed = Some(stage.clock.now());
            stage.world.device.kill();
            fault.reference = stage.clock.now();
            stage.world.device = stage.world.node.start_device();
            // The ingress may not have seen the old plane's channel close
            // yet: a 200 counts once the new plane is the active one.
            let pid = u64::from(stage.world.device.child.id());
            let node = &stage.world.node;
            if !poll(OK_BOUND, || active_plane_pid(node) == Some(pid)) {
                fault.problems.push(format!(
                    "the new device plane was not active within {OK_BOUND:?}"
                ));
            }
            watch(stage.runtime)
        }
        Kind::KillIngress => {
            fault.killed = Some(stage.clock.now());
            stage.world.ingress.kill();
            // Measured from the new process's start: it must start first.
            fault.reference = stage.clock.now();
            let ok = watch(stage.runtime);
            stage.world.ingress = stage.world.node.spawn_ingress();
            ok
        }
        Kind::KillRedis => {
            fault.killed = Some(stage.clock.now());
            let ok = watch(stage.runtime);
            kill_redis(stage, rng, &mut fault);
            ok
        }
        Kind::Churn => {
            let ok = watch(stage.runtime);
            churn(stage, &mut fault);
            ok
        }
    };
    fault.ok_at = stage.runtime.block_on(ok).ok().flatten();
    if fault.ok_at.is_none() {
        fault
            .problems
            .push(format!("/status did not answer 200 within {OK_BOUND:?}"));
    }
    fault.end = stage.clock.now();
    fault
}

/// Polls `condition` every 20 ms for at most `bound`.
fn poll(bound: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn deploy(stage: &mut Stage<'_>, fault: &mut Fault) {
    let world = &mut *stage.world;
    let mut new = world.node.start_device();
    let pid = u64::from(new.child.id());
    let mut exited = None;
    let active = poll(STEP_BOUND, || {
        if let Ok(Some(status)) = new.child.try_wait() {
            exited = Some(status);
            return true;
        }
        active_plane_pid(&world.node) == Some(pid)
    });
    if let Some(status) = exited {
        fault
            .problems
            .push(format!("the new device plane exited with {status}"));
        return;
    }
    if !active {
        fault.problems.push(format!(
            "the new device plane was not active within {STEP_BOUND:?}"
        ));
    }
    let took = Instant::now();
    match world.device.wait_exit(STEP_BOUND) {
        Some(status) if status.success() => {
            fault.detail = format!(
                "the old plane left {} after the new one was active",
                crate::format::short_seconds(took.elapsed().as_secs_f64())
            );
        }
        Some(status) => fault
            .problems
            .push(format!("the old device plane exited with {status}")),
        None => fault.problems.push(format!(
            "the old device plane did not exit within {STEP_BOUND:?}"
        )),
    }
    world.device = new;
}

fn hand_off(stage: &mut Stage<'_>, fault: &mut Fault) {
    let world = &mut *stage.world;
    let started = Instant::now();
    let mut new = world.node.spawn_ingress();
    let mut outcome = None;
    poll(Duration::from_secs(90), || {
        if let Ok(Some(status)) = world.ingress.child.try_wait() {
            outcome = Some(Ok(status));
        } else if let Ok(Some(status)) = new.child.try_wait() {
            outcome = Some(Err(status));
        }
        outcome.is_some()
    });
    match outcome {
        Some(Ok(status)) if status.success() => {
            fault.detail = format!(
                "the old ingress left after {}",
                crate::format::short_seconds(started.elapsed().as_secs_f64())
            );
            world.ingress = new;
        }
        Some(Ok(status)) => {
            fault
                .problems
                .push(format!("the old ingress exited with {status}"));
            world.ingress = new;
        }
        Some(Err(status)) => fault
            .problems
            .push(format!("the new ingress exited with {status}")),
        None => {
            fault
                .problems
                .push("the old ingress did not exit within 90 s".into());
            world.ingress = new;
        }
    }
}

fn kill_redis(stage: &mut Stage<'_>, rng: &mut Rng, fault: &mut Fault) {
    let world = &mut *stage.world;
    world.redis.stop();
    let down = rng.between(REDIS_DOWN.0, REDIS_DOWN.1);
    std::thread::sleep(Duration::from_secs_f64(down));
    if std::panic::catch_unwind(AssertUnwindSafe(|| world.redis.restart())).is_err() {
        fault
            .problems
            .push("redis-server did not start again".into());
        return;
    }
    let back = poll(Duration::from_secs(20), || {
        world.node.ctl(&["client", "list"]).status.success()
    });
    if back {
        fault.detail = format!("down {}", crate::format::short_seconds(down));
    } else {
        fault
            .problems
            .push("`blipless-ctl client list` failed for 20 s after the restart".into());
    }
}
