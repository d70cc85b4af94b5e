//! The WireGuard metrics ([`WgMetrics`]): peers, held packets, datagrams,
//! inner packets, drops, cookie replies, handshakes and send failures.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::clamp;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

/// Every drop reason (`drop_reason` in wg/mod.rs and the receive path): each
/// series exists from the start, at 0, so an alert on `increase()` sees the
/// first drop.
const DROP_REASONS: [&str; 16] = [
    "unknown_peer",
    "source",
    "queue_full",
    "no_endpoint",
    "no_peer_for_destination",
    "malformed_inner",
    "workers_busy",
    "invalid",
    "replay",
    "authentication",
    "no_session",
    "under_load",
    "source_limited",
    "expired",
    "stepped_aside",
    "other",
];

/// Every reason a device plane drops an inner packet for
/// (`blipless_wg_plane_dropped_total`).
const PLANE_DROP_REASONS: [&str; 3] = ["denied", "limited", "lost"];

/// Makes each reason's series, at 0, so an alert on `increase()` sees the
/// first one counted.
fn declare(family: &Family<ReasonLabel, Counter>, reasons: &[&'static str]) {
    for &reason in reasons {
        family.get_or_create(&ReasonLabel { reason }).inc_by(0);
    }
}

/// What one crypto worker round counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Round {
    /// Datagrams received.
    pub datagrams_in: u64,
    /// Inner packets from peers, for the device plane.
    pub inner_in: u64,
    /// Inner packets encrypted for peers.
    pub inner_out: u64,
}

impl Round {
    /// Back to nothing counted.
    pub fn take(&mut self) -> Self {
        std::mem::take(self)
    }
}

/// WireGuard figures, shared by the receive loop, the timers and the device links.
#[derive(Debug, Clone, Default)]
pub struct WgMetrics {
    peers: Gauge,
    held: Gauge,
    datagrams_in: Counter,
    inner: Family<DirectionLabel, Counter>,
    /// `inner{direction="in"}` and `"out"`, held so that counting a packet
    /// looks nothing up and allocates nothing.
    inner_in: Counter,
    inner_out: Counter,
    dropped: Family<ReasonLabel, Counter>,
    /// Inner packets the device planes dropped, from their reports.
    plane_dropped: Family<ReasonLabel, Counter>,
    cookie_replies: Counter,
    handshakes: Counter,
    send_failures: Counter,
    worker_jobs: Family<WorkerLabel, Counter>,
}

impl WgMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let mut metrics = Self::default();
        metrics.inner_in = metrics
            .inner
            .get_or_create(&DirectionLabel { direction: "in" })
            .clone();
        metrics.inner_out = metrics
            .inner
            .get_or_create(&DirectionLabel { direction: "out" })
            .clone();
        declare(&metrics.dropped, &DROP_REASONS);
        declare(&metrics.plane_dropped, &PLANE_DROP_REASONS);
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
            "wg_plane_dropped",
            "Inner packets the device planes dropped, by reason: refused by the egress policy or held back from leaving directly (denied), over their client's rate limit or quota (limited), no TUN queue, a full writer queue or a write error (lost)",
            metrics.plane_dropped.clone(),
        );
        registry.register(
            "wg_cookie_replies",
            "Cookie replies sent because handshakes arrived faster than wireguard.handshake_limit",
            metrics.cookie_replies.clone(),
        );
        registry.register(
            "wg_handshakes",
            "Handshake responses sent to peers' initiations (a replay to a fresh session state gets one too)",
            metrics.handshakes.clone(),
        );
        registry.register(
            "wg_worker_jobs",
            "Jobs each crypto worker took: its share of one receive batch, or of one device-plane frame",
            metrics.worker_jobs.clone(),
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

    /// Counts what a crypto worker did in one round: the workers count
    /// locally and add here once a round, so that counting costs the cores
    /// no shared cache line per packet.
    pub fn count_round(&self, round: &Round) {
        for (counter, count) in [
            (&self.datagrams_in, round.datagrams_in),
            (&self.inner_in, round.inner_in),
            (&self.inner_out, round.inner_out),
        ] {
            if count > 0 {
                counter.inc_by(count);
            }
        }
    }

    /// The job counter of crypto worker `worker` (looked up once, by the worker).
    pub fn worker_jobs(&self, worker: usize) -> Counter {
        let worker = u16::try_from(worker).unwrap_or(u16::MAX);
        self.worker_jobs
            .get_or_create(&WorkerLabel { worker })
            .clone()
    }

    /// Counts one drop for `reason`.
    pub fn count_drop(&self, reason: &'static str) {
        self.count_drops(reason, 1);
    }

    /// Counts `count` drops for `reason`.
    pub fn count_drops(&self, reason: &'static str, count: usize) {
        self.dropped
            .get_or_create(&ReasonLabel { reason })
            .inc_by(count as u64);
    }

    /// Adds what a device plane's report counted since its previous one.
    pub(super) fn count_plane_drops(
        &self,
        previous: blipless_protocol::channel::WgPacketCounts,
        report: blipless_protocol::channel::WgPacketCounts,
    ) {
        let added = report.since(previous);
        for (reason, count) in [
            ("denied", added.denied),
            ("limited", added.limited),
            ("lost", added.lost),
        ] {
            self.plane_dropped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(count);
        }
    }

    /// Drops so far for `reason`.
    pub fn drops(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&ReasonLabel { reason }).get()
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
