//! The fleet bench (`blipless-bench-fleet`): the store on one Redis, on a
//! Sentinel-managed master and on a Redis Cluster, each started for the bench
//! from Debian's `redis-server` (`blipless_store::testing`), on loopback:
//!
//! 1. **store operations** from one node ([`ops`]): client adds one at a time,
//!    usage adds one at a time (as a device plane's flush sends them) and 32 at
//!    once, client reads 32 at once (a device plane catching up), and the memory
//!    Redis holds per client;
//! 2. **fleet-wide visibility** ([`visibility`]): three nodes (release daemons)
//!    on one store; a client added with `blipless-ctl` on one is timed, from the
//!    moment `client add` returns, until it can log in on both others; removal
//!    likewise (until refused);
//! 3. **failover** ([`failover`]): on Sentinel and Cluster, a master SIGKILLed
//!    while usage is added every 10 ms (the time until writes resume), and the
//!    end-to-end run of `blipless_tests::fleet::failover_under_load` (curl load
//!    through SOCKS5 and HTTP CONNECT, clients added): requests failed (must be
//!    0) and whether the stored usage is exact.
//!
//! Authentication never touches the store (the device plane holds every client
//! in memory and follows the change feed), so none of this is on a request's
//! path. Its section of docs/BENCHMARKS.md lies between `<!-- fleet:begin -->`
//! and `<!-- fleet:end -->`; [`report`] writes it.

mod failover;
mod ops;
mod report;
mod topology;
mod visibility;

use crate::report::Markers;

pub use report::render;
pub use topology::Kind;

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- fleet:begin -->",
    end: "<!-- fleet:end -->",
};

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Clients added (and usage adds per round) in the store measurements.
    pub clients: usize,
    /// Operations in each concurrent measurement.
    pub concurrent_ops: usize,
    /// Clients added (and removed) across the three nodes.
    pub visibility_adds: usize,
    /// Store-level failovers per replicated topology.
    pub failovers: usize,
}

impl Plan {
    /// The full run.
    pub fn full() -> Self {
        Self {
            clients: 500,
            concurrent_ops: 5000,
            visibility_adds: 30,
            failovers: 3,
        }
    }

    /// A quick check of the bench itself.
    pub fn quick() -> Self {
        Self {
            clients: 50,
            concurrent_ops: 500,
            visibility_adds: 5,
            failovers: 1,
        }
    }
}

/// Everything measured, per topology.
#[derive(Debug)]
pub struct Results {
    /// Store operations, per topology.
    pub ops: Vec<(Kind, ops::Ops)>,
    /// Visibility across three nodes, per topology.
    pub visibility: Vec<(Kind, visibility::Visibility)>,
    /// Failovers, per replicated topology.
    pub failovers: Vec<(Kind, failover::Failovers)>,
}

/// Runs every measurement (panics on what it cannot set up; every process it
/// started is killed as the panic unwinds).
pub fn measure(plan: Plan) -> Results {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut results = Results {
        ops: Vec::new(),
        visibility: Vec::new(),
        failovers: Vec::new(),
    };
    for kind in Kind::ALL {
        eprintln!("fleet bench: store operations on {}", kind.name());
        let measured = runtime.block_on(ops::measure(kind, plan));
        results.ops.push((kind, measured));
    }
    for kind in Kind::ALL {
        eprintln!(
            "fleet bench: visibility across three nodes on {}",
            kind.name()
        );
        results
            .visibility
            .push((kind, visibility::measure(kind, plan)));
    }
    for kind in [Kind::Sentinel, Kind::Cluster] {
        eprintln!("fleet bench: failover on {}", kind.name());
        results
            .failovers
            .push((kind, failover::measure(&runtime, kind, plan)));
    }
    results
}
