//! What the device planes report to the ingress every second, folded into
//! the ingress's metrics: their counters summed so they never go backwards
//! (what a plane counted stays counted after it exits), and the active
//! plane's egress routes.

use blipless_protocol::channel::DeviceReport;

use super::{clamp, Metrics, ProtocolLabel, RefusalLabel, RouteLabel};

impl Metrics {
    /// Adds what a plane's `report` counted since its `previous` one (on the
    /// same link) to the summed counters: they keep what a plane counted
    /// after it is gone, so they never go backwards.
    pub fn count_reported(&self, previous: &DeviceReport, report: &DeviceReport) {
        for (family, protocol, before, now) in [
            (
                &self.auth_failures,
                "socks5",
                previous.auth_failures_socks5,
                report.auth_failures_socks5,
            ),
            (
                &self.auth_throttled,
                "socks5",
                previous.auth_throttled_socks5,
                report.auth_throttled_socks5,
            ),
            (
                &self.auth_failures,
                "http",
                previous.auth_failures_http,
                report.auth_failures_http,
            ),
            (
                &self.auth_throttled,
                "http",
                previous.auth_throttled_http,
                report.auth_throttled_http,
            ),
        ] {
            let added = now.saturating_sub(before);
            if added > 0 {
                family
                    .get_or_create(&ProtocolLabel { protocol })
                    .inc_by(added);
            }
        }
        for (reason, before, now) in [
            (
                "fd_limit",
                previous.refused_fd_limit,
                report.refused_fd_limit,
            ),
            (
                "connection_cap",
                previous.refused_connection_cap,
                report.refused_connection_cap,
            ),
            (
                "tunnel_cap",
                previous.refused_tunnel_cap,
                report.refused_tunnel_cap,
            ),
            (
                "over_quota",
                previous.refused_over_quota,
                report.refused_over_quota,
            ),
        ] {
            self.refused
                .get_or_create(&RefusalLabel { reason })
                .inc_by(now.saturating_sub(before));
        }
        for (reason, before, now) in [
            (
                "head_too_large",
                previous.http_head_too_large,
                report.http_head_too_large,
            ),
            (
                "response_timeout",
                previous.http_response_timeouts,
                report.http_response_timeouts,
            ),
            (
                "body_stall",
                previous.http_body_stalls,
                report.http_body_stalls,
            ),
            (
                "userinfo",
                previous.http_userinfo_refused,
                report.http_userinfo_refused,
            ),
        ] {
            self.http_refused
                .get_or_create(&RefusalLabel { reason })
                .inc_by(now.saturating_sub(before));
        }
        self.channel_fds_dropped.inc_by(
            report
                .channel_fds_dropped
                .saturating_sub(previous.channel_fds_dropped),
        );
        self.device_process
            .count_cpu(previous.cpu_micros, report.cpu_micros);
        self.socks5_udp.count(previous.udp, report.udp);
        self.wg
            .count_plane_drops(previous.wg_packets, report.wg_packets);
        self.dns.count(
            (previous.dns_answered, report.dns_answered),
            (previous.dns_dropped, report.dns_dropped),
        );
    }

    /// The active plane's routes, replacing what an earlier plane reported
    /// (a route no longer configured disappears).
    pub(super) fn set_routes(&self, routes: &[blipless_protocol::channel::RouteReport]) {
        self.route_up.clear();
        self.route_latency.clear();
        self.route_clients.clear();
        for route in routes {
            let label = RouteLabel {
                route: route.name.clone(),
            };
            self.route_up.get_or_create(&label).set(i64::from(route.up));
            if let Some(us) = route.latency_us {
                self.route_latency
                    .get_or_create(&label)
                    .set(us as f64 / 1e6);
            }
            self.route_clients
                .get_or_create(&label)
                .set(clamp(route.clients));
        }
    }
}
