//! The SOCKS5 UDP relays' metrics ([`UdpMetrics`]), summed from what the
//! device planes report: associations opened and refused at the cap, and
//! datagrams dropped by reason (docs/METRICS.md).

use blipless_protocol::channel::UdpCounts;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// `fragment`, `bad_header`, `denied`, `foreign`, `rate_limited` or
    /// `send_failed`.
    reason: &'static str,
}

/// `blipless_socks5_udp_*`.
#[derive(Debug, Clone, Default)]
pub struct UdpMetrics {
    opened: Counter,
    refused_at_cap: Counter,
    dropped: Family<ReasonLabel, Counter>,
}

const REASONS: [&str; 6] = [
    "fragment",
    "bad_header",
    "denied",
    "foreign",
    "rate_limited",
    "send_failed",
];

impl UdpMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for reason in REASONS {
            metrics
                .dropped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(0);
        }
        registry.register(
            "socks5_udp_associations",
            "SOCKS5 UDP associations the device planes opened (adopted ones not counted again)",
            metrics.opened.clone(),
        );
        registry.register(
            "socks5_udp_associations_refused",
            "SOCKS5 UDP ASSOCIATE requests the device planes refused at limits.udp_associations_per_client (reply 2)",
            metrics.refused_at_cap.clone(),
        );
        registry.register(
            "socks5_udp_dropped",
            "Datagrams the SOCKS5 UDP relays dropped, by reason: a fragment (FRAG not 0), a bad header, a destination or sender the egress policy refuses, a sender not the customer, over the client's rate limit, refused by the kernel's send",
            metrics.dropped.clone(),
        );
        metrics
    }

    /// Adds what a plane counted between two reports.
    pub(super) fn count(&self, previous: UdpCounts, report: UdpCounts) {
        let added = report.since(previous);
        self.opened.inc_by(added.opened);
        self.refused_at_cap.inc_by(added.refused_at_cap);
        for (reason, count) in [
            ("fragment", added.fragment),
            ("bad_header", added.bad_header),
            ("denied", added.denied),
            ("foreign", added.foreign),
            ("rate_limited", added.rate_limited),
            ("send_failed", added.send_failed),
        ] {
            self.dropped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(count);
        }
    }
}
