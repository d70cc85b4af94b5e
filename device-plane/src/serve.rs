//! What every connection handler shares: the clients, the egress, the
//! timeouts, the plane's mode, and the way to hand a connection over.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::{Message, Migrate};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use tokio::net::TcpStream;

use crate::clients::Directory;
use crate::devices::Devices;
use crate::egress::{Egress, EgressError, Target};

/// What the plane asks of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve normally.
    Serving,
    /// A successor is active: hand every connection over as soon as it is
    /// between requests (HTTP) or established (tunnels).
    Handover,
    /// No successor: finish within the grace; idle HTTP connections close.
    Finish,
}

/// Shared by every connection this plane serves.
#[derive(Debug)]
pub struct Context {
    /// Known clients.
    pub directory: Arc<Directory>,
    /// Client devices: egress identities and activity.
    pub devices: Arc<Devices>,
    /// The egress policy and connector.
    pub egress: Egress,
    /// Time a customer has to finish its proxy handshake.
    pub handshake_timeout: Duration,
    /// A tunnel with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Every live connection task.
    pub connections: TaskTracker,
    /// Serving, handing over, or finishing.
    pub mode: watch::Sender<Mode>,
    /// Cancelled when the drain grace is over: everything still open is cut.
    /// Replaced by a fresh one if the plane is re-activated afterwards.
    cut_all: Mutex<CancellationToken>,
    /// Connections taken since start (accepted and adopted).
    pub taken: AtomicU64,
    /// Connections handed to a successor.
    pub migrated: AtomicU64,
    /// The device channel, while attached: handovers go through it.
    channel: Mutex<Option<Arc<UnixSeqpacket>>>,
    /// Handovers in flight at once: a tunnel keeps relaying until it holds
    /// one, so each pauses only for its own handover, not for the whole queue.
    handover_slots: Arc<Semaphore>,
    /// Handovers sent and not yet confirmed by the successor (MigrateDone).
    awaiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

/// Longest wait for a successor's confirmation: longer than the ingress
/// holds a connection looking for a plane (10 s) before sending it back.
const CONFIRM_WAIT: Duration = Duration::from_secs(30);

/// Handovers sent at once.
const HANDOVER_SLOTS: usize = 32;

impl Context {
    /// A context serving normally, not yet attached.
    pub fn new(
        directory: Arc<Directory>,
        devices: Arc<Devices>,
        egress: Egress,
        handshake_timeout: Duration,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            directory,
            devices,
            egress,
            handshake_timeout,
            idle_timeout,
            connections: TaskTracker::new(),
            mode: watch::channel(Mode::Serving).0,
            cut_all: Mutex::new(CancellationToken::new()),
            taken: AtomicU64::new(0),
            migrated: AtomicU64::new(0),
            channel: Mutex::new(None),
            handover_slots: Arc::new(Semaphore::new(HANDOVER_SLOTS)),
            awaiting: Mutex::new(HashMap::new()),
        }
    }

    /// Connects `client` to `target` from its device's egress identity
    /// (opening the device on first use). A source address that can no longer
    /// be bound evicts the identity; the connect is retried once with a new one.
    pub async fn connect_for(
        &self,
        client: &str,
        target: &Target,
    ) -> Result<TcpStream, EgressError> {
        self.devices.touch(client);
        let device = self.devices.open(client).await;
        match self.egress.connect(device.identity.source, target).await {
            Err(EgressError::SourceUnusable(source, error)) => {
                tracing::warn!(client, %source, %error, "egress identity unusable; evicting it");
                self.devices.evict(client).await;
                let device = self.devices.open(client).await;
                self.egress.connect(device.identity.source, target).await
            }
            other => other,
        }
    }

    /// The token that cuts every connection at the end of a drain's grace.
    pub fn cut_token(&self) -> CancellationToken {
        self.cut_all
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Cuts every connection (the drain grace is over).
    pub fn cut_everything(&self) {
        self.cut_token().cancel();
    }

    /// Back to serving: a later drain gets a grace of its own.
    pub fn serve_again(&self) {
        *self
            .cut_all
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = CancellationToken::new();
        self.mode.send_replace(Mode::Serving);
        self.connections.reopen();
    }

    /// Sets (or clears) the channel handovers go through. Clearing it
    /// releases every handover still waiting for a confirmation.
    pub fn set_channel(&self, channel: Option<Arc<UnixSeqpacket>>) {
        if channel.is_none() {
            self.awaiting_map().clear();
        }
        *self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = channel;
    }

    fn awaiting_map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<()>>> {
        self.awaiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The successor confirmed connection `id` (MigrateDone from the ingress).
    pub fn handover_confirmed(&self, id: u64) {
        if let Some(done) = self.awaiting_map().remove(&id) {
            let _ = done.send(());
        }
    }

    /// Tells the ingress this plane took over connection `id`.
    pub async fn confirm_adoption(&self, id: u64) {
        if let Some(channel) = self.channel() {
            if let Err(error) = blipless_link::send(&channel, &Message::MigrateDone(id), &[]).await
            {
                tracing::debug!(id, %error, "could not confirm an adopted connection");
            }
        }
    }

    fn channel(&self) -> Option<Arc<UnixSeqpacket>> {
        self.channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The plane's mode now.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Completes when the plane hands connections over and this one may go
    /// now: it yields the slot to hold while sending.
    pub fn handover_slot(
        &self,
    ) -> impl std::future::Future<Output = OwnedSemaphorePermit> + Send + 'static {
        let mut mode = self.mode.subscribe();
        let slots = self.handover_slots.clone();
        async move {
            if mode.wait_for(|m| *m == Mode::Handover).await.is_err() {
                return std::future::pending().await;
            }
            match slots.acquire_owned().await {
                Ok(slot) => slot,
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Completes when the plane stops serving (handover or finish).
    pub fn serving_ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut mode = self.mode.subscribe();
        async move {
            if mode.wait_for(|m| *m != Mode::Serving).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Sends one connection to the successor through the ingress and waits
    /// for its confirmation (the ingress answers for a successor that goes
    /// away). Gives the state back when it could not be sent: the caller
    /// keeps serving it.
    pub async fn hand_over(
        &self,
        mut migrate: Migrate,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), Migrate> {
        let Some(channel) = self.channel() else {
            return Err(migrate);
        };
        let id = migrate.connection_id;
        // A run too long for the frame travels in a pipe (the frame then
        // carries only its length); the bytes stay here until the send succeeds.
        let mut pipes = Vec::new();
        let mut no_pipe = None;
        for (pending, piped) in [
            (&migrate.up.pending, &mut migrate.up_piped),
            (&migrate.down.pending, &mut migrate.down_piped),
        ] {
            if pending.len() <= crate::piped::INLINE_LIMIT {
                continue;
            }
            match crate::piped::pipe_out(pending) {
                Ok(pipe) => {
                    *piped = pending.len() as u32;
                    pipes.push(pipe);
                }
                Err(error) => no_pipe = Some(error),
            }
        }
        if let Some(error) = no_pipe {
            tracing::warn!(id, %error, "no pipe for the pending bytes; keeping the connection here");
            return Err(unpiped(migrate));
        }
        if !pipes.is_empty() {
            tracing::debug!(
                id,
                up = migrate.up_piped,
                down = migrate.down_piped,
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
            return Err(unpiped(migrate));
        }
        self.migrated.fetch_add(1, Ordering::Relaxed);
        // Hold the caller's slot until the successor has the connection
        // relaying, so migrations queue here, live, not in socket buffers,
        // frozen. The wait ends early only at the drain grace or when the
        // channel is lost (which drops every waiting confirmation).
        let cut = self.cut_token();
        tokio::select! {
            _ = confirmed => {}
            () = cut.cancelled() => {}
            () = tokio::time::sleep(CONFIRM_WAIT) => {
                tracing::warn!(id, "no confirmation from the successor; going on");
            }
        }
        self.awaiting_map().remove(&id);
        tracing::debug!(id, "connection handed over");
        Ok(())
    }
}

/// A Migrate that was not sent: its bytes are all in `pending` again.
fn unpiped(mut migrate: Migrate) -> Migrate {
    migrate.up_piped = 0;
    migrate.down_piped = 0;
    migrate
}
