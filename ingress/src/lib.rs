//! blipless-ingress: the stable plane of a blipless node.
//!
//! It owns every customer-facing socket and hands each accepted connection
//! to the active device plane over the device channel; it terminates
//! WireGuard sessions and trades their inner packets with the active device
//! plane over the same channel; it serves `/status`, `/metrics` and the
//! control socket. It holds no database client and no per-connection state
//! once a connection is handed over.
//!
//! It restarts by handing off ([`handoff`]): a new ingress takes the running
//! one's listening sockets and WireGuard peers, and the old one steps aside.

pub mod accept;
pub mod control;
pub mod device_link;
pub mod handoff;
pub mod listeners;
pub mod metrics;
pub mod node;
pub mod peercred;
pub mod planes;
pub mod sockets;
pub mod status;
pub mod wg;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::{HandoffOffer, ListenerKind, Message};
use blipless_protocol::control::ListenerInfo;
use tokio::sync::mpsc;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept::{AcceptContext, ConnectionIds};
use crate::listeners::Listeners;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::planes::Planes;

/// An ingress that handed off exits once no session of its own has carried a
/// packet for this long (its peers have moved to the successor).
const QUIET_BEFORE_EXIT: Duration = Duration::from_secs(3);
/// ... but not before this long after the successor started serving, so device
/// planes and peers have time to move.
const MIN_OVERLAP: Duration = Duration::from_secs(1);

/// Fault injection for tests: a successor stalls this many milliseconds after
/// taking the offer, before it serves.
pub const FAULT_STALL_HANDOFF: &str = "BLIPLESS_FAULT_STALL_HANDOFF_MS";
/// Fault injection for tests: a successor exits this many milliseconds after
/// it started serving, as a crash would.
pub const FAULT_DIE_AFTER_SERVING: &str = "BLIPLESS_FAULT_DIE_AFTER_SERVING_MS";

fn fault_delay(variable: &str) -> Option<Duration> {
    std::env::var(variable)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
}

async fn fault_pause(variable: &str) {
    if let Some(delay) = fault_delay(variable) {
        tracing::warn!(?delay, "fault injection: {variable}");
        tokio::time::sleep(delay).await;
    }
}

/// Where this ingress stands with the ingresses before and after it.
#[derive(Debug, Default)]
struct Lineage {
    /// Our predecessor still runs (its handoff connection is open): a third
    /// ingress is refused.
    beside_predecessor: AtomicBool,
    /// A successor is taking over (or has): no other may.
    handing_off: AtomicBool,
}

/// Binds (or takes over) every socket, serves until `shutdown` is cancelled,
/// then drains: `/status` answers 503 `draining`, the listeners close after the
/// lame-duck period, every device plane is told to drain, and this returns once
/// no plane is attached or the drain grace has passed. When a successor takes
/// over by handoff instead, this returns once its own WireGuard sessions have
/// gone quiet (or at the drain grace).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    // Sockets the service manager kept for us (after a crash), by name.
    let inherited = blipless_supervise::listen_fds::take().unwrap_or_else(|error| {
        tracing::warn!(%error, "ignoring LISTEN_FDS");
        Vec::new()
    });
    let socket_kept = inherited.iter().any(|(name, _)| name == "handoff");
    let predecessor = handoff::find_predecessor(&config, socket_kept).await?;
    let metrics = Arc::new(Metrics::new());
    let planes = Arc::new(Planes::new(metrics.clone()));
    let lineage = Arc::new(Lineage::default());
    let mut predecessor = predecessor;
    let (mut listeners, generation) = match predecessor.as_mut() {
        Some(predecessor) => {
            let fds = std::mem::take(&mut predecessor.fds);
            // The predecessor's sockets are the ones the service manager keeps.
            drop(inherited);
            let (listeners, rebound) = Listeners::adopt(&config, &predecessor.offer, fds)?;
            listeners.park(&rebound);
            tracing::info!(
                predecessor_generation = predecessor.offer.wg_generation,
                rebound = ?rebound,
                peers = predecessor.peers.len(),
                "taking over from the running ingress"
            );
            (listeners, 1 - (predecessor.offer.wg_generation & 1))
        }
        None => {
            let (listeners, fresh) = Listeners::bind(&config, inherited)?;
            listeners.park(&fresh);
            (listeners, 0)
        }
    };
    let key_file = config.wireguard_key_file();
    let key = blipless_config::wireguard_key::WireguardKey::load_or_create(&key_file)?;
    let wireguard = Arc::new(wg::Wireguard::new(
        key.private_bytes(),
        wg::udp::WgSocket::new(listeners.wg(generation)?)
            .context("setting up the WireGuard socket")?,
        planes.clone(),
        metrics.wg.clone(),
        config.wireguard.handshake_limit,
        config.wireguard.queue,
        generation,
    ));
    let infos = listener_infos(&listeners);
    let node = Arc::new(Node::new(
        planes.clone(),
        wireguard.clone(),
        metrics.clone(),
        infos,
        shutdown.clone(),
    ));
    let context = AcceptContext {
        planes: planes.clone(),
        metrics: metrics.clone(),
        ids: Arc::new(ConnectionIds::default()),
    };
    let device_context = device_link::DeviceContext {
        planes: planes.clone(),
        metrics: metrics.clone(),
        wireguard: wireguard.clone(),
        ready_budget: config.deploy.ready_budget,
    };

    // WireGuard runs for the whole life of the process, handoff or not.
    let stop_wireguard = CancellationToken::new();
    let wireguard_task = tokio::spawn(wireguard.clone().serve(stop_wireguard.clone()));
    if let Some(predecessor) = &predecessor {
        wireguard.seed(&predecessor.peers, &predecessor.endpoints);
    }
    listeners.steer_to(generation)?;

    let (takeover_sender, mut takeovers) = mpsc::channel::<UnixSeqpacket>(1);
    let serving = Serving {
        listeners: &listeners,
        node: &node,
        context: &context,
        device_context: &device_context,
        lineage: &lineage,
        takeovers: &takeover_sender,
        generation,
    };
    let (mut stop_accepting, mut stop_serving, mut tasks) = serving.spawn()?;
    if let Some(predecessor) = predecessor {
        fault_pause(FAULT_STALL_HANDOFF).await;
        metrics.carry_on(&predecessor.offer.counters, started.elapsed());
        let connection = predecessor.serving().await?;
        lineage.beside_predecessor.store(true, Ordering::SeqCst);
        let lineage = lineage.clone();
        tokio::spawn(async move {
            handoff::closed(&connection).await;
            lineage.beside_predecessor.store(false, Ordering::SeqCst);
            tracing::info!("the predecessor ingress has exited");
        });
        if let Some(delay) = fault_delay(FAULT_DIE_AFTER_SERVING) {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                tracing::error!("fault injection: dying after serving");
                std::process::exit(3);
            });
        }
    }
    tracing::info!(
        socks = %config.listen.socks,
        http = %config.listen.http,
        status = %config.listen.status,
        wg = %config.listen.wg,
        wg_generation = generation,
        wg_public_key = %key.public_base64(),
        device = %config.device_socket().display(),
        took = ?started.elapsed(),
        "ingress serving; waiting for a device plane"
    );
    // Under systemd (Type=notify), directly or through --supervise.
    if let Err(error) = blipless_supervise::notify::notify("READY=1\nSTATUS=serving") {
        tracing::warn!(%error, "telling the service manager READY=1 failed");
    }

    loop {
        let successor = tokio::select! {
            () = shutdown.cancelled() => break,
            successor = takeovers.recv() => match successor {
                Some(successor) => successor,
                None => break,
            },
        };
        // A successor serves: step aside, keep decrypting our own sessions
        // until they go quiet, or take everything back if it dies.
        let overlap = Instant::now();
        tracing::info!("a successor ingress serves; stepping aside");
        stop_accepting.cancel();
        stop_serving.cancel();
        tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
        Planes::send_orders(
            planes
                .all()
                .into_iter()
                .map(|p| (p, Message::Goaway))
                .collect(),
        )
        .await;
        let successor_died = tokio::select! {
            () = handoff::closed(&successor) => true,
            () = quiet(&wireguard, overlap, config.drain.grace) => false,
            () = shutdown.cancelled() => false,
        };
        if !successor_died {
            tracing::info!(overlap = ?overlap.elapsed(), idle = ?wireguard.idle_for(), "sessions quiet; the successor has them all: exiting");
            stop_wireguard.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(2), wireguard_task).await;
            return Ok(());
        }
        tracing::warn!("the successor ingress died after taking over; serving again");
        listeners.steer_to(generation)?;
        lineage.handing_off.store(false, Ordering::SeqCst);
        (stop_accepting, stop_serving, tasks) = serving.spawn()?;
    }

    tracing::info!(lame_duck = ?config.drain.lame_duck, grace = ?config.drain.grace, "draining the node");
    node.start_draining();
    tokio::time::sleep(config.drain.lame_duck).await;
    stop_accepting.cancel();
    listeners.close(&["socks", "http"]);
    Planes::send_orders(planes.drain_all()).await;
    let deadline = tokio::time::Instant::now() + config.drain.grace;
    while !planes.all().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = planes.all().len();
    if left > 0 {
        tracing::warn!(
            planes = left,
            "drain grace over with device planes still attached"
        );
    }
    stop_serving.cancel();
    stop_wireguard.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
    for path in [
        config.device_socket(),
        config.control_socket(),
        config.handoff_socket(),
    ] {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("ingress stopped");
    Ok(())
}

/// Completes once no session of this ingress has carried a packet for
/// [`QUIET_BEFORE_EXIT`] (and at least [`MIN_OVERLAP`] has passed since
/// `since`), or at `grace`.
async fn quiet(wireguard: &wg::Wireguard, since: Instant, grace: Duration) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if since.elapsed() >= grace {
            tracing::warn!("drain grace over while sessions still carried packets");
            return;
        }
        if since.elapsed() < MIN_OVERLAP {
            continue;
        }
        match wireguard.idle_for() {
            None => return,
            Some(idle) if idle >= QUIET_BEFORE_EXIT => return,
            Some(_) => {}
        }
    }
}

/// What the listener tasks need; spawned afresh when an ingress takes its
/// sockets back from a successor that died.
struct Serving<'a> {
    listeners: &'a Listeners,
    node: &'a Arc<Node>,
    context: &'a AcceptContext,
    device_context: &'a device_link::DeviceContext,
    lineage: &'a Arc<Lineage>,
    takeovers: &'a mpsc::Sender<UnixSeqpacket>,
    generation: u32,
}

impl Serving<'_> {
    /// Starts every accept loop; returns the tokens that stop the customer
    /// listeners and the rest, and the tasks.
    fn spawn(&self) -> anyhow::Result<(CancellationToken, CancellationToken, TaskTracker)> {
        let stop_accepting = CancellationToken::new();
        let stop_serving = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(accept::serve(
            ListenerKind::Socks,
            self.listeners.tcp("socks")?,
            self.context.clone(),
            stop_accepting.clone(),
        ));
        tasks.spawn(accept::serve(
            ListenerKind::Http,
            self.listeners.tcp("http")?,
            self.context.clone(),
            stop_accepting.clone(),
        ));
        tasks.spawn(status::serve(
            self.listeners.tcp("status")?,
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
        tasks.spawn(serve_handoff(
            self.listeners.handoff()?,
            HandoffContext {
                listeners_offer: self.offer(),
                node: self.node.clone(),
                lineage: self.lineage.clone(),
                takeovers: self.takeovers.clone(),
            },
            stop_serving.clone(),
        ));
        tasks.close();
        Ok((stop_accepting, stop_serving, tasks))
    }

    /// The sockets to offer a successor (duplicated fds it can own).
    fn offer(&self) -> Arc<(HandoffOffer, Vec<std::os::fd::OwnedFd>)> {
        let (sockets, fds) = self.listeners.offer();
        let owned = fds
            .iter()
            .filter_map(|fd| fd.try_clone_to_owned().ok())
            .collect();
        Arc::new((
            HandoffOffer {
                sockets,
                wg_generation: self.generation,
                counters: Default::default(),
            },
            owned,
        ))
    }
}

/// What the handoff listener needs.
struct HandoffContext {
    listeners_offer: Arc<(HandoffOffer, Vec<std::os::fd::OwnedFd>)>,
    node: Arc<Node>,
    lineage: Arc<Lineage>,
    takeovers: mpsc::Sender<UnixSeqpacket>,
}

/// Accepts would-be successors on the handoff socket until `stop`.
async fn serve_handoff(
    listener: tokio_seqpacket::UnixSeqpacketListener,
    context: HandoffContext,
    stop: CancellationToken,
) {
    let context = Arc::new(context);
    sockets::accept_each(listener, stop, "handoff", "handoff failed", move |socket| {
        let context = context.clone();
        async move { hand_off(socket, &context).await }
    })
    .await;
}

/// One would-be successor: refuse it, or offer it everything and, once it
/// serves, tell the run loop to step aside.
async fn hand_off(socket: UnixSeqpacket, context: &HandoffContext) -> anyhow::Result<()> {
    let hello = handoff::hello(&socket).await?;
    if context.lineage.beside_predecessor.load(Ordering::SeqCst) {
        let reason = "this ingress is still taking over from its own predecessor (two generations at most): retry once it has exited".to_string();
        tracing::warn!(pid = hello.pid, "refusing a third ingress");
        peercred::refuse(&socket, reason).await;
        return Ok(());
    }
    if context.lineage.handing_off.swap(true, Ordering::SeqCst) {
        tracing::warn!(pid = hello.pid, "refusing a second successor");
        peercred::refuse(
            &socket,
            "another successor is taking over this ingress".to_string(),
        )
        .await;
        return Ok(());
    }
    tracing::info!(pid = hello.pid, software = %hello.software, "a successor ingress asks to take over");
    let (offer, fds) = &*context.listeners_offer;
    let mut offer = offer.clone();
    offer.counters = context.node.metrics.handoff_counters();
    let (peers, endpoints) = context.node.wireguard.snapshot();
    let offering = handoff::Offering {
        offer,
        fds: fds.iter().map(std::os::fd::AsFd::as_fd).collect(),
        peers,
        endpoints,
        taken_at_ms: context.node.wireguard.now_ms(),
    };
    let serves = handoff::offer(&socket, offering).await.unwrap_or(false);
    if !serves {
        tracing::warn!(
            pid = hello.pid,
            "the successor went away before serving; carrying on"
        );
        context.lineage.handing_off.store(false, Ordering::SeqCst);
        return Ok(());
    }
    if context.takeovers.send(socket).await.is_err() {
        context.lineage.handing_off.store(false, Ordering::SeqCst);
    }
    Ok(())
}

fn listener_infos(listeners: &Listeners) -> Vec<ListenerInfo> {
    [
        ("socks", "socks"),
        ("http", "http"),
        ("status", "status"),
        ("wg", "wg0"),
    ]
    .iter()
    .map(|(shown, name)| ListenerInfo {
        name: (*shown).to_string(),
        address: listeners
            .address(name)
            .map_or_else(|| "?".into(), |a| a.to_string()),
    })
    .collect()
}
