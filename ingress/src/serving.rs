//! The ingress's listener tasks: one accept loop per listening socket
//! (customers, status, device planes, control, would-be successors), started
//! at start-up and again when a successor that took over dies, and stopped
//! in two steps (customers first) by a drain or a handoff.

use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::{ListenerKind, SocketName};
use tokio::sync::mpsc;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept::{self, AcceptContext};
use crate::device_link::{self, DeviceContext};
use crate::handoff::{self, Handoffs, Lineage};
use crate::listeners::Listeners;
use crate::node::Node;
use crate::{control, status};

/// How long stopping waits for the listener tasks to end.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// What the listener tasks need.
#[derive(Debug)]
pub struct Serving<'a> {
    /// The sockets (each task gets a duplicate of its fd).
    pub listeners: &'a Listeners,
    /// Status, control and handoff answer from it.
    pub node: &'a Arc<Node>,
    /// The customer accept loops'.
    pub context: &'a AcceptContext,
    /// The device socket's.
    pub device_context: &'a DeviceContext,
    /// Whether a successor may take over.
    pub lineage: &'a Arc<Lineage>,
    /// Where a successor that serves is sent.
    pub takeovers: &'a mpsc::Sender<UnixSeqpacket>,
    /// This ingress's WireGuard generation, offered to a successor.
    pub generation: u32,
}

/// The listener tasks while they run.
#[derive(Debug)]
pub struct Running {
    stop_accepting: CancellationToken,
    stop_serving: CancellationToken,
    tasks: TaskTracker,
    /// What the handoff task offers (a drain withdraws the customer
    /// listeners); weak, so that the offer's fds close with that task.
    handoffs: std::sync::Weak<Handoffs>,
}

impl Serving<'_> {
    /// Starts every accept loop.
    pub fn spawn(&self) -> anyhow::Result<Running> {
        let stop_accepting = CancellationToken::new();
        let stop_serving = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(accept::serve(
            ListenerKind::Socks,
            self.listeners.tcp(SocketName::Socks)?,
            self.context.clone(),
            stop_accepting.clone(),
        ));
        tasks.spawn(accept::serve(
            ListenerKind::Http,
            self.listeners.tcp(SocketName::Http)?,
            self.context.clone(),
            stop_accepting.clone(),
        ));
        if self.listeners.has(SocketName::Https) {
            tasks.spawn(accept::serve(
                ListenerKind::Https,
                self.listeners.tcp(SocketName::Https)?,
                self.context.clone(),
                stop_accepting.clone(),
            ));
        }
        tasks.spawn(status::serve(
            self.listeners.tcp(SocketName::Status)?,
            self.node.clone(),
            stop_serving.clone(),
        ));
        tasks.spawn(device_link::serve(
            self.listeners.device()?,
            self.device_context.clone(),
            stop_serving.clone(),
        ));
        tasks.spawn(control::serve(
            self.listeners.control()?,
            self.node.clone(),
            stop_serving.clone(),
        ));
        let handoffs = Arc::new(Handoffs::new(
            self.listeners,
            self.generation,
            self.node.clone(),
            self.lineage.clone(),
            self.takeovers.clone(),
        ));
        tasks.spawn(handoff::serve(
            self.listeners.handoff()?,
            handoffs.clone(),
            stop_serving.clone(),
        ));
        tasks.close();
        Ok(Running {
            stop_accepting,
            stop_serving,
            tasks,
            handoffs: Arc::downgrade(&handoffs),
        })
    }
}

impl Running {
    /// Stops the customer accept loops (SOCKS5, HTTP and HTTPS; the TLS
    /// connections already accepted are relayed on).
    pub fn stop_accepting(&self) {
        self.stop_accepting.cancel();
    }

    /// Closes the customer listeners (SOCKS5, HTTP, HTTPS) for a drain:
    /// stops their accept loops, and closes this ingress's copies and the
    /// handoff offer's, so that new customers are refused, not queued
    /// (under systemd the fd store keeps its own: docs/OPERATIONS.md,
    /// "Stopping").
    pub fn close_customer_listeners(&self, listeners: &mut Listeners) {
        const CUSTOMERS: [SocketName; 3] = [SocketName::Socks, SocketName::Http, SocketName::Https];
        self.stop_accepting();
        listeners.close(&CUSTOMERS);
        if let Some(handoffs) = self.handoffs.upgrade() {
            handoffs.withdraw(&CUSTOMERS);
        }
    }

    /// Stops the others: status, device, control and handoff.
    pub fn stop_serving(&self) {
        self.stop_serving.cancel();
    }

    /// Waits (at most `STOP_WAIT`, 2 s) for the stopped tasks to end.
    pub async fn wait(&self) {
        self.tasks.close();
        let _ = tokio::time::timeout(STOP_WAIT, self.tasks.wait()).await;
    }
}
