//! Handing connections over between device planes, both sides: the draining
//! plane sends each established tunnel or idle HTTP connection to its
//! successor through the ingress (`Migrate`, paced by a few slots, each held
//! until the successor confirms with `MigrateDone`, or the ingress answers
//! `MigrateNotTaken` for a successor that died first), and the successor adopts
//! what arrives and serves it on, byte-exact (docs/ARCHITECTURE.md,
//! "Handing connections over"). A SOCKS5 UDP association moves the same way,
//! its three sockets together ([`udp_associate`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::{Migrate, MigrateKind, ToIngress};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_seqpacket::UnixSeqpacket;

use super::context::{Context, Mode};
use super::tunnel::{self, EmptiedPipes, Tunnel};
use super::{http, piped, stream_from_fd, udp_associate};

/// Longest wait for a successor's confirmation: longer than the ingress
/// holds a connection looking for a plane (10 s) before sending it back.
const CONFIRM_WAIT: Duration = Duration::from_secs(30);

/// Longest wait for a channel to hand a connection over on (an ingress
/// handoff: the plane attaches to the successor).
const CHANNEL_WAIT: Duration = Duration::from_secs(10);

/// Handovers sent at once.
pub(super) const HANDOVER_SLOTS: usize = 32;

/// The ingress's answer for a connection handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The successor took it over (`MigrateDone`): let it go.
    Taken,
    /// The successor died without taking it (`MigrateNotTaken`): serve it on.
    NotTaken,
}

/// Why [`Context::hand_over`] did not hand a connection over; either way the
/// caller still holds it, and the state it sent comes back to serve it on.
#[derive(Debug)]
pub enum NotHandedOver {
    /// It could not be sent (no channel, no pipe, a failed send): keep it
    /// through this handover, as a connection that came back is kept.
    Kept(Migrate),
    /// It was sent and the successor died before taking it: serve it on;
    /// it may go again at once (the plane normally serves again by now).
    NotTaken(Migrate),
    /// Its pending bytes need a pipe and none could be had (the user's
    /// pipe pages are spent, as a busy plane's spliced tunnels spend them:
    /// a fresh pipe cannot grow past one page): relay on a moment, so
    /// that what is pending is written and less is, and try again in this
    /// handover ([`RETRY_WITHOUT_PIPE`]).
    NoPipe(Migrate),
}

/// How long a connection whose pending bytes found no pipe relays before
/// it is offered again ([`NotHandedOver::NoPipe`]).
pub const RETRY_WITHOUT_PIPE: Duration = Duration::from_millis(100);

impl NotHandedOver {
    /// The state the handover carried.
    pub fn into_migrate(self) -> Migrate {
        match self {
            NotHandedOver::Kept(migrate)
            | NotHandedOver::NotTaken(migrate)
            | NotHandedOver::NoPipe(migrate) => migrate,
        }
    }

    /// Whether the connection may go again in the current handover
    /// ([`Context::handover_slot_when`]).
    pub fn may_hand_over_again(&self) -> bool {
        matches!(self, NotHandedOver::NotTaken(_) | NotHandedOver::NoPipe(_))
    }

    /// How long to relay before offering it again, when it may go again
    /// but not at once.
    pub fn relay_first(&self) -> Option<Duration> {
        matches!(self, NotHandedOver::NoPipe(_)).then_some(RETRY_WITHOUT_PIPE)
    }
}

impl Context {
    pub(super) fn awaiting_map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Answer>>> {
        self.awaiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connections sent to a successor whose confirmation has not come:
    /// still open here, but counted as handed over (the cut at the grace
    /// ends the wait, not the connection, which the successor holds).
    pub fn handovers_in_flight(&self) -> u64 {
        self.sent_awaiting.load(Ordering::Relaxed)
    }

    /// The ingress answered for connection `id`: the successor confirmed it
    /// (MigrateDone), or died without taking it (MigrateNotTaken).
    pub fn handover_answered(&self, id: u64, answer: Answer) {
        if let Some(done) = self.awaiting_map().remove(&id) {
            let _ = done.send(answer);
        }
    }

    /// Tells the ingress the connection came through (`via`) that this
    /// plane took over connection `id`: that ingress knows where it came
    /// from, even when it has handed off to a successor since. A send that
    /// fails means that ingress's end is closed: it can no longer tell the
    /// sender anything, and the sender lets its copies go when it loses the
    /// channel (or on its 30 s wait), so the connection is served here.
    pub async fn confirm_adoption(&self, via: &UnixSeqpacket, id: u64) {
        if let Err(error) = blipless_link::send(via, &ToIngress::MigrateDone(id), &[]).await {
            tracing::debug!(id, %error, "could not confirm an adopted connection");
        }
    }

    /// Completes when the plane hands connections over and this one may go
    /// now: it yields the slot to hold while sending. The mode is checked
    /// again once the slot is had: a connection that queued for a slot while
    /// the plane handed over must not go once the plane serves again (its
    /// successor died and it was activated again).
    pub fn handover_slot(
        &self,
    ) -> impl std::future::Future<Output = OwnedSemaphorePermit> + Send + 'static {
        let mut mode = self.mode.subscribe();
        let slots = self.handover_slots.clone();
        async move {
            loop {
                if mode.wait_for(|m| *m == Mode::Handover).await.is_err() {
                    return std::future::pending().await;
                }
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return std::future::pending().await;
                };
                if *mode.borrow() == Mode::Handover {
                    return slot;
                }
            }
        }
    }

    /// [`Context::handover_slot`] for a connection that may go in this
    /// handover (`now`), or only in one that begins after the plane serves
    /// again: one that could not go in this one, or came back from it. A
    /// plane given the node back after its successor died thus moves it at
    /// the next deploy instead of keeping it to that deploy's grace, and a
    /// plane still handing over never sends it round again.
    pub fn handover_slot_when(
        &self,
        now: bool,
    ) -> impl std::future::Future<Output = OwnedSemaphorePermit> + Send + 'static {
        let mut mode = self.mode.subscribe();
        let slot = self.handover_slot();
        async move {
            if !now && mode.wait_for(|m| *m == Mode::Serving).await.is_err() {
                return std::future::pending().await;
            }
            slot.await
        }
    }

    /// Sends one connection to the successor through the ingress and waits
    /// for its confirmation (the ingress answers for a successor that goes
    /// away). Gives the state back when it could not be sent, or the
    /// successor died without taking it: the caller keeps serving it. The
    /// caller's `fds` stay open until this returns, so a connection not
    /// taken is whole here still.
    pub async fn hand_over(
        &self,
        migrate: Migrate,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), NotHandedOver> {
        self.hand_over_carrying(migrate, fds, EmptiedPipes::default())
            .await
    }

    /// [`Context::hand_over`] for a tunnel whose directions spliced: a
    /// direction's pending run too long for the frame travels in the pipe
    /// it spliced through (`emptied`), so a handover asks the kernel for no
    /// new pipe pages.
    pub async fn hand_over_carrying(
        &self,
        mut migrate: Migrate,
        fds: &[BorrowedFd<'_>],
        emptied: EmptiedPipes,
    ) -> Result<(), NotHandedOver> {
        // Between an ingress's Goaway and the attachment to its successor
        // there is no channel for a moment: wait for it rather than keep the
        // connection here.
        // Not past the drain grace, though: the connection is cut then, as
        // the others waiting here for a confirmation are.
        let mut channel = self.channel();
        let waiting_since = tokio::time::Instant::now();
        let cut = self.cut_token();
        while channel.is_none() && waiting_since.elapsed() < CHANNEL_WAIT && !cut.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            channel = self.channel();
        }
        let Some(channel) = channel else {
            return Err(NotHandedOver::Kept(migrate));
        };
        // A UDP association only through an ingress that passes them on,
        // asked of the channel in hand: the caller asked before the wait,
        // and an ingress handoff meanwhile may have brought one that does
        // not (a rollback), which would take it for garbage and drop this
        // plane's channel. (Its Welcome is stored before its channel.)
        if migrate.kind == MigrateKind::SocksUdp && !self.channel_passes_udp.load(Ordering::Relaxed)
        {
            tracing::info!(
                id = migrate.connection_id,
                "the ingress now attached cannot pass a udp association on; keeping it"
            );
            return Err(NotHandedOver::Kept(migrate));
        }
        let id = migrate.connection_id;
        // A run too long for the frame travels in a pipe (the frame then
        // carries only its length); the bytes stay here until the send succeeds.
        let mut pipes = Vec::new();
        let mut no_pipe = None;
        let mut own_pipes = 0;
        for (pending, piped, own_pipe) in [
            (&migrate.up.pending, &mut migrate.up_piped, emptied.up),
            (&migrate.down.pending, &mut migrate.down_piped, emptied.down),
        ] {
            if pending.len() <= piped::INLINE_LIMIT {
                continue;
            }
            let carried = match own_pipe.map(|pipe| pipe.carry(pending)) {
                Some(Ok(pipe)) => {
                    own_pipes += 1;
                    Ok(pipe)
                }
                Some(Err(error)) => {
                    tracing::debug!(id, %error, "the direction's own pipe cannot carry its bytes; a fresh one");
                    piped::pipe_out(pending)
                }
                None => piped::pipe_out(pending),
            };
            match carried {
                Ok(pipe) => {
                    *piped = pending.len() as u32;
                    pipes.push(pipe);
                }
                Err(error) => no_pipe = Some(error),
            }
        }
        if let Some(error) = no_pipe {
            tracing::debug!(id, %error, "no pipe for the pending bytes; relaying a moment before trying again");
            return Err(NotHandedOver::NoPipe(unpiped(migrate)));
        }
        if !pipes.is_empty() {
            tracing::debug!(
                id,
                up = migrate.up_piped,
                down = migrate.down_piped,
                own_pipes,
                "pending bytes travel in pipes"
            );
        }
        let all_fds: Vec<BorrowedFd<'_>> = fds
            .iter()
            .copied()
            .chain(pipes.iter().map(|p| p.as_fd()))
            .collect();
        let (done, confirmed) = oneshot::channel();
        self.awaiting_map().insert(id, done);
        let frame = blipless_protocol::channel::encode_migrate(&migrate);
        if let Err(error) = blipless_link::send_encoded(&channel, &frame, "Migrate", &all_fds).await
        {
            self.awaiting_map().remove(&id);
            tracing::warn!(id, %error, "handover failed; keeping the connection here");
            return Err(NotHandedOver::Kept(unpiped(migrate)));
        }
        self.migrated.fetch_add(1, Ordering::Relaxed);
        let in_flight = InFlight::count(&self.sent_awaiting);
        // Hold the caller's slot until the successor has the connection
        // relaying, so migrations queue here, live, not in socket buffers,
        // frozen. The wait ends early only at the drain grace or when the
        // channel is lost (which drops every waiting confirmation).
        let answer = tokio::select! {
            // A dropped sender (the channel was lost) is no answer: going on.
            answer = confirmed => answer.unwrap_or(Answer::Taken),
            () = cut.cancelled() => Answer::Taken,
            () = tokio::time::sleep(CONFIRM_WAIT) => {
                tracing::warn!(id, "no confirmation from the successor; going on");
                Answer::Taken
            }
        };
        self.awaiting_map().remove(&id);
        drop(in_flight);
        if answer == Answer::NotTaken {
            self.migrated.fetch_sub(1, Ordering::Relaxed);
            tracing::info!(
                id,
                "the successor died before taking the connection; serving it on"
            );
            return Err(NotHandedOver::NotTaken(unpiped(migrate)));
        }
        tracing::debug!(id, "connection handed over");
        Ok(())
    }
}

/// One handover sent and awaiting its answer, in
/// [`Context::handovers_in_flight`] for as long as it lives (however the
/// wait ends).
struct InFlight<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> InFlight<'a> {
    fn count(counter: &'a std::sync::atomic::AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A Migrate that was not sent: its bytes are all in `pending` again.
fn unpiped(mut migrate: Migrate) -> Migrate {
    migrate.up_piped = 0;
    migrate.down_piped = 0;
    migrate
}

/// Takes over a connection a predecessor handed us through the ingress
/// channel `via`.
pub async fn adopt(
    context: Arc<Context>,
    via: Arc<UnixSeqpacket>,
    mut migrate: Migrate,
    mut fds: Vec<OwnedFd>,
) {
    let id = migrate.connection_id;
    // A connection this plane sent away itself and still awaits the
    // confirmation of came back: the ingress found no plane to take it.
    // It stays here rather than go round again. Asked before confirming,
    // which ends that wait. (Not the mode: a plane adopting from its
    // predecessor may be handing over already, to a newer plane whose
    // deploy began meanwhile, and what it adopts then must move on.)
    let bounced = context.awaiting_map().contains_key(&id);
    if bounced {
        // Counted as migrated when it was sent; it never left.
        context.migrated.fetch_sub(1, Ordering::Relaxed);
    }
    crate::fault::die_adopting();
    // Nothing here touches the connection before the confirmation is sent:
    // a plane that dies before sending it took nothing, which is what lets
    // the ingress tell its sender to serve it on (`MigrateNotTaken`). Once
    // sent, the fds are ours, whatever happens below: the predecessor may
    // send the next connection.
    context.confirm_adoption(&via, id).await;
    // Not held for the connection's life: the ingress must see this
    // channel's end when the plane drops it (a lost attachment), however
    // many adopted connections live on.
    drop(via);
    crate::fault::slow_adoption().await;
    // Pipes come last: down after up.
    for (piped, pending) in [
        (migrate.down_piped, &mut migrate.down.pending),
        (migrate.up_piped, &mut migrate.up.pending),
    ] {
        if piped == 0 {
            continue;
        }
        let Some(pipe) = fds.pop() else { return };
        match piped::pipe_in(pipe, piped as usize) {
            Ok(bytes) => *pending = bytes,
            Err(error) => {
                tracing::warn!(id, %error, "an adopted connection's pending bytes are lost; closing it");
                return;
            }
        }
    }
    let may_hand_over = !bounced;
    let mut fds = fds.into_iter();
    let (Some(client_fd), second, third) = (fds.next(), fds.next(), fds.next()) else {
        return;
    };
    let client_socket = match stream_from_fd(client_fd) {
        Ok(socket) => socket,
        Err(error) => {
            tracing::warn!(id, %error, "cannot use an adopted connection");
            return;
        }
    };
    let known = if migrate.client.is_empty() {
        None
    } else {
        match context.directory.get(&migrate.client) {
            Some(client) => Some(client),
            None => {
                // Maybe added a moment ago; look once more before giving up.
                let _ = context.directory.catch_up().await;
                context.directory.get(&migrate.client)
            }
        }
    };
    match migrate.kind {
        MigrateKind::HttpIdle => {
            // With no client named, the predecessor billed nobody for the
            // bytes it read and left: the first client to authenticate is.
            // (A client it named but this plane does not know, removed
            // meanwhile, was billed there already.)
            let unbilled_up = if migrate.client.is_empty() {
                migrate.up.pending.len() as u64
            } else {
                0
            };
            let adopted = http::Adopted {
                prefix: migrate.up.pending,
                unbilled_up,
                client: known,
                may_hand_over,
                source: None,
            };
            http::serve(client_socket, adopted, context, id).await;
        }
        MigrateKind::SocksUdp => {
            let Some(client) = known else {
                tracing::info!(id, client = %migrate.client, "adopted udp association of an unknown client; closing");
                return;
            };
            let (Some(relay), Some(egress)) = (second, third) else {
                tracing::warn!(id, "adopted udp association without its sockets");
                return;
            };
            let state = migrate.udp.unwrap_or_default();
            match udp_associate::Association::adopted(client_socket, relay, egress, state) {
                Ok(association) => {
                    udp_associate::run(context, id, client, association, may_hand_over, None).await;
                }
                Err(error) => tracing::warn!(id, %error, "cannot use an adopted udp association"),
            }
        }
        MigrateKind::SocksTunnel | MigrateKind::HttpTunnel => {
            let Some(client) = known else {
                tracing::info!(id, client = %migrate.client, "adopted tunnel of an unknown client; closing");
                return;
            };
            let Some(egress) = second.and_then(|fd| stream_from_fd(fd).ok()) else {
                tracing::warn!(id, "adopted tunnel without a usable destination socket");
                return;
            };
            let tunnel = Tunnel {
                client: client_socket,
                egress,
                up: migrate.up,
                down: migrate.down,
                up_billed: 0,
                emptied_pipes: EmptiedPipes::default(),
            };
            tunnel::run(
                context,
                migrate.kind,
                id,
                client,
                tunnel,
                may_hand_over,
                None,
            )
            .await;
        }
    }
}
