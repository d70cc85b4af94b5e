//! The ingress's shared view of the node: readiness, planes, metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use blipless_protocol::control::{DeployInfo, ListenerInfo, StatusReport};

use crate::metrics::Metrics;
use crate::planes::Planes;
use crate::wg::Wireguard;

/// What `/status` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// No active device plane yet, or its WireGuard peer set is not applied yet.
    Starting,
    /// Serving.
    Ok,
    /// A drain has started.
    Draining,
}

impl Readiness {
    /// The word on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Starting => "starting",
            Readiness::Ok => "ok",
            Readiness::Draining => "draining",
        }
    }
}

/// State shared by the ingress's tasks.
#[derive(Debug)]
pub struct Node {
    /// Attached device planes.
    pub planes: Arc<Planes>,
    /// WireGuard sessions.
    pub wireguard: Arc<Wireguard>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Listening sockets, for status.
    pub listeners: Vec<ListenerInfo>,
    /// The HTTPS listener's TLS edge (certificate reloads), when it is on.
    pub tls: Option<Arc<crate::tls::TlsEdge>>,
    started: Instant,
    draining: AtomicBool,
    /// Cancelled to drain the node (SIGTERM, or `blipless-ctl drain`).
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl Node {
    /// A node that has just started.
    pub fn new(
        planes: Arc<Planes>,
        wireguard: Arc<Wireguard>,
        metrics: Arc<Metrics>,
        listeners: Vec<ListenerInfo>,
        tls: Option<Arc<crate::tls::TlsEdge>>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Self {
        Self {
            planes,
            wireguard,
            metrics,
            listeners,
            tls,
            started: Instant::now(),
            draining: AtomicBool::new(false),
            shutdown,
        }
    }

    /// Marks the node as draining (from then on `/status` answers 503).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Readiness now.
    pub fn readiness(&self) -> Readiness {
        if self.draining.load(Ordering::SeqCst) {
            Readiness::Draining
        } else if self.planes.active().is_some() && self.wireguard.synced() {
            Readiness::Ok
        } else {
            Readiness::Starting
        }
    }

    /// The egress routes the active device plane reports down, for
    /// `/status` (docs/EGRESS.md).
    pub fn routes_down(&self) -> Vec<blipless_protocol::channel::RouteReport> {
        self.planes
            .active()
            .map(|plane| plane.report().routes)
            .unwrap_or_default()
            .into_iter()
            .filter(|route| !route.up)
            .collect()
    }

    /// The report `blipless-ctl status` prints.
    pub fn status_report(&self) -> StatusReport {
        StatusReport {
            state: self.readiness().as_str().to_string(),
            version: blipless_config::build::VERSION.to_string(),
            ingress_pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs(),
            connections_accepted: self.metrics.accepted_total(),
            listeners: self.listeners.clone(),
            device_planes: self.planes.all().iter().map(|p| p.info()).collect(),
            last_deploy: self.planes.last_deploy().map(|d| DeployInfo {
                from: d.from,
                to: d.to,
                from_software: d.from_software,
                to_software: Some(d.to_software),
                outcome: d.outcome,
                detail: d.detail,
                seconds: d.duration.map(|d| d.as_secs_f64()),
            }),
            tls: self.tls.as_ref().map(|edge| edge.info()),
        }
    }

    /// The Prometheus exposition.
    pub fn render_metrics(&self) -> String {
        self.metrics
            .render(&self.planes, self.readiness() == Readiness::Ok)
    }
}
