//! The device planes attached to this ingress and which one is active.
//!
//! A plane is Standby after its Hello, Active once it says Ready (the
//! ingress sends it every new connection), Draining once a newer plane took
//! over, it asked to leave, or the node drains. Exactly one plane is active at a time; the accept loops
//! watch [`Planes::subscribe`] and switch the moment it changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blipless_protocol::channel::{DrainOrder, Rejoin, ToDevice};
use blipless_protocol::control::DeployOutcome;
use tokio::sync::watch;

use crate::metrics::Metrics;

mod link;
pub mod process;

use link::lock;
pub use link::{send_frame, Frame, OrderSent, PlaneLink, PlaneState, SendFailure};

/// How the latest deploy went.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployRecord {
    /// The plane that was active before, if any.
    pub from: Option<u64>,
    /// The new plane.
    pub to: u64,
    /// The build the plane active before said in its Hello, if there was one.
    pub from_software: Option<String>,
    /// The build the new plane said in its Hello.
    pub to_software: String,
    /// How it went.
    pub outcome: DeployOutcome,
    /// Why it failed, or what happened.
    pub detail: String,
    /// From the new plane's Hello to the old plane's exit (or the failure).
    pub duration: Option<Duration>,
    started: Instant,
}

/// Every attached plane, and the active one.
#[derive(Debug)]
pub struct Planes {
    attached: Mutex<Vec<Arc<PlaneLink>>>,
    active: watch::Sender<Option<Arc<PlaneLink>>>,
    next_generation: AtomicU64,
    last_deploy: Mutex<Option<DeployRecord>>,
    metrics: Arc<Metrics>,
    /// Connections passed between planes and not yet confirmed: which plane
    /// each came from (so the successor's MigrateDone finds its way back) and
    /// which it went to (so a successor that goes away is answered for).
    migrations: Mutex<std::collections::HashMap<u64, Migration>>,
    /// Connections taken out of `migrations` for a gone plane whose answer
    /// is not sent yet (it waits up to a second for the plane's process):
    /// still in flight for an ingress deciding whether it may exit.
    answers_pending: std::sync::atomic::AtomicUsize,
    /// Client syncs (read-your-writes) waiting for planes' answers.
    pub syncs: crate::client_sync::ClientSyncs,
    /// The node drains ([`Planes::drain_all`]): no plane is activated again.
    node_draining: std::sync::atomic::AtomicBool,
}

/// One connection between planes, until its successor confirms it.
#[derive(Debug)]
struct Migration {
    from: std::sync::Weak<PlaneLink>,
    to: Option<u64>,
}

/// What a plane's confirmation of a migrated connection turned out to be.
#[derive(Debug)]
pub enum Confirmation {
    /// It was this plane's to confirm: here is the sender, if still attached.
    Confirmed(Option<Arc<PlaneLink>>),
    /// No connection of that id was passed to this plane.
    Unknown,
}

/// A message the caller must send to a plane after a state change.
pub type Order = (Arc<PlaneLink>, ToDevice<'static>);

/// What [`Planes::detach`] leaves its caller to do.
#[derive(Debug, Default)]
pub struct Detached {
    /// Orders to send at once (the Activate of a plane given the node back).
    pub orders: Vec<Order>,
    /// Connections passed to the gone plane that it never confirmed, each
    /// with the plane that sent it and still waits: answer them with
    /// [`Planes::answers_for_gone`].
    pub unconfirmed: Vec<(Arc<PlaneLink>, u64)>,
}

fn drain(handover: bool) -> ToDevice<'static> {
    ToDevice::Drain(DrainOrder { handover })
}

impl Planes {
    /// No plane attached.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            attached: Mutex::new(Vec::new()),
            active: watch::channel(None).0,
            next_generation: AtomicU64::new(1),
            last_deploy: Mutex::new(None),
            metrics,
            migrations: Mutex::new(std::collections::HashMap::new()),
            answers_pending: std::sync::atomic::AtomicUsize::new(0),
            syncs: crate::client_sync::ClientSyncs::default(),
            node_draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The next generation number.
    pub fn next_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Watches the active plane (None while there is none).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<PlaneLink>>> {
        self.active.subscribe()
    }

    /// The active plane now.
    pub fn active(&self) -> Option<Arc<PlaneLink>> {
        self.active.borrow().clone()
    }

    /// Remembers that connection `id` came from `from`.
    pub fn migration_sent(&self, id: u64, from: &Arc<PlaneLink>) {
        lock(&self.migrations).insert(
            id,
            Migration {
                from: Arc::downgrade(from),
                to: None,
            },
        );
    }

    /// Remembers which plane connection `id`, sent by `from`, was passed to.
    /// Only the record of that sending is changed: this bookkeeping runs after
    /// the pass, and by then the receiver may have confirmed it and sent the
    /// same connection on again (a deploy during a deploy), which is a new
    /// record this late word must not overwrite.
    ///
    /// Returns the id if `to` is detached already: [`Planes::detach`] took it
    /// out of the attached before it answered for its connections, so it
    /// answered without this one, and the caller must
    /// ([`Planes::answers_for_gone`]).
    pub fn migration_passed(
        &self,
        id: u64,
        from: &Arc<PlaneLink>,
        to: &Arc<PlaneLink>,
    ) -> Option<u64> {
        let mut migrations = lock(&self.migrations);
        let migration = migrations.get_mut(&id)?;
        if !std::ptr::eq(migration.from.as_ptr(), Arc::as_ptr(from)) {
            return None;
        }
        if lock(&self.attached).iter().any(|p| Arc::ptr_eq(p, to)) {
            migration.to = Some(to.generation);
            return None;
        }
        migrations.remove(&id);
        self.answers_pending.fetch_add(1, Ordering::SeqCst);
        Some(id)
    }

    /// How many connections passed between planes await their confirmation
    /// or an answer for a gone plane.
    pub fn migrations_in_flight(&self) -> usize {
        let migrations = lock(&self.migrations);
        migrations.len() + self.answers_pending.load(Ordering::SeqCst)
    }

    /// `count` answers for a gone plane ([`Detached::unconfirmed`], or a
    /// late [`Planes::migration_passed`]) were sent.
    pub fn answered(&self, count: usize) {
        self.answers_pending.fetch_sub(count, Ordering::SeqCst);
    }

    /// Process ids of the attached planes that carry traffic (active or
    /// draining; a plane on standby is still warming up).
    pub fn carrying_traffic(&self) -> Vec<u32> {
        lock(&self.attached)
            .iter()
            .filter(|plane| plane.state() != PlaneState::Standby)
            .map(|plane| plane.pid)
            .collect()
    }

    /// Plane `by` confirms connection `id`. Only the plane it was passed to
    /// may (or any plane while the pass is not yet recorded, as the receiver
    /// can confirm before the passing task records it): a confirmation of
    /// another plane's connection, or of none, is ignored, so that it
    /// neither releases a sender's copy nor counts as migrated.
    pub fn migration_done(&self, id: u64, by: &PlaneLink) -> Confirmation {
        let mut migrations = lock(&self.migrations);
        match migrations.get(&id) {
            None => Confirmation::Unknown,
            Some(migration) if migration.to.is_some_and(|to| to != by.generation) => {
                Confirmation::Unknown
            }
            Some(_) => match migrations.remove(&id) {
                Some(migration) => Confirmation::Confirmed(migration.from.upgrade()),
                None => Confirmation::Unknown,
            },
        }
    }

    /// The latest deploy, if any.
    pub fn last_deploy(&self) -> Option<DeployRecord> {
        lock(&self.last_deploy).clone()
    }

    fn finish_deploy(&self, outcome: DeployOutcome, detail: String) {
        let mut last = lock(&self.last_deploy);
        if let Some(record) = last
            .as_mut()
            .filter(|r| r.outcome == DeployOutcome::InProgress)
        {
            let duration = record.started.elapsed();
            record.outcome = outcome;
            record.detail = detail;
            record.duration = Some(duration);
            self.metrics.record_deploy(outcome, duration);
            match outcome {
                DeployOutcome::Succeeded => {
                    tracing::info!(to = record.to, ?duration, "deploy succeeded")
                }
                _ => tracing::error!(to = record.to, detail = %record.detail, "deploy failed"),
            }
        }
    }

    /// Adds a plane that said Hello (Standby).
    pub fn attach(&self, link: Arc<PlaneLink>) {
        lock(&self.attached).push(link);
    }

    /// Adds a plane that was draining at this ingress's predecessor and
    /// carries on here (its Hello said so): Draining from the start, never
    /// activated by a Ready (it sends none), its migrations passed to the
    /// active plane as any draining plane's. It may still be re-activated if
    /// the active plane dies, as a plane that drained here may.
    pub fn attach_draining(&self, link: Arc<PlaneLink>) {
        link.set_state(PlaneState::Draining);
        lock(&self.attached).push(link);
    }

    /// A plane said Ready: it becomes active and the previous active plane
    /// drains, handing its connections over. Returns the messages to send.
    pub fn on_ready(&self, generation: u64) -> Vec<Order> {
        let attached = lock(&self.attached);
        let Some(new) = attached
            .iter()
            .find(|p| p.generation == generation)
            .cloned()
        else {
            return Vec::new();
        };
        if new.state() != PlaneState::Standby {
            return Vec::new();
        }
        // A plane that attached while the node drains (a deploy racing the
        // stop) is not given the node: it holds nothing, so it exits.
        if self.node_draining.load(Ordering::SeqCst) {
            new.mark_leaving();
            new.set_state(PlaneState::Draining);
            tracing::info!(
                generation,
                "a plane ready while the node drains is told to drain"
            );
            return vec![(new, drain(false))];
        }
        // A plane that was serving at this ingress's predecessor, arriving
        // after a newer plane took over here: the newer one keeps serving and
        // takes this one's connections, as in a deploy.
        // (Its own stale link, from before it followed a successor that has
        // since died, is not a newer plane: that one is drained below.)
        let newer_active = attached.iter().any(|p| {
            p.generation != generation && p.pid != new.pid && p.state() == PlaneState::Active
        });
        if new.rejoin == Rejoin::Serving && newer_active {
            new.set_state(PlaneState::Draining);
            tracing::info!(generation, "a plane that served before the handoff rejoins after a newer one: it hands over to it");
            return vec![(new, drain(true))];
        }
        let mut orders = Vec::new();
        new.set_state(PlaneState::Active);
        orders.push((new.clone(), ToDevice::Activate));
        let mut from = None;
        let mut from_software = None;
        for old in attached.iter().filter(|p| p.generation != generation) {
            if old.state() == PlaneState::Active {
                old.set_state(PlaneState::Draining);
                orders.push((old.clone(), drain(true)));
                from = Some(old.generation);
                from_software = Some(old.software.clone());
            }
        }
        let record = DeployRecord {
            from,
            to: generation,
            from_software,
            to_software: new.software.clone(),
            outcome: if from.is_some() {
                DeployOutcome::InProgress
            } else {
                DeployOutcome::Succeeded
            },
            detail: match from {
                Some(old) => format!("g{old} hands over to g{generation}"),
                None => format!("g{generation} is the first active plane"),
            },
            duration: from.is_none().then(|| new.attached_at.elapsed()),
            started: new.attached_at,
        };
        *lock(&self.last_deploy) = Some(record);
        self.active.send_replace(Some(new));
        orders
    }

    /// A plane stayed Standby past its ready budget: the deploy failed, the
    /// active plane carries on, and the late one is told to drain (it holds
    /// nothing, so it exits).
    pub fn on_ready_timeout(&self, generation: u64, budget: Duration) -> Vec<Order> {
        let attached = lock(&self.attached);
        let Some(late) = attached
            .iter()
            .find(|p| p.generation == generation && p.state() == PlaneState::Standby)
            .cloned()
        else {
            return Vec::new();
        };
        late.set_state(PlaneState::Draining);
        late.mark_leaving();
        let detail = format!(
            "g{generation} was not ready within {budget:?}; the active plane keeps serving"
        );
        let active = self.active();
        *lock(&self.last_deploy) = Some(DeployRecord {
            from: active.as_ref().map(|p| p.generation),
            to: generation,
            from_software: active.map(|p| p.software.clone()),
            to_software: late.software.clone(),
            outcome: DeployOutcome::InProgress,
            detail: String::new(),
            duration: None,
            started: late.attached_at,
        });
        drop(attached);
        self.finish_deploy(DeployOutcome::Failed, detail);
        vec![(late, drain(false))]
    }

    /// A plane's channel is gone (`drained`: it said Drained first). If it
    /// was active, the newest draining plane that may come back is
    /// re-activated (a new plane that died after its activation gives the
    /// node back to the old one).
    pub fn detach(&self, generation: u64, drained: bool) -> Detached {
        // First out of the attached, so that a pass recorded after the
        // answers below finds it gone (`migration_passed`).
        let orders = self.detach_plane(generation, drained);
        // Confirmations can no longer reach a plane that is gone, nor come
        // from one: the gone successor's unconfirmed connections are
        // answered for, so their predecessor stops waiting.
        let mut unconfirmed = Vec::new();
        let mut migrations = lock(&self.migrations);
        migrations.retain(|id, migration| {
            let Some(from) = migration.from.upgrade() else {
                return false;
            };
            if from.generation == generation {
                return false;
            }
            if migration.to == Some(generation) {
                unconfirmed.push((from, *id));
                return false;
            }
            true
        });
        // Counted while the migrations are still locked: the sum
        // `migrations_in_flight` reads never dips meanwhile.
        self.answers_pending
            .fetch_add(unconfirmed.len(), Ordering::SeqCst);
        drop(migrations);
        Detached {
            orders,
            unconfirmed,
        }
    }

    /// The answers for connections a gone plane never confirmed
    /// ([`Detached::unconfirmed`]). `never_taken`: every frame it sent was
    /// read and its process has exited, so it took none of them (it
    /// confirms each before touching it) and each sender still holds its
    /// copy: a sender that reads `MigrateNotTaken` serves it on. Otherwise,
    /// or to an older sender, `MigrateDone`: the sender lets its copy go.
    pub fn answers_for_gone(
        unconfirmed: Vec<(Arc<PlaneLink>, u64)>,
        never_taken: bool,
    ) -> Vec<Order> {
        unconfirmed
            .into_iter()
            .map(|(from, id)| {
                let answer = if never_taken && from.reads_not_taken {
                    ToDevice::MigrateNotTaken(id)
                } else {
                    ToDevice::MigrateDone(id)
                };
                (from, answer)
            })
            .collect()
    }

    /// [`Planes::detach`] for the plane's state: removed from the attached,
    /// and the node given back to an older plane if it was active.
    fn detach_plane(&self, generation: u64, drained: bool) -> Vec<Order> {
        let mut orders = Vec::new();
        let mut attached = lock(&self.attached);
        attached.retain(|p| p.generation != generation);
        let was_active = self
            .active
            .borrow()
            .as_ref()
            .is_some_and(|p| p.generation == generation);
        let deploy = self.last_deploy();
        let in_progress = deploy
            .as_ref()
            .filter(|r| r.outcome == DeployOutcome::InProgress);
        if !was_active {
            drop(attached);
            if in_progress.is_some_and(|r| r.from == Some(generation)) {
                if drained {
                    self.finish_deploy(
                        DeployOutcome::Succeeded,
                        format!("g{generation} handed over and exited"),
                    );
                } else {
                    self.finish_deploy(
                        DeployOutcome::Failed,
                        format!("g{generation} went away before it had handed everything over"),
                    );
                }
            }
            return orders;
        }
        let successor = attached
            .iter()
            .rev()
            // Not one that said Drained: it is finishing and will not read
            // an Activate.
            .find(|p| p.state() == PlaneState::Draining && !p.leaving() && !p.drained())
            .cloned();
        if let Some(next) = &successor {
            tracing::warn!(
                gone = generation,
                next = next.generation,
                "active device plane gone; activating the next"
            );
            next.set_state(PlaneState::Active);
            orders.push((next.clone(), ToDevice::Activate));
        }
        self.active.send_replace(successor.clone());
        drop(attached);
        if in_progress.is_some_and(|r| r.to == generation) {
            let detail = match &successor {
                Some(next) => format!(
                    "g{generation} died after activation; g{} re-activated",
                    next.generation
                ),
                None => {
                    format!("g{generation} died after activation; no plane left to re-activate")
                }
            };
            self.finish_deploy(DeployOutcome::Failed, detail);
        }
        orders
    }

    /// A plane asked to drain (it got SIGTERM): it takes no new work and,
    /// with no successor, finishes what it holds. If it was the active plane,
    /// none is active until the next one says Ready. The Drain sent back is
    /// queued after every connection already handed to it.
    pub fn on_leaving(&self, generation: u64) -> Vec<Order> {
        let attached = lock(&self.attached);
        let Some(leaving) = attached
            .iter()
            .find(|p| p.generation == generation)
            .cloned()
        else {
            return Vec::new();
        };
        leaving.mark_leaving();
        let was_active = self
            .active
            .borrow()
            .as_ref()
            .is_some_and(|p| p.generation == generation);
        let mut orders = Vec::new();
        if was_active {
            leaving.set_state(PlaneState::Draining);
            orders.push((leaving.clone(), drain(false)));
            self.active.send_replace(None);
        } else if leaving.state() != PlaneState::Draining {
            leaving.set_state(PlaneState::Draining);
            orders.push((leaving.clone(), drain(self.active().is_some())));
        }
        orders
    }

    /// Every plane drains (the node is going down); none is active.
    pub fn drain_all(&self) -> Vec<Order> {
        let attached = lock(&self.attached);
        self.node_draining.store(true, Ordering::SeqCst);
        let mut orders = Vec::new();
        for plane in attached.iter() {
            plane.mark_leaving();
            if plane.state() != PlaneState::Draining {
                plane.set_state(PlaneState::Draining);
                orders.push((plane.clone(), drain(false)));
            }
        }
        self.active.send_replace(None);
        orders
    }

    /// Every attached plane, oldest first.
    pub fn all(&self) -> Vec<Arc<PlaneLink>> {
        lock(&self.attached).clone()
    }

    /// Gives each plane its orders ([`PlaneLink::order`]): queued at once,
    /// so the caller waits on no plane's channel; each plane's are sent in
    /// turn, and a plane whose channel is full (wedged or starved) holds up
    /// no other plane's. Await the result to know that every one was sent
    /// or given up; [`Orders::give_up`] withdraws those not sent yet.
    pub fn send_orders(orders: Vec<Order>) -> Orders {
        Orders {
            pending: orders
                .into_iter()
                .map(|(plane, message)| plane.order(message))
                .collect(),
        }
    }
}

/// Orders given by [`Planes::send_orders`]: a future that completes once
/// each was sent or given up.
#[derive(Debug)]
pub struct Orders {
    pending: Vec<OrderSent>,
}

impl Orders {
    /// Withdraws the orders not sent yet (a caller's grace is over: a
    /// wedged plane that reads again later must not find a stale Goaway or
    /// Drain).
    pub fn give_up(&self) {
        for order in &self.pending {
            order.give_up();
        }
    }
}

impl std::future::Future for Orders {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        while let Some(last) = self.pending.last_mut() {
            std::task::ready!(std::pin::Pin::new(last).poll(context));
            self.pending.pop();
        }
        std::task::Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blipless_protocol::channel::Hello;

    fn plane(planes: &Planes, generation: u64) -> Arc<PlaneLink> {
        plane_with_peer(planes, generation).0
    }

    /// A plane, and the device plane's end of its channel.
    fn plane_with_peer(
        planes: &Planes,
        generation: u64,
    ) -> (Arc<PlaneLink>, tokio_seqpacket::UnixSeqpacket) {
        let (socket, peer) = tokio_seqpacket::UnixSeqpacket::pair().expect("socket pair");
        let hello = Hello {
            pid: 1,
            software: "test".into(),
            rejoin: Rejoin::default(),
            accepts_many: true,
            reads_not_taken: true,
            reads_udp_migrate: true,
        };
        let link = Arc::new(PlaneLink::new(
            generation,
            hello,
            socket,
            process::PlaneProcess::unknown(),
        ));
        planes.attach(link.clone());
        (link, peer)
    }

    /// The next message the device plane's end `peer` reads, by name.
    async fn next_order(peer: &tokio_seqpacket::UnixSeqpacket) -> &'static str {
        let mut buffer = vec![0u8; blipless_protocol::channel::MAX_FRAME];
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            blipless_link::receive::<ToDevice>(peer, &mut buffer),
        )
        .await
        .expect("an order within 10 s")
        .expect("a frame")
        .expect("not closed");
        read.0.name()
    }

    /// A plane that stopped reading (its channel full) holds up neither
    /// the caller nor another plane's orders, and one plane's orders arrive
    /// in the order given even when given by different callers.
    #[tokio::test]
    async fn orders_wait_only_for_their_own_plane_and_keep_their_order() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let (stopped, stopped_peer) = plane_with_peer(&planes, 1);
        let (reading, reading_peer) = plane_with_peer(&planes, 2);
        let filler = ToDevice::Activate;
        while tokio::time::timeout(Duration::from_millis(100), stopped.send(&filler, &[]))
            .await
            .is_ok()
        {}
        let mut stuck = Planes::send_orders(vec![
            (stopped.clone(), drain(true)),
            (reading.clone(), ToDevice::Activate),
        ]);
        drop(Planes::send_orders(vec![(reading.clone(), drain(false))]));
        assert_eq!(next_order(&reading_peer).await, "Activate");
        assert_eq!(next_order(&reading_peer).await, "Drain");
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut stuck)
                .await
                .is_err(),
            "the stopped plane's order is still waiting"
        );
        // Given up, it is never sent, though the plane reads again.
        stuck.give_up();
        tokio::time::timeout(Duration::from_secs(10), stuck)
            .await
            .expect("a given-up order stops waiting");
        let mut buffer = vec![0u8; blipless_protocol::channel::MAX_FRAME];
        while let Ok(read) = tokio::time::timeout(
            Duration::from_millis(200),
            blipless_link::receive::<ToDevice>(&stopped_peer, &mut buffer),
        )
        .await
        {
            let (message, _) = read.expect("a frame").expect("not closed");
            assert_eq!(message.name(), "Activate", "only the fillers arrive");
        }
        stopped.closed.cancel();
        let after_close = Planes::send_orders(vec![(stopped, drain(false))]);
        tokio::time::timeout(Duration::from_secs(10), after_close)
            .await
            .expect("an order for a plane gone is given up");
    }

    /// A deploy during a deploy: A's connection reaches B, B confirms it and
    /// sends it on to C before A's forwarding task records where it went.
    /// That late record must not make C's record say B, or C's death would
    /// leave B waiting for a confirmation nobody answers for.
    #[tokio::test]
    async fn a_late_record_of_an_earlier_pass_leaves_the_next_pass_alone() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let (a, b, c) = (plane(&planes, 1), plane(&planes, 2), plane(&planes, 3));
        planes.migration_sent(7, &a);
        assert!(
            matches!(planes.migration_done(7, &b), Confirmation::Confirmed(Some(from)) if Arc::ptr_eq(&from, &a))
        );
        planes.migration_sent(7, &b);
        assert_eq!(planes.migration_passed(7, &b, &c), None);
        assert_eq!(planes.migration_passed(7, &a, &b), None);
        let detached = planes.detach(c.generation, false);
        assert!(
            matches!(&detached.unconfirmed[..], [(to, 7)] if Arc::ptr_eq(to, &b)),
            "B is answered for C: {:?}",
            detached.unconfirmed
        );
        assert_eq!(planes.migrations_in_flight(), 1, "until it is answered");
        planes.answered(1);
        assert_eq!(planes.migrations_in_flight(), 0);
    }

    /// A pass recorded after its receiver was detached is handed back to the
    /// caller to answer: detach answered for the receiver without it.
    #[tokio::test]
    async fn a_pass_recorded_after_its_receiver_went_is_answered_by_the_caller() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let (a, c) = (plane(&planes, 1), plane(&planes, 2));
        planes.migration_sent(9, &a);
        let detached = planes.detach(c.generation, false);
        assert!(detached.unconfirmed.is_empty());
        assert_eq!(planes.migration_passed(9, &a, &c), Some(9));
        assert_eq!(planes.migrations_in_flight(), 1, "until it is answered");
        planes.answered(1);
        assert_eq!(planes.migrations_in_flight(), 0);
    }

    /// Only the plane a connection was passed to confirms it; another
    /// plane's word, or a word about no connection, changes nothing.
    #[tokio::test]
    async fn only_the_receiver_confirms_a_migration() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let (a, b, c) = (plane(&planes, 1), plane(&planes, 2), plane(&planes, 3));
        planes.migration_sent(5, &a);
        assert_eq!(planes.migration_passed(5, &a, &b), None);
        assert!(matches!(
            planes.migration_done(5, &c),
            Confirmation::Unknown
        ));
        assert!(matches!(
            planes.migration_done(6, &b),
            Confirmation::Unknown
        ));
        assert_eq!(planes.migrations_in_flight(), 1, "still waiting for B");
        assert!(
            matches!(planes.migration_done(5, &b), Confirmation::Confirmed(Some(from)) if Arc::ptr_eq(&from, &a))
        );
        assert_eq!(planes.migrations_in_flight(), 0);
    }

    /// A plane that says Ready after the node began to drain (it attached
    /// meanwhile) is told to drain too, and none is active.
    #[tokio::test]
    async fn a_plane_ready_while_the_node_drains_is_not_activated() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let first = plane(&planes, 1);
        assert_eq!(planes.on_ready(first.generation).len(), 1);
        assert_eq!(planes.drain_all().len(), 1);
        let late = plane(&planes, 2);
        let orders = planes.on_ready(late.generation);
        assert!(
            matches!(&orders[..], [(to, ToDevice::Drain(DrainOrder { handover: false }))] if Arc::ptr_eq(to, &late)),
            "{orders:?}"
        );
        assert!(planes.active().is_none());
        assert_eq!(late.state(), PlaneState::Draining);
        assert!(late.leaving());
    }

    /// "Not taken" only with proof and only to a sender that reads it.
    #[tokio::test]
    async fn not_taken_is_said_only_with_proof_to_a_plane_that_reads_it() {
        let planes = Planes::new(Arc::new(Metrics::default()));
        let a = plane(&planes, 1);
        let answers = Planes::answers_for_gone(vec![(a.clone(), 4)], true);
        assert!(matches!(answers[..], [(_, ToDevice::MigrateNotTaken(4))]));
        let answers = Planes::answers_for_gone(vec![(a, 4)], false);
        assert!(matches!(answers[..], [(_, ToDevice::MigrateDone(4))]));
    }
}
