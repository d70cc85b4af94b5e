//! Keeping file descriptors in reserve, so that running out of them costs
//! one customer connection, never the device channel (issue 14: "EMFILE
//! never loses the channel").
//!
//! A connection the ingress hands over already has its fd in this process;
//! what it would need next (an egress socket, and fds a handover moves in)
//! is what runs out. So while fewer than [`FdBudget::reserve`] descriptors
//! are left below the open-file limit, a new connection is refused at once
//! (closed: the customer's proxy client sees the connection end and may
//! retry), counted, and logged at most once a second with how many. What is
//! left stays for migrations, the store and the channel. It recovers by
//! itself as connections close.
//!
//! Counting the open descriptors lists `/proc/self/fd`, which costs in
//! proportion to what is open: near the limit, with ten thousand tunnels,
//! doing it for every new connection made each one cost milliseconds. So a
//! count is reused for [`RECOUNT_EVERY`], with two descriptors added for
//! every connection opened since (what a tunnel holds: the customer's socket
//! and the egress socket; a second connect attempt in flight is what the
//! reserve is for), and none taken off for those closed: a count that errs,
//! errs toward refusing, and only until the next count.
//!
//! Descriptors held outside the connection tracker (a refusal being
//! answered at the connection cap, a WireGuard client's DNS-over-TCP
//! connection) are [`Held`]: each counts one on top of the connections, and
//! their holders ask [`FdBudget::admits_another`] before taking one, so they
//! never eat into the reserve either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Descriptors kept back from new connections, at most (a quarter of the
/// limit when the limit is small).
pub const RESERVE: u64 = 64;

/// How long a count of the open descriptors is reused.
pub const RECOUNT_EVERY: Duration = Duration::from_millis(100);

/// A count of the open descriptors, and the connections open at the time.
#[derive(Debug, Clone, Copy)]
struct Counted {
    at: Instant,
    open: u64,
    connections: u64,
    held: u64,
}

/// One descriptor held outside the connection tracker, counted by the
/// budget it came from until dropped.
#[derive(Debug)]
pub struct Held(Arc<AtomicU64>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open-file limit, what is kept back from new connections, and what
/// was refused.
#[derive(Debug)]
pub struct FdBudget {
    limit: u64,
    reserve: u64,
    /// Descriptors open when the budget was made (the runtime, the store,
    /// the channel, and whatever the process inherited): the cheap check
    /// counts connections on top of these.
    baseline: u64,
    refused: AtomicU64,
    logged: Mutex<Option<(Instant, u64)>>,
    counted: Mutex<Option<Counted>>,
    /// Descriptors [`Held`] now.
    held: Arc<AtomicU64>,
    /// The connections open at the last [`FdBudget::admits_connection`].
    last_connections: AtomicU64,
}

impl FdBudget {
    /// The budget under this process's soft open-file limit.
    pub fn from_rlimit() -> Self {
        let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        Self::new(limit)
    }

    /// A budget under `limit` descriptors, on top of those open now.
    pub fn new(limit: u64) -> Self {
        Self::with_baseline(limit, open_descriptors())
    }

    /// A budget under `limit` descriptors, `baseline` of them open already.
    fn with_baseline(limit: u64, baseline: u64) -> Self {
        Self {
            limit,
            reserve: RESERVE.min(limit / 4),
            baseline,
            refused: AtomicU64::new(0),
            logged: Mutex::new(None),
            counted: Mutex::new(None),
            held: Arc::new(AtomicU64::new(0)),
            last_connections: AtomicU64::new(0),
        }
    }

    /// Descriptors kept back from new connections.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Whether a new connection may be served, with `connections` open now.
    /// Cheap while far from the limit (each connection holds about two
    /// descriptors, counted as three, on top of the baseline and a margin of
    /// [`RESERVE`] for what opened since); near it, the process's open
    /// descriptors are counted, at most once per [`RECOUNT_EVERY`].
    pub fn admits(&self, connections: u64) -> bool {
        self.admits_counting(connections, Instant::now(), open_descriptors)
    }

    /// [`Self::admits`] for a new customer connection, with `connections`
    /// open now: the count [`Self::admits_another`] goes by.
    pub fn admits_connection(&self, connections: u64) -> bool {
        self.last_connections.store(connections, Ordering::Relaxed);
        self.admits(connections)
    }

    /// Whether a descriptor held outside the connection tracker may be
    /// taken now (with the connections open at the last
    /// [`Self::admits_connection`]).
    pub fn admits_another(&self) -> bool {
        self.admits_counting(
            self.last_connections.load(Ordering::Relaxed),
            Instant::now(),
            open_descriptors,
        )
    }

    /// Counts one descriptor held outside the connection tracker until the
    /// guard is dropped.
    pub fn hold(&self) -> Held {
        self.held.fetch_add(1, Ordering::Relaxed);
        Held(self.held.clone())
    }

    /// [`Self::admits`] at `now`, counting open descriptors with `open` when
    /// near the limit and the last count is stale.
    fn admits_counting(&self, connections: u64, now: Instant, open: impl FnOnce() -> u64) -> bool {
        let room = self.limit.saturating_sub(self.reserve);
        let held = self.held.load(Ordering::Relaxed);
        let estimate = connections
            .saturating_mul(3)
            .saturating_add(held)
            .saturating_add(self.baseline)
            .saturating_add(RESERVE);
        if estimate < room {
            return true;
        }
        let mut counted = self
            .counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = counted.filter(|c| now.saturating_duration_since(c.at) < RECOUNT_EVERY);
        let open_now = match fresh {
            Some(c) => c
                .open
                .saturating_add(connections.saturating_sub(c.connections).saturating_mul(2))
                .saturating_add(held.saturating_sub(c.held)),
            None => {
                let open = open();
                *counted = Some(Counted {
                    at: now,
                    open,
                    connections,
                    held,
                });
                open
            }
        };
        open_now < room
    }

    /// Counts a refused connection; logs at most once a second.
    pub fn refuse(&self, id: u64) {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut logged = self
            .logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.is_none_or(|(at, _)| at.elapsed() >= Duration::from_secs(1)) {
            let since = total - logged.map_or(0, |(_, seen)| seen);
            tracing::warn!(
                id,
                refused = since,
                total,
                limit = self.limit,
                reserve = self.reserve,
                "open-file limit nearly reached: new connections are refused until some close (raise LimitNOFILE / ulimit -n)"
            );
            *logged = Some((Instant::now(), total));
        }
    }

    /// Descriptors [`Held`] now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The descriptors this process has open now.
fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| entries.count() as u64)
        // Unknown: assume the worst only if /proc is missing entirely.
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_from_the_limit_everything_is_admitted_without_counting() {
        let budget = FdBudget::with_baseline(1_000_000, 20);
        assert!(budget.admits_counting(1000, Instant::now(), || unreachable!("counted")));
        assert_eq!(budget.reserve(), RESERVE);
    }

    #[test]
    fn near_the_limit_the_reserve_is_kept() {
        // 20 open at the start, a limit of 400: the reserve is 64, so up to
        // 335 open descriptors admit a connection and 336 do not.
        let budget = FdBudget::with_baseline(400, 20);
        let start = Instant::now();
        assert!(budget.admits_counting(100, start, || 335));
        let later = start + RECOUNT_EVERY;
        assert!(!budget.admits_counting(100, later, || 336));
        budget.refuse(7);
        budget.refuse(8);
        assert_eq!(budget.refused(), 2);
    }

    #[test]
    fn inherited_descriptors_do_not_fool_the_cheap_check() {
        // A process started by a CI runner may inherit hundreds of
        // descriptors: with 300 open at the start and a limit of 302, one
        // connection is not waved through; the count decides.
        let budget = FdBudget::with_baseline(302, 300);
        assert!(!budget.admits_counting(1, Instant::now(), || 300));
    }

    #[test]
    fn near_the_limit_a_count_is_reused_with_what_opened_since() {
        // A limit of 1000 (reserve 64): room below 936 descriptors.
        let budget = FdBudget::with_baseline(1000, 20);
        let start = Instant::now();
        assert!(budget.admits_counting(300, start, || 900));
        // Within RECOUNT_EVERY nothing is listed again: 900 + 2 × 17 new
        // connections is still under 936, 900 + 2 × 18 is not.
        let soon = start + RECOUNT_EVERY / 2;
        assert!(budget.admits_counting(317, soon, || unreachable!("recounted")));
        assert!(!budget.admits_counting(318, soon, || unreachable!("recounted")));
        // Fewer connections than at the count: the count stands.
        assert!(budget.admits_counting(200, soon, || unreachable!("recounted")));
        // Stale: counted again, and connections that closed meanwhile show.
        let later = start + RECOUNT_EVERY;
        assert!(budget.admits_counting(318, later, || 700));
    }

    #[test]
    fn the_live_count_sees_this_process() {
        // Whatever else the test threads hold, this process has stdin,
        // stdout and stderr open.
        assert!(open_descriptors() >= 3);
        let budget = FdBudget::new(3);
        assert!(!budget.admits(0));
    }

    #[test]
    fn descriptors_held_outside_the_tracker_count() {
        // A limit of 1000 (reserve 64, room below 936) and 20 at the start:
        // 280 connections (840) admit one more by the cheap check alone.
        let budget = FdBudget::with_baseline(1000, 20);
        let start = Instant::now();
        assert!(budget.admits_counting(280, start, || unreachable!("counted")));
        // 20 held descriptors take the estimate to the room: counted now.
        let held: Vec<Held> = (0..20).map(|_| budget.hold()).collect();
        assert!(budget.admits_counting(280, start, || 900));
        // Within RECOUNT_EVERY, descriptors held since the count add to it:
        // 900 + 35 is under 936, 900 + 36 is not.
        let more: Vec<Held> = (0..35).map(|_| budget.hold()).collect();
        let soon = start + RECOUNT_EVERY / 2;
        assert!(budget.admits_counting(280, soon, || unreachable!("recounted")));
        let one_more = budget.hold();
        assert!(!budget.admits_counting(280, soon, || unreachable!("recounted")));
        // Dropped, they count no more.
        drop((held, more, one_more));
        assert_eq!(budget.held.load(Ordering::Relaxed), 0);
        assert!(budget.admits_counting(280, start + RECOUNT_EVERY, || unreachable!("counted")));
    }

    #[test]
    fn a_small_limit_keeps_a_quarter() {
        assert_eq!(FdBudget::with_baseline(100, 0).reserve(), 25);
    }
}
