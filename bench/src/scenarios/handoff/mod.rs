//! The ingress handoff bench (`blipless-bench-handoff`): ingress
//! restart-by-handoff under WireGuard traffic (issue 5). For 1, 100 and
//! 1,000 WireGuard peers it restarts the ingress by handoff three times while
//! every peer exchanges ICMP echoes with the origin, and measures:
//!
//! - the **handoff time**: from spawning the successor `blipless-ingress`
//!   until the old one has exited (status 0), with its parts from the
//!   daemons' own log timestamps (successor serving, device plane on the
//!   successor, the old ingress's last packet, its exit);
//! - per peer, the **longest gap** between two consecutive echo replies
//!   across the handoff (the customer-visible stall), and how many peers had
//!   one over 1 s;
//! - **lost echoes**: requests sent across the handoff with no reply within
//!   2 s.
//!
//! Topology: [`blipless_tests::topology::Topology`] (customer, node and
//! internet namespaces) with a blipless node in the node namespace, built as
//! [`blipless_tests::topology::WgWorld`] builds it but with a /16 WireGuard
//! pool (1,000 clients do not fit the tests' /24). With N peers, one is the
//! real client, wireguard-go ("alice", pinging the origin every 10 ms with
//! `ping -D`); the other N − 1 are in-process boringtun peers
//! ([`blipless_tests::wg_peer::TestPeer`], each on its own UDP socket in the
//! customer namespace), added with `blipless-ctl client add NAME --wg`. A few
//! threads drive them through epoll: each peer sends an echo every 10 ms
//! (every 100 ms above 100 peers, to keep 2 cores sane) and every datagram
//! it receives goes through boringtun's `decapsulate`, whose answers (the
//! handshake responses to the successor's call-back) are sent back.
//!
//! Its section of docs/BENCHMARKS.md lies between `<!-- handoff:begin -->`
//! and `<!-- handoff:end -->` (replaced when present, appended otherwise;
//! the rest of the file is left alone).
//!
//! This file holds the plan, the constants and one size's run; `world.rs`
//! builds the world and hands the ingress off, `traffic.rs` drives the peers
//! and reads the client's ping, `analysis.rs` measures the traces over each
//! handoff's window, `report.rs` and `explain.rs` write the section.

mod analysis;
mod explain;
mod report;
mod traffic;
mod world;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::report::Markers;

pub use report::render;

use analysis::{analyse, losses, Handoff, Losses};
use traffic::Traffic;
use world::{make_peers, World};

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- handoff:begin -->",
    end: "<!-- handoff:end -->",
};
/// The subnet number S (10.S.1.0/24, 10.S.2.0/24); the namespaces are the
/// bench's own, so it may equal another bench's.
const SUBNET: u8 = 91;
/// The WireGuard pool: room for 1,000 clients.
const POOL: &str = "10.64.0.0/16";
/// Traffic flows this long before the first handoff.
const WARM_UP: Duration = Duration::from_secs(2);
/// Between one old ingress's exit and the next spawn.
const PAUSE: Duration = Duration::from_secs(3);
/// Traffic goes on this long after the last old ingress exited.
const AFTER: Duration = Duration::from_secs(2);
/// An echo without a reply within this long is lost.
const LOST_AFTER: f64 = 2.0;
/// A handoff's window runs from the spawn until this long after the old
/// ingress exited: gaps and losses are counted within it.
const WINDOW_AFTER_EXIT: f64 = 1.0;
/// Gaps before the spawn, for comparison, are taken over this long.
const BEFORE: f64 = 2.0;
/// The target: no customer-visible stall over this long.
const STALL_TARGET: f64 = 1.0;
/// The target (issue 13): spawn → old exit under this long with 1,000 peers.
const HANDOFF_TARGET: f64 = 0.5;
/// The wireguard-go client's ping interval.
const PING_INTERVAL: f64 = 0.01;
/// Peers one driving thread serves at most.
const PEERS_PER_THREAD: usize = 500;

/// How much work the bench does.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// Peer counts, one world each.
    pub sizes: &'a [usize],
    /// Handoffs per size.
    pub runs: usize,
}

impl Plan<'_> {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            sizes: &[1, 100, 1000],
            runs: 3,
        }
    }

    /// 1 and 10 peers, one handoff each, to check the bench itself.
    pub fn quick() -> Self {
        Self {
            sizes: &[1, 10],
            runs: 1,
        }
    }
}

/// How often each boringtun peer sends an echo with `peers` peers.
fn echo_interval(peers: usize) -> Duration {
    if peers > 100 {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(10)
    }
}

/// Seconds since the bench started, and the wall clock at that moment (to
/// place log and ping timestamps on the same axis).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    unix: f64,
}

impl Clock {
    /// Starts now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            unix: crate::logs::unix_now(),
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn of_unix(&self, unix: f64) -> f64 {
        unix - self.unix
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// A log's timestamped lines (colours stripped) with their times on `clock`.
fn timed_lines(text: &str, clock: Clock) -> Vec<(f64, String)> {
    crate::logs::timed_lines(text)
        .into_iter()
        .map(|(at, line)| (clock.of_unix(at), line))
        .collect()
}

/// Everything one size measured.
#[derive(Debug, Default)]
pub struct SizeResult {
    peers: usize,
    interval: Duration,
    handoffs: Vec<Handoff>,
    /// Over the whole traffic period (handoffs and the time between).
    total: Losses,
    send_failures: usize,
    setup: Duration,
    warnings: Vec<String>,
}

/// Copies the node's daemon logs and the client's ping output into
/// `logs/peers-N` (the node's folder goes away with the world).
fn keep_logs(world: &World, knobs: &Knobs, peers: usize) {
    let Some(logs) = &knobs.logs else { return };
    let folder = logs.join(format!("peers-{peers}"));
    match crate::logs::copy_logs(world.node.path(), &folder, true) {
        Ok(()) => eprintln!("  logs kept in {}", folder.display()),
        Err(error) => eprintln!("  cannot keep the logs in {}: {error}", folder.display()),
    }
}

/// Settings beside the plan.
#[derive(Debug, Default)]
pub struct Knobs {
    /// Keep the daemons' logs here.
    pub logs: Option<PathBuf>,
    /// `wireguard.handshake_limit` for the node (default: the config's).
    pub handshake_limit: Option<usize>,
}

/// One size: a world of `peers` peers, traffic, `runs` handoffs, the traces
/// measured over each handoff's window.
pub fn measure_size(
    peers: usize,
    runs: usize,
    clock: Clock,
    knobs: &Knobs,
) -> Result<SizeResult, String> {
    let setup = Instant::now();
    eprintln!("{peers} peer(s): building the world");
    let (mut world, credentials) = World::build(peers, knobs)?;
    let test_peers = make_peers(world.net.customer.name(), credentials)?;
    let interval = echo_interval(peers);
    let setup = setup.elapsed();
    let traffic = Traffic::start(&world, test_peers, interval, clock)?;
    std::thread::sleep(WARM_UP);
    let mut handoffs: Vec<Handoff> = Vec::new();
    for run in 1..=runs {
        if let Some(previous) = handoffs.last_mut() {
            world.successor_figures(previous, clock);
        }
        let handoff = match world::hand_off(&mut world, clock, peers, run) {
            Ok(handoff) => handoff,
            Err(error) => {
                keep_logs(&world, knobs, peers);
                return Err(format!("{error}\n{}", world.diagnostics()));
            }
        };
        eprintln!(
            "  handoff {run}: old ingress exited {:.3} s after the spawn (successor serving at {})",
            handoff.exit,
            handoff
                .serving
                .map_or("?".into(), |s| format!("{:.3} s", s))
        );
        handoffs.push(handoff);
        std::thread::sleep(if run < runs { PAUSE } else { AFTER });
    }
    if let Some(last) = handoffs.last_mut() {
        world.successor_figures(last, clock);
    }
    let stopped = traffic.stop(clock);
    keep_logs(&world, knobs, peers);
    let (traces, alice) = stopped?;
    analyse(&mut handoffs, &traces, &alice);
    let mut result = SizeResult {
        peers,
        interval,
        handoffs,
        setup,
        warnings: world.daemon_warnings(),
        ..SizeResult::default()
    };
    for trace in traces.iter().chain(std::iter::once(&alice)) {
        result.total.add(&losses(trace, 0.0, f64::INFINITY));
        result.send_failures += trace.send_failures;
    }
    for handoff in &result.handoffs {
        eprintln!(
            "  handoff {}: longest gap {:.0} ms (wireguard-go {:.0} ms), {} peer(s) over 1 s, {} of {} echoes lost",
            handoff.run,
            handoff.longest_gap() * 1000.0,
            handoff.alice_gap * 1000.0,
            handoff.over_target(),
            handoff.all_lost(),
            handoff.all_sent()
        );
    }
    Ok(result)
}
