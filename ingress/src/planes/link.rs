//! One attached device plane as the ingress sees it: its half of the channel
//! (sends serialised by a lock, so nothing is queued after the Drain that
//! ends its activity), its queue of orders, its state, and the figures it
//! reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use blipless_protocol::channel::{DeviceReport, Hello, MigrateKind, Rejoin, ToDevice};
use blipless_protocol::control::DevicePlaneInfo;
use tokio::sync::{mpsc, oneshot};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

/// A frame for a device plane, encoded once however many planes it is
/// offered to: by [`blipless_protocol::channel::encode`], or written in
/// place (a batch of WireGuard packets,
/// [`blipless_protocol::channel::PacketsFrame`]).
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// The whole frame.
    pub bytes: &'a [u8],
    /// Its message type, for logs and errors.
    pub name: &'static str,
    /// It moves a SOCKS5 UDP association, which only a plane that
    /// [`reads_udp_migrate`](PlaneLink::reads_udp_migrate) may be sent.
    pub udp_association: bool,
}

impl<'a> Frame<'a> {
    /// The frame `encoded` holds, of `message`'s type.
    pub fn of(message: &ToDevice<'_>, encoded: &'a [u8]) -> Self {
        Self {
            bytes: encoded,
            name: message.name(),
            udp_association: matches!(
                message,
                ToDevice::Migrate(migrate) if migrate.kind == MigrateKind::SocksUdp
            ),
        }
    }

    /// Whether `plane` can read this frame.
    pub fn readable_by(&self, plane: &PlaneLink) -> bool {
        !self.udp_association || plane.reads_udp_migrate
    }
}

/// Where a device plane is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneState {
    /// Said Hello; warming up.
    Standby,
    /// Receives every new connection.
    Active,
    /// Told to drain; receives nothing new.
    Draining,
}

impl PlaneState {
    /// The word status and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            PlaneState::Standby => "standby",
            PlaneState::Active => "active",
            PlaneState::Draining => "draining",
        }
    }
}

/// One attached device plane: its half of the channel and what we know of it.
#[derive(Debug)]
pub struct PlaneLink {
    /// The number this ingress gave it.
    pub generation: u64,
    /// Its process id (from its Hello).
    pub pid: u32,
    /// Its software version (from its Hello).
    pub software: String,
    socket: UnixSeqpacket,
    /// Held across each send, so that a connection handed while this plane
    /// was active is queued before the Drain that ends its activity.
    send_lock: tokio::sync::Mutex<()>,
    /// Orders ([`PlaneLink::order`]) waiting for their turn.
    orders: mpsc::UnboundedSender<QueuedOrder>,
    /// The other end of `orders`, until the first order starts the task
    /// that sends them.
    order_queue: Mutex<Option<mpsc::UnboundedReceiver<QueuedOrder>>>,
    state: Mutex<PlaneState>,
    /// Woken at each change of `state`: a send that waits on a full channel
    /// gives up once the plane is no longer active ([`PlaneLink::send_if_active`]).
    state_changed: tokio::sync::Notify,
    handed: AtomicU64,
    report: Mutex<DeviceReport>,
    leaving: std::sync::atomic::AtomicBool,
    drained: std::sync::atomic::AtomicBool,
    read_to_end: std::sync::atomic::AtomicBool,
    /// When it said Hello.
    pub attached_at: Instant,
    /// What it was at this ingress's predecessor (from its Hello).
    pub rejoin: Rejoin,
    /// It reads `AcceptedMany` (from its Hello): a burst of connections may
    /// travel to it in one frame.
    pub accepts_many: bool,
    /// It reads `MigrateNotTaken` (from its Hello).
    pub reads_not_taken: bool,
    /// It reads a `Migrate` of a SOCKS5 UDP association (from its Hello).
    pub reads_udp_migrate: bool,
    /// Its process, to tell whether it is gone once its channel is.
    pub process: super::process::PlaneProcess,
    /// Cancelled when the channel to this plane is gone.
    pub closed: CancellationToken,
    /// Cancelled once the orders its detach gave (the Activate of the plane
    /// given the node back) are queued: answers for its unconfirmed
    /// connections wait for it, so that each plane's queue sends them after
    /// its Activate, never before.
    pub detach_orders_sent: CancellationToken,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it:
/// every value guarded here stays consistent between statements.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An order waiting for its turn, and who waits for it to be sent.
#[derive(Debug)]
struct QueuedOrder {
    message: ToDevice<'static>,
    sent: oneshot::Sender<()>,
    /// The giver gave up on it ([`OrderSent::give_up`]): not sent, or no
    /// longer waited for.
    given_up: CancellationToken,
}

/// Resolves once an order given with [`PlaneLink::order`] was sent, or
/// given up because its plane is gone or its giver gave up on it.
#[derive(Debug)]
pub struct OrderSent {
    done: oneshot::Receiver<()>,
    given_up: CancellationToken,
}

impl OrderSent {
    /// The order is not to be sent if it has not been yet (a Goaway or a
    /// Drain whose caller's grace ran out: a plane that reads again later
    /// must not find it). A send under way is stopped; a SOCK_SEQPACKET
    /// send is whole or not at all.
    pub fn give_up(&self) {
        self.given_up.cancel();
    }
}

impl std::future::Future for OrderSent {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // A dropped sender (the plane gone with the order unsent) ends the
        // wait as a send does.
        std::pin::Pin::new(&mut self.done).poll(context).map(|_| ())
    }
}

impl PlaneLink {
    /// A link over an accepted channel socket whose Hello has been read,
    /// to the plane whose process is `process`.
    pub fn new(
        generation: u64,
        hello: Hello,
        socket: UnixSeqpacket,
        process: super::process::PlaneProcess,
    ) -> Self {
        let (orders, order_queue) = mpsc::unbounded_channel();
        Self {
            generation,
            pid: hello.pid,
            software: hello.software,
            socket,
            send_lock: tokio::sync::Mutex::new(()),
            orders,
            order_queue: Mutex::new(Some(order_queue)),
            state: Mutex::new(PlaneState::Standby),
            state_changed: tokio::sync::Notify::new(),
            handed: AtomicU64::new(0),
            report: Mutex::new(DeviceReport::default()),
            leaving: std::sync::atomic::AtomicBool::new(false),
            drained: std::sync::atomic::AtomicBool::new(false),
            read_to_end: std::sync::atomic::AtomicBool::new(false),
            attached_at: Instant::now(),
            rejoin: hello.rejoin,
            accepts_many: hello.accepts_many,
            reads_not_taken: hello.reads_not_taken,
            reads_udp_migrate: hello.reads_udp_migrate,
            process,
            closed: CancellationToken::new(),
            detach_orders_sent: CancellationToken::new(),
        }
    }

    /// The channel socket, for the task that reads from it.
    pub fn socket(&self) -> &UnixSeqpacket {
        &self.socket
    }

    /// The plane's state now.
    pub fn state(&self) -> PlaneState {
        *lock(&self.state)
    }

    pub(super) fn set_state(&self, state: PlaneState) {
        *lock(&self.state) = state;
        self.state_changed.notify_waiters();
    }

    /// True once the plane asked to leave (or the node drains): it is never
    /// re-activated.
    pub fn leaving(&self) -> bool {
        self.leaving.load(Ordering::SeqCst)
    }

    /// Records that the plane said Drained (it holds nothing).
    pub fn mark_drained(&self) {
        self.drained.store(true, Ordering::SeqCst);
    }

    /// True once the plane said Drained.
    pub fn drained(&self) -> bool {
        self.drained.load(Ordering::SeqCst)
    }

    /// Records that every frame the plane sent was read: its channel
    /// reached its end, not an error.
    pub fn mark_read_to_end(&self) {
        self.read_to_end.store(true, Ordering::SeqCst);
    }

    /// The plane is gone and provably took none of the connections it did
    /// not confirm: its channel was read to the end (no confirmation left
    /// unread) and its process exited within `wait` (nothing holds them).
    pub async fn never_took_unconfirmed(&self, wait: std::time::Duration) -> bool {
        self.read_to_end.load(Ordering::SeqCst) && self.process.exited_within(wait).await
    }

    pub(super) fn mark_leaving(&self) {
        self.leaving.store(true, Ordering::SeqCst);
    }

    /// Records the plane's latest figures.
    pub fn set_report(&self, report: DeviceReport) {
        *lock(&self.report) = report;
    }

    /// The plane's latest figures.
    pub fn report(&self) -> DeviceReport {
        lock(&self.report).clone()
    }

    /// Counts a connection handed to this plane.
    pub fn count_handed(&self) {
        self.handed.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends one message, with `fds` beside it as SCM_RIGHTS.
    pub async fn send(
        &self,
        message: &ToDevice<'_>,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let _turn = self.send_lock.lock().await;
        send_frame(&self.socket, message, fds).await
    }

    /// Gives this plane an order (Activate, Drain, Goaway, an answer about
    /// a migration) without waiting for its channel: one task per plane
    /// sends its orders in the order given. A caller never waits on a plane
    /// that stopped reading (the reader of the plane that just said Ready
    /// used to, sending the old plane's Drain, and so read nothing more
    /// from its own plane), and two orders to one plane never cross (a
    /// Drain from one task overtaking the Activate another gave).
    /// Await the result to know it was sent (or that the plane is gone).
    pub fn order(self: &Arc<Self>, message: ToDevice<'static>) -> OrderSent {
        if let Some(queue) = lock(&self.order_queue).take() {
            tokio::spawn(send_orders_in_turn(Arc::downgrade(self), queue));
        }
        let (sent, done) = oneshot::channel();
        let given_up = CancellationToken::new();
        // The queue's task ends only once this link is dropped, so the send
        // cannot fail while `self` is alive.
        let _ = self.orders.send(QueuedOrder {
            message,
            sent,
            given_up: given_up.clone(),
        });
        OrderSent { done, given_up }
    }

    /// Sends one frame only if this plane is still the active one;
    /// Ok(false) when it is not (the caller re-routes to the new one).
    ///
    /// A send waiting on a full channel (a plane wedged, stopped or starved)
    /// gives up as soon as the plane stops being active: every accept loop
    /// waited in it, so a deploy could not take over from a plane that no
    /// longer read. A SOCK_SEQPACKET send is whole or not at all, so one
    /// given up sent nothing, and what was sent while the plane was active
    /// is still queued before the Drain that ends its activity.
    pub async fn send_if_active(
        &self,
        frame: Frame<'_>,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<bool> {
        let _turn = self.send_lock.lock().await;
        let changed = self.state_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if self.state() != PlaneState::Active {
            return Ok(false);
        }
        let send = blipless_link::send_encoded(&self.socket, frame.bytes, frame.name, fds);
        tokio::pin!(send);
        loop {
            tokio::select! {
                biased;
                sent = &mut send => {
                    sent.map_err(std::io::Error::other)?;
                    return Ok(true);
                }
                () = &mut changed => {
                    // Armed again before the look, so no change is missed.
                    changed.set(self.state_changed.notified());
                    changed.as_mut().enable();
                    if self.state() != PlaneState::Active {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// The plane as `blipless-ctl status` shows it.
    pub fn info(&self) -> DevicePlaneInfo {
        let report = self.report();
        DevicePlaneInfo {
            generation: self.generation,
            pid: self.pid,
            software: self.software.clone(),
            state: self.state().as_str().to_string(),
            connections_handed: self.handed.load(Ordering::Relaxed),
            connections_open: report.connections,
            clients: report.clients,
            migrated: report.migrated,
            routes: report.routes,
        }
    }
}

/// Sends `link`'s orders one after the other as they come. It holds the link
/// only while sending, so it ends when the link is dropped; an order for a
/// plane whose channel is gone is given up.
async fn send_orders_in_turn(
    link: Weak<PlaneLink>,
    mut queue: mpsc::UnboundedReceiver<QueuedOrder>,
) {
    while let Some(QueuedOrder {
        message,
        sent,
        given_up,
    }) = queue.recv().await
    {
        let Some(plane) = link.upgrade() else {
            return;
        };
        let (generation, name) = (plane.generation, message.name());
        if given_up.is_cancelled() {
            tracing::warn!(generation, message = name, "order given up unsent");
            drop(plane);
            let _ = sent.send(());
            continue;
        }
        // One per migrated connection at a deploy: not worth a line each.
        if matches!(
            message,
            ToDevice::MigrateDone(_) | ToDevice::MigrateNotTaken(_)
        ) {
            tracing::debug!(generation, message = name, "telling device plane");
        } else {
            tracing::info!(generation, message = name, "telling device plane");
        }
        // The send is tried first: a plane gone, or a giver that gave up,
        // stops only a send that waits.
        tokio::select! {
            biased;
            result = plane.send(&message, &[]) => {
                if let Err(error) = result {
                    tracing::warn!(generation, %error, "device plane unreachable");
                }
            }
            () = given_up.cancelled() => {
                tracing::warn!(generation, message = name, "order given up unsent");
            }
            () = plane.closed.cancelled() => {
                tracing::debug!(generation, message = name, "device plane gone; order not sent");
            }
        }
        drop(plane);
        let _ = sent.send(());
    }
}

/// What a failed send to a device plane says about its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The channel is gone (the plane closed it, or died): send it nothing
    /// more; its reader sees the end and detaches it.
    ChannelGone,
    /// The kernel had no memory for the frame just now (ENOBUFS, ENOMEM: a
    /// large frame on a fragmented host), or too many descriptors are in
    /// flight (ETOOMANYREFS: a plane slow to read them): the channel is
    /// fine; try again in a moment.
    NoBuffer,
    /// This frame cannot go (over the size cap, too many fds, ...): the
    /// channel is fine; the frame stays with the caller.
    ThisFrame,
}

impl SendFailure {
    /// Classifies the error of [`PlaneLink::send`] or
    /// [`PlaneLink::send_if_active`] (an I/O error, or a
    /// [`blipless_link::LinkError`] wrapped in one).
    pub fn of(error: &std::io::Error) -> Self {
        let io = match error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<blipless_link::LinkError>())
        {
            Some(blipless_link::LinkError::Io(io)) => io,
            Some(_) => return SendFailure::ThisFrame,
            None => error,
        };
        match io.raw_os_error() {
            Some(libc::ENOBUFS | libc::ENOMEM | libc::ETOOMANYREFS) => SendFailure::NoBuffer,
            Some(libc::EMSGSIZE) => SendFailure::ThisFrame,
            _ => SendFailure::ChannelGone,
        }
    }
}

/// Sends one frame with its fds on a channel socket.
pub async fn send_frame(
    socket: &UnixSeqpacket,
    message: &ToDevice<'_>,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    blipless_link::send(socket, message, fds)
        .await
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::SendFailure;

    fn io(errno: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn only_a_channel_that_is_gone_is_taken_for_gone() {
        for errno in [libc::EPIPE, libc::ECONNRESET, libc::ENOTCONN] {
            assert_eq!(SendFailure::of(&io(errno)), SendFailure::ChannelGone);
            let wrapped = std::io::Error::other(blipless_link::LinkError::Io(io(errno)));
            assert_eq!(SendFailure::of(&wrapped), SendFailure::ChannelGone);
        }
        for errno in [libc::ENOBUFS, libc::ENOMEM] {
            let wrapped = std::io::Error::other(blipless_link::LinkError::Io(io(errno)));
            assert_eq!(SendFailure::of(&wrapped), SendFailure::NoBuffer);
        }
        let too_large = std::io::Error::other(blipless_link::LinkError::TooLarge {
            message: "Migrate",
            len: usize::MAX,
        });
        assert_eq!(SendFailure::of(&too_large), SendFailure::ThisFrame);
        assert_eq!(SendFailure::of(&io(libc::EMSGSIZE)), SendFailure::ThisFrame);
    }
}
