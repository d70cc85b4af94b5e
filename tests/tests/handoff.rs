//! Ingress restart-by-handoff: a new ingress takes the running one's sockets
//! and the old one steps aside, with no failed request, no broken tunnel, and
//! every failure case leaving the node serving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_tests::curl::fetch;
use blipless_tests::load::{finish_echoes, steady_load, streaming_echo};
use blipless_tests::netns::{self, require_root, Netns};
use blipless_tests::node::{ClientUrls, Daemon, Node};
use blipless_tests::origin::Origin;
use blipless_tests::topology::add_wg_client;
use blipless_tests::wg_peer::{icmp_echo, TestPeer};
use blipless_tests::{pattern, wait_until};

#[test]
fn ten_ingress_handoffs_under_load_fail_no_request_and_break_no_tunnel() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut ingress, _device, client) = node.start();
    // At 1 MB/s each way, longer than ten handoffs take.
    let size = 24 * 1024 * 1024;
    let upload = node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("write upload");
    let (socks_out, http_out) = (node.path().join("socks.out"), node.path().join("http.out"));
    let url = origin.url("/echo");
    let mut socks = streaming_echo(&client.socks, &url, &upload, &socks_out, false);
    let mut http = streaming_echo(&client.http, &url, &upload, &http_out, true);
    let stop = Arc::new(AtomicBool::new(false));
    let short = origin.url("/bytes/2000");
    let loads = [
        steady_load(client.socks.clone(), short.clone(), 4, stop.clone()),
        steady_load(client.http.clone(), short, 4, stop.clone()),
    ];
    std::thread::sleep(Duration::from_millis(500));
    for round in 1..=10 {
        let (next, took) = node.hand_off(&mut ingress);
        ingress = next;
        eprintln!("handoff {round}: the old ingress left after {took:?}");
    }
    node.wait_ready();
    stop.store(true, Ordering::SeqCst);
    for load in loads {
        let (total, failures) = load.join().expect("load thread");
        assert!(total > 0, "the load ran");
        assert!(
            failures.is_empty(),
            "{} of {total} requests failed: {failures:?}",
            failures.len()
        );
    }
    finish_echoes(
        [
            (&mut socks, &socks_out, "SOCKS5"),
            (&mut http, &http_out, "HTTP CONNECT"),
        ],
        size,
        "handoffs",
    );
    assert_eq!(node.metric("blipless_ingress_handoffs_total"), 10.0);
}

#[test]
fn a_third_ingress_waits_for_its_turn_and_takes_over_from_the_second() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut first, _device, client) = node.start();
    // Two restarts in a row: the second ingress serves beside the first,
    // and the third arrives meanwhile. It waits, then takes over from the
    // second. The second reports no progress, so the first stays its 3 s
    // (the rule for a successor that sends no reports) and the third
    // surely finds it there.
    let mut second = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_SILENT_SUCCESSOR", "1")]);
    wait_until(
        Duration::from_secs(20),
        "the second ingress to serve",
        || second.log_text().contains("ingress serving"),
    );
    let mut third = node.spawn_ingress();
    assert!(first
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    assert!(
        second
            .wait_exit(Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "the second hands over to the third and exits: {}",
        second.log_text()
    );
    assert!(
        third.wait_exit(Duration::from_millis(10)).is_none(),
        "the third serves: {}",
        third.log_text()
    );
    assert!(
        third.log_text().contains("waiting for its turn"),
        "it waited, and said so: {}",
        third.log_text()
    );
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

/// `systemctl restart` twice in a row: SIGUSR2 reaches the second ingress
/// while its predecessor is still leaving (held 5 s by a fault hook, past
/// the 3 s grace). The second counts its grace from the predecessor's exit,
/// so the third, which waited for its turn meanwhile, takes over from it.
/// Before, the second's grace ran from the signal, ended first, and it
/// drained the whole node under the waiting third.
#[test]
fn a_restart_of_an_ingress_still_beside_its_predecessor_hands_off_without_a_drain() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\ngrace = \"3s\"\n");
    let (mut first, client) = lingering_ingress(&mut node, "5000");
    let mut device = node.start_device();
    node.wait_ready();
    let mut second = node.spawn_ingress();
    wait_until(
        Duration::from_secs(20),
        "the second ingress to serve",
        || second.log_text().contains("ingress serving"),
    );
    second.signal(nix::sys::signal::Signal::SIGUSR2);
    wait_until(
        Duration::from_secs(10),
        "the second ingress to hear SIGUSR2",
        || second.log_text().contains("still beside the predecessor"),
    );
    let mut third = node.spawn_ingress();
    assert!(
        first
            .wait_exit(Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "{}",
        first.log_text()
    );
    assert!(
        second
            .wait_exit(Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "the second hands over to the third and exits: {}",
        second.log_text()
    );
    assert_not_logged(&second, "no successor took over within drain.grace");
    assert_not_logged(&second, "draining the node");
    assert!(
        third.wait_exit(Duration::from_millis(10)).is_none(),
        "the third serves: {}",
        third.log_text()
    );
    assert_logged(&third, "waiting for its turn");
    assert!(
        device.wait_exit(Duration::from_millis(10)).is_none(),
        "the device plane was not drained: {}",
        device.log_text()
    );
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

#[test]
fn a_successor_waits_for_its_turn_no_longer_than_drain_grace_and_a_margin() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\ngrace = \"1s\"\n");
    let (mut first, _device, client) = node.start();
    // A successor that stalls after taking the offer keeps the first busy.
    let mut stalled = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_STALL_HANDOFF_MS", "60000")]);
    wait_until(
        Duration::from_secs(20),
        "the successor to take the offer",
        || stalled.log_text().contains("taking over"),
    );
    let started = std::time::Instant::now();
    let mut patient = node.spawn_ingress();
    let status = patient
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the waiting ingress gives up: {}", patient.log_text()));
    assert!(!status.success());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "it waited drain.grace and the margin first: {waited:?}"
    );
    assert!(
        patient.log_text().contains("still busy after"),
        "it says why: {}",
        patient.log_text()
    );
    stalled.kill();
    std::thread::sleep(Duration::from_millis(500));
    assert!(first.wait_exit(Duration::from_millis(10)).is_none());
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

#[test]
fn a_successor_stopped_while_waiting_for_its_turn_takes_nothing_over() {
    // A restart that comes before a successor was ready makes the stand-in
    // stop it (SIGTERM). One waiting for its turn used to take over from the
    // ingress it waited for and then drain the whole node.
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut first, _device, client) = node.start();
    // A successor that stalls 4 s after taking the offer keeps the first busy.
    let mut second = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_STALL_HANDOFF_MS", "4000")]);
    wait_until(
        Duration::from_secs(20),
        "the successor to take the offer",
        || second.log_text().contains("taking over"),
    );
    let mut third = node.spawn_ingress();
    wait_until(
        Duration::from_secs(20),
        "the third to wait its turn",
        || third.log_text().contains("waiting for its turn"),
    );
    third.signal(nix::sys::signal::Signal::SIGTERM);
    let status = third
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the stopped one exits: {}", third.log_text()));
    assert!(status.success(), "{status}: {}", third.log_text());
    assert!(
        third.log_text().contains("before serving"),
        "{}",
        third.log_text()
    );
    // The second serves once its stall is over, and the first hands the
    // node to it; nobody drains it.
    let exited = first.wait_exit(Duration::from_secs(30));
    assert!(
        exited.is_some(),
        "the first hands over: {}",
        first.log_text()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        second.wait_exit(Duration::from_millis(10)).is_none(),
        "the second serves on: {}",
        second.log_text()
    );
    assert!(!second.log_text().contains("draining the node"));
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

#[test]
fn a_successor_killed_mid_handoff_leaves_the_old_one_serving() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut first, _device, client) = node.start();
    // The successor stalls after taking the offer, before it serves.
    let mut doomed = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_STALL_HANDOFF_MS", "60000")]);
    wait_until(
        Duration::from_secs(20),
        "the successor to take the offer",
        || doomed.log_text().contains("taking over"),
    );
    doomed.kill();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "the old one serves on"
    );
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
    // And the next successor takes over from it as usual.
    let (_next, _) = node.hand_off(&mut first);
    node.wait_ready();
    assert_eq!(
        fetch(&client.http, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

/// A successor that dies after taking the offer and before it serves has
/// steered WireGuard initiations to its own member of the port's group
/// already (it does so before it serves): the old ingress steers them back,
/// so a peer's handshake is answered. Before, every initiation went to a
/// socket nobody read, until the next handoff.
#[test]
fn a_successor_killed_before_serving_leaves_wireguard_handshakes_with_the_old_one() {
    let mut node = Node::new("[wireguard]\nendpoint = \"127.0.0.1:51820\"\n");
    let (mut first, _device, _client) = node.start();
    let config = add_wg_client(&node, "bob");
    let (private, server, address) = wg_client_settings(&config);
    let endpoint = wg_listener(&node);
    let mut doomed = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_STALL_HANDOFF_MS", "60000")]);
    wait_until(
        Duration::from_secs(20),
        "the successor to steer WireGuard to itself and stall before serving",
        || {
            doomed
                .log_text()
                .contains("fault injection: BLIPLESS_FAULT_STALL_HANDOFF_MS")
        },
    );
    doomed.kill();
    wait_until(
        Duration::from_secs(20),
        "the old ingress to see the successor go",
        || first.log_text().contains("went away before serving"),
    );
    let mut bob = TestPeer::new(private, server, address, endpoint, 9).expect("bob");
    wait_until(
        Duration::from_secs(20),
        "bob's handshake with the old ingress",
        || bob.handshake(Duration::from_secs(1)).is_ok(),
    );
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "the old one serves on"
    );
}

#[test]
fn a_successor_that_dies_after_serving_gives_the_node_back_to_the_old_one() {
    let origin = Origin::start();
    // Keep the old ingress around long enough to see the successor die: a
    // successor that reports no progress keeps it 3 s (its device plane
    // may still depend on it).
    // The successor moves the SOCKS5 listener to another port, and so shuts
    // the old one's: the old one must listen there again.
    let mut node = Node::new("");
    let (mut first, _device, client) = node.start();
    let moved = format!("listen.socks=127.0.0.1:{}", blipless_tests::free_port());
    let mut second = node.spawn_ingress_with(
        &["--set", &moved],
        &[
            ("BLIPLESS_FAULT_DIE_AFTER_SERVING_MS", "300"),
            ("BLIPLESS_FAULT_SILENT_SUCCESSOR", "1"),
        ],
    );
    let status = second
        .wait_exit(Duration::from_secs(20))
        .expect("the successor dies");
    assert!(!status.success());
    wait_until(
        Duration::from_secs(20),
        "the old ingress to serve again",
        || first.log_text().contains("serving again"),
    );
    assert_logged(&second, "stops taking connections");
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
    assert_eq!(
        fetch(&client.http, &origin.url("/bytes/100"), &[]).len(),
        100
    );
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "still running"
    );
}

#[test]
fn a_listener_whose_address_changed_is_bound_afresh() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut first, _device, client) = node.start();
    let moved = blipless_tests::free_port();
    let set = format!("listen.socks=127.0.0.1:{moved}");
    let mut second = node.spawn_ingress_with(&["--set", &set], &[]);
    assert!(first
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    node.wait_ready();
    let proxy = client
        .socks
        .replace(&node.socks.port().to_string(), &moved.to_string());
    assert_eq!(fetch(&proxy, &origin.url("/bytes/100"), &[]).len(), 100);
    // The HTTP listener moved unchanged.
    assert_eq!(
        fetch(&client.http, &origin.url("/bytes/100"), &[]).len(),
        100
    );
    assert!(second.log_text().contains("socks"), "{}", second.log_text());
    second.kill();
}

/// An operator opening a listener to the network (127.0.0.1:1080 to
/// 0.0.0.0:1080) on an ingress restart: the old listener is still open while
/// the successor binds, on the same port. Run in a namespace of its own, so
/// the wildcard address holds only its loopback.
#[test]
fn a_listener_moved_to_the_wildcard_address_on_its_port_is_bound_beside_the_old_one() {
    require_root();
    let ns = Netns::new("moved").expect("a namespace");
    let origin: std::net::SocketAddr = "127.0.0.1:8000".parse().expect("address");
    let _origin = netns::start_origin(&ns, origin).expect("an origin in the namespace");
    let mut node = Node::in_netns(ns.name(), "allow = [\"127.0.0.1/32\"]", "");
    let (mut first, _device, client) = node.start();
    assert!(
        client.socks.ends_with("@127.0.0.1:1080"),
        "{}",
        client.socks
    );
    // A successor that reports no progress keeps the old ingress beside it
    // for 3 s: new connections to 127.0.0.1:1080 meanwhile must reach the
    // successor's wildcard listener, not queue on the old one's.
    let mut second = node.spawn_ingress_with(
        &["--set", "listen.socks=0.0.0.0:1080"],
        &[("BLIPLESS_FAULT_SILENT_SUCCESSOR", "1")],
    );
    wait_until(
        Duration::from_secs(20),
        "the old ingress to step aside",
        || first.log_text().contains("stepping aside"),
    );
    node.wait_ready();
    let url = format!("http://{origin}/bytes/100");
    let fetch_in_ns = || {
        ns.exec_bytes(
            "curl",
            &[
                "-sS",
                "--fail",
                "--max-time",
                "20",
                "--proxy",
                &client.socks,
                &url,
            ],
        )
        .expect("curl through the moved listener")
    };
    assert_eq!(fetch_in_ns(), blipless_tests::pattern(100));
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "the fetch was made while the old ingress ran beside the new one"
    );
    let left = first.wait_exit(Duration::from_secs(30));
    assert!(
        left.is_some_and(|status| status.success()),
        "the old ingress steps aside ({left:?}); the successor said:\n{}",
        second.log_text()
    );
    assert_eq!(fetch_in_ns(), blipless_tests::pattern(100));
    let status = node.ctl(&["status", "--json"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("0.0.0.0:1080"), "{status}");
    second.kill();
}

/// `blipless-ctl drain`, then a new ingress before the old one is gone (an
/// operator restarting a node it meant to take out): the draining ingress
/// offers nothing (it is about to remove the node's socket files), the new
/// one waits for it to exit and then starts afresh, on the same ports.
#[test]
fn a_successor_started_while_the_node_drains_waits_and_then_starts_afresh() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\nlame_duck = \"3s\"\ngrace = \"5s\"\n");
    let (mut first, mut device, client) = node.start();
    let drain = node.ctl(&["drain"]);
    assert!(
        drain.status.success(),
        "{}",
        String::from_utf8_lossy(&drain.stderr)
    );
    let mut second = node.spawn_ingress();
    wait_until(
        Duration::from_secs(20),
        "the new ingress to wait for the draining one",
        || second.log_text().contains("waiting for its turn"),
    );
    assert!(first.log_text().contains("while this ingress drains"));
    let left = first.wait_exit(Duration::from_secs(30));
    assert!(left.is_some_and(|status| status.success()), "{left:?}");
    // The WireGuard socket too closed before the files went.
    assert_logged(&first, "every socket but handoff.sock closed");
    assert!(device.wait_exit(Duration::from_secs(30)).is_some());
    serves_afresh(&mut node, &second, &origin, &client);
    assert!(
        !second.log_text().contains("takes over"),
        "{}",
        second.log_text()
    );
    second.kill();
}

/// A new ingress that connects to the handoff socket in the last moment of
/// a drain, after the draining ingress stopped answering there and before
/// it closed its sockets (a fault hook holds that moment open for 3 s):
/// it sits in the socket's backlog until the close, asks once more, finds
/// no socket there, and starts afresh on the same ports (before, it took
/// the close for an error and exited 1).
#[test]
fn a_successor_caught_in_the_last_moment_of_a_drain_starts_afresh() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\nlame_duck = \"100ms\"\ngrace = \"2s\"\n");
    let (mut first, client) = lingering_ingress(&mut node, "3000");
    first.signal(nix::sys::signal::Signal::SIGTERM);
    wait_until(
        Duration::from_secs(20),
        "the draining ingress to linger with its sockets open",
        || {
            first
                .log_text()
                .contains("BLIPLESS_FAULT_LINGER_AT_STOP_MS")
        },
    );
    let mut second = node.spawn_ingress();
    let left = first.wait_exit(Duration::from_secs(30));
    assert!(left.is_some_and(|status| status.success()), "{left:?}");
    serves_afresh(&mut node, &second, &origin, &client);
    assert!(
        second
            .log_text()
            .contains("closed the handoff socket before answering"),
        "the new ingress connected in the moment the hook held open: {}",
        second.log_text()
    );
    second.kill();
}

/// A stop asked of the running ingress after it offered its sockets to a
/// successor and before that one serves (SIGTERM, or the SIGUSR2 fallback
/// at `drain.grace` while a slow successor takes over): the handoff is
/// already under way, so the old ingress waits for its outcome. The
/// successor serves, and the old one steps aside as after any handoff: its
/// device plane moves to the successor, and the node's socket files stay.
/// Before, it drained the node under the successor: its device plane
/// drained and exited, and `device.sock`, `control.sock` and `handoff.sock`
/// went from under the successor.
#[test]
fn a_stop_asked_while_a_successor_takes_over_leaves_the_node_to_the_successor() {
    let origin = Origin::start();
    let (node, mut first, mut device, client, _successor) =
        stop_while_a_successor_takes_over("8000");
    let left = first.wait_exit(Duration::from_secs(45));
    assert!(left.is_some_and(|status| status.success()), "{left:?}");
    assert_logged(&first, "waits for its outcome");
    assert_not_logged(&first, "draining the node");
    // Its departure ran its course, as after any handoff, rather than
    // being cut short as a stop during the overlap is.
    assert_logged(&first, "nothing depends on this ingress any more");
    for (file, there) in socket_files(&node) {
        assert!(there, "{file} is gone");
    }
    assert!(
        device.wait_exit(Duration::from_millis(10)).is_none(),
        "the device plane moved to the successor rather than drain: {}",
        device.log_text()
    );
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
    let status = node.ctl(&["status"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// The same stop, but the successor dies before it serves: the drain the
/// old ingress was asked for goes ahead once the handoff has failed (it
/// drains its device plane and removes the node's socket files), rather
/// than wait for a successor that will never serve.
#[test]
fn a_stop_asked_while_a_successor_takes_over_drains_once_the_successor_died() {
    let (node, mut first, mut device, _client, mut doomed) =
        stop_while_a_successor_takes_over("60000");
    wait_until(
        Duration::from_secs(20),
        "the old ingress to wait for the handoff's outcome",
        || first.log_text().contains("waits for its outcome"),
    );
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "the old ingress waits"
    );
    doomed.kill();
    let left = first.wait_exit(Duration::from_secs(30));
    assert!(left.is_some_and(|status| status.success()), "{left:?}");
    assert_logged(&first, "draining the node");
    assert_logged(&first, "every socket but handoff.sock closed");
    assert!(device.wait_exit(Duration::from_secs(30)).is_some());
    for (file, there) in socket_files(&node) {
        assert!(!there, "{file} is left");
    }
}

/// The new ingress, once its predecessor left, serves afresh (no handoff):
/// a device plane started now attaches to it, and a SOCKS5 fetch through it
/// brings all its bytes. No device plane is attached when it is called.
/// Serving here also says the new ingress is still running: before the fix
/// that the second caller tests, it exited 1 instead.
fn serves_afresh(node: &mut Node, second: &Daemon, origin: &Origin, client: &ClientUrls) {
    wait_until(
        Duration::from_secs(30),
        "the new ingress to serve afresh",
        || second.log_text().contains("ingress serving"),
    );
    let _device = node.start_device();
    node.wait_ready();
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );
}

/// A stop asked of the new ingress while the old one still runs beside it
/// (`systemctl stop` right after a restart): the new one drains the node and
/// removes its socket files, so the old one must exit too, not serve again
/// on sockets no device plane can find. A WireGuard peer that keeps sending
/// on its session with the old ingress (and a successor that reports no
/// progress) keeps the old one beside the new one meanwhile.
#[test]
fn a_successor_stopped_beside_its_predecessor_takes_the_predecessor_with_it() {
    let mut node =
        Node::new("[drain]\ngrace = \"20s\"\n\n[wireguard]\nendpoint = \"127.0.0.1:51820\"\n");
    let (mut first, mut device, _client) = node.start();
    let config = add_wg_client(&node, "bob");
    let (private, server, address) = wg_client_settings(&config);
    let mut bob = TestPeer::new(private, server, address, wg_listener(&node), 7).expect("bob");
    wait_until(Duration::from_secs(20), "bob's handshake", || {
        bob.handshake(Duration::from_secs(1)).is_ok()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let talking = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ping = icmp_echo(address, std::net::Ipv4Addr::new(10, 9, 9, 9), 7, 1);
            while !stop.load(Ordering::SeqCst) {
                let _ = bob.send_inner(&ping);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut second = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_SILENT_SUCCESSOR", "1")]);
    wait_until(
        Duration::from_secs(20),
        "the old ingress to step aside",
        || first.log_text().contains("stepping aside"),
    );
    // Beside it for a while: bob keeps it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        first.wait_exit(Duration::from_millis(10)).is_none(),
        "bob keeps the old ingress: {}",
        first.log_text()
    );
    second.signal(nix::sys::signal::Signal::SIGTERM);
    let second_left = second.wait_exit(Duration::from_secs(30));
    let first_left = first.wait_exit(Duration::from_secs(10));
    stop.store(true, Ordering::SeqCst);
    talking.join().expect("bob's thread");
    assert!(
        second_left.is_some_and(|status| status.success()),
        "{second_left:?}"
    );
    assert!(
        first_left.is_some_and(|status| status.success()),
        "the old ingress exits too ({first_left:?}):\n{}",
        first.log_text()
    );
    assert_logged(&first, "was asked to stop");
    assert_not_logged(&first, "serving again");
    assert!(device.wait_exit(Duration::from_secs(30)).is_some());
}

/// An ingress that lingers `linger_ms` at its end (a drain's, or a step
/// aside's) with its sockets open, once its status listener answers, and
/// a client.
fn lingering_ingress(node: &mut Node, linger_ms: &str) -> (Daemon, ClientUrls) {
    let first = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_LINGER_AT_STOP_MS", linger_ms)]);
    wait_until(
        Duration::from_secs(20),
        "the first ingress's status listener",
        || node.status().0 != 0,
    );
    let client = node.add_client("alice");
    (first, client)
}

/// Fails the test, with the log, unless `daemon` logged `text`.
#[track_caller]
fn assert_logged(daemon: &Daemon, text: &str) {
    let log = daemon.log_text();
    assert!(log.contains(text), "no {text:?} in:\n{log}");
}

/// Fails the test, with the log, if `daemon` logged `text`.
#[track_caller]
fn assert_not_logged(daemon: &Daemon, text: &str) {
    let log = daemon.log_text();
    assert!(!log.contains(text), "{text:?} in:\n{log}");
}

/// Whether each of the node's socket files (`device.sock`, `control.sock`,
/// `handoff.sock`) is there.
fn socket_files(node: &Node) -> Vec<(&'static str, bool)> {
    ["device.sock", "control.sock", "handoff.sock"]
        .into_iter()
        .map(|file| (file, node.path().join("run").join(file).exists()))
        .collect()
}

/// A node whose ingress has offered its sockets to a successor that stalls
/// `stall_ms` before it serves, and has then been sent SIGTERM: the node,
/// the old ingress, its device plane and the successor.
fn stop_while_a_successor_takes_over(stall_ms: &str) -> (Node, Daemon, Daemon, ClientUrls, Daemon) {
    let mut node = Node::new("[drain]\nlame_duck = \"100ms\"\ngrace = \"10s\"\n");
    let (first, device, client) = node.start();
    let successor = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_STALL_HANDOFF_MS", stall_ms)]);
    wait_until(
        Duration::from_secs(20),
        "the successor to take the offer",
        || successor.log_text().contains("taking over"),
    );
    first.signal(nix::sys::signal::Signal::SIGTERM);
    (node, first, device, client, successor)
}

/// Where the node's WireGuard listener is bound, from `/status`.
fn wg_listener(node: &Node) -> std::net::SocketAddr {
    let status = node.status_json();
    status["listeners"]
        .as_array()
        .and_then(|all| all.iter().find(|l| l["name"] == "wg"))
        .and_then(|wg| wg["address"].as_str())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the WireGuard listener in {status}"))
}

/// The keys and tunnel address of a wg-quick config.
fn wg_client_settings(config: &str) -> ([u8; 32], [u8; 32], std::net::Ipv4Addr) {
    let key = |field: &str| {
        let line = config
            .lines()
            .find_map(|line| line.strip_prefix(field)?.trim_start().strip_prefix('='))
            .unwrap_or_else(|| panic!("no {field} in {config}"));
        blipless_config::wireguard_key::decode(line.trim()).expect("a base64 key")
    };
    let address = config
        .lines()
        .find_map(|line| line.strip_prefix("Address = "))
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("an IPv4 Address line");
    (key("PrivateKey"), key("PublicKey"), address)
}
