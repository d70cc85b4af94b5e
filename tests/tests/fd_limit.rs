//! Running out of file descriptors costs connections, never the device
//! channel (issue 14: "with the device plane's limit lowered to 53 and 300
//! idle SOCKS5 connections held, it reattached 13 times"): at its limit the
//! device plane refuses new connections at once, keeps its one attachment,
//! says so at most once a second, and serves again as soon as connections
//! close.

use std::net::TcpStream;
use std::time::Duration;

use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{raw, wait_until};

#[test]
fn a_device_plane_at_its_fd_limit_refuses_connections_and_keeps_its_channel() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let alice = node.add_client("alice");
    let device = node.start_device_with_fd_limit(96);
    node.wait_ready();
    let generation = node.active_generation();
    // 300 idle connections: far more than 96 descriptors allow.
    let idle: Vec<TcpStream> = (0..300).map(|_| raw::connect(node.socks)).collect();
    // Every one either reached the plane (and waits for its greeting) or was
    // refused with a close; give the plane time to take them all.
    std::thread::sleep(Duration::from_secs(2));
    let log = std::fs::read_to_string(&device.log).unwrap_or_default();
    assert!(
        log.contains("open-file limit nearly reached"),
        "the plane said it refused connections: {log}"
    );
    let said = log.matches("open-file limit nearly reached").count();
    assert!(
        said <= 10,
        "logged {said} times in about 2 s: once a second at most"
    );
    assert!(
        !log.contains("reattaching") && !log.contains("device channel lost"),
        "the device channel stayed up: {log}"
    );
    assert_eq!(
        node.active_generation(),
        generation,
        "the same attachment is active"
    );
    wait_until(Duration::from_secs(10), "the refusals in /metrics", || {
        node.metric("blipless_connections_refused_total{reason=\"fd_limit\"}") > 0.0
    });
    drop(idle);
    // Once they close, it serves again, by itself.
    wait_until(Duration::from_secs(20), "the plane to serve again", || {
        let mut stream = raw::connect(node.socks);
        raw::try_socks5_login(&mut stream, "alice", &alice.secret) == Some(0)
            && raw::socks5_connect_v4(&mut stream, origin.address) == 0
    });
    let log = std::fs::read_to_string(&device.log).unwrap_or_default();
    assert!(!log.contains("reattaching"), "{log}");
}
