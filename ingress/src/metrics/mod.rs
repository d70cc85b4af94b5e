//! The ingress's Prometheus metrics, including the figures device planes report.
//!
//! The WireGuard figures are in `wg.rs` ([`WgMetrics`]), registered in the
//! same registry.

use blipless_protocol::channel::{DeviceReport, ListenerKind};
use blipless_protocol::control::DeployOutcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::planes::{PlaneState, Planes};

mod dns;
mod process;
mod reports;
mod socks_udp;
mod tls;
pub mod wg;

pub use process::ProcessMetrics;
pub use socks_udp::UdpMetrics;
pub use tls::TlsMetrics;
pub use wg::WgMetrics;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabel {
    /// `fd_limit`, `connection_cap`, `tunnel_cap` or `over_quota`; for HTTP refusals
    /// `head_too_large`, `response_timeout`, `body_stall` or `userinfo`.
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    /// `direct` or an upstream's name.
    route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    /// `socks5` or `http`.
    protocol: &'static str,
}

/// Every metric the ingress exposes on `/metrics`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    accepted: Family<ListenerLabel, Counter>,
    handed: Counter,
    bursts_handed: Counter,
    ready: Gauge,
    planes: Family<StateLabel, Gauge>,
    connections_open: Gauge,
    devices_live: Gauge,
    prewarmed: Gauge,
    clients_over_quota: Gauge,
    route_up: Family<RouteLabel, Gauge>,
    route_latency: Family<RouteLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    route_clients: Family<RouteLabel, Gauge>,
    drain_remaining: Gauge,
    migrated: Counter,
    deploys: Family<OutcomeLabel, Counter>,
    deploy_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The WireGuard metrics, registered in the same registry.
    pub wg: WgMetrics,
    /// The HTTPS proxy listener's, registered in the same registry.
    pub tls: TlsMetrics,
    /// The SOCKS5 UDP relays' counts, from the planes' reports.
    pub socks5_udp: UdpMetrics,
    /// The WireGuard DNS gateway's counts, from the planes' reports.
    dns: dns::DnsMetrics,
    handoffs: Counter,
    handoff_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    auth_failures: Family<ProtocolLabel, Counter>,
    auth_throttled: Family<ProtocolLabel, Counter>,
    refused: Family<RefusalLabel, Counter>,
    http_refused: Family<RefusalLabel, Counter>,
    channel_fds_dropped: Counter,
    /// The ingress's own count of dropped-fd frames at the last render.
    own_fds_dropped_seen: std::sync::atomic::AtomicU64,
    /// `process_*`, outside the `blipless_` prefix.
    process: ProcessMetrics,
    /// `blipless_device_*`: the planes' process figures.
    device_process: process::DevicePlaneProcess,
    /// Held through a render ([`Metrics::render_states`]).
    rendering: std::sync::Mutex<()>,
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
        let bursts_handed = Counter::default();
        registry.register(
            "connection_bursts_handed",
            "Frames that handed a device plane several connections at once (AcceptedMany)",
            bursts_handed.clone(),
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
        let clients_over_quota = Gauge::default();
        registry.register(
            "clients_over_quota",
            "Clients over their quota now (the active device plane's view; docs/LIMITS.md)",
            clients_over_quota.clone(),
        );
        let route_up = Family::<RouteLabel, Gauge>::default();
        registry.register(
            "egress_route_up",
            "1 while the active device plane sees the egress route up, 0 while down",
            route_up.clone(),
        );
        let route_latency =
            Family::<RouteLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "egress_route_latency_seconds",
            "Smoothed latency of the route's probes and connects (upstreams only)",
            route_latency.clone(),
        );
        let route_clients = Family::<RouteLabel, Gauge>::default();
        registry.register(
            "egress_route_clients",
            "Clients whose egress window on the active device plane holds the route",
            route_clients.clone(),
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
        // Both outcomes exist from the start, at 0: `increase()` sees the first failure.
        for outcome in [DeployOutcome::Succeeded, DeployOutcome::Failed] {
            deploys
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.as_str(),
                })
                .inc_by(0);
        }
        let deploy_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "deploy_duration_seconds",
            "The latest deploy: new plane's Hello to the old plane's exit",
            deploy_seconds.clone(),
        );
        let wg = WgMetrics::register(&mut registry);
        let tls = TlsMetrics::register(&mut registry);
        let socks5_udp = UdpMetrics::register(&mut registry);
        let dns = dns::DnsMetrics::register(&mut registry);
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
        let auth_failures = Family::<ProtocolLabel, Counter>::default();
        registry.register(
            "auth_failures",
            "Failed proxy authentications reported by the device planes, by protocol",
            auth_failures.clone(),
        );
        let auth_throttled = Family::<ProtocolLabel, Counter>::default();
        registry.register(
            "auth_throttled",
            "Proxy authentications refused unchecked while throttled (their username at their source, or their whole source), by protocol",
            auth_throttled.clone(),
        );
        let refused = Family::<RefusalLabel, Counter>::default();
        registry.register(
            "connections_refused",
            "Customer connections or tunnels the device planes refused at once, by reason: near the open-file limit, at limits.connections, at limits.tunnels_per_client",
            refused.clone(),
        );
        for reason in ["fd_limit", "connection_cap", "tunnel_cap", "over_quota"] {
            refused.get_or_create(&RefusalLabel { reason }).inc_by(0);
        }
        let http_refused = Family::<RefusalLabel, Counter>::default();
        registry.register(
            "http_refused",
            "HTTP proxy exchanges the device planes refused or ended, by reason: a head over limits.header_bytes (431), an origin past timeouts.response (504), a body stalled past timeouts.body_idle, a target with userinfo (400)",
            http_refused.clone(),
        );
        for reason in [
            "head_too_large",
            "response_timeout",
            "body_stall",
            "userinfo",
        ] {
            http_refused
                .get_or_create(&RefusalLabel { reason })
                .inc_by(0);
        }
        let device_process = process::DevicePlaneProcess::register(&mut registry);
        let channel_fds_dropped = Counter::default();
        registry.register(
            "channel_fds_dropped",
            "Device-channel frames whose file descriptors the kernel dropped on receipt (a process at its open-file limit), in the ingress and the planes",
            channel_fds_dropped.clone(),
        );
        registry.register(
            "build",
            "The build this ingress is (always 1): version and commit",
            prometheus_client::metrics::info::Info::new(vec![
                ("version", blipless_config::build::VERSION),
                ("commit", blipless_config::build::COMMIT),
            ]),
        );
        // Both protocols' series exist from the start, at 0.
        for protocol in ["socks5", "http"] {
            auth_failures
                .get_or_create(&ProtocolLabel { protocol })
                .inc_by(0);
            auth_throttled
                .get_or_create(&ProtocolLabel { protocol })
                .inc_by(0);
        }
        Self {
            wg,
            tls,
            socks5_udp,
            dns,
            handoffs,
            handoff_seconds,
            auth_failures,
            auth_throttled,
            refused,
            http_refused,
            channel_fds_dropped,
            own_fds_dropped_seen: std::sync::atomic::AtomicU64::new(0),
            process: ProcessMetrics::new(),
            device_process,
            rendering: std::sync::Mutex::new(()),
            registry,
            migrated,
            deploys,
            deploy_seconds,
            accepted,
            handed,
            bursts_handed,
            ready,
            planes,
            connections_open,
            devices_live,
            prewarmed,
            clients_over_quota,
            route_up,
            route_latency,
            route_clients,
            drain_remaining,
        }
    }

    /// Counts one accepted connection.
    pub fn count_accepted(&self, kind: ListenerKind) {
        let listener = match kind {
            ListenerKind::Socks => "socks",
            ListenerKind::Http => "http",
            ListenerKind::Https => "https",
        };
        self.accepted
            .get_or_create(&ListenerLabel {
                listener: listener.into(),
            })
            .inc();
    }

    /// Connections accepted on every listener since start.
    pub fn accepted_total(&self) -> u64 {
        ["socks", "http", "https"]
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
            accepted_https: accepted("https"),
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
            ("https", counters.accepted_https),
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

    /// Counts one frame that handed a plane several connections (each of
    /// them is counted by [`Metrics::count_handed`] too).
    pub fn count_burst_handed(&self) {
        self.bursts_handed.inc();
    }

    /// Refreshes the gauges from the planes and renders the text exposition.
    pub fn render(&self, planes: &Planes, ready: bool) -> String {
        let states: Vec<(PlaneState, DeviceReport)> = planes
            .all()
            .iter()
            .map(|plane| (plane.state(), plane.report()))
            .collect();
        self.render_states(&states, ready)
    }

    /// [`Metrics::render`] over each plane's state and last report. One
    /// render at a time: the derived gauges are zeroed (or cleared) and
    /// then refilled, and a scrape made meanwhile would read them half
    /// done (two planes active, or no route at all).
    fn render_states(&self, planes: &[(PlaneState, DeviceReport)], ready: bool) -> String {
        let _one_at_a_time = self
            .rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.ready.set(i64::from(ready));
        let own = blipless_link::fds_dropped();
        let seen = self
            .own_fds_dropped_seen
            .swap(own, std::sync::atomic::Ordering::Relaxed);
        self.channel_fds_dropped.inc_by(own.saturating_sub(seen));
        let mut open = 0u64;
        let mut draining = 0u64;
        let mut devices = 0u64;
        let mut prewarmed = 0u64;
        let mut over_quota = 0u64;
        let (mut active_fds, mut active_limit, mut resident) = (0u64, 0u64, 0u64);
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
        for (state, report) in planes {
            let state = *state;
            self.planes
                .get_or_create(&StateLabel {
                    state: state.as_str().into(),
                })
                .inc();
            open += report.connections;
            devices += report.devices;
            if state == PlaneState::Draining {
                draining += report.connections;
            }
            resident += report.resident_bytes;
            if state == PlaneState::Active {
                (active_fds, active_limit) = (report.open_fds, report.max_fds);
                prewarmed = report.prewarmed;
                over_quota = report.clients_over_quota;
                self.set_routes(&report.routes);
            }
        }
        self.connections_open.set(clamp(open));
        self.devices_live.set(clamp(devices));
        self.prewarmed.set(clamp(prewarmed));
        self.clients_over_quota.set(clamp(over_quota));
        self.drain_remaining.set(clamp(draining));
        self.device_process.set(active_fds, active_limit, resident);
        self.process.sample();
        let mut text = String::new();
        // OpenMetrics: both registries, then the one `# EOF`.
        let encoded = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry)
            .and_then(|()| {
                prometheus_client::encoding::text::encode_registry(
                    &mut text,
                    &self.process.registry,
                )
            })
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text));
        if let Err(error) = encoded {
            tracing::warn!(%error, "encoding metrics failed");
        }
        text
    }
}

/// A count as a gauge's value.
fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
