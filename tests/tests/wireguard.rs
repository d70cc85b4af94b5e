//! WireGuard end to end, as root, in network namespaces the tests create and
//! remove: a "customer" namespace with the real client (wireguard-go and `wg`,
//! configured from the wg-quick config `blipless-ctl client add --wg` prints),
//! a "node" namespace running blipless-ingress and blipless-device (TUN egress
//! with nftables masquerade, set up by the device plane: `egress.tun.manage`),
//! and an "internet" namespace with an HTTP origin.
//!
//! ```text
//! customer 10.S.1.2 ── 10.S.1.1 node 10.S.2.1 ── 10.S.2.2 internet (origin :8000)
//!   wg (10.64.0.x) ──UDP 51820──▶ ingress ⇄ device plane ⇄ blip0 ⇄ masquerade
//! ```
//!
//! The world is [`blipless_tests::topology::WgWorld`] (the WireGuard
//! benchmark builds the same one, and its wireguard-go baseline).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use blipless_tests::node::Node;
use blipless_tests::topology::{add_wg_client, WgWorld};
use blipless_tests::wg_peer::{icmp_echo, in_netns, is_echo_reply, TestPeer};
use blipless_tests::{pattern, ping_counts, sha256, wait_until};

/// The client's private key, the node's public key and the client's tunnel
/// address, from a wg-quick config.
fn client_settings(config: &str) -> ([u8; 32], [u8; 32], std::net::Ipv4Addr) {
    let address = config
        .lines()
        .find_map(|line| line.strip_prefix("Address = "))
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("an IPv4 Address line");
    (
        config_key(config, "PrivateKey"),
        config_key(config, "PublicKey"),
        address,
    )
}

/// A key line (`PrivateKey = ...`) of a wg-quick config, decoded.
fn config_key(config: &str, field: &str) -> [u8; 32] {
    let line = config
        .lines()
        .find_map(|line| line.strip_prefix(field)?.trim_start().strip_prefix('='))
        .unwrap_or_else(|| panic!("no {field} in {config}"));
    blipless_config::wireguard_key::decode(line.trim()).expect("a base64 key")
}

#[test]
fn a_wireguard_go_client_fetches_through_the_node_byte_exact() {
    let world = WgWorld::new(71);
    let size = 8_000_000;
    let body = world.fetch(&format!("/bytes/{size}"), &[]);
    assert_eq!(body.len(), size);
    assert_eq!(sha256(&body), sha256(&pattern(size)), "bytes differ");
    // The origin sees the node's masqueraded address, not the tunnel address.
    let whoami = String::from_utf8(world.fetch("/whoami", &[])).expect("utf-8");
    assert!(
        whoami.starts_with(&world.net.internet_net[..world.net.internet_net.len() - 4]),
        "origin saw {whoami:?}"
    );
    assert_eq!(world.node.metric("blipless_wg_peers"), 1.0);
    assert!(world.node.metric("blipless_wg_handshakes_total") >= 1.0);
}

#[test]
fn packets_from_an_address_that_is_not_the_peers_own_are_dropped_and_counted() {
    let world = WgWorld::new(72);
    let interface = world.peer.interface().to_string();
    world
        .net
        .customer
        .ip(&["addr", "add", "10.64.0.200/32", "dev", &interface])
        .expect("a second address");
    let spoofed = world
        .net
        .customer
        .command("ping")
        .args([
            "-n",
            "-q",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            "10.64.0.200",
        ])
        .arg(world.net.origin.ip().to_string())
        .output()
        .expect("ping");
    let (sent, received) = ping_counts(&spoofed);
    assert_eq!(
        (sent, received),
        (5, 0),
        "spoofed pings must not get through"
    );
    wait_until(Duration::from_secs(10), "the drops to be counted", || {
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"source\"}")
            >= 5.0
    });
    // The peer's own address still works.
    assert_eq!(world.fetch("/bytes/1000", &[]).len(), 1000);
}

#[test]
fn a_removed_client_loses_its_session_within_seconds() {
    let world = WgWorld::new(73);
    assert_eq!(world.fetch("/bytes/1000", &[]).len(), 1000);
    let output = world.node.ctl(&["client", "remove", "alice"]);
    assert!(output.status.success(), "client remove failed");
    wait_until(Duration::from_secs(10), "the peer to be removed", || {
        world.node.metric("blipless_wg_peers") == 0.0
    });
    let ping = world.net.ping(3, "0.2").wait_with_output().expect("ping");
    assert_eq!(
        ping_counts(&ping).1,
        0,
        "a removed client's packets must not pass"
    );
}

#[test]
fn an_inner_tcp_stream_survives_five_device_deploys() {
    let mut world = WgWorld::new(74);
    // Rate-limited so the stream outlasts the deploys by a wide margin.
    let download = world.start_download(24_000_000, "3M");
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    for round in 1..=5 {
        let (device, took) = world.node.deploy(&mut world.device);
        world.device = device;
        eprintln!("deploy {round} took {took:?}");
    }
    eprintln!("5 deploys in {:?}", started.elapsed());
    download.finish("deploys", || world.diagnostics());
}

#[test]
fn ping_through_the_tunnel_loses_nothing_across_a_deploy() {
    let mut world = WgWorld::new(75);
    // 10 ms apart for 6 s; the deploy happens in the middle.
    let ping = world.net.ping(600, "0.01");
    std::thread::sleep(Duration::from_secs(2));
    let (device, took) = world.node.deploy(&mut world.device);
    world.device = device;
    let output = ping.wait_with_output().expect("ping");
    let (sent, received) = ping_counts(&output);
    eprintln!(
        "ping across a deploy ({took:?}): {sent} sent, {received} received, {} lost",
        sent - received
    );
    assert_eq!(sent, 600);
    assert_eq!(
        received,
        sent,
        "lost pings across a deploy\n{}",
        world.diagnostics()
    );
}

#[test]
fn junk_truncated_replayed_and_flooded_messages_harm_no_one() {
    let world = WgWorld::new(76);
    let config = add_wg_client(&world.node, "bob");
    wait_until(Duration::from_secs(10), "bob to be a peer", || {
        world.node.metric("blipless_wg_peers") == 2.0
    });
    let (private, server, address) = client_settings(&config);
    let endpoint: SocketAddr = "10.76.1.1:51820".parse().expect("endpoint");
    let origin = match world.net.origin.ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => unreachable!("the origin is IPv4"),
    };
    let (replies, cookies) = in_netns(world.net.customer.name(), move || {
        let mut bob = TestPeer::new(private, server, address, endpoint, 11).expect("bob");
        // Junk of every size, and junk that looks like each message type.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for size in 0..300usize {
            let mut datagram: Vec<u8> = (0..size).map(|_| random() as u8).collect();
            if let Some(first) = datagram.first_mut() {
                *first = (size % 5) as u8;
            }
            bob.socket().send_to(&datagram, endpoint).expect("junk");
        }
        // Truncated initiations, then a session, then truncated data.
        let initiation = bob.initiation().expect("initiation");
        for cut in [1, 4, 32, 100, initiation.len() - 1] {
            bob.socket()
                .send_to(&initiation[..cut], endpoint)
                .expect("truncated");
        }
        bob.handshake(Duration::from_secs(10))
            .expect("bob's handshake");
        // A packet whose IP length field is shorter than its own header:
        // boringtun keeps only that much, a stub whose client the plane
        // could not tell (and a batch it would not meter).
        let mut stub = icmp_echo(address, origin, 77, 9);
        stub[2..4].copy_from_slice(&1u16.to_be_bytes());
        bob.send_inner(&stub).expect("stub");
        let ping = icmp_echo(address, origin, 77, 1);
        let sent = bob.send_inner(&ping).expect("ping");
        for cut in [16, 31, sent.len() - 1] {
            bob.socket()
                .send_to(&sent[..cut], endpoint)
                .expect("truncated data");
        }
        // Replays of the same encrypted ping: each must be dropped.
        for _ in 0..5 {
            bob.socket().send_to(&sent, endpoint).expect("replay");
        }
        let mut replies = 0;
        while let Some(packet) = bob.recv_inner(Duration::from_secs(2)).expect("receive") {
            if is_echo_reply(&packet, 77, 1) {
                replies += 1;
            }
        }
        // A flood of initiations from keys no one knows, with valid mac1s.
        let flood = std::net::UdpSocket::bind("0.0.0.0:0").expect("flood socket");
        flood
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        for n in 0..1500u32 {
            let mut stranger = TestPeer::new(
                [(n % 251) as u8 + 1; 32],
                server,
                address,
                endpoint,
                1000 + n,
            )
            .expect("stranger");
            let initiation = stranger.initiation().expect("initiation");
            flood.send_to(&initiation, endpoint).expect("flood");
        }
        let mut cookies = 0;
        let mut datagram = [0u8; 256];
        while let Ok((length, _)) = flood.recv_from(&mut datagram) {
            if length == 64 && datagram[0] == 3 {
                cookies += 1;
            }
        }
        (replies, cookies)
    });
    assert_eq!(replies, 1, "one ping, one reply: replays are not delivered");
    assert!(cookies > 0, "the flood got cookie replies");
    assert!(world.node.metric("blipless_wg_cookie_replies_total") > 0.0);
    assert!(
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"replay\"}")
            >= 5.0
    );
    assert!(
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"invalid\"}")
            > 0.0
    );
    assert!(
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"malformed_inner\"}")
            >= 1.0,
        "the stub is dropped at the ingress"
    );
    // The legitimate client keeps working, and so does the ingress.
    let ping = world.net.ping(5, "0.2").wait_with_output().expect("ping");
    assert_eq!(ping_counts(&ping), (5, 5), "alice's pings after the flood");
    assert_eq!(world.fetch("/bytes/100000", &[]).len(), 100_000);
    assert!(world.ingress_serving(), "the ingress survived");
}

/// Under load a cookie proves only that its sender receives at its address:
/// one such sender replaying a cookie-carrying initiation must not buy an
/// X25519 operation per copy, and a peer at another address gets its
/// session while the flood goes on. The flood is paced (about 3,000 copies
/// a second, a rate the node answers without falling behind once it drops
/// them cheaply): a flood that fills the node's socket buffer drops
/// everyone's datagrams in the kernel, which no limit here can help.
#[test]
fn an_initiation_flood_from_one_source_is_limited_under_load_and_others_get_through() {
    // A low limit, so that the node is under load from the first datagrams.
    const HANDSHAKE_LIMIT: f64 = 10.0;
    // The flood lasts at least this long, and on until bob is done.
    const FLOOD: Duration = Duration::from_secs(4);
    let world = WgWorld::with(89, "handshake_limit = 10", &[]);
    let config = add_wg_client(&world.node, "bob");
    wait_until(Duration::from_secs(10), "bob to be a peer", || {
        world.node.metric("blipless_wg_peers") == 2.0
    });
    // Bob sends from an address of his own in the customer namespace.
    world
        .net
        .customer
        .ip(&["addr", "add", "10.89.1.3/32", "dev", "lo"])
        .expect("bob's address");
    world
        .net
        .node_ns
        .exec("ping", &["-c", "1", "-W", "5", "10.89.1.3"])
        .expect("the node reaches bob's address");
    let (private, server, address) = client_settings(&config);
    let endpoint: SocketAddr = world.net.endpoint().parse().expect("endpoint");
    let unknown_before = world
        .node
        .metric("blipless_wg_dropped_total{reason=\"unknown_peer\"}");
    let netns = world.net.customer.name().to_string();
    let flood_netns = netns.clone();
    let (armed_sender, armed_receiver) = std::sync::mpsc::channel();
    let bob_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood_goes_on = bob_done.clone();
    let flood = std::thread::spawn(move || {
        in_netns(&flood_netns, move || {
            // A key the node does not know: every initiation that gets past
            // the limiters costs the node its X25519 work and is dropped as
            // `unknown_peer`.
            let mut stranger =
                TestPeer::new([9; 32], server, address, endpoint, 4000).expect("stranger");
            stranger
                .socket()
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("timeout");
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut datagram = [0u8; 256];
            let mut armed = loop {
                assert!(Instant::now() < deadline, "no cookie reply in 20 s");
                let initiation = stranger.initiation().expect("initiation");
                stranger
                    .socket()
                    .send_to(&initiation, endpoint)
                    .expect("send");
                if let Ok((64, _)) = stranger.socket().recv_from(&mut datagram) {
                    if datagram[0] == 3 {
                        stranger.receive(&datagram[..64]);
                        break stranger.initiation().expect("an initiation with mac2");
                    }
                }
            };
            // The same initiation, mac2 and all. A cookie reply means the
            // node's cookie secret changed (every two minutes): the next
            // copies carry the new cookie.
            stranger
                .socket()
                .set_nonblocking(true)
                .expect("nonblocking");
            let started = Instant::now();
            let _ = armed_sender.send(());
            let mut sent = 0u64;
            let flooding = || {
                let bob_busy = !flood_goes_on.load(std::sync::atomic::Ordering::SeqCst);
                started.elapsed() < FLOOD || (bob_busy && started.elapsed() < FLOOD * 10)
            };
            while flooding() {
                for _ in 0..15 {
                    if stranger.socket().send_to(&armed, endpoint).is_ok() {
                        sent += 1;
                    }
                }
                while let Ok((length, _)) = stranger.socket().recv_from(&mut datagram) {
                    if length == 64 && datagram[0] == 3 {
                        stranger.receive(&datagram[..64]);
                        armed = stranger.initiation().expect("an initiation with mac2");
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (sent, started, Instant::now())
        })
    });
    // Bob starts half a second into the flood; it goes on until he is done.
    armed_receiver
        .recv_timeout(Duration::from_secs(30))
        .expect("the stranger got its cookie");
    std::thread::sleep(Duration::from_millis(500));
    let (bob, bob_at) = in_netns(&netns, move || {
        let mut bob = TestPeer::new(private, server, address, endpoint, 31).expect("bob");
        bob.bind_to("10.89.1.3:0".parse().expect("address"))
            .expect("bob's socket");
        let result = bob.handshake(Duration::from_secs(30));
        let at = Instant::now();
        bob_done.store(true, std::sync::atomic::Ordering::SeqCst);
        (result, at)
    });
    let (sent, flood_started, flood_ended) = flood.join().expect("the flood");
    let took = flood_ended - flood_started;
    let limited = world
        .node
        .metric("blipless_wg_dropped_total{reason=\"source_limited\"}");
    let unknown = world
        .node
        .metric("blipless_wg_dropped_total{reason=\"unknown_peer\"}")
        - unknown_before;
    eprintln!(
        "{sent} replays in {took:?}: {limited} limited, {unknown} reached the handshake; \
         bob's session {:?} into the flood",
        bob_at.saturating_duration_since(flood_started)
    );
    if let Err(error) = bob {
        panic!(
            "bob's handshake from another address during the flood: {error}\n{}",
            world.diagnostics()
        );
    }
    // Each second: the limit's worth before the node is under load, then the
    // source's 20 (burst 5); the cookie's own second and spare ones for a
    // backlog on top.
    let seconds = took.as_secs_f64().ceil() + 4.0;
    let bound = (HANDSHAKE_LIMIT + 20.0) * seconds + 5.0;
    assert!(
        unknown <= bound,
        "{unknown} of {sent} replayed initiations reached the X25519 work (at most {bound})"
    );
    assert!(
        limited >= 1000.0,
        "only {limited} dropped as source_limited"
    );
    assert!(world.ingress_serving(), "the ingress survived");
}

#[test]
fn status_is_503_until_the_device_planes_peer_set_is_applied() {
    // No namespaces needed: nothing crosses the tunnel here.
    let mut node = Node::new("[wireguard]\nendpoint = \"127.0.0.1:51820\"\n");
    let _ingress = node.start_ingress();
    add_wg_client(&node, "carol");
    let _device = node.start_device_with_env(&[("BLIPLESS_FAULT_DELAY_PEERS_MS", "3000")]);
    wait_until(Duration::from_secs(30), "an active device plane", || {
        node.active_generation().is_some()
    });
    let (code, body) = node.status();
    assert_eq!(
        (code, body.lines().next()),
        (503, Some("starting")),
        "active plane, no peer set yet"
    );
    assert_eq!(node.metric("blipless_wg_peers"), 0.0);
    node.wait_ready();
    assert_eq!(node.metric("blipless_wg_peers"), 1.0);
}

#[test]
fn a_peer_that_roams_gets_its_replies_at_its_new_address() {
    let world = WgWorld::new(77);
    let config = add_wg_client(&world.node, "dave");
    wait_until(Duration::from_secs(10), "dave to be a peer", || {
        world.node.metric("blipless_wg_peers") == 2.0
    });
    let (private, server, address) = client_settings(&config);
    let endpoint: SocketAddr = world.net.endpoint().parse().expect("endpoint");
    let std::net::IpAddr::V4(origin) = world.net.origin.ip() else {
        unreachable!("the origin is IPv4")
    };
    let (before, after, ports) = in_netns(world.net.customer.name(), move || {
        let mut dave = TestPeer::new(private, server, address, endpoint, 21).expect("dave");
        dave.handshake(Duration::from_secs(10)).expect("handshake");
        let echo = |dave: &mut TestPeer, sequence: u16| {
            dave.send_inner(&icmp_echo(address, origin, 5, sequence))
                .expect("send");
            let mut replied = false;
            while let Some(packet) = dave.recv_inner(Duration::from_secs(3)).expect("receive") {
                if is_echo_reply(&packet, 5, sequence) {
                    replied = true;
                    break;
                }
            }
            replied
        };
        let before = echo(&mut dave, 1);
        let old_port = dave.socket().local_addr().expect("address").port();
        // Same session, new source port: the next reply must find it there.
        dave.rebind().expect("rebind");
        let new_port = dave.socket().local_addr().expect("address").port();
        let after = echo(&mut dave, 2);
        (before, after, (old_port, new_port))
    });
    assert_ne!(ports.0, ports.1);
    assert!(before, "a reply before roaming");
    assert!(after, "the reply followed the peer to its new port");
}

#[test]
fn with_no_device_plane_packets_wait_up_to_a_bound_and_then_arrive() {
    let mut world = WgWorld::new(78);
    world.device.kill();
    wait_until(Duration::from_secs(10), "no active device plane", || {
        world.node.status().0 == 503
    });
    // Bursts until more than the 4,096-packet bound wait while no plane is
    // active (not every burst's packet makes it through the client's queues).
    let overflowed = || {
        world
            .node
            .metric("blipless_wg_dropped_total{reason=\"queue_full\"}")
            > 0.0
    };
    for _ in 0..20 {
        let burst = world
            .net
            .customer
            .command("ping")
            .args(["-n", "-q", "-l", "2000", "-c", "2000", "-W", "1"])
            .arg(world.net.origin.ip().to_string())
            .output()
            .expect("ping -l");
        assert_eq!(ping_counts(&burst).1, 0, "no plane, no replies yet");
        if overflowed() {
            break;
        }
    }
    assert!(overflowed(), "the overflow is counted");
    let held = world.node.metric("blipless_wg_held_packets");
    // Whole batches are held or dropped: up to the bound, and close to it.
    assert!((3500.0..=4096.0).contains(&held), "{held} packets held");
    // Once a plane is active every held request goes out: the origin's
    // kernel counts each echo request it receives, exactly as many as were
    // held. (Their replies are not all counted back: a burst of thousands
    // overflows the TUN device's own transmit queue of 500 on the way back,
    // which the kernel counts as the device's TX drops, not ours.)
    let echoes = || {
        world
            .net
            .internet
            .snmp_counter("Icmp", "InEchos")
            .expect("the origin's ICMP counters")
    };
    let echoes_before = echoes();
    let replies_before = world
        .node
        .metric("blipless_wg_inner_packets_total{direction=\"out\"}");
    world.device = world.node.start_device();
    wait_until(
        Duration::from_secs(30),
        "the held packets to be delivered",
        || world.node.metric("blipless_wg_held_packets") == 0.0,
    );
    wait_until(
        Duration::from_secs(30),
        "every held echo request to reach the origin",
        || (echoes() - echoes_before) as f64 >= held,
    );
    assert_eq!(
        (echoes() - echoes_before) as f64,
        held,
        "each held request reached the origin once"
    );
    // Every echo request was sent while no plane was active, so any reply
    // came back to a held request.
    wait_until(
        Duration::from_secs(30),
        "replies to the held requests",
        || {
            world
                .node
                .metric("blipless_wg_inner_packets_total{direction=\"out\"}")
                > replies_before
        },
    );
    assert_eq!(world.fetch("/bytes/1000", &[]).len(), 1000);
}

#[test]
fn inner_packets_to_a_denied_destination_go_nowhere() {
    let world = WgWorld::new(79);
    let ping = |target: &str| {
        world
            .net
            .customer
            .command("ping")
            .args(["-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", target])
            .output()
            .expect("ping")
    };
    // The origin's network is allowed (egress.allow). The node's own address
    // on the TUN device, 10.64.0.1, is private and not allowed: without the
    // policy the node's kernel would answer it.
    assert_eq!(
        ping_counts(&ping(&world.net.origin.ip().to_string())),
        (3, 3)
    );
    world
        .net
        .customer
        .ip(&[
            "route",
            "add",
            "10.64.0.1/32",
            "dev",
            world.peer.interface(),
        ])
        .expect("a route through the tunnel");
    assert_eq!(
        ping_counts(&ping("10.64.0.1")).1,
        0,
        "10.64.0.1 is denied by default"
    );
}

/// A host outside that routes the client pool through the node (a
/// neighbour on its network, a VPC without source checks) reaches no
/// client: only replies to what clients began are let into the tunnel
/// device. Before, the node forwarded the pings into alice's tunnel and
/// she answered them (and her download was charged for them).
#[test]
fn the_internet_cannot_reach_a_client_unasked() {
    let world = WgWorld::new(97);
    let (_, _, alice) = client_settings(&world.client_config);
    let ping_from_outside = || {
        world
            .net
            .internet
            .command("ping")
            .args(["-n", "-q", "-c", "3", "-i", "0.2", "-W", "1"])
            .arg(alice.to_string())
            .output()
            .expect("ping")
    };
    // Alice reaches the internet, and its answers come back.
    let from_alice = world
        .net
        .customer
        .command("ping")
        .args(["-n", "-q", "-c", "3", "-i", "0.2", "-W", "2"])
        .arg(world.net.origin.ip().to_string())
        .output()
        .expect("ping");
    assert_eq!(ping_counts(&from_alice), (3, 3), "alice's own pings");
    world
        .net
        .internet
        .ip(&[
            "route",
            "add",
            "10.64.0.0/16",
            "via",
            &format!("10.{}.2.1", world.net.subnet),
        ])
        .expect("a route to the pool through the node");
    let before = world
        .net
        .customer
        .snmp_counter("Icmp", "InEchos")
        .expect("counter");
    let answered = ping_counts(&ping_from_outside());
    let after = world
        .net
        .customer
        .snmp_counter("Icmp", "InEchos")
        .expect("counter");
    assert_eq!(answered.1, 0, "pings from outside answered: {answered:?}");
    assert_eq!(after, before, "pings from outside reached alice");
}
