//! The ingress's Prometheus metrics, including the figures device planes report.

use blipless_protocol::channel::ListenerKind;
use blipless_protocol::control::DeployOutcome;
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
    /// The WireGuard metrics, registered in the same registry.
    pub wg: WgMetrics,
    handoffs: Counter,
    handoff_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: String,
}

/// WireGuard figures, shared by the receive loop, the timers and the device links.
#[derive(Debug, Clone, Default)]
pub struct WgMetrics {
    peers: Gauge,
    held: Gauge,
    datagrams_in: Counter,
    inner: Family<DirectionLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    cookie_replies: Counter,
    handshakes: Counter,
    send_failures: Counter,
}

impl WgMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "wg_peers",
            "WireGuard peers known to the ingress",
            metrics.peers.clone(),
        );
        registry.register(
            "wg_held_packets",
            "Inner packets held while no device plane is active",
            metrics.held.clone(),
        );
        registry.register(
            "wg_datagrams_received",
            "UDP datagrams received on the WireGuard socket",
            metrics.datagrams_in.clone(),
        );
        registry.register(
            "wg_inner_packets",
            "Inner packets: in (from peers to the device plane) and out (to peers)",
            metrics.inner.clone(),
        );
        registry.register(
            "wg_dropped",
            "WireGuard datagrams or inner packets dropped, by reason",
            metrics.dropped.clone(),
        );
        registry.register(
            "wg_cookie_replies",
            "Cookie replies sent because handshakes arrived faster than wireguard.handshake_limit",
            metrics.cookie_replies.clone(),
        );
        registry.register(
            "wg_handshakes",
            "Handshake responses sent (sessions made)",
            metrics.handshakes.clone(),
        );
        registry.register(
            "wg_send_failures",
            "Datagrams the WireGuard socket failed to send",
            metrics.send_failures.clone(),
        );
        metrics
    }

    /// Sets the peer count.
    pub fn set_peers(&self, peers: usize) {
        self.peers.set(clamp(peers as u64));
    }

    /// Sets the number of held inner packets.
    pub fn set_held(&self, packets: usize) {
        self.held.set(clamp(packets as u64));
    }

    /// Counts one received datagram.
    pub fn count_datagram_in(&self) {
        self.datagrams_in.inc();
    }

    /// Counts one inner packet from a peer.
    pub fn count_inner_in(&self) {
        self.inner
            .get_or_create(&DirectionLabel {
                direction: "in".into(),
            })
            .inc();
    }

    /// Counts one inner packet sent to a peer.
    pub fn count_inner_out(&self) {
        self.inner
            .get_or_create(&DirectionLabel {
                direction: "out".into(),
            })
            .inc();
    }

    /// Counts one drop for `reason`.
    pub fn count_drop(&self, reason: &'static str) {
        self.count_drops(reason, 1);
    }

    /// Counts `count` drops for `reason`.
    pub fn count_drops(&self, reason: &'static str, count: usize) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc_by(count as u64);
    }

    /// Drops so far for `reason`.
    pub fn drops(&self, reason: &'static str) -> u64 {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .get()
    }

    /// Counts one cookie reply.
    pub fn count_cookie_reply(&self) {
        self.cookie_replies.inc();
    }

    /// Counts one handshake answered.
    pub fn count_handshake(&self) {
        self.handshakes.inc();
    }

    /// Counts datagrams that failed to send.
    pub fn count_send_failures(&self, failed: usize) {
        if failed > 0 {
            self.send_failures.inc_by(failed as u64);
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// [`DeployOutcome::as_str`].
    outcome: &'static str,
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
        let wg = WgMetrics::register(&mut registry);
        let handoffs = Counter::default();
        registry.register(
            "ingress_handoffs",
            "Ingress restarts by handoff this node has seen (carried from predecessor to successor)",
            handoffs.clone(),
        );
        let handoff_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "ingress_handoff_duration_seconds",
            "The latest ingress handoff: connecting to the predecessor to serving",
            handoff_seconds.clone(),
        );
        Self {
            wg,
            handoffs,
            handoff_seconds,
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
    pub fn record_deploy(&self, outcome: DeployOutcome, duration: std::time::Duration) {
        self.deploys
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
        self.deploy_seconds.set(duration.as_secs_f64());
    }

    /// The counters a successor ingress carries on from.
    pub fn handoff_counters(&self) -> blipless_protocol::channel::HandoffCounters {
        let accepted = |listener: &str| {
            self.accepted
                .get_or_create(&ListenerLabel {
                    listener: listener.into(),
                })
                .get()
        };
        blipless_protocol::channel::HandoffCounters {
            accepted_socks: accepted("socks"),
            accepted_http: accepted("http"),
            handed: self.handed.get(),
            migrated: self.migrated.get(),
            handoffs: self.handoffs.get(),
        }
    }

    /// Carries on from a predecessor's counters, counting this handoff.
    pub fn carry_on(
        &self,
        counters: &blipless_protocol::channel::HandoffCounters,
        took: std::time::Duration,
    ) {
        for (listener, count) in [
            ("socks", counters.accepted_socks),
            ("http", counters.accepted_http),
        ] {
            self.accepted
                .get_or_create(&ListenerLabel {
                    listener: listener.into(),
                })
                .inc_by(count);
        }
        self.handed.inc_by(counters.handed);
        self.migrated.inc_by(counters.migrated);
        self.handoffs.inc_by(counters.handoffs + 1);
        self.handoff_seconds.set(took.as_secs_f64());
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
