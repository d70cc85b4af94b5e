//! blipless-ingress: the stable plane of a blipless node.
//!
//! It owns every customer-facing socket and hands each accepted connection
//! to the active device plane over the device channel; it terminates
//! WireGuard sessions and trades their inner packets with the active device
//! plane over the same channel; it serves `/status`,
//! `/metrics` and the control socket. It holds no database client and no
//! per-connection state once a connection is handed over.

pub mod accept;
pub mod control;
pub mod device_link;
pub mod metrics;
pub mod node;
pub mod peercred;
pub mod planes;
pub mod sockets;
pub mod status;
pub mod wg;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use blipless_config::Config;
use blipless_protocol::channel::ListenerKind;
use blipless_protocol::control::ListenerInfo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept::{AcceptContext, ConnectionIds};
use crate::metrics::Metrics;
use crate::node::Node;
use crate::planes::Planes;

/// Binds every socket, serves until `shutdown` is cancelled, then drains:
/// `/status` answers 503 `draining`, the listeners close after the lame-duck
/// period, every device plane is told to drain, and this returns once no
/// plane is attached or the drain grace has passed.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let socks = sockets::bind_tcp("socks", config.listen.socks)?;
    let http = sockets::bind_tcp("http", config.listen.http)?;
    let status = sockets::bind_tcp("status", config.listen.status)?;
    let device = sockets::bind_device_socket(&config.device_socket())?;
    let control = sockets::bind_control_socket(&config.control_socket())?;
    let wg_socket = sockets::bind_udp("wg", config.listen.wg)?;
    let key_file = config.wireguard_key_file();
    let key = blipless_config::wireguard_key::WireguardKey::load_or_create(&key_file)?;

    let listeners = vec![
        listener_info("socks", &socks),
        listener_info("http", &http),
        listener_info("status", &status),
        ListenerInfo {
            name: "wg".to_string(),
            address: wg_socket
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
        },
    ];
    let metrics = Arc::new(Metrics::new());
    let planes = Arc::new(Planes::new(metrics.clone()));
    let wireguard = Arc::new(wg::Wireguard::new(
        key.private_bytes(),
        wg::udp::WgSocket::new(wg_socket).context("setting up the WireGuard socket")?,
        planes.clone(),
        metrics.wg.clone(),
        config.wireguard.handshake_limit,
        config.wireguard.queue,
        0,
    ));
    let node = Arc::new(Node::new(
        planes.clone(),
        wireguard.clone(),
        metrics.clone(),
        listeners,
        shutdown.clone(),
    ));
    let context = AcceptContext {
        planes: planes.clone(),
        metrics: metrics.clone(),
        ids: Arc::new(ConnectionIds::default()),
    };

    // Customer listeners stop at `stop_accepting`; the rest serve to the end.
    let stop_accepting = CancellationToken::new();
    let stop_serving = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(accept::serve(
        ListenerKind::Socks,
        socks,
        context.clone(),
        stop_accepting.clone(),
    ));
    tasks.spawn(accept::serve(
        ListenerKind::Http,
        http,
        context,
        stop_accepting.clone(),
    ));
    tasks.spawn(status::serve(status, node.clone(), stop_serving.clone()));
    tasks.spawn(device_link::serve(
        device,
        device_link::DeviceContext {
            planes: planes.clone(),
            metrics: metrics.clone(),
            wireguard: wireguard.clone(),
            ready_budget: config.deploy.ready_budget,
        },
        stop_serving.clone(),
    ));
    tasks.spawn(wireguard.clone().serve(stop_serving.clone()));
    tasks.spawn(control::serve(control, node.clone(), stop_serving.clone()));
    tasks.close();
    tracing::info!(
        socks = %config.listen.socks,
        http = %config.listen.http,
        status = %config.listen.status,
        wg = %config.listen.wg,
        wg_public_key = %key.public_base64(),
        device = %config.device_socket().display(),
        "ingress serving; waiting for a device plane"
    );

    shutdown.cancelled().await;
    tracing::info!(lame_duck = ?config.drain.lame_duck, grace = ?config.drain.grace, "draining the node");
    node.start_draining();
    tokio::time::sleep(config.drain.lame_duck).await;
    stop_accepting.cancel();
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
    let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
    for path in [config.device_socket(), config.control_socket()] {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("ingress stopped");
    Ok(())
}

fn listener_info(name: &str, listener: &tokio::net::TcpListener) -> ListenerInfo {
    ListenerInfo {
        name: name.to_string(),
        address: listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into()),
    }
}
