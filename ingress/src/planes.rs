//! The device planes attached to this ingress and which one is active.
//!
//! A plane is Standby after its Hello, Active once it says Ready (the
//! ingress sends it every new connection), Draining once a newer plane took
//! over, it asked to leave, or the node drains. Exactly one plane is active at a time; the accept loops
//! watch [`Planes::subscribe`] and switch the moment it changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blipless_protocol::channel::{DeviceReport, DrainOrder, Message};
use blipless_protocol::control::DevicePlaneInfo;
use tokio::sync::watch;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

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
    state: Mutex<PlaneState>,
    handed: AtomicU64,
    report: Mutex<DeviceReport>,
    leaving: std::sync::atomic::AtomicBool,
    drained: std::sync::atomic::AtomicBool,
    /// When it said Hello.
    pub attached_at: Instant,
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
            leaving: std::sync::atomic::AtomicBool::new(false),
            drained: std::sync::atomic::AtomicBool::new(false),
            attached_at: Instant::now(),
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

    fn mark_leaving(&self) {
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
            migrated: report.migrated,
        }
    }
}

/// Sends one frame with its fds on a channel socket.
pub async fn send_frame(
    socket: &UnixSeqpacket,
    message: &Message,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    blipless_link::send(socket, message, fds)
        .await
        .map_err(std::io::Error::other)
}

/// How the latest deploy went.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployRecord {
    /// The plane that was active before, if any.
    pub from: Option<u64>,
    /// The new plane.
    pub to: u64,
    /// "in progress", "succeeded" or "failed".
    pub outcome: &'static str,
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
}

/// One connection between planes, until its successor confirms it.
#[derive(Debug)]
struct Migration {
    from: std::sync::Weak<PlaneLink>,
    to: Option<u64>,
}

/// A message the caller must send to a plane after a state change.
pub type Order = (Arc<PlaneLink>, Message);

fn drain(handover: bool) -> Message {
    Message::Drain(DrainOrder { handover })
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

    /// Remembers which plane connection `id` was passed to.
    pub fn migration_passed(&self, id: u64, to: u64) {
        if let Some(migration) = lock(&self.migrations).get_mut(&id) {
            migration.to = Some(to);
        }
    }

    /// The plane connection `id` came from, if it is still attached.
    pub fn migration_done(&self, id: u64) -> Option<Arc<PlaneLink>> {
        lock(&self.migrations).remove(&id)?.from.upgrade()
    }

    /// The latest deploy, if any.
    pub fn last_deploy(&self) -> Option<DeployRecord> {
        lock(&self.last_deploy).clone()
    }

    fn finish_deploy(&self, outcome: &'static str, detail: String) {
        let mut last = lock(&self.last_deploy);
        if let Some(record) = last.as_mut().filter(|r| r.outcome == "in progress") {
            let duration = record.started.elapsed();
            record.outcome = outcome;
            record.detail = detail;
            record.duration = Some(duration);
            self.metrics.record_deploy(outcome, duration);
            match outcome {
                "succeeded" => tracing::info!(to = record.to, ?duration, "deploy succeeded"),
                _ => tracing::error!(to = record.to, detail = %record.detail, "deploy failed"),
            }
        }
    }

    /// Adds a plane that said Hello (Standby).
    pub fn attach(&self, link: Arc<PlaneLink>) {
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
        let mut orders = Vec::new();
        new.set_state(PlaneState::Active);
        orders.push((new.clone(), Message::Activate));
        let mut from = None;
        for old in attached.iter().filter(|p| p.generation != generation) {
            if old.state() == PlaneState::Active {
                old.set_state(PlaneState::Draining);
                orders.push((old.clone(), drain(true)));
                from = Some(old.generation);
            }
        }
        let record = DeployRecord {
            from,
            to: generation,
            outcome: if from.is_some() {
                "in progress"
            } else {
                "succeeded"
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
        *lock(&self.last_deploy) = Some(DeployRecord {
            from: self.active().map(|p| p.generation),
            to: generation,
            outcome: "in progress",
            detail: String::new(),
            duration: None,
            started: late.attached_at,
        });
        drop(attached);
        self.finish_deploy("failed", detail);
        vec![(late, drain(false))]
    }

    /// A plane's channel is gone (`drained`: it said Drained first). If it
    /// was active, the newest draining plane that may come back is
    /// re-activated (a new plane that died after its activation gives the
    /// node back to the old one).
    pub fn detach(&self, generation: u64, drained: bool) -> Vec<Order> {
        // Confirmations can no longer reach a plane that is gone, nor come
        // from one: answer for the gone successor so its predecessor stops
        // waiting (the connections it held are lost with it).
        let mut orders = Vec::new();
        lock(&self.migrations).retain(|id, migration| {
            let Some(from) = migration.from.upgrade() else {
                return false;
            };
            if from.generation == generation {
                return false;
            }
            if migration.to == Some(generation) {
                orders.push((from, Message::MigrateDone(*id)));
                return false;
            }
            true
        });
        let mut attached = lock(&self.attached);
        attached.retain(|p| p.generation != generation);
        let was_active = self
            .active
            .borrow()
            .as_ref()
            .is_some_and(|p| p.generation == generation);
        let deploy = self.last_deploy();
        let in_progress = deploy.as_ref().filter(|r| r.outcome == "in progress");
        if !was_active {
            drop(attached);
            if in_progress.is_some_and(|r| r.from == Some(generation)) {
                if drained {
                    self.finish_deploy(
                        "succeeded",
                        format!("g{generation} handed over and exited"),
                    );
                } else {
                    self.finish_deploy(
                        "failed",
                        format!("g{generation} went away before it had handed everything over"),
                    );
                }
            }
            return orders;
        }
        let successor = attached
            .iter()
            .rev()
            .find(|p| p.state() == PlaneState::Draining && !p.leaving())
            .cloned();
        if let Some(next) = &successor {
            tracing::warn!(
                gone = generation,
                next = next.generation,
                "active device plane gone; activating the next"
            );
            next.set_state(PlaneState::Active);
            orders.insert(0, (next.clone(), Message::Activate));
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
            self.finish_deploy("failed", detail);
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
