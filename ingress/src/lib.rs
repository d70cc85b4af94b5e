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
//! This file is the ingress's life, start to exit: [`run`].

pub mod accept;
pub mod client_sync;
pub mod control;
pub mod device_link;
pub mod dispatch;
mod fault;
pub mod handoff;
pub mod listeners;
pub mod metrics;
pub mod node;
pub mod peercred;
pub mod planes;
pub mod serving;
pub mod sockets;
pub mod status;
pub mod tls;
pub mod watched_listener;
pub mod wg;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::SocketName;
use tokio::sync::mpsc;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use crate::accept::{AcceptContext, ConnectionIds};
use crate::handoff::{Lineage, SteppedAside};
use crate::listeners::Listeners;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::planes::Planes;
use crate::serving::Serving;

/// Says that this ingress stops before it serves, leaving the node to the
/// ingress running it (if any), and ends `run` with nothing taken.
fn stopped_before_serving() -> anyhow::Result<()> {
    tracing::info!(
        "stopped (SIGTERM or SIGINT) before serving: nothing taken over; a running ingress keeps the node"
    );
    Ok(())
}

/// Binds (or takes over) every socket, serves until `shutdown` is cancelled,
/// then drains: `/status` answers 503 `draining`, the listeners close after the
/// lame-duck period, every device plane is told to drain, and this returns once
/// no plane is attached or the drain grace has passed. When a successor takes
/// over by handoff instead, this returns once nothing depends on this ingress
/// any more (`handoff::departure`), or at the drain grace.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    // First of all: until a SIGHUP handler is in place, a SIGHUP (passed on
    // by the stand-in for `systemctl reload`, or a certificate renewal hook)
    // would end the process, and finding a predecessor may take seconds.
    let hangups = tls::TlsEdge::hangups();
    // Sockets the service manager kept for us (after a crash), by name.
    let inherited = blipless_supervise::listen_fds::take().unwrap_or_else(|error| {
        tracing::warn!(%error, "ignoring LISTEN_FDS");
        Vec::new()
    });
    let socket_kept = inherited
        .iter()
        .any(|(name, _)| name == SocketName::Handoff.as_str());
    // Before any socket under it is used: created 0700, or refused when
    // another user owns it or others may write in it.
    sockets::prepare_runtime_dir(&config.node.runtime_dir)?;
    // A stop asked for before this ingress serves (a restart of a successor
    // still waiting for its turn: the stand-in stops it) ends it with
    // nothing taken: the running ingress keeps the node. Taking over and
    // then draining would end the node's service.
    let mut predecessor = tokio::select! {
        biased;
        () = shutdown.cancelled() => return stopped_before_serving(),
        found = handoff::find_predecessor(&config, socket_kept) => found?,
    };
    let metrics = Arc::new(Metrics::new());
    // Before any socket is taken: a certificate that does not load stops
    // the start with the reason, and a predecessor keeps serving.
    let tls = tls::TlsEdge::from_config(&config, metrics.tls.clone())?;
    let planes = Arc::new(Planes::new(metrics.clone()));
    let lineage = Arc::new(Lineage::new(predecessor.as_ref()));
    let (mut listeners, generation) = match predecessor.as_mut() {
        Some(predecessor) => {
            // The predecessor's sockets are the ones the service manager keeps.
            drop(inherited);
            predecessor.take_listeners(&config)?
        }
        None => {
            let (listeners, fresh) = Listeners::bind(&config, inherited)?;
            listeners.park(&fresh);
            (listeners, 0)
        }
    };
    let key_file = config.wireguard_key_file();
    let key = blipless_config::wireguard_key::WireguardKey::load_or_create(&key_file)?;
    let wireguard = Arc::new(
        wg::Wireguard::new(
            key.private_bytes(),
            wg::udp::WgSocket::new(listeners.wg(generation)?)
                .context("setting up the WireGuard socket")?,
            planes.clone(),
            metrics.wg.clone(),
            config.wireguard.handshake_limit,
            config.wireguard.queue,
            generation,
            config.wireguard.worker_count(),
        )
        .with_pools6(config.wireguard.pool6.and_then(|pool6| {
            blipless_config::pool6::TunnelPools::new(config.wireguard.pool, pool6)
        })),
    );
    let node = Arc::new(Node::new(
        planes.clone(),
        wireguard.clone(),
        metrics.clone(),
        listeners.infos(),
        tls.clone(),
        shutdown.clone(),
    ));
    let context = AcceptContext {
        planes: planes.clone(),
        metrics: metrics.clone(),
        ids: Arc::new(ConnectionIds::now()),
        tls: tls.clone(),
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
    // SIGHUP (systemctl reload): the certificate again, for as long as we run.
    tokio::spawn(tls::TlsEdge::reload_on_hangup(
        tls.clone(),
        hangups,
        stop_wireguard.clone(),
    ));
    // `wg show`: this ingress's peers, from now until it exits (or a
    // successor's socket replaces it).
    let uapi_path = config.wireguard_uapi_socket();
    let mut uapi = wg::uapi::start(uapi_path.clone(), wireguard.clone(), &stop_wireguard);
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
    if predecessor.is_some() && shutdown.is_cancelled() {
        // Dropping the offer: the predecessor steers WireGuard back and
        // serves on (docs/ARCHITECTURE.md, "Ingress restart by handoff").
        return stopped_before_serving();
    }
    let mut running = serving.spawn()?;
    if let Some(predecessor) = predecessor {
        predecessor
            .serve_beside(
                &metrics,
                &lineage,
                started,
                wireguard.clone(),
                planes.clone(),
                shutdown.clone(),
            )
            .await?;
    }
    tracing::info!(
        socks = %config.listen.socks,
        http = %config.listen.http,
        https = ?config.listen.https,
        status = %config.listen.status,
        wg = %config.listen.wg,
        wg_generation = generation,
        wg_workers = wireguard.worker_count(),
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
        // A successor that serves comes first; a drain asked for while one
        // takes over waits for that handoff's outcome (`Lineage`).
        let successor = tokio::select! {
            biased;
            successor = takeovers.recv() => successor,
            () = shutdown.cancelled() => lineage.drain_or_step_aside(&mut takeovers).await,
        };
        let Some(successor) = successor else { break };
        // A successor serves: step aside, keep decrypting our own sessions
        // until nothing depends on us, or take everything back if it dies.
        // A drain asked for before it served is met by this departure, which
        // runs its course within the grace as a drain would (a stop asked
        // for during the overlap, by contrast, cuts it short).
        let stop = if shutdown.is_cancelled() {
            CancellationToken::new()
        } else {
            shutdown.clone()
        };
        let grace = config.drain.grace;
        let handoff_started = tokio::time::Instant::now();
        match handoff::step_aside(
            &successor, running, &planes, &wireguard, &lineage, grace, &stop,
        )
        .await
        {
            SteppedAside::Exit => {
                // Our copies of the listening sockets go now: a successor
                // that drains closes its own, and ours must not keep them
                // listening (customers queued, then reset) while the TLS
                // connections below finish.
                drop(listeners);
                // The TLS connections we relay are ours to the end (or the
                // grace, from the handoff's start).
                if let Some(tls) = &tls {
                    tls.finish(handoff_started + grace).await;
                }
                stop_wireguard.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(2), wireguard_task).await;
                fault::linger_at_stop().await;
                return Ok(());
            }
            SteppedAside::ServeAgain => {
                // The successor shut our listeners it left behind.
                listeners.listen_again();
                listeners.steer_to(generation)?;
                drop(uapi.take());
                uapi = wg::uapi::start(uapi_path.clone(), wireguard.clone(), &stop_wireguard);
                running = serving.spawn()?;
            }
        }
    }

    tracing::info!(lame_duck = ?config.drain.lame_duck, grace = ?config.drain.grace, "draining the node");
    node.start_draining();
    tokio::time::sleep(config.drain.lame_duck).await;
    running.close_customer_listeners(&mut listeners);
    // The planes are told to drain next: none will be active again.
    if let Some(tls) = &tls {
        tls.no_more_hand_overs();
    }
    // The grace counts from here, and bounds telling the planes too: a
    // wedged plane that reads nothing must not hold the drain past it.
    let deadline = tokio::time::Instant::now() + config.drain.grace;
    let mut drains = Planes::send_orders(planes.drain_all());
    if tokio::time::timeout_at(deadline, &mut drains)
        .await
        .is_err()
    {
        drains.give_up();
        tracing::warn!("drain grace over while telling the device planes to drain");
    }
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
    // A drained plane closed its ends of the HTTPS pairs; a relay left is
    // one the grace cut short.
    if let Some(tls) = &tls {
        tls.finish(deadline).await;
    }
    running.stop_serving();
    stop_wireguard.cancel();
    drop(uapi);
    running.wait().await;
    // The crypto workers finish what they were given.
    let _ = tokio::time::timeout(Duration::from_secs(2), wireguard_task).await;
    fault::linger_at_stop().await;
    // Every socket but handoff.sock closes before the files go: a successor
    // that finds no handoff.sock starts afresh, and must find the ports
    // free. The WireGuard pair too, with the duplicate `Wireguard` owns:
    // bound with SO_REUSEPORT, it would not refuse a fresh group on its
    // port, but take the fresh group into its own, where closing it later
    // shuffles the members the steering program picks by position.
    let all_but_handoff: Vec<SocketName> = SocketName::ALL
        .into_iter()
        .filter(|name| *name != SocketName::Handoff)
        .collect();
    listeners.close(&all_but_handoff);
    let wireguard_socket = Arc::downgrade(&wireguard);
    drop((wireguard, node, device_context));
    if wait_until_dropped(&wireguard_socket, Duration::from_secs(2)).await {
        tracing::info!("every socket but handoff.sock closed; removing the node's socket files");
    } else {
        tracing::warn!(
            "the WireGuard socket is still held after 2 s; removing the node's socket files anyway"
        );
    }
    for path in [
        config.device_socket(),
        config.control_socket(),
        config.handoff_socket(),
    ] {
        let _ = std::fs::remove_file(path);
    }
    // handoff.sock last, once its file is gone: a successor that connected
    // since the handoff server stopped sat in its backlog until now, asks
    // again and finds no file (successor.rs). Had it closed first, a
    // successor finding nobody there would start afresh, bind the files
    // anew, and lose them to the removal above.
    drop(listeners);
    tracing::info!("ingress stopped");
    Ok(())
}

/// Waits, at most `bound`, until nothing holds what `weak` points to;
/// whether nothing does.
async fn wait_until_dropped<T>(weak: &std::sync::Weak<T>, bound: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    while weak.strong_count() > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}
