//! The device planes attached to this ingress and which one is active.
//!
//! A plane is Standby after its Hello, Ready once it says so, Active when
//! the ingress sends it new work, Draining once a newer plane took over (or
//! the node drains). Exactly one plane is active at a time; the accept loops
//! watch [`Planes::subscribe`] and switch the moment it changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use blipless_protocol::channel::{self, DeviceReport, Message, MAX_FRAME};
use blipless_protocol::control::DevicePlaneInfo;
use tokio::sync::watch;
use tokio_seqpacket::ancillary::AncillaryMessageWriter;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

/// Where a device plane is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneState {
    /// Said Hello; warming up.
    Standby,
    /// Said Ready; may be activated.
    Ready,
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
            PlaneState::Ready => "ready",
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
    state: Mutex<PlaneState>,
    handed: AtomicU64,
    report: Mutex<DeviceReport>,
    /// Cancelled when the channel to this plane is gone.
    pub closed: CancellationToken,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it:
/// every value guarded here stays consistent between statements.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PlaneLink {
    /// A link over an accepted channel socket whose Hello has been read.
    pub fn new(generation: u64, pid: u32, software: String, socket: UnixSeqpacket) -> Self {
        Self {
            generation,
            pid,
            software,
            socket,
            send_lock: tokio::sync::Mutex::new(()),
            state: Mutex::new(PlaneState::Standby),
            handed: AtomicU64::new(0),
            report: Mutex::new(DeviceReport::default()),
            closed: CancellationToken::new(),
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

    fn set_state(&self, state: PlaneState) {
        *lock(&self.state) = state;
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
        message: &Message,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let _turn = self.send_lock.lock().await;
        send_frame(&self.socket, message, fds).await
    }

    /// Sends one message only if this plane is still the active one;
    /// Ok(false) when it is not (the caller re-routes to the new one).
    pub async fn send_if_active(
        &self,
        message: &Message,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<bool> {
        let _turn = self.send_lock.lock().await;
        if self.state() != PlaneState::Active {
            return Ok(false);
        }
        send_frame(&self.socket, message, fds).await?;
        Ok(true)
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
        }
    }
}

/// Sends one frame with its fds on a channel socket, refusing frames over the cap.
pub async fn send_frame(
    socket: &UnixSeqpacket,
    message: &Message,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    let frame = channel::encode(message);
    if frame.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} frame of {} bytes exceeds the cap",
                message.name(),
                frame.len()
            ),
        ));
    }
    // CMSG_SPACE for up to 8 fds; the ingress never sends more per frame today.
    let mut ancillary_buffer = [0u8; 128];
    let mut ancillary = AncillaryMessageWriter::new(&mut ancillary_buffer);
    if !fds.is_empty() {
        ancillary.add_fds(fds.iter().copied())?;
    }
    let sent = socket.send_with_ancillary(&frame, &mut ancillary).await?;
    if sent != frame.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short write on a SOCK_SEQPACKET socket",
        ));
    }
    Ok(())
}

/// Every attached plane, and the active one.
#[derive(Debug)]
pub struct Planes {
    attached: Mutex<Vec<Arc<PlaneLink>>>,
    active: watch::Sender<Option<Arc<PlaneLink>>>,
    next_generation: AtomicU64,
}

/// A message the caller must send to a plane after a state change.
pub type Order = (Arc<PlaneLink>, Message);

impl Default for Planes {
    fn default() -> Self {
        Self::new()
    }
}

impl Planes {
    /// No plane attached.
    pub fn new() -> Self {
        Self {
            attached: Mutex::new(Vec::new()),
            active: watch::channel(None).0,
            next_generation: AtomicU64::new(1),
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

    /// Adds a plane that said Hello (Standby).
    pub fn attach(&self, link: Arc<PlaneLink>) {
        lock(&self.attached).push(link);
    }

    /// A plane said Ready: it becomes active and the previous active plane
    /// drains. Returns the messages to send, in order.
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
        let mut orders = Vec::new();
        new.set_state(PlaneState::Active);
        orders.push((new.clone(), Message::Activate));
        for old in attached.iter().filter(|p| p.generation != generation) {
            if old.state() == PlaneState::Active {
                old.set_state(PlaneState::Draining);
                orders.push((old.clone(), Message::Drain));
            }
        }
        self.active.send_replace(Some(new));
        orders
    }

    /// A plane's channel is gone. If it was active, the newest Ready plane
    /// (if any) takes over; returns the messages to send.
    pub fn detach(&self, generation: u64) -> Vec<Order> {
        let mut attached = lock(&self.attached);
        attached.retain(|p| p.generation != generation);
        let was_active = self
            .active
            .borrow()
            .as_ref()
            .is_some_and(|p| p.generation == generation);
        if !was_active {
            return Vec::new();
        }
        let successor = attached
            .iter()
            .rev()
            .find(|p| p.state() == PlaneState::Ready)
            .cloned();
        let mut orders = Vec::new();
        if let Some(next) = &successor {
            next.set_state(PlaneState::Active);
            orders.push((next.clone(), Message::Activate));
        }
        self.active.send_replace(successor);
        orders
    }

    /// A plane asked to drain (it got SIGTERM): it takes no new work; the
    /// newest Ready plane, if any, becomes active. The Drain sent back is
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
        leaving.set_state(PlaneState::Draining);
        let mut orders = vec![(leaving.clone(), Message::Drain)];
        let was_active = self
            .active
            .borrow()
            .as_ref()
            .is_some_and(|p| p.generation == generation);
        if was_active {
            let successor = attached
                .iter()
                .rev()
                .find(|p| p.state() == PlaneState::Ready)
                .cloned();
            if let Some(next) = &successor {
                next.set_state(PlaneState::Active);
                orders.push((next.clone(), Message::Activate));
            }
            self.active.send_replace(successor);
        }
        orders
    }

    /// Every plane drains (the node is going down); none is active.
    pub fn drain_all(&self) -> Vec<Order> {
        let attached = lock(&self.attached);
        let mut orders = Vec::new();
        for plane in attached.iter() {
            if plane.state() != PlaneState::Draining {
                plane.set_state(PlaneState::Draining);
                orders.push((plane.clone(), Message::Drain));
            }
        }
        self.active.send_replace(None);
        orders
    }

    /// Every attached plane, oldest first.
    pub fn all(&self) -> Vec<Arc<PlaneLink>> {
        lock(&self.attached).clone()
    }

    /// Sends each order, logging (not failing on) a plane that is gone: its
    /// reader task notices and detaches it.
    pub async fn send_orders(orders: Vec<Order>) {
        for (plane, message) in orders {
            tracing::info!(
                generation = plane.generation,
                message = message.name(),
                "telling device plane"
            );
            if let Err(error) = plane.send(&message, &[]).await {
                tracing::warn!(generation = plane.generation, %error, "device plane unreachable");
            }
        }
    }
}
