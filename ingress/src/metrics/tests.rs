//! Unit tests of the summed counters the device planes report.

use super::*;
use blipless_protocol::channel::DeviceReport;
use std::sync::Arc;

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

#[test]
fn reported_wireguard_plane_drops_are_summed_by_reason() {
    use blipless_protocol::channel::WgPacketCounts;
    let metrics = Metrics::new();
    for reason in ["denied", "limited", "lost"] {
        let line = format!("blipless_wg_plane_dropped_total{{reason=\"{reason}\"}} 0");
        assert!(text(&metrics).contains(&line), "{line} from the start");
    }
    let report = |denied, limited, lost| DeviceReport {
        wg_packets: WgPacketCounts {
            denied,
            limited,
            lost,
        },
        ..DeviceReport::default()
    };
    let (zero, first, second) = (report(0, 0, 0), report(200, 1, 0), report(210, 1, 7));
    metrics.count_reported(&zero, &first);
    metrics.count_reported(&first, &second);
    // Another plane's first report adds to them.
    metrics.count_reported(&zero, &report(5, 0, 0));
    let text = text(&metrics);
    for line in [
        "blipless_wg_plane_dropped_total{reason=\"denied\"} 215",
        "blipless_wg_plane_dropped_total{reason=\"limited\"} 1",
        "blipless_wg_plane_dropped_total{reason=\"lost\"} 7",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// Scrapes at the same time each see the planes as they are: one active
/// plane and its route, never two (the gauges zeroed by one render and
/// refilled by both) nor none (the routes cleared and not yet refilled).
#[test]
fn concurrent_renders_each_see_a_whole_picture() {
    let metrics = Arc::new(Metrics::new());
    let report = DeviceReport {
        routes: vec![blipless_protocol::channel::RouteReport {
            name: "direct".into(),
            kind: "direct".into(),
            up: true,
            ..Default::default()
        }],
        ..DeviceReport::default()
    };
    let planes = Arc::new(vec![
        (PlaneState::Active, report),
        (PlaneState::Draining, DeviceReport::default()),
    ]);
    let scrapers: Vec<_> = (0..2)
        .map(|_| {
            let (metrics, planes) = (metrics.clone(), planes.clone());
            std::thread::spawn(move || {
                for _ in 0..3000 {
                    let text = metrics.render_states(&planes, true);
                    for line in [
                        "blipless_device_planes{state=\"active\"} 1\n",
                        "blipless_device_planes{state=\"draining\"} 1\n",
                        "blipless_egress_route_up{route=\"direct\"} 1\n",
                    ] {
                        if !text.contains(line) {
                            return Err(format!("{line:?} missing from\n{text}"));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for scraper in scrapers {
        if let Err(torn) = scraper.join().expect("scraper") {
            panic!("{torn}");
        }
    }
}
