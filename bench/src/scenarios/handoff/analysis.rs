//! The handoff bench's measures of a trace over a handoff's window: the
//! longest gap between replies, the echoes lost, and what one handoff
//! measured in all.

use super::traffic::Trace;
use super::{BEFORE, LOST_AFTER, STALL_TARGET, WINDOW_AFTER_EXIT};

/// The longest time between two consecutive replies that overlaps
/// `[from, to]` (up to `to` when no reply came after it).
pub(super) fn longest_gap(replies: &[f64], from: f64, to: f64) -> f64 {
    let mut longest: f64 = 0.0;
    for pair in replies.windows(2) {
        if pair[1] >= from && pair[0] <= to {
            longest = longest.max(pair[1] - pair[0]);
        }
    }
    match replies.iter().rev().find(|at| **at <= to) {
        Some(last) if !replies.iter().any(|at| *at > to) => longest.max(to - last),
        None => to - from,
        _ => longest,
    }
}

/// The longest gap between two replies both within `[from, to]`.
pub(super) fn longest_gap_within(replies: &[f64], from: f64, to: f64) -> f64 {
    replies
        .windows(2)
        .filter(|pair| pair[0] >= from && pair[1] <= to)
        .map(|pair| pair[1] - pair[0])
        .fold(0.0, f64::max)
}

/// Echo requests sent within a window and what became of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Losses {
    /// Requests sent.
    pub sent: usize,
    /// Never answered.
    pub never: usize,
    /// Answered after more than [`LOST_AFTER`].
    pub late: usize,
    /// Send times of the first and last never answered.
    pub never_from: f64,
    /// See `never_from`.
    pub never_to: f64,
    /// The longest round trip of an answered request.
    pub longest_rtt: f64,
}

impl Default for Losses {
    fn default() -> Self {
        Self {
            sent: 0,
            never: 0,
            late: 0,
            never_from: f64::INFINITY,
            never_to: f64::NEG_INFINITY,
            longest_rtt: 0.0,
        }
    }
}

impl Losses {
    /// Lost: no reply within [`LOST_AFTER`].
    pub fn lost(&self) -> usize {
        self.never + self.late
    }

    pub fn add(&mut self, other: &Losses) {
        self.sent += other.sent;
        self.never += other.never;
        self.late += other.late;
        self.never_from = self.never_from.min(other.never_from);
        self.never_to = self.never_to.max(other.never_to);
        self.longest_rtt = self.longest_rtt.max(other.longest_rtt);
    }
}

/// The requests sent within `[from, to]`: how many, how many never
/// answered, how many answered late.
pub(super) fn losses(trace: &Trace, from: f64, to: f64) -> Losses {
    let mut losses = Losses::default();
    for (at, answer) in trace.sent.iter().zip(&trace.answered) {
        if at.is_nan() || *at < from || *at > to {
            continue;
        }
        losses.sent += 1;
        match answer {
            None => {
                losses.never += 1;
                losses.never_from = losses.never_from.min(*at);
                losses.never_to = losses.never_to.max(*at);
            }
            Some(rtt) => {
                losses.longest_rtt = losses.longest_rtt.max(*rtt);
                if *rtt > LOST_AFTER {
                    losses.late += 1;
                }
            }
        }
    }
    losses
}

/// What one handoff measured. Times are seconds since the spawn.
#[derive(Debug, Clone, Default)]
pub(super) struct Handoff {
    /// Peers in the world.
    pub peers: usize,
    /// Which handoff of the size (from 1).
    pub run: usize,
    /// Spawn → the old ingress exited (status 0).
    pub exit: f64,
    /// Spawn → the successor logged "ingress serving".
    pub serving: Option<f64>,
    /// The successor's `blipless_ingress_handoff_duration_seconds`
    /// (connecting to the predecessor → serving).
    pub handoff_metric: Option<f64>,
    /// Spawn → the device plane was ready on the successor.
    pub device_moved: Option<f64>,
    /// Spawn → the old ingress's last packet of its own sessions (its exit
    /// minus the quiet it logged).
    pub last_old_packet: Option<f64>,
    /// The old ingress's quiet period at exit.
    pub quiet: Option<f64>,
    /// The successor's call-back: how long, how many peers, how many did
    /// not answer.
    pub call_back: Option<f64>,
    /// Peers called back ("calling_back" in the successor's log).
    pub called: Option<usize>,
    /// Peers that never answered the call-back.
    pub unanswered: Option<usize>,
    /// boringtun peers: per-peer longest gap across the window (sorted).
    pub gaps: Vec<f64>,
    /// boringtun peers: longest gap within the 2 s before the spawn.
    pub gap_before: f64,
    /// boringtun peers: echoes across the window.
    pub losses: Losses,
    /// wireguard-go: longest gap, echoes.
    pub alice_gap: f64,
    /// wireguard-go: longest gap within the 2 s before the spawn.
    pub alice_gap_before: f64,
    /// wireguard-go: echoes across the window.
    pub alice_losses: Losses,
    /// The successor's WireGuard counters over its time as the serving one.
    pub cookie_replies: f64,
    /// Handshake initiations that reached the customer namespace from the
    /// node (the call-back's), from the spawn until the next spawn (or the
    /// end): counted by nftables there.
    pub initiations: Option<u64>,
    /// The nftables counter at the spawn.
    pub initiations_at_spawn: Option<u64>,
    /// `blipless_wg_handshakes_total` of the successor.
    pub handshakes: f64,
    /// `blipless_wg_dropped_total` of the successor, by reason (non-zero).
    pub drops: Vec<(String, f64)>,
    /// Window bounds on the bench clock, for the analysis after the fact.
    pub spawned_at: f64,
    /// See `spawned_at`.
    pub exited_at: f64,
}

impl Handoff {
    pub fn longest_gap(&self) -> f64 {
        self.gaps.last().copied().unwrap_or(0.0).max(self.alice_gap)
    }

    pub fn over_target(&self) -> usize {
        self.gaps.iter().filter(|g| **g > STALL_TARGET).count()
            + usize::from(self.alice_gap > STALL_TARGET)
    }

    pub fn all_losses(&self) -> Losses {
        let mut all = self.losses;
        all.add(&self.alice_losses);
        all
    }

    pub fn all_lost(&self) -> usize {
        self.all_losses().lost()
    }

    pub fn all_sent(&self) -> usize {
        self.all_losses().sent
    }
}

pub(super) fn analyse(handoffs: &mut [Handoff], peers: &[Trace], alice: &Trace) {
    for handoff in handoffs {
        let (from, to) = (handoff.spawned_at, handoff.exited_at + WINDOW_AFTER_EXIT);
        let mut gaps: Vec<f64> = peers
            .iter()
            .map(|trace| longest_gap(&trace.replies, from, to))
            .collect();
        gaps.sort_by(f64::total_cmp);
        handoff.gaps = gaps;
        handoff.gap_before = peers
            .iter()
            .map(|trace| longest_gap_within(&trace.replies, from - BEFORE, from))
            .fold(0.0, f64::max);
        for trace in peers {
            handoff.losses.add(&losses(trace, from, to));
        }
        handoff.alice_gap = longest_gap(&alice.replies, from, to);
        handoff.alice_gap_before = longest_gap_within(&alice.replies, from - BEFORE, from);
        handoff.alice_losses = losses(alice, from, to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_losses_over_a_window() {
        let replies = [0.0, 0.1, 0.2, 1.5, 1.6];
        assert!((longest_gap(&replies, 0.15, 1.55) - 1.3).abs() < 1e-9);
        assert!((longest_gap_within(&replies, 0.0, 0.25) - 0.1).abs() < 1e-9);
        // No reply after the window: the gap runs to its end.
        assert!((longest_gap(&replies, 1.0, 5.0) - 3.4).abs() < 1e-9);
        let trace = Trace {
            sent: vec![0.0, 0.1, 0.2],
            answered: vec![Some(0.001), None, Some(2.5)],
            replies: vec![],
            send_failures: 0,
        };
        let found = losses(&trace, 0.0, 1.0);
        assert_eq!((found.sent, found.never, found.late), (3, 1, 1));
        assert_eq!((found.never_from, found.longest_rtt), (0.1, 2.5));
    }
}
