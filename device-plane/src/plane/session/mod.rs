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

use blipless_protocol::channel::{Drained, Synced};
use tokio::time::Instant;

/// How one attachment to the ingress ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Drained: nothing is held; exit.
    Drained,
    /// The channel is gone; holds the drain deadline if a drain had started.
    Lost(Option<Instant>),
    /// The ingress is handing off to a successor: attach to it, and keep
    /// reading what the old one still sends until it closes the channel. A
    /// drain under way carries on there (`Some`): an ingress handoff during a
    /// device-plane deploy does not stop the deploy.
    Goaway(Option<Draining>),
}

/// A drain under way, carried from one attachment to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draining {
    /// When what is left is cut.
    pub deadline: Instant,
    /// Whether a successor takes the connections.
    pub handover: bool,
    /// Connections open when the drain began.
    pub open_at_drain: u64,
    /// Connections this plane had handed over when the drain began.
    pub migrated_at_drain: u64,
    /// Set once the grace was over and what was left was cut.
    pub cut: Option<u64>,
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
        /// Connections handed over so far (the plane's running count).
        migrated: u64,
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
    /// Every connection has ended or moved.
    AllClosed {
        /// Connections handed over so far (the plane's running count).
        migrated: u64,
    },
    /// The client change feed has been applied for a `SyncClients` request.
    ClientsSynced(Synced),
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
    /// Answer a `SyncClients` request (after any peer changes it caused).
    SendSynced(Synced),
    /// The attachment is over.
    End(SessionEnd),
}

/// The lifecycle of one attachment.
#[derive(Debug)]
pub struct Session {
    grace: Duration,
    active: bool,
    asked_to_leave: bool,
    drain: Option<Draining>,
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
            drain: None,
            answer_endpoints: wants_endpoints,
        }
    }

    /// An attachment to a successor ingress while a drain is under way: it
    /// carries on (no Ready, no Activate expected), with the same deadline.
    pub fn resume(grace: Duration, drain: Draining) -> Self {
        Self {
            grace,
            active: false,
            // SIGTERM is passed on to this ingress too, even if the last one
            // had it (or it came before this attachment): a draining plane
            // may be activated again if the active one dies, unless the
            // ingress knows it is leaving.
            asked_to_leave: false,
            drain: Some(drain),
            answer_endpoints: false,
        }
    }

    /// True while draining.
    pub fn draining(&self) -> bool {
        self.drain.is_some()
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
        self.drain
            .filter(|drain| drain.cut.is_none())
            .map(|drain| drain.deadline)
    }

    /// The drain deadline, if a drain has started.
    pub fn drain_deadline(&self) -> Option<Instant> {
        self.drain.map(|drain| drain.deadline)
    }

    /// Applies `event` at `now` and says what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        match event {
            Event::Activate => {
                let mut actions = Vec::with_capacity(3);
                if self.draining() {
                    self.drain = None;
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
            Event::Drain {
                handover,
                open,
                migrated,
            } => {
                self.drain = Some(Draining {
                    deadline: now + self.grace,
                    handover,
                    open_at_drain: open,
                    migrated_at_drain: migrated,
                    cut: None,
                });
                self.active = false;
                let mut actions = vec![Action::EnterDrain { handover }];
                if handover {
                    // The successor is active: the TUN queues are its now
                    // (before Drained can end this attachment).
                    actions.push(Action::HandOverTunQueues);
                }
                actions
            }
            Event::Goaway => vec![Action::End(SessionEnd::Goaway(self.drain))],
            Event::ChannelClosed => vec![Action::End(SessionEnd::Lost(self.drain_deadline()))],
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
                if let Some(drain) = self.drain.as_mut() {
                    drain.cut = Some(left);
                }
                vec![Action::CutEverything]
            }
            Event::GraceOver { .. } => Vec::new(),
            Event::AllClosed { migrated: total } if self.draining() => {
                let drain = self.drain.unwrap_or(Draining {
                    deadline: now,
                    handover: false,
                    open_at_drain: 0,
                    migrated_at_drain: total,
                    cut: None,
                });
                let cut = drain.cut.unwrap_or(0);
                let migrated = total.saturating_sub(drain.migrated_at_drain);
                let summary = Drained {
                    migrated,
                    finished: drain.open_at_drain.saturating_sub(migrated + cut),
                    cut,
                };
                vec![
                    Action::SendDrained(summary),
                    Action::End(SessionEnd::Drained),
                ]
            }
            Event::AllClosed { .. } => Vec::new(),
            // The peer set the change implies goes out before the answer, so
            // the ingress has it when the operator hears "done".
            Event::ClientsSynced(synced) if self.active => {
                vec![Action::SendPeerChanges, Action::SendSynced(synced)]
            }
            Event::ClientsSynced(synced) => vec![Action::SendSynced(synced)],
        }
    }
}

#[cfg(test)]
mod tests;
