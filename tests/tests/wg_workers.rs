//! The ingress's crypto workers (`wireguard.workers`; docs/WIREGUARD.md,
//! "Crypto workers"), end to end as root in namespaces the test creates:
//! many peers, each from a UDP socket of its own, send bursts of numbered
//! pings through a node with four workers. Every peer must get every reply,
//! in the order it sent the requests (a peer's packets keep their order on
//! the way in and on the way out), and the work must have spread over more
//! than one worker.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use blipless_tests::topology::{add_wg_client, WgWorld};
use blipless_tests::wait_until;
use blipless_tests::wg_peer::{icmp_echo, in_netns, TestPeer};

/// The subnet number of this test's namespaces (unique among the tests).
const SUBNET: u8 = 96;
/// Peers besides the world's wireguard-go client.
const PEERS: u16 = 8;
/// Pings each peer sends, in bursts of [`CHUNK`] back to back.
const BURST: u16 = 300;
/// Pings of one burst.
const CHUNK: u16 = 50;

/// The tunnel address and the two keys of a wg-quick config.
fn settings(config: &str) -> ([u8; 32], [u8; 32], Ipv4Addr) {
    let value = |field: &str| {
        config
            .lines()
            .find_map(|line| line.strip_prefix(field)?.trim_start().strip_prefix('='))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {field} in {config}"))
    };
    let key =
        |field: &str| blipless_config::wireguard_key::decode(value(field)).expect("a base64 key");
    let address = value("Address")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("an IPv4 Address line");
    (key("PrivateKey"), key("PublicKey"), address)
}

/// The ICMP sequence number of an echo reply with identifier `id`.
fn reply_sequence(packet: &[u8], id: u16) -> Option<u16> {
    let is_reply = packet.len() >= 28
        && packet[0] >> 4 == 4
        && packet[9] == 1
        && packet[20] == 0
        && packet[24..26] == id.to_be_bytes();
    is_reply.then(|| u16::from_be_bytes([packet[26], packet[27]]))
}

#[test]
fn each_peers_packets_keep_their_order_while_peers_spread_over_the_workers() {
    let world = WgWorld::with(SUBNET, "workers = 4", &[]);
    let peers: Vec<_> = (0..PEERS)
        .map(|n| settings(&add_wg_client(&world.node, &format!("burst{n}"))))
        .collect();
    wait_until(Duration::from_secs(10), "every peer in the ingress", || {
        world.node.metric("blipless_wg_peers") == f64::from(PEERS + 1)
    });
    let endpoint: SocketAddr = world.net.endpoint().parse().expect("endpoint");
    let std::net::IpAddr::V4(origin) = world.net.origin.ip() else {
        panic!("the origin is IPv4");
    };
    let results = in_netns(world.net.customer.name(), move || {
        let threads: Vec<_> = peers
            .into_iter()
            .zip(0u16..)
            .map(|((private, server, address), n)| {
                std::thread::spawn(move || {
                    let id = 500 + n;
                    let mut peer =
                        TestPeer::new(private, server, address, endpoint, 40 + u32::from(n))
                            .expect("a test peer");
                    // Room for every reply of the burst, unread until it is sent.
                    nix::sys::socket::setsockopt(
                        peer.socket(),
                        nix::sys::socket::sockopt::RcvBufForce,
                        &(4 << 20),
                    )
                    .expect("SO_RCVBUFFORCE (as root)");
                    peer.handshake(Duration::from_secs(10))
                        .expect("a handshake");
                    // The first packet of a flow may be overtaken by the next
                    // few while the node's kernel sets the flow up (it was so
                    // before the workers): one answered ping first.
                    peer.send_inner(&icmp_echo(address, origin, id, 0))
                        .expect("a ping");
                    loop {
                        match peer.recv_inner(Duration::from_secs(10)).expect("receive") {
                            Some(packet) if reply_sequence(&packet, id) == Some(0) => break,
                            Some(_) => {}
                            None => panic!("peer {n}: no reply to the first ping"),
                        }
                    }
                    // Bursts of CHUNK back to back, each answered before the
                    // next: deep enough to queue in the workers, shallow
                    // enough that a loaded machine drops none on the way.
                    let mut replies = Vec::new();
                    for first in (1..=BURST).step_by(usize::from(CHUNK)) {
                        let last = (first + CHUNK - 1).min(BURST);
                        for sequence in first..=last {
                            peer.send_inner(&icmp_echo(address, origin, id, sequence))
                                .expect("a ping");
                        }
                        while replies.len() < usize::from(last) {
                            match peer.recv_inner(Duration::from_secs(10)).expect("receive") {
                                Some(packet) => replies.extend(reply_sequence(&packet, id)),
                                None => return (n, replies),
                            }
                        }
                    }
                    (n, replies)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a peer's thread"))
            .collect::<Vec<_>>()
    });
    assert_eq!(
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"workers_busy\"}"),
        0.0,
        "no return packet dropped for a full worker queue"
    );
    let expected: Vec<u16> = (1..=BURST).collect();
    for (n, replies) in &results {
        assert_eq!(
            replies,
            &expected,
            "peer {n}: every reply, in the order of the requests\n{}",
            world.diagnostics()
        );
    }
    let busy: Vec<f64> = (0..4)
        .map(|worker| {
            world.node.metric(&format!(
                "blipless_wg_worker_jobs_total{{worker=\"{worker}\"}}"
            ))
        })
        .collect();
    assert!(
        busy.iter().filter(|jobs| **jobs > 0.0).count() >= 2,
        "the peers' work spread over more than one of the 4 workers: {busy:?}"
    );
    assert!(
        world.ingress.log_text().contains("wg_workers=4"),
        "the ingress says how many workers it runs"
    );
}
