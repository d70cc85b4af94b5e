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
    pub cut_all: CancellationToken,
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

/// How long a handover waits for the successor's confirmation before it
/// lets the next one go anyway (the successor holds the sockets either way).
const CONFIRM_WAIT: Duration = Duration::from_secs(5);

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
            cut_all: CancellationToken::new(),
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

    /// Sends one connection to the successor through the ingress. Gives the
    /// state back when it could not be sent: the caller keeps serving it.
    pub async fn hand_over(
        &self,
        mut migrate: Migrate,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), Migrate> {
        let Some(channel) = self.channel() else {
            return Err(migrate);
        };
        let id = migrate.connection_id;
        // Runs too long for the frame go in pipes; the bytes stay here too
        // until the send succeeds.
        let mut pipes = Vec::new();
        let mut kept: [Option<Vec<u8>>; 2] = [None, None];
        for index in 0..2 {
            let direction = if index == 0 {
                &mut migrate.up
            } else {
                &mut migrate.down
            };
            if direction.pending.len() <= crate::piped::INLINE_LIMIT {
                continue;
            }
            let piped = match crate::piped::pipe_out(&direction.pending) {
                Ok(pipe) => pipe,
                Err(error) => {
                    tracing::warn!(id, %error, "no pipe for the pending bytes; keeping the connection here");
                    restore(&mut migrate, &mut kept);
                    return Err(migrate);
                }
            };
            let len = direction.pending.len() as u32;
            kept[index] = Some(std::mem::take(&mut direction.pending));
            if index == 0 {
                migrate.up_piped = len;
            } else {
                migrate.down_piped = len;
            }
            pipes.push(piped);
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
        let message = Message::Migrate(migrate);
        let (done, confirmed) = oneshot::channel();
        self.awaiting_map().insert(id, done);
        match blipless_link::send(&channel, &message, &all_fds).await {
            Ok(()) => {
                self.migrated.fetch_add(1, Ordering::Relaxed);
                // Hold the caller's slot until the successor has the
                // connection relaying, so migrations queue here, live, not
                // in socket buffers, frozen.
                if tokio::time::timeout(CONFIRM_WAIT, confirmed).await.is_err() {
                    self.awaiting_map().remove(&id);
                    tracing::debug!(id, "no confirmation from the successor; going on");
                }
                tracing::debug!(id, "connection handed over");
                Ok(())
            }
            Err(error) => {
                self.awaiting_map().remove(&id);
                tracing::warn!(id, %error, "handover failed; keeping the connection here");
                match message {
                    Message::Migrate(mut migrate) => {
                        restore(&mut migrate, &mut kept);
                        Err(migrate)
                    }
                    _ => unreachable_message(),
                }
            }
        }
    }
}

/// Puts bytes moved into pipes back into a Migrate that will not be sent.
fn restore(migrate: &mut Migrate, kept: &mut [Option<Vec<u8>>; 2]) {
    if let Some(up) = kept[0].take() {
        migrate.up.pending = up;
        migrate.up_piped = 0;
    }
    if let Some(down) = kept[1].take() {
        migrate.down.pending = down;
        migrate.down_piped = 0;
    }
}

/// `hand_over` builds the message from a Migrate and takes it apart again.
#[allow(clippy::panic)]
fn unreachable_message() -> ! {
    panic!("a Migrate message is still a Migrate")
}
