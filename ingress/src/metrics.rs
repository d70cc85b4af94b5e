//! The ingress's Prometheus metrics, including the figures device planes report.

use blipless_protocol::channel::ListenerKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::planes::{PlaneState, Planes};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// Every metric the ingress exposes on `/metrics`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    accepted: Family<ListenerLabel, Counter>,
    handed: Counter,
    ready: Gauge,
    planes: Family<StateLabel, Gauge>,
    connections_open: Gauge,
    devices_live: Gauge,
    prewarmed: Gauge,
    drain_remaining: Gauge,
    migrated: Counter,
    deploys: Family<OutcomeLabel, Counter>,
    deploy_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("blipless");
        let accepted = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "connections_accepted",
            "Customer connections accepted, by listener",
            accepted.clone(),
        );
        let handed = Counter::default();
        registry.register(
            "connections_handed",
            "Connections handed to a device plane",
            handed.clone(),
        );
        let ready = Gauge::default();
        registry.register("ready", "1 when /status answers ok", ready.clone());
        let planes = Family::<StateLabel, Gauge>::default();
        registry.register(
            "device_planes",
            "Attached device planes, by state",
            planes.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Customer connections held by device planes",
            connections_open.clone(),
        );
        let devices_live = Gauge::default();
        registry.register(
            "devices_live",
            "Client devices open on the device planes",
            devices_live.clone(),
        );
        let prewarmed = Gauge::default();
        registry.register(
            "prewarmed_devices",
            "Devices the active device plane opened by pre-warm before it said Ready",
            prewarmed.clone(),
        );
        let drain_remaining = Gauge::default();
        registry.register(
            "drain_active_remaining",
            "Connections still held by draining device planes",
            drain_remaining.clone(),
        );
        let migrated = Counter::default();
        registry.register(
            "tunnels_migrated",
            "Connections moved from a draining device plane to its successor",
            migrated.clone(),
        );
        let deploys = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "deploys",
            "Device-plane deploys, by outcome",
            deploys.clone(),
        );
        let deploy_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "deploy_duration_seconds",
            "The latest deploy: new plane's Hello to the old plane's exit",
            deploy_seconds.clone(),
        );
        Self {
            registry,
            migrated,
            deploys,
            deploy_seconds,
            accepted,
            handed,
            ready,
            planes,
            connections_open,
            devices_live,
            prewarmed,
            drain_remaining,
        }
    }

    /// Counts one accepted connection.
    pub fn count_accepted(&self, kind: ListenerKind) {
        let listener = match kind {
            ListenerKind::Socks => "socks",
            ListenerKind::Http => "http",
        };
        self.accepted
            .get_or_create(&ListenerLabel {
                listener: listener.into(),
            })
            .inc();
    }

    /// Connections accepted on every listener since start.
    pub fn accepted_total(&self) -> u64 {
        ["socks", "http"]
            .iter()
            .map(|listener| {
                self.accepted
                    .get_or_create(&ListenerLabel {
                        listener: (*listener).into(),
                    })
                    .get()
            })
            .sum()
    }

    /// Counts one connection moved between planes.
    pub fn count_migrated(&self) {
        self.migrated.inc();
    }

    /// Records a finished deploy.
    pub fn record_deploy(&self, outcome: &str, duration: std::time::Duration) {
        self.deploys
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
        self.deploy_seconds.set(duration.as_secs_f64());
    }

    /// Counts one connection handed to a plane.
    pub fn count_handed(&self) {
        self.handed.inc();
    }

    /// Refreshes the gauges from the planes and renders the text exposition.
    pub fn render(&self, planes: &Planes, ready: bool) -> String {
        self.ready.set(i64::from(ready));
        let mut open = 0u64;
        let mut draining = 0u64;
        let mut devices = 0u64;
        let mut prewarmed = 0u64;
        for state in [
            PlaneState::Standby,
            PlaneState::Active,
            PlaneState::Draining,
        ] {
            self.planes
                .get_or_create(&StateLabel {
                    state: state.as_str().into(),
                })
                .set(0);
        }
        for plane in planes.all() {
            let state = plane.state();
            self.planes
                .get_or_create(&StateLabel {
                    state: state.as_str().into(),
                })
                .inc();
            let report = plane.report();
            open += report.connections;
            devices += report.devices;
            if state == PlaneState::Draining {
                draining += report.connections;
            }
            if state == PlaneState::Active {
                prewarmed = report.prewarmed;
            }
        }
        self.connections_open.set(clamp(open));
        self.devices_live.set(clamp(devices));
        self.prewarmed.set(clamp(prewarmed));
        self.drain_remaining.set(clamp(draining));
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        text
    }
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
