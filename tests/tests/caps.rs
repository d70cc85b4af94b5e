//! Caps on one device plane (issue 14): customer connections at once
//! (`limits.connections`) and tunnels per client (`limits.tunnels_per_client`),
//! each refused with the protocol's own answer, counted in `/metrics`, and
//! lifted as soon as connections close.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{raw, wait_until};

fn metric(node: &Node, reason: &str) -> f64 {
    node.metric(&format!(
        "blipless_connections_refused_total{{reason=\"{reason}\"}}"
    ))
}

/// Writes to a refused connection a few times, a little apart: each write
/// must succeed (the plane reads and drops what a refused client still
/// sends, for a while, rather than resetting the connection).
fn still_written_to(stream: &mut TcpStream) {
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(50));
        let written = stream.write_all(&[b'y'; 4096]);
        assert!(
            written.is_ok(),
            "write {round} after the refusal: {written:?}"
        );
    }
}

#[test]
fn over_the_connection_cap_socks5_and_http_get_their_refusals() {
    let origin = Origin::start();
    let mut node = Node::new("[limits]\nconnections = 4\n");
    let (_ingress, _device, alice) = node.start();
    // Four connections the plane holds (greeted, logged in, idle).
    let mut held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = raw::connect(node.socks);
            assert_eq!(raw::socks5_login(&mut stream, "alice", &alice.secret), 0);
            stream
        })
        .collect();
    // The fifth SOCKS5 customer: "no acceptable method", then a close.
    let mut fifth = raw::connect(node.socks);
    fifth.write_all(&[5, 1, 2]).expect("greeting");
    assert_eq!(raw::read_exact(&mut fifth, 2), [5, 0xFF]);
    assert!(raw::closed(&mut fifth));
    // One that sends more than its greeting in its first write (a client
    // that pipelines), and goes on writing: the refusal and a clean close,
    // and its writes are not answered with a reset for the bytes the plane
    // did not read (which would lose the refusal on Windows, and make a
    // client still sending report "connection reset" instead).
    let mut pipelining = raw::connect(node.socks);
    let mut greeting_and_more = vec![5, 1, 2];
    greeting_and_more.extend_from_slice(&[0u8; 4096]);
    pipelining.write_all(&greeting_and_more).expect("greeting");
    assert_eq!(raw::read_exact(&mut pipelining, 2), [5, 0xFF]);
    let mut rest = Vec::new();
    let end = pipelining.read_to_end(&mut rest);
    assert!(end.is_ok(), "the refusal ended in {end:?}");
    still_written_to(&mut pipelining);
    // An HTTP customer sending a body the plane does not read: the 503, a
    // clean close, and no reset for the body's bytes.
    let mut posting = raw::connect(node.http);
    write!(
        posting,
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n",
        origin.url("/")
    )
    .expect("request");
    posting.write_all(&[b'x'; 8192]).expect("the body's start");
    let mut answer = Vec::new();
    let end = posting.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(end.is_ok(), "the refusal ended in {end:?}");
    still_written_to(&mut posting);
    // An HTTP customer: 503 with Retry-After.
    let mut http = raw::connect(node.http);
    write!(
        http,
        "GET {} HTTP/1.1\r\nHost: x\r\n\r\n",
        origin.url("/bytes/10")
    )
    .expect("request");
    let mut answer = String::new();
    http.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    wait_until(Duration::from_secs(10), "the refusals in /metrics", || {
        metric(&node, "connection_cap") >= 4.0
    });
    // One closes: a new customer is served again, once the plane has seen
    // the close (until then a try is refused with 0xFF, which is fine).
    held.pop();
    wait_until(Duration::from_secs(10), "a free place", || {
        let mut stream = raw::connect(node.socks);
        raw::try_socks5_login(&mut stream, "alice", &alice.secret) == Some(0)
    });
}

#[test]
fn over_the_tunnel_cap_a_client_gets_reply_2_and_others_are_unaffected() {
    let origin = Origin::start();
    let mut node = Node::new("[limits]\ntunnels_per_client = 2\n");
    let (_ingress, _device, alice) = node.start();
    let bob = node.add_client("bob");
    let tunnel = |name: &str, secret: &str| {
        let mut stream = raw::connect(node.socks);
        assert_eq!(raw::socks5_login(&mut stream, name, secret), 0);
        let reply = raw::socks5_connect_v4(&mut stream, origin.address);
        (stream, reply)
    };
    let first = tunnel("alice", &alice.secret);
    let second = tunnel("alice", &alice.secret);
    assert_eq!((first.1, second.1), (0, 0));
    let (_third, reply) = tunnel("alice", &alice.secret);
    assert_eq!(reply, 2, "SOCKS5 reply 2: not allowed by the ruleset");
    let (_bobs, reply) = tunnel("bob", &bob.secret);
    assert_eq!(reply, 0, "another client is not capped by alice's tunnels");
    // HTTP CONNECT counts against the same cap: 429.
    let mut http = raw::connect(node.http);
    let auth = blipless_tests::base64(format!("alice:{}", alice.secret).as_bytes());
    write!(
        http,
        "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
        origin.address
    )
    .expect("CONNECT");
    let mut status = [0u8; 12];
    http.read_exact(&mut status).expect("status line");
    assert_eq!(
        &status,
        b"HTTP/1.1 429",
        "{}",
        String::from_utf8_lossy(&status)
    );
    wait_until(Duration::from_secs(10), "the refusal in /metrics", || {
        metric(&node, "tunnel_cap") >= 2.0
    });
    drop(first);
    wait_until(Duration::from_secs(10), "alice's place to free up", || {
        tunnel("alice", &alice.secret).1 == 0
    });
}
