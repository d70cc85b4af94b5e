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
//!
//! This file runs the section; `round.rs` is one round on a node of its own,
//! `report.rs` writes the section.

mod report;
mod round;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use crate::echo::EchoServer;
use crate::format::{micros, millis};
use crate::stats::p50;

pub use report::render;

/// Source addresses the nodes allocate from (all on loopback).
pub const SOURCES: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
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
    let runtime = match crate::runtime(2) {
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
                round::store_round(&runtime, store, plan.clients, echo.address, &mut run)
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
