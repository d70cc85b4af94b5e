//! WireGuard across ingress restarts, as root in network namespaces (see
//! `blipless_tests::topology`): a wireguard-go client keeps pinging and
//! streaming through handoffs, and comes back within seconds after a crash.

use std::time::{Duration, Instant};

use blipless_tests::topology::{tail, WgWorld};
use blipless_tests::{missing_replies, ping_counts, wait_until};

/// Now, as Unix seconds: to place a lost ping among the steps.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Five handoffs, back to back: each waits for the old ingress to exit.
fn five_handoffs(world: &mut WgWorld) {
    let started = Instant::now();
    for round in 1..=5 {
        let (next, took) = world.node.hand_off(&mut world.ingress);
        // The old ingress left because its peer had moved and its device
        // plane had rejoined the successor (not on a timer, not at the
        // grace): the successor reported the peer moved.
        let old_log = world.ingress.log_text();
        let left = old_log
            .lines()
            .find(|line| line.contains("nothing depends on this ingress"))
            .unwrap_or_else(|| {
                panic!("handoff {round}: the old ingress did not say why it left:\n{old_log}")
            });
        assert!(
            left.contains("moved=1"),
            "handoff {round}: the successor reported the peer moved: {left}"
        );
        world.ingress = next;
        eprintln!("ingress handoff {round}: the old one left after {took:?}");
    }
    eprintln!("5 handoffs in {:?}", started.elapsed());
}

#[test]
fn pings_every_10ms_cross_five_ingress_handoffs_without_a_loss() {
    // Nothing else on the tunnel: a loss here is the handoff's, not congestion's.
    let mut world = WgWorld::new(81);
    let ping = world.net.ping(3500, "0.01");
    std::thread::sleep(Duration::from_secs(1));
    five_handoffs(&mut world);
    let output = ping.wait_with_output().expect("ping");
    let (sent, received) = ping_counts(&output);
    eprintln!(
        "ping every 10 ms across 5 ingress handoffs: {sent} sent, {received} received, {} lost",
        sent - received
    );
    assert_eq!(sent, 3500, "ping ran to the end");
    let counters: Vec<String> = world
        .node
        .metrics()
        .lines()
        .filter(|line| line.starts_with("blipless_wg_"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        received,
        sent,
        "lost pings; the last ingress counted {counters:?}\n{}",
        world.diagnostics()
    );
    assert_eq!(world.node.metric("blipless_ingress_handoffs_total"), 5.0);
}

#[test]
fn an_inner_tcp_stream_crosses_five_ingress_handoffs_unbroken() {
    let mut world = WgWorld::new(83);
    let download = world.start_download(60_000_000, "2M");
    std::thread::sleep(Duration::from_secs(1));
    five_handoffs(&mut world);
    download.finish("handoffs", || world.diagnostics());
}

#[test]
fn after_an_ingress_crash_wireguard_traffic_resumes_within_seconds() {
    let mut world = WgWorld::new(82);
    assert_eq!(world.fetch("/bytes/1000", &[]).len(), 1000);
    // Let the ingress send the device plane an endpoint snapshot to keep.
    wait_until(
        Duration::from_secs(20),
        "an endpoint snapshot in the store",
        || {
            world
                .device
                .log_text()
                .contains("WireGuard endpoint snapshot kept")
        },
    );
    world.ingress.kill();
    let restarted = Instant::now();
    world.ingress = world.node.spawn_ingress();
    let resumed = loop {
        let ping = world
            .net
            .customer
            .command("ping")
            .args(["-n", "-q", "-c", "1", "-W", "1"])
            .arg(world.net.origin.ip().to_string())
            .output()
            .expect("ping");
        if ping_counts(&ping).1 == 1 {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "WireGuard did not come back\n{}",
            world.diagnostics()
        );
    };
    eprintln!("WireGuard traffic resumed {resumed:?} after the ingress restarted");
    assert!(
        resumed < Duration::from_secs(5),
        "took {resumed:?}: the client's own retry, not the call-back\n{}",
        tail(&world.ingress.log_text())
    );
    assert!(world
        .ingress
        .log_text()
        .contains("WireGuard endpoints seeded"));
}

#[test]
fn pings_cross_handoffs_and_deploys_overlapping_in_every_order_without_a_loss() {
    // Issue 14: an ingress handoff during a device-plane deploy (while the
    // new plane warms up, and while the old one hands over, TUN queues
    // included), and a deploy during a handoff: no ping lost.
    let mut world = WgWorld::new(84);
    let ping = world.net.ping(2500, "0.01");
    std::thread::sleep(Duration::from_secs(1));
    let mut steps = vec![(now(), "ping started")];
    // The handoff while the new plane warms up.
    let mut old_device = std::mem::replace(&mut world.device, world.node.start_device());
    std::thread::sleep(Duration::from_millis(50));
    let (next, _) = world.node.hand_off(&mut world.ingress);
    world.ingress = next;
    old_device.exits_cleanly("device plane (handoff during warm-up)");
    world.node.wait_ready();
    steps.push((now(), "handoff during warm-up done"));
    // The handoff the moment the new plane is active.
    let before = world.node.active_generation();
    let mut old_device = std::mem::replace(&mut world.device, world.node.start_device());
    wait_until(
        Duration::from_secs(60),
        "the new plane to be active",
        || {
            world
                .node
                .active_generation()
                .is_some_and(|g| Some(g) != before)
        },
    );
    let (next, _) = world.node.hand_off(&mut world.ingress);
    world.ingress = next;
    old_device.exits_cleanly("device plane (handoff during its drain)");
    world.node.wait_ready();
    steps.push((now(), "handoff during a drain done"));
    // A deploy during a handoff.
    let mut old_ingress = std::mem::replace(&mut world.ingress, world.node.spawn_ingress());
    std::thread::sleep(Duration::from_millis(30));
    let mut old_device = std::mem::replace(&mut world.device, world.node.start_device());
    old_ingress.exits_cleanly("ingress (deploy during a handoff)");
    old_device.exits_cleanly("device plane (deploy during a handoff)");
    steps.push((now(), "deploy during a handoff done"));
    let output = ping.wait_with_output().expect("ping");
    let (sent, received) = ping_counts(&output);
    eprintln!(
        "ping every 10 ms across overlapping handoffs and deploys: {sent} sent, {received} received"
    );
    assert_eq!(sent, 2500, "ping ran to the end");
    assert_eq!(
        received,
        sent,
        "lost pings (seq, last reply before it): {:?}; steps: {steps:?}\n{}",
        missing_replies(&output, sent),
        world.diagnostics()
    );
}
