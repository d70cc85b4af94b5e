//! One attachment's lifecycle as a sans-IO state machine: events in (what
//! the ingress said, a timer, a signal), actions out (what to send, what to
//! change in the plane). The I/O loop in [`super::attachment`] feeds it and
//! carries the actions out; the tests here drive it without a socket.
//!
//! The sequence is docs/ARCHITECTURE.md, "Device-plane lifecycle": Standby
//! until `Activate`; Active (new connections come here, the WireGuard peer
//! set is sent and kept current); Draining after `Drain` (hand over or
//! finish within the grace); `Drained` once nothing is held. A drain that the
//! ingress takes back with a fresh `Activate` (the successor died) serves
//! again with a grace of its own later.

use std::time::Duration;

use blipless_protocol::channel::Drained;
use tokio::time::Instant;

/// How one attachment to the ingress ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Drained: nothing is held; exit.
    Drained,
    /// The channel is gone; holds the drain deadline if a drain had started.
    Lost(Option<Instant>),
    /// The ingress is handing off to a successor: attach to it, and keep
    /// reading what the old one still sends until it closes the channel.
    Goaway,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The ingress activated this plane (first time, or again after a drain
    /// whose successor went away).
    Activate,
    /// The ingress asked for a drain; `open` connections are held now.
    Drain {
        /// Hand connections to the successor (true) or finish them here.
        handover: bool,
        /// Connections open at this moment.
        open: u64,
    },
    /// The ingress hands off to a successor ingress.
    Goaway,
    /// The channel closed (or failed while draining).
    ChannelClosed,
    /// The client directory changed.
    ClientsChanged,
    /// SIGTERM or SIGINT.
    Terminate,
    /// The drain grace is over with `left` connections still open.
    GraceOver {
        /// Connections still open.
        left: u64,
    },
    /// Every connection has ended or moved; `migrated` were handed over
    /// since this attachment began.
    AllClosed {
        /// Connections handed to a successor during this attachment.
        migrated: u64,
    },
}

/// What the I/O side must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Re-activated after a drain: serve again (fresh cut token, mode
    /// Serving, connection tracker reopened) and take TUN queues back.
    ServeAgain,
    /// First activation: if this plane has no TUN queue, expect the
    /// predecessor's.
    ExpectInheritedQueues,
    /// Send the whole WireGuard peer set (and mark the directory seen).
    SendFullPeers,
    /// Send the ingress the last endpoint snapshot (it started fresh).
    AnswerEndpoints,
    /// Send the peer set's differences since the last send.
    SendPeerChanges,
    /// Stop taking new work: connections hand over (`handover`) or finish.
    EnterDrain {
        /// Hand over to the successor.
        handover: bool,
    },
    /// The successor is active: hand it this plane's TUN queues.
    HandOverTunQueues,
    /// Ask the ingress to drain this plane (no successor).
    AskToDrain,
    /// The grace is over: cut every connection still open.
    CutEverything,
    /// Tell the ingress this plane holds nothing.
    SendDrained(Drained),
    /// The attachment is over.
    End(SessionEnd),
}

/// The lifecycle of one attachment.
#[derive(Debug)]
pub struct Session {
    grace: Duration,
    active: bool,
    asked_to_leave: bool,
    drain_deadline: Option<Instant>,
    cut: Option<u64>,
    open_at_drain: u64,
    answer_endpoints: bool,
}

impl Session {
    /// A Standby attachment. `wants_endpoints`: the ingress started fresh and
    /// gets the last endpoint snapshot after the first peer set.
    pub fn new(grace: Duration, wants_endpoints: bool) -> Self {
        Self {
            grace,
            active: false,
            asked_to_leave: false,
            drain_deadline: None,
            cut: None,
            open_at_drain: 0,
            answer_endpoints: wants_endpoints,
        }
    }

    /// True while draining.
    pub fn draining(&self) -> bool {
        self.drain_deadline.is_some()
    }

    /// True while client changes must be passed on (Active).
    pub fn follows_clients(&self) -> bool {
        self.active
    }

    /// True until SIGTERM has been passed on.
    pub fn listens_for_terminate(&self) -> bool {
        !self.asked_to_leave
    }

    /// When to cut what is left, while draining and not yet cut.
    pub fn grace_deadline(&self) -> Option<Instant> {
        self.drain_deadline.filter(|_| self.cut.is_none())
    }

    /// The drain deadline, if a drain has started.
    pub fn drain_deadline(&self) -> Option<Instant> {
        self.drain_deadline
    }

    /// Applies `event` at `now` and says what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        match event {
            Event::Activate => {
                let mut actions = Vec::with_capacity(3);
                if self.draining() {
                    self.drain_deadline = None;
                    self.cut = None;
                    actions.push(Action::ServeAgain);
                } else {
                    actions.push(Action::ExpectInheritedQueues);
                }
                self.active = true;
                actions.push(Action::SendFullPeers);
                if std::mem::take(&mut self.answer_endpoints) {
                    actions.push(Action::AnswerEndpoints);
                }
                actions
            }
            Event::Drain { handover, open } => {
                self.open_at_drain = open;
                self.drain_deadline = Some(now + self.grace);
                self.active = false;
                let mut actions = vec![Action::EnterDrain { handover }];
                if handover {
                    // The successor is active: the TUN queues are its now
                    // (before Drained can end this attachment).
                    actions.push(Action::HandOverTunQueues);
                }
                actions
            }
            Event::Goaway if self.draining() => {
                vec![Action::End(SessionEnd::Lost(self.drain_deadline))]
            }
            Event::Goaway => vec![Action::End(SessionEnd::Goaway)],
            Event::ChannelClosed => vec![Action::End(SessionEnd::Lost(self.drain_deadline))],
            Event::ClientsChanged if self.active => vec![Action::SendPeerChanges],
            Event::ClientsChanged => Vec::new(),
            Event::Terminate if self.asked_to_leave => Vec::new(),
            Event::Terminate => {
                // The ingress answers with Drain after the last connection it
                // handed us.
                self.asked_to_leave = true;
                vec![Action::AskToDrain]
            }
            Event::GraceOver { left } if self.grace_deadline().is_some() => {
                self.cut = Some(left);
                vec![Action::CutEverything]
            }
            Event::GraceOver { .. } => Vec::new(),
            Event::AllClosed { migrated } if self.draining() => {
                let cut = self.cut.unwrap_or(0);
                let summary = Drained {
                    migrated,
                    finished: self.open_at_drain.saturating_sub(migrated + cut),
                    cut,
                };
                vec![
                    Action::SendDrained(summary),
                    Action::End(SessionEnd::Drained),
                ]
            }
            Event::AllClosed { .. } => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(120);

    fn activated(wants_endpoints: bool) -> (Session, Instant) {
        let now = Instant::now();
        let mut session = Session::new(GRACE, wants_endpoints);
        session.on(Event::Activate, now);
        (session, now)
    }

    #[test]
    fn first_activation_expects_queues_sends_peers_and_answers_endpoints_once() {
        let now = Instant::now();
        let mut session = Session::new(GRACE, true);
        assert!(!session.follows_clients());
        assert_eq!(
            session.on(Event::Activate, now),
            vec![
                Action::ExpectInheritedQueues,
                Action::SendFullPeers,
                Action::AnswerEndpoints
            ]
        );
        assert!(session.follows_clients());
        assert_eq!(
            session.on(Event::ClientsChanged, now),
            vec![Action::SendPeerChanges]
        );
        // A second Activate (after a drain) never answers endpoints again.
        session.on(
            Event::Drain {
                handover: true,
                open: 0,
            },
            now,
        );
        assert_eq!(
            session.on(Event::Activate, now),
            vec![Action::ServeAgain, Action::SendFullPeers]
        );
    }

    #[test]
    fn standby_ignores_client_changes_and_grace_and_closing() {
        let now = Instant::now();
        let mut session = Session::new(GRACE, false);
        assert!(session.on(Event::ClientsChanged, now).is_empty());
        assert!(session.on(Event::GraceOver { left: 3 }, now).is_empty());
        assert!(session.on(Event::AllClosed { migrated: 0 }, now).is_empty());
        assert_eq!(session.grace_deadline(), None);
    }

    #[test]
    fn handover_drain_hands_queues_over_and_reports_what_moved() {
        let (mut session, now) = activated(false);
        assert_eq!(
            session.on(
                Event::Drain {
                    handover: true,
                    open: 10
                },
                now
            ),
            vec![
                Action::EnterDrain { handover: true },
                Action::HandOverTunQueues
            ]
        );
        assert!(session.draining());
        assert!(!session.follows_clients());
        assert_eq!(session.grace_deadline(), Some(now + GRACE));
        assert_eq!(
            session.on(Event::AllClosed { migrated: 7 }, now),
            vec![
                Action::SendDrained(Drained {
                    migrated: 7,
                    finished: 3,
                    cut: 0
                }),
                Action::End(SessionEnd::Drained)
            ]
        );
    }

    #[test]
    fn grace_over_cuts_once_and_counts_the_cut() {
        let (mut session, now) = activated(false);
        session.on(
            Event::Drain {
                handover: false,
                open: 5,
            },
            now,
        );
        assert_eq!(
            session.on(Event::GraceOver { left: 2 }, now + GRACE),
            vec![Action::CutEverything]
        );
        assert_eq!(session.grace_deadline(), None, "cut only once");
        assert!(session
            .on(Event::GraceOver { left: 2 }, now + GRACE)
            .is_empty());
        assert_eq!(
            session.on(Event::AllClosed { migrated: 0 }, now + GRACE),
            vec![
                Action::SendDrained(Drained {
                    migrated: 0,
                    finished: 3,
                    cut: 2
                }),
                Action::End(SessionEnd::Drained)
            ]
        );
    }

    #[test]
    fn reactivation_gives_a_later_drain_a_fresh_grace() {
        let (mut session, now) = activated(false);
        session.on(
            Event::Drain {
                handover: true,
                open: 1,
            },
            now,
        );
        session.on(Event::GraceOver { left: 1 }, now + GRACE);
        session.on(Event::Activate, now + GRACE);
        assert!(!session.draining());
        let later = now + GRACE * 2;
        session.on(
            Event::Drain {
                handover: true,
                open: 1,
            },
            later,
        );
        assert_eq!(session.grace_deadline(), Some(later + GRACE));
    }

    #[test]
    fn terminate_asks_once() {
        let (mut session, now) = activated(false);
        assert!(session.listens_for_terminate());
        assert_eq!(session.on(Event::Terminate, now), vec![Action::AskToDrain]);
        assert!(!session.listens_for_terminate());
        assert!(session.on(Event::Terminate, now).is_empty());
    }

    #[test]
    fn goaway_follows_the_successor_unless_draining() {
        let (mut session, now) = activated(false);
        assert_eq!(
            session.on(Event::Goaway, now),
            vec![Action::End(SessionEnd::Goaway)]
        );
        session.on(
            Event::Drain {
                handover: false,
                open: 0,
            },
            now,
        );
        assert_eq!(
            session.on(Event::Goaway, now),
            vec![Action::End(SessionEnd::Lost(Some(now + GRACE)))]
        );
    }

    #[test]
    fn a_closed_channel_says_whether_a_drain_had_started() {
        let (mut session, now) = activated(false);
        assert_eq!(
            session.on(Event::ChannelClosed, now),
            vec![Action::End(SessionEnd::Lost(None))]
        );
        session.on(
            Event::Drain {
                handover: true,
                open: 0,
            },
            now,
        );
        assert_eq!(
            session.on(Event::ChannelClosed, now),
            vec![Action::End(SessionEnd::Lost(Some(now + GRACE)))]
        );
    }
}
