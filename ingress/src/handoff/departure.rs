//! When an ingress that handed off may exit (docs/ARCHITECTURE.md, "Ingress
//! restart-by-handoff", step 7), as a state machine with no I/O: the
//! predecessor feeds it its successor's [`HandoffProgress`] reports and, on
//! every check, what its own sessions and device planes look like now.
//!
//! The predecessor may leave once nothing depends on it any more:
//! - **every WireGuard peer is settled**: it has moved (the successor has
//!   received data from it: a peer sends on its newest session, so it sends
//!   the predecessor nothing more) or it is idle (no authenticated packet to
//!   the predecessor for [`QUIET_BEFORE_EXIT`]);
//! - **every device plane that carries traffic has rejoined** the successor
//!   (until then its return packets come to the predecessor), and no
//!   connection the predecessor passed between planes waits for its
//!   confirmation;
//! - **its socket is drained**: nothing waits unread in its receive queue and
//!   no packet came for [`TAIL`], so datagrams a moved peer sent on the old
//!   session just before it moved have been read. A peer's datagrams follow
//!   one path in order, so by the time the successor has data from it on the
//!   new session, what it sent on the old one is in the predecessor's queue;
//!   the queue check holds the predecessor however long it takes to read them
//!   (a busy machine), the tail only allows for a reordering network.
//!
//! `drain.grace` bounds it all. A successor built before progress reports
//! existed sends none: every active peer then settles by being idle, as
//! before (3 s of quiet), and the planes by the same 3 s.

use std::collections::HashSet;
use std::time::Duration;

use blipless_protocol::channel::HandoffProgress;

/// A peer that has sent the predecessor nothing for this long is idle: its
/// next packet, if any, goes to whichever session it then has.
pub const QUIET_BEFORE_EXIT: Duration = Duration::from_secs(3);
/// The predecessor's own socket must have been quiet this long (and its
/// receive queue empty): what a peer sent on the old session just before it
/// moved is read, not dropped.
pub const TAIL: Duration = Duration::from_millis(30);
/// With no progress reports at all (a successor that sends none), device
/// planes count as rejoined after this long.
pub const PLANES_WITHOUT_REPORTS: Duration = QUIET_BEFORE_EXIT;

/// What the predecessor sees at one check.
#[derive(Debug)]
pub struct Look<'a> {
    /// Since the successor said it serves.
    pub elapsed: Duration,
    /// Milliseconds since the epoch, by the predecessor's WireGuard clock.
    pub now_ms: u64,
    /// Each peer heard from, by key, with its last authenticated packet to
    /// the predecessor (ms since the epoch).
    pub peers: &'a [([u8; 32], u64)],
    /// Process ids of the device planes attached here that carry traffic
    /// (active or draining).
    pub planes: &'a [u32],
    /// Connections passed between planes, not yet confirmed.
    pub migrations: usize,
    /// Datagrams wait unread in the predecessor's socket.
    pub queued: bool,
}

/// What the predecessor does after a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stay: something still depends on this ingress.
    Stay(Waiting),
    /// Leave: nothing depends on it any more.
    Settled,
    /// Leave: `drain.grace` is over, though something still did.
    GraceOver(Waiting),
}

/// What a predecessor is still waiting for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Peers neither moved nor idle.
    pub peers: usize,
    /// Device planes carrying traffic that have not rejoined the successor.
    pub planes: usize,
    /// Connections between planes not yet confirmed.
    pub migrations: usize,
    /// A packet came in within [`TAIL`], or some wait unread.
    pub tail: bool,
}

impl Waiting {
    fn is_nothing(&self) -> bool {
        *self == Waiting::default()
    }
}

/// A predecessor's departure: what its successor has reported so far.
#[derive(Debug)]
pub struct Departure {
    grace: Duration,
    moved: HashSet<[u8; 32]>,
    rejoined: HashSet<u32>,
    reports: usize,
}

impl Departure {
    /// A departure bounded by `grace` (from the successor serving).
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            moved: HashSet::new(),
            rejoined: HashSet::new(),
            reports: 0,
        }
    }

    /// The successor reports peers that moved and planes that rejoined.
    pub fn on_progress(&mut self, progress: HandoffProgress) {
        self.reports += 1;
        self.moved.extend(progress.moved);
        self.rejoined.extend(progress.planes);
    }

    /// How many peers the successor has reported moved.
    pub fn moved(&self) -> usize {
        self.moved.len()
    }

    /// Whether to stay or leave, given what the predecessor sees now.
    pub fn check(&self, look: &Look<'_>) -> Verdict {
        let quiet = QUIET_BEFORE_EXIT.as_millis() as u64;
        let tail = TAIL.as_millis() as u64;
        let mut waiting = Waiting {
            migrations: look.migrations,
            ..Waiting::default()
        };
        let mut newest = 0;
        for (key, last) in look.peers {
            if *last == 0 {
                continue;
            }
            newest = newest.max(*last);
            let silent = look.now_ms.saturating_sub(*last);
            if silent < quiet && !self.moved.contains(key) {
                waiting.peers += 1;
            }
        }
        waiting.tail = look.queued || (newest > 0 && look.now_ms.saturating_sub(newest) < tail);
        let planes_count = self.reports > 0 || look.elapsed < PLANES_WITHOUT_REPORTS;
        if planes_count {
            waiting.planes = look
                .planes
                .iter()
                .filter(|pid| !self.rejoined.contains(pid))
                .count();
        }
        if waiting.is_nothing() {
            Verdict::Settled
        } else if look.elapsed >= self.grace {
            Verdict::GraceOver(waiting)
        } else {
            Verdict::Stay(waiting)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;
    const GRACE: Duration = Duration::from_secs(120);

    fn look<'a>(
        elapsed_ms: u64,
        peers: &'a [([u8; 32], u64)],
        planes: &'a [u32],
        migrations: usize,
    ) -> Look<'a> {
        Look {
            elapsed: Duration::from_millis(elapsed_ms),
            now_ms: NOW,
            peers,
            planes,
            migrations,
            queued: false,
        }
    }

    fn moved(keys: &[[u8; 32]], planes: &[u32]) -> HandoffProgress {
        HandoffProgress {
            moved: keys.to_vec(),
            planes: planes.to_vec(),
        }
    }

    #[test]
    fn nothing_to_wait_for_leaves_at_once() {
        let departure = Departure::new(GRACE);
        assert_eq!(departure.check(&look(0, &[], &[], 0)), Verdict::Settled);
        // Peers never heard from, or idle for longer than the quiet time.
        let peers = [([1; 32], 0), ([2; 32], NOW - 3_000)];
        assert_eq!(departure.check(&look(5, &peers, &[], 0)), Verdict::Settled);
    }

    #[test]
    fn an_active_peer_holds_until_it_moves_then_the_tail_passes() {
        let mut departure = Departure::new(GRACE);
        let peers = [([1; 32], NOW - 10), ([2; 32], NOW - 500)];
        let Verdict::Stay(waiting) = departure.check(&look(20, &peers, &[], 0)) else {
            panic!("left with two active peers");
        };
        assert_eq!((waiting.peers, waiting.tail), (2, true));
        departure.on_progress(moved(&[[1; 32]], &[]));
        assert!(matches!(
            departure.check(&look(30, &peers, &[], 0)),
            Verdict::Stay(Waiting { peers: 1, .. })
        ));
        departure.on_progress(moved(&[[2; 32]], &[]));
        // Both moved, but a packet came within the tail.
        assert_eq!(
            departure.check(&look(40, &peers, &[], 0)),
            Verdict::Stay(Waiting {
                tail: true,
                ..Waiting::default()
            })
        );
        let later = [([1; 32], NOW - 100), ([2; 32], NOW - 600)];
        assert_eq!(
            departure.check(&look(130, &later, &[], 0)),
            Verdict::Settled
        );
    }

    #[test]
    fn datagrams_waiting_unread_hold_after_every_peer_moved() {
        let mut departure = Departure::new(GRACE);
        let peers = [([1; 32], NOW - 1_000)];
        departure.on_progress(moved(&[[1; 32]], &[]));
        let mut busy = look(50, &peers, &[], 0);
        busy.queued = true;
        assert_eq!(
            departure.check(&busy),
            Verdict::Stay(Waiting {
                tail: true,
                ..Waiting::default()
            })
        );
        assert_eq!(departure.check(&look(60, &peers, &[], 0)), Verdict::Settled);
    }

    #[test]
    fn a_peer_that_never_moves_settles_by_going_quiet() {
        let departure = Departure::new(GRACE);
        let peers = [([1; 32], NOW - 2_999)];
        assert!(matches!(
            departure.check(&look(100, &peers, &[], 0)),
            Verdict::Stay(Waiting { peers: 1, .. })
        ));
        let peers = [([1; 32], NOW - 3_000)];
        assert_eq!(
            departure.check(&look(101, &peers, &[], 0)),
            Verdict::Settled
        );
    }

    #[test]
    fn device_planes_hold_until_reported_on_the_successor() {
        let mut departure = Departure::new(GRACE);
        assert!(matches!(
            departure.check(&look(10, &[], &[77, 78], 0)),
            Verdict::Stay(Waiting { planes: 2, .. })
        ));
        departure.on_progress(moved(&[], &[77]));
        assert!(matches!(
            departure.check(&look(20, &[], &[77, 78], 0)),
            Verdict::Stay(Waiting { planes: 1, .. })
        ));
        // Long after, a plane that never rejoined still holds while the
        // successor reports (it may rejoin), up to the grace.
        assert!(matches!(
            departure.check(&look(60_000, &[], &[77, 78], 0)),
            Verdict::Stay(Waiting { planes: 1, .. })
        ));
        departure.on_progress(moved(&[], &[78]));
        assert_eq!(
            departure.check(&look(60_010, &[], &[77, 78], 0)),
            Verdict::Settled
        );
    }

    #[test]
    fn a_successor_that_reports_nothing_gets_the_old_quiet_rule() {
        let departure = Departure::new(GRACE);
        let peers = [([1; 32], NOW - 1_000)];
        assert!(matches!(
            departure.check(&look(2_000, &peers, &[5], 0)),
            Verdict::Stay(Waiting {
                peers: 1,
                planes: 1,
                ..
            })
        ));
        let quiet = [([1; 32], NOW - 3_000)];
        assert_eq!(
            departure.check(&look(3_000, &quiet, &[5], 0)),
            Verdict::Settled
        );
    }

    #[test]
    fn unconfirmed_migrations_hold() {
        let departure = Departure::new(GRACE);
        assert!(matches!(
            departure.check(&look(10, &[], &[], 3)),
            Verdict::Stay(Waiting { migrations: 3, .. })
        ));
    }

    #[test]
    fn the_grace_ends_the_wait_and_says_what_was_left() {
        let departure = Departure::new(Duration::from_secs(2));
        let peers = [([1; 32], NOW - 10)];
        assert_eq!(
            departure.check(&look(2_000, &peers, &[], 1)),
            Verdict::GraceOver(Waiting {
                peers: 1,
                planes: 0,
                migrations: 1,
                tail: true,
            })
        );
    }
}
