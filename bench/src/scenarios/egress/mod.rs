//! The egress bench (`blipless-bench-egress`): egress through an upstream
//! SOCKS5 provider and through a WireGuard exit, beside direct, on one node
//! in one run:
//!
//! 1. **connection rate and latency** per route: new connections, each a
//!    SOCKS5 handshake with RFC 1929 credentials to blipless, CONNECT, a
//!    tiny `GET /` to the origin and close; one at a time, then from 8
//!    workers ([`rate`]);
//! 2. **one-tunnel throughput** per route: one large download through one
//!    SOCKS5 tunnel, with curl ([`throughput`]);
//! 3. **the stall of an inner TCP flow through the exit across device-plane
//!    deploys**: a wireguard-go client in the customer namespace, steered
//!    to the exit by its policy, reads a paced stream from the origin while
//!    the device plane is deployed five times; the longest gap between
//!    reads with data (target < 1 s) and the bytes lost (must be 0)
//!    ([`stall`]);
//! 4. **failover** between two SOCKS5 upstreams: a request loop through a
//!    client whose window holds both; the one it uses is killed; the time
//!    until the first success through the other and the failed requests,
//!    three times ([`failover`]).
//!
//! Topology: [`blipless_tests::exit_world`]'s customer, node, exit and
//! internet namespaces with wireguard-go as the exit; dante (Debian's
//! `danted`, no authentication) on the node namespace's loopback as the
//! SOCKS5 upstreams ([`world`]). Every client runs in the node namespace
//! (or, for the WireGuard client's stream, the customer namespace) as this
//! binary re-executed there ([`inside`]), so all three routes are measured
//! from the same place through the same ingress listener: only the route
//! differs.
//!
//! Its section of docs/BENCHMARKS.md lies between `<!-- egress:begin -->`
//! and `<!-- egress:end -->` (replaced when present, appended otherwise;
//! the rest of the file is left alone); [`report`] writes it.

mod failover;
pub mod inside;
mod rate;
mod report;
mod stall;
mod throughput;
mod world;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Instant;

use crate::report::Markers;

pub use report::render;

use world::World;

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- egress:begin -->",
    end: "<!-- egress:end -->",
};
/// The subnet number S (10.S.1–4.0/24); the namespaces are the bench's own.
const SUBNET: u8 = 75;
/// The bench's origin's port on the origin's host (the harness's is 8000).
const ORIGIN_PORT: u16 = 8001;
/// The target: no stall of an inner TCP flow through an exit over this
/// long across a deploy.
const STALL_TARGET: f64 = 1.0;

/// A way out of the node, as the bench measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The client straight to the origin from the node namespace: no
    /// blipless at all (a reference, not a route).
    NoProxy,
    /// Through blipless, policy `direct`.
    Direct,
    /// The client straight to the SOCKS5 upstream's dante (SOCKS5 without
    /// authentication), no blipless: what dante alone costs (a reference).
    DanteAlone,
    /// Through blipless and dante, policy `upstream:dante`.
    Socks,
    /// Through blipless and the wireguard-go exit, policy
    /// `upstream:wg-exit`.
    Exit,
}

impl Route {
    /// The reference first, then direct, then the upstreams.
    pub const ALL: [Route; 5] = [
        Route::NoProxy,
        Route::Direct,
        Route::DanteAlone,
        Route::Socks,
        Route::Exit,
    ];

    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Route::NoProxy => "no proxy (reference)",
            Route::Direct => "direct",
            Route::DanteAlone => "dante alone, no blipless (reference)",
            Route::Socks => "SOCKS5 upstream (dante)",
            Route::Exit => "WireGuard exit (wireguard-go)",
        }
    }
}

/// How much work the bench does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// New connections per route, phase and round.
    pub connections: u64,
    /// Warm-up connections before each measured batch (not counted).
    pub warmup: u64,
    /// Rounds of every route and phase, interleaved; the median rate counts.
    pub rounds: usize,
    /// Workers of the concurrent phase.
    pub workers: usize,
    /// Bytes per download.
    pub download: u64,
    /// Downloads per route, interleaved; the median counts.
    pub downloads: usize,
    /// Device-plane deploys under the stream through the exit.
    pub deploys: usize,
    /// Failovers.
    pub failovers: usize,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            connections: 500,
            warmup: 50,
            rounds: 3,
            workers: 8,
            download: 256 * 1024 * 1024,
            downloads: 3,
            deploys: 5,
            failovers: 3,
        }
    }

    /// A short run, to check the bench itself.
    pub fn quick() -> Self {
        Self {
            connections: 50,
            warmup: 10,
            rounds: 1,
            workers: 8,
            download: 32 * 1024 * 1024,
            downloads: 1,
            deploys: 2,
            failovers: 1,
        }
    }
}

/// Everything the run measured.
#[derive(Debug)]
pub struct Results {
    /// What the origin saw through each route before the measurements
    /// (route, seen, expected, how long that first request took in s).
    pub seen: Vec<(Route, String, String, f64)>,
    /// Section 1.
    rate: rate::RateResults,
    /// Section 2.
    throughput: Vec<throughput::Download>,
    /// Section 3.
    stall: stall::Stall,
    /// Section 4.
    failover: Vec<failover::Repeat>,
    /// Warning and error lines of the node's daemons.
    pub warnings: Vec<String>,
    /// Building the world, seconds.
    pub setup: f64,
}

/// Builds the world and measures it all; with `logs`, copies the daemons'
/// logs there at the end (also when a measurement failed).
pub fn measure(plan: Plan, logs: Option<&Path>) -> Result<Results, String> {
    let started = Instant::now();
    eprintln!("building the world (namespaces, dante x3, wireguard-go exit, node, client)");
    let mut world = World::build()?;
    let setup = started.elapsed().as_secs_f64();
    let measured = std::panic::catch_unwind(AssertUnwindSafe(|| run(&mut world, plan, setup)));
    if let Some(folder) = logs {
        match crate::logs::copy_logs(world.node.node.path(), folder, false) {
            Ok(()) => eprintln!("logs kept in {}", folder.display()),
            Err(error) => eprintln!("cannot keep the logs in {}: {error}", folder.display()),
        }
    }
    match measured {
        Ok(Err(error)) => Err(format!("{error}\n{}", world.diagnostics())),
        Ok(results) => results,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn run(world: &mut World, plan: Plan, setup: f64) -> Result<Results, String> {
    let mut seen = Vec::new();
    for route in Route::ALL {
        let asked = Instant::now();
        let got = world.whoami_via(world.proxy_url(route).as_deref())?;
        let took = asked.elapsed().as_secs_f64();
        let want = world.public(route);
        if got != want {
            return Err(format!(
                "{}: the origin saw {got}, not {want}",
                route.label()
            ));
        }
        seen.push((route, got, want, took));
    }
    eprintln!("1. connection rate and latency");
    let rate = rate::measure(world, plan)?;
    eprintln!("2. one-tunnel throughput");
    let throughput = throughput::measure(world, plan)?;
    eprintln!(
        "3. an inner TCP flow through the exit across {} device-plane deploys",
        plan.deploys
    );
    let stall = stall::measure(world, plan)?;
    eprintln!(
        "4. failover between two SOCKS5 upstreams, {} time(s)",
        plan.failovers
    );
    let failover = failover::measure(world, plan)?;
    Ok(Results {
        seen,
        rate,
        throughput,
        stall,
        failover,
        warnings: world.daemon_warnings(),
        setup,
    })
}
