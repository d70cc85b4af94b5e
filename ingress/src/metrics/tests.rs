//! Unit tests of the summed counters the device planes report.

use super::*;
use blipless_protocol::channel::DeviceReport;

fn text(metrics: &Metrics) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics.registry).expect("encode");
    text
}

#[test]
fn reported_auth_counts_are_summed_and_never_go_backwards() {
    let metrics = Metrics::new();
    let zero = DeviceReport::default();
    assert!(text(&metrics).contains("blipless_auth_failures_total{protocol=\"socks5\"} 0"));
    assert!(text(&metrics).contains("blipless_auth_throttled_total{protocol=\"http\"} 0"));
    // Plane 1 reports twice; plane 2 (a fresh link) once.
    let first = DeviceReport {
        auth_failures_socks5: 5,
        auth_throttled_socks5: 10,
        ..DeviceReport::default()
    };
    let second = DeviceReport {
        auth_failures_socks5: 6,
        auth_throttled_socks5: 194,
        auth_failures_http: 3,
        ..DeviceReport::default()
    };
    metrics.count_reported(&zero, &first);
    metrics.count_reported(&first, &second);
    let other = DeviceReport {
        auth_failures_http: 2,
        auth_throttled_http: 1,
        ..DeviceReport::default()
    };
    metrics.count_reported(&zero, &other);
    // Plane 1 is gone: nothing is taken back.
    let text = text(&metrics);
    for line in [
        "blipless_auth_failures_total{protocol=\"socks5\"} 6",
        "blipless_auth_throttled_total{protocol=\"socks5\"} 194",
        "blipless_auth_failures_total{protocol=\"http\"} 5",
        "blipless_auth_throttled_total{protocol=\"http\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}
