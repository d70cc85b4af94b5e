//! Unit tests of the attachment's state machine: events in at given
//! instants, the actions out checked, no socket.

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
            migrated: 0,
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
                open: 10,
                migrated: 0,
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
            migrated: 0,
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
            migrated: 0,
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
            migrated: 0,
        },
        later,
    );
    assert_eq!(session.grace_deadline(), Some(later + GRACE));
}

#[test]
fn a_client_sync_sends_the_peer_changes_first_when_active() {
    let synced = Synced {
        token: 4,
        applied: 9,
    };
    let now = Instant::now();
    let mut standby = Session::new(GRACE, false);
    assert_eq!(
        standby.on(Event::ClientsSynced(synced), now),
        vec![Action::SendSynced(synced)]
    );
    let (mut active, now) = activated(false);
    assert_eq!(
        active.on(Event::ClientsSynced(synced), now),
        vec![Action::SendPeerChanges, Action::SendSynced(synced)]
    );
    active.on(
        Event::Drain {
            handover: true,
            open: 0,
            migrated: 0,
        },
        now,
    );
    assert_eq!(
        active.on(Event::ClientsSynced(synced), now),
        vec![Action::SendSynced(synced)],
        "a draining plane answers but no longer owns the peer set"
    );
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
fn goaway_follows_the_successor_and_a_drain_carries_on_there() {
    let (mut session, now) = activated(false);
    assert_eq!(
        session.on(Event::Goaway, now),
        vec![Action::End(SessionEnd::Goaway(None))]
    );
    session.on(
        Event::Drain {
            handover: true,
            open: 10,
            migrated: 4,
        },
        now,
    );
    let carried = Draining {
        deadline: now + GRACE,
        handover: true,
        open_at_drain: 10,
        migrated_at_drain: 4,
        cut: None,
    };
    assert_eq!(
        session.on(Event::Goaway, now),
        vec![Action::End(SessionEnd::Goaway(Some(carried)))]
    );
    // At the successor ingress: still draining, same deadline, no Ready,
    // and the summary counts the whole drain. A SIGTERM (now, or one the
    // last ingress had) is passed on, so this ingress never activates it
    // again; once.
    let mut resumed = Session::resume(GRACE, carried);
    assert!(resumed.draining());
    assert!(resumed.listens_for_terminate());
    assert_eq!(resumed.on(Event::Terminate, now), vec![Action::AskToDrain]);
    assert!(!resumed.listens_for_terminate());
    assert_eq!(resumed.grace_deadline(), Some(now + GRACE));
    assert_eq!(
        resumed.on(Event::AllClosed { migrated: 13 }, now),
        vec![
            Action::SendDrained(Drained {
                migrated: 9,
                finished: 1,
                cut: 0
            }),
            Action::End(SessionEnd::Drained)
        ]
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
            migrated: 0,
        },
        now,
    );
    assert_eq!(
        session.on(Event::ChannelClosed, now),
        vec![Action::End(SessionEnd::Lost(Some(now + GRACE)))]
    );
}
