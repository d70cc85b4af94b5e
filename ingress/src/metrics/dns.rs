//! The WireGuard DNS gateway's metric ([`DnsMetrics`]), summed from what
//! the device planes report: queries answered and dropped
//! (docs/METRICS.md).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// `answered` or `dropped`.
    result: &'static str,
}

/// `blipless_wg_dns_queries_total`.
#[derive(Debug, Clone, Default)]
pub struct DnsMetrics {
    queries: Family<ResultLabel, Counter>,
}

impl DnsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for result in ["answered", "dropped"] {
            metrics
                .queries
                .get_or_create(&ResultLabel { result })
                .inc_by(0);
        }
        registry.register(
            "wg_dns_queries",
            "WireGuard clients' DNS queries to the node's tunnel address: answered, or dropped (unreadable, a response, too many in flight; and DNS-over-TCP connections closed unserved at a cap)",
            metrics.queries.clone(),
        );
        metrics
    }

    /// Adds what a plane counted between two reports.
    pub(super) fn count(&self, answered: (u64, u64), dropped: (u64, u64)) {
        for (result, (before, now)) in [("answered", answered), ("dropped", dropped)] {
            self.queries
                .get_or_create(&ResultLabel { result })
                .inc_by(now.saturating_sub(before));
        }
    }
}
