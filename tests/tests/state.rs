//! State that outlives a device plane: egress identity, usage, activity and
//! pre-warm, clients shared by a fleet through Redis, and a Redis outage.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use blipless_tests::curl::fetch;
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::redis::Redis;
use blipless_tests::{raw, wait_until};

const SOURCES: &str = "sources = [\"127.0.0.2\", \"127.0.0.3\", \"127.0.0.4\"]";

fn whoami(node: &Node, name: &str, secret: &str, origin: &Origin) -> String {
    let proxy = format!("socks5h://{name}:{secret}@{}", node.socks);
    String::from_utf8(fetch(&proxy, &origin.url("/whoami"), &[])).expect("an address")
}

fn add(node: &Node, name: &str) -> String {
    node.add_client(name).secret
}

#[test]
fn a_client_keeps_its_exit_address_across_deploys_and_a_crash() {
    let origin = Origin::start();
    let mut node = Node::custom("test", SOURCES, "");
    let (_ingress, mut device, alice) = node.start();
    let mut clients = vec![("alice".to_string(), alice.secret.clone())];
    for name in ["bob", "carol"] {
        clients.push((name.to_string(), add(&node, name)));
    }
    wait_until(
        Duration::from_secs(10),
        "the new clients to reach the device plane",
        || node.status_json()["device_planes"][0]["clients"] == 3,
    );
    let first: Vec<String> = clients
        .iter()
        .map(|(n, s)| whoami(&node, n, s, &origin))
        .collect();
    for address in &first {
        assert!(
            ["127.0.0.2", "127.0.0.3", "127.0.0.4"].contains(&address.as_str()),
            "{address}"
        );
    }
    let mut distinct = first.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        3,
        "three clients spread over the pool: {first:?}"
    );

    for _ in 0..2 {
        let (next, _) = node.deploy(&mut device);
        device = next;
        let now: Vec<String> = clients
            .iter()
            .map(|(n, s)| whoami(&node, n, s, &origin))
            .collect();
        assert_eq!(now, first, "addresses after a deploy");
    }
    // A crash: SIGKILL, then a fresh device plane.
    device.kill();
    wait_until(Duration::from_secs(20), "/status to say starting", || {
        node.status().0 == 503
    });
    let _restarted = node.start_device();
    node.wait_ready();
    let now: Vec<String> = clients
        .iter()
        .map(|(n, s)| whoami(&node, n, s, &origin))
        .collect();
    assert_eq!(now, first, "addresses after a crash and restart");
}

/// An echo server for byte-exact tunnels.
fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 16 * 1024];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

fn usage_of(node: &Node, name: &str) -> serde_json::Value {
    let output = node.ctl(&["--json", "client", "list"]);
    let list: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("client list --json");
    list.as_array()
        .and_then(|clients| clients.iter().find(|c| c["name"] == name).cloned())
        .map(|c| c["usage"].clone())
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn usage_is_exact_across_five_deploys() {
    let echo = echo_server();
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    // Three tunnels, each sending 64 KiB per round and reading it back.
    let mut tunnels: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut stream = raw::connect(node.socks);
            assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
            assert_eq!(raw::socks5_connect_v4(&mut stream, echo), 0);
            stream
        })
        .collect();
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    let mut sent = 0u64;
    for round in 0..6 {
        for stream in &mut tunnels {
            stream.write_all(&chunk).expect("write");
            let mut back = vec![0u8; chunk.len()];
            stream.read_exact(&mut back).expect("read back");
            assert_eq!(back, chunk);
            sent += chunk.len() as u64;
        }
        if round < 5 {
            let (next, _) = node.deploy(&mut device);
            device = next;
        }
    }
    drop(tunnels);
    // SIGTERM flushes usage at exit.
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(device
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    let usage = usage_of(&node, "alice");
    assert_eq!(usage["bytes_up"], sent, "{usage}");
    assert_eq!(usage["bytes_down"], sent, "{usage}");
    assert_eq!(usage["connections"], 3, "{usage}");
}

#[test]
fn pre_warm_opens_the_recently_active_clients_only() {
    let redis = Redis::start(false);
    let mut node = Node::new(&format!("[store]\nurl = \"{}\"\n", redis.url()));
    let (_ingress, _device, _client) = node.start();
    for name in ["bob", "carol", "dave"] {
        add(&node, name);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let key = "{pca_test_0}";
    // bob and carol were active minutes ago, dave 30 minutes ago (stale).
    for (name, at) in [
        ("bob", now - 60),
        ("carol", now - 300),
        ("dave", now - 1800),
    ] {
        let output = redis.cli(&["ZADD", key, &at.to_string(), name]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut old = _device;
    let (_new, _) = node.deploy(&mut old);
    let metrics = blipless_tests::curl::curl(&[
        "--max-time",
        "5",
        &format!("http://{}/metrics", node.status),
    ]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    let prewarmed: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("blipless_prewarmed_devices")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(-1.0);
    assert_eq!(
        prewarmed, 2.0,
        "bob and carol pre-warmed, not dave:\n{text}"
    );
}

#[test]
fn a_client_added_once_works_on_every_node_of_a_fleet() {
    let origin = Origin::start();
    let redis = Redis::start(false);
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let mut a = Node::custom("node-a", "", &store);
    let mut b = Node::custom("node-b", "", &store);
    let (_ia, mut da, alice) = a.start();
    let _ib = b.start_ingress();
    let mut db = b.start_device();
    b.wait_ready();
    // A client added through node b's blipless-ctl reaches both nodes within seconds.
    let started = Instant::now();
    let bob = add(&b, "bob");
    for node in [&a, &b] {
        let proxy = format!("http://bob:{bob}@{}", node.http);
        wait_until(Duration::from_secs(10), "bob to work", || {
            blipless_tests::curl::status_code(&proxy, &origin.url("/"), &[]) == "200"
        });
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // alice (added through node a) works on node b as well.
    let carol = add(&a, "carol");
    let alice_on_b = format!("socks5h://alice:{}@{}", alice.secret, b.socks);
    assert_eq!(fetch(&alice_on_b, &origin.url("/"), &[]), b"hello");
    // Activity stays per node: carol only uses node a, dave only node b.
    let dave = add(&a, "dave");
    let carol_on_a = format!("socks5h://carol:{carol}@{}", a.socks);
    let dave_on_b = format!("socks5h://dave:{dave}@{}", b.socks);
    wait_until(Duration::from_secs(10), "carol to work on node a", || {
        blipless_tests::curl::curl(&["--max-time", "5", "--proxy", &carol_on_a, &origin.url("/")])
            .stdout
            == b"hello"
    });
    wait_until(Duration::from_secs(10), "dave to work on node b", || {
        blipless_tests::curl::curl(&["--max-time", "5", "--proxy", &dave_on_b, &origin.url("/")])
            .stdout
            == b"hello"
    });
    // A draining device plane flushes its usage and activity.
    for device in [&mut da, &mut db] {
        device.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(device
            .wait_exit(Duration::from_secs(30))
            .is_some_and(|s| s.success()));
    }
    let set = |key: &str| {
        String::from_utf8_lossy(&redis.cli(&["ZRANGE", key, "0", "-1"]).stdout).into_owned()
    };
    let (on_a, on_b) = (set("{pca_node-a_0}"), set("{pca_node-b_0}"));
    assert!(
        on_a.contains("carol") && !on_a.contains("dave"),
        "node a's activity: {on_a}"
    );
    assert!(
        on_b.contains("dave") && !on_b.contains("carol"),
        "node b's activity: {on_b}"
    );
}

#[test]
fn traffic_flows_while_redis_is_down_and_nothing_acknowledged_is_lost() {
    let origin = Origin::start();
    let echo = echo_server();
    let mut redis = Redis::start(true);
    let mut node = Node::new(&format!("[store]\nurl = \"{}\"\n", redis.url()));
    let (_ingress, mut device, client) = node.start();
    // carol's curls check the data path; alice's tunnel is the byte count.
    let carol = node.add_client("carol");
    wait_until(
        Duration::from_secs(10),
        "carol to reach the device plane",
        || node.status_json()["device_planes"][0]["clients"] == 2,
    );
    let mut tunnel = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut tunnel, "alice", &client.secret), 0);
    assert_eq!(raw::socks5_connect_v4(&mut tunnel, echo), 0);
    let chunk = vec![7u8; 100_000];
    let exchange = |tunnel: &mut std::net::TcpStream| {
        tunnel.write_all(&chunk).expect("write");
        let mut back = vec![0u8; chunk.len()];
        tunnel.read_exact(&mut back).expect("read");
    };
    exchange(&mut tunnel);

    redis.stop();
    // The data path keeps working on what the plane holds.
    exchange(&mut tunnel);
    assert_eq!(fetch(&carol.socks, &origin.url("/"), &[]), b"hello");
    assert_eq!(fetch(&carol.http, &origin.url("/"), &[]), b"hello");
    let ctl = node.ctl(&["client", "list"]);
    assert!(!ctl.status.success(), "blipless-ctl reports the outage");
    assert!(
        String::from_utf8_lossy(&ctl.stderr).contains("127.0.0.1"),
        "{}",
        String::from_utf8_lossy(&ctl.stderr)
    );
    std::thread::sleep(Duration::from_secs(11)); // a usage flush fails meanwhile

    redis.restart();
    // The store reconnects without a restart: a new client reaches the plane.
    let bob = add(&node, "bob");
    let proxy = format!("socks5h://bob:{bob}@{}", node.socks);
    wait_until(
        Duration::from_secs(15),
        "bob to work after Redis came back",
        || {
            blipless_tests::curl::curl(&["--max-time", "5", "--proxy", &proxy, &origin.url("/")])
                .stdout
                == b"hello"
        },
    );
    exchange(&mut tunnel);
    drop(tunnel);
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(device
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    let usage = usage_of(&node, "alice");
    assert_eq!(usage["bytes_up"], 300_000, "{usage}");
    assert_eq!(usage["bytes_down"], 300_000, "{usage}");
    assert_eq!(usage["connections"], 1, "{usage}");
}

#[test]
fn http_usage_counts_every_byte_the_client_sent_after_it_authenticated() {
    let origin = Origin::start();
    let echo = echo_server();
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let client = node.add_client("alice");
    // Heads written by hand so their lengths are known.
    let auth = blipless_tests::base64(format!("alice:{}", client.secret).as_bytes());
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n",
        origin.url("/bytes/1000"),
        origin.address
    );
    let connect = format!(
        "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    let tunnel_bytes = b"sent with the CONNECT head, before its 200";

    // Sent before any device plane is there: the plane reads these heads
    // with the connections' first bytes, before it registers them.
    let mut early = raw::connect(node.http);
    early.write_all(request.as_bytes()).expect("request");
    let mut early_connect = raw::connect(node.http);
    early_connect
        .write_all(&[connect.as_bytes(), tunnel_bytes].concat())
        .expect("CONNECT and the tunnel's first bytes");
    let mut device = node.start_device();
    node.wait_ready();
    // Sent long after the connection was handed over: hyper reads it.
    let mut late = raw::connect(node.http);
    std::thread::sleep(Duration::from_millis(300));
    late.write_all(request.as_bytes()).expect("request");
    let mut late_connect = raw::connect(node.http);
    std::thread::sleep(Duration::from_millis(300));
    late_connect
        .write_all(&[connect.as_bytes(), tunnel_bytes].concat())
        .expect("CONNECT and the tunnel's first bytes");

    let mut down = 0;
    for mut stream in [early, late] {
        let mut response = Vec::new();
        stream.read_to_end(&mut response).expect("response");
        assert!(
            response.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&response)
        );
        down += response.len();
    }
    for mut stream in [early_connect, late_connect] {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.extend(raw::read_exact(&mut stream, 1));
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        let echoed = raw::read_exact(&mut stream, tunnel_bytes.len());
        assert_eq!(echoed, tunnel_bytes, "the echo");
        down += head.len() + echoed.len();
    }
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(device
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    let usage = usage_of(&node, "alice");
    assert_eq!(
        usage["bytes_up"],
        2 * (request.len() + connect.len() + tunnel_bytes.len()),
        "every head is billed once, and the tunnel's bytes sent with it once: {usage}"
    );
    assert_eq!(usage["bytes_down"], down, "{usage}");
}

/// Reads one HTTP response with a `Content-Length` body from `stream`,
/// leaving the connection open for the next: head and body, as sent.
fn read_one_response(stream: &mut std::net::TcpStream) -> Vec<u8> {
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        response.extend(raw::read_exact(stream, 1));
    }
    let head = String::from_utf8_lossy(&response).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("a Content-Length in {head}"));
    response.extend(raw::read_exact(stream, length));
    response
}

#[test]
fn requests_of_two_clients_on_one_http_connection_are_billed_each_to_its_own() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let (alice, bob) = (node.add_client("alice"), node.add_client("bob"));
    let mut device = node.start_device();
    node.wait_ready();
    let basic =
        |name: &str, secret: &str| blipless_tests::base64(format!("{name}:{secret}").as_bytes());
    let request = |size: usize, auth: String, close: &str| {
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {auth}\r\n{close}\r\n",
            origin.url(&format!("/bytes/{size}")),
            origin.address
        )
    };
    let first = request(1_000, basic("alice", &alice.secret), "");
    let second = request(50_000, basic("bob", &bob.secret), "Connection: close\r\n");
    let mut stream = raw::connect(node.http);
    stream.write_all(first.as_bytes()).expect("alice's request");
    let alice_down = read_one_response(&mut stream).len();
    assert!(alice_down > 1_000, "alice's answer");
    stream.write_all(second.as_bytes()).expect("bob's request");
    let mut bob_down = Vec::new();
    stream.read_to_end(&mut bob_down).expect("bob's answer");
    assert!(bob_down.starts_with(b"HTTP/1.1 200"), "bob's answer");
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(device
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    // Each answer is billed to the client that asked for it. A request's
    // head is read before it authenticates, so bob's goes to alice
    // (docs/DECISIONS.md, "Usage accounting").
    let (alice_usage, bob_usage) = (usage_of(&node, "alice"), usage_of(&node, "bob"));
    assert_eq!(alice_usage["bytes_down"], alice_down, "{alice_usage}");
    assert_eq!(bob_usage["bytes_down"], bob_down.len(), "{bob_usage}");
    assert_eq!(
        alice_usage["bytes_up"],
        first.len() + second.len(),
        "{alice_usage}"
    );
    assert_eq!(bob_usage["bytes_up"], 0, "{bob_usage}");
}
