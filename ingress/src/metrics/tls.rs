//! The HTTPS proxy listener's metrics ([`TlsMetrics`]): handshakes, the TLS
//! connections the ingress relays, certificate reloads and the expiry of the
//! certificate in use.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// `ok` or `failed`.
    result: &'static str,
}

/// TLS figures, shared by the HTTPS accept loop, its relays and reloads.
#[derive(Debug, Clone, Default)]
pub struct TlsMetrics {
    handshakes: Family<ResultLabel, Counter>,
    relayed: Gauge,
    reloads: Family<ResultLabel, Counter>,
    expiry: Gauge,
}

impl TlsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for result in ["ok", "failed", "refused"] {
            metrics
                .handshakes
                .get_or_create(&ResultLabel { result })
                .inc_by(0);
        }
        for result in ["ok", "failed"] {
            metrics
                .reloads
                .get_or_create(&ResultLabel { result })
                .inc_by(0);
        }
        registry.register(
            "tls_handshakes",
            "TLS handshakes on the HTTPS proxy listener: ok, failed (not TLS, an unknown name, a timeout), or refused (not begun: limits.tls_handshakes under way)",
            metrics.handshakes.clone(),
        );
        registry.register(
            "tls_connections_relayed",
            "HTTPS proxy connections whose TLS this ingress is relaying",
            metrics.relayed.clone(),
        );
        registry.register(
            "tls_certificate_reloads",
            "Certificate reloads (SIGHUP, blipless-ctl tls reload): ok, or failed (the old certificate stays)",
            metrics.reloads.clone(),
        );
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the HTTPS proxy listener's certificate expires (Unix time; 0 without one)",
            metrics.expiry.clone(),
        );
        metrics
    }

    /// Counts a handshake that completed (`true`) or did not.
    pub fn count_handshake(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.handshakes.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a connection closed before its handshake began: as many
    /// were under way as `limits.tls_handshakes` allows.
    pub fn count_handshake_refused(&self) {
        self.handshakes
            .get_or_create(&ResultLabel { result: "refused" })
            .inc();
    }

    /// One more TLS connection relayed (`+1`), or one fewer (`-1`).
    pub fn add_relayed(&self, delta: i64) {
        self.relayed.inc_by(delta);
    }

    /// Counts a reload that took (`true`) or kept the old certificate.
    pub fn count_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }

    /// The certificate in use expires at `unix_seconds`.
    pub fn set_expiry(&self, unix_seconds: u64) {
        self.expiry
            .set(i64::try_from(unix_seconds).unwrap_or(i64::MAX));
    }
}
