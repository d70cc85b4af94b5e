//! `wg show` against the ingress, as root in network namespaces (see
//! `blipless_tests::topology`): Debian's own `wg` reads the read-only UAPI
//! socket and lists the peer with its endpoint, handshake, transfer and
//! allowed IPs; `wg set` is refused and changes nothing; after an ingress
//! handoff `wg` reads the successor.
//!
//! The node's socket is in its test folder (the harness sets
//! `wireguard.uapi_dir`); `wg` looks only in /run/wireguard, so it runs in a
//! mount namespace of its own whose /run is an empty tmpfs holding a link to
//! that socket. The host's /run is never touched.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use blipless_tests::topology::WgWorld;
use blipless_tests::wireguard::{parse_dump, Dump};

/// `wg <args>` with `/run/wireguard/blipless.sock` linked to `socket`, in a
/// private mount namespace.
fn wg(socket: &Path, args: &[&str]) -> Output {
    let script = format!(
        "mount -t tmpfs blipless-wg-show /run && mkdir /run/wireguard && \
         ln -s '{}' /run/wireguard/blipless.sock && exec wg \"$@\"",
        socket.display()
    );
    std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "wg",
        ])
        .args(args)
        .output()
        .expect("running unshare and wg")
}

fn dump(socket: &Path) -> Dump {
    let output = wg(socket, &["show", "blipless", "dump"]);
    assert!(
        output.status.success(),
        "wg show dump failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_dump(&String::from_utf8_lossy(&output.stdout)).expect("a wg dump")
}

#[test]
fn wg_show_lists_the_peer_and_wg_set_is_refused_across_a_handoff() {
    let mut world = WgWorld::new(86);
    let size = 2_000_000;
    assert_eq!(world.fetch(&format!("/bytes/{size}"), &[]).len(), size);
    let socket = world.node.path().join("wg").join("blipless.sock");
    // The client's own view: its key, and the node's.
    let client = world.peer.status().expect("the client's wg dump");
    let node_key = client.peers[0].public_key.clone();
    let client_address = world.peer.addresses()[0]
        .split('/')
        .next()
        .expect("an address")
        .to_owned();

    let before = dump(&socket);
    assert_eq!(before.public_key, node_key, "the node's public key");
    assert_eq!(before.listen_port, 51820);
    assert_eq!(before.peers.len(), 1, "{before:?}");
    let peer = &before.peers[0];
    assert_eq!(peer.public_key, client.public_key, "the client's key");
    assert_eq!(peer.allowed_ips, vec![format!("{client_address}/32")]);
    let endpoint = peer.endpoint.as_deref().expect("an endpoint");
    assert!(
        endpoint.starts_with(&format!("10.{}.1.2:", world.net.subnet)),
        "endpoint {endpoint}"
    );
    let handshake = peer.latest_handshake.expect("a handshake");
    let age = SystemTime::now()
        .duration_since(handshake)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(120), "handshake {age:?} ago");
    // The download came to the client through this peer's session.
    assert!(peer.tx_bytes > size as u64, "{peer:?}");
    assert!(peer.rx_bytes > 0, "{peer:?}");

    // The human form works too.
    let shown = wg(&socket, &["show", "blipless"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{text}");
    assert!(text.contains("interface: blipless"), "{text}");
    assert!(
        text.contains(&format!("peer: {}", peer.public_key)),
        "{text}"
    );
    assert!(text.contains("latest handshake:"), "{text}");
    assert!(text.contains("private key: (hidden)"), "{text}");

    // Peers come from the store: `wg set` changes nothing.
    let set = wg(
        &socket,
        &["set", "blipless", "peer", &peer.public_key, "remove"],
    );
    assert!(!set.status.success(), "wg set must be refused");
    assert!(
        String::from_utf8_lossy(&set.stderr).contains("Operation not permitted"),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert_eq!(dump(&socket).peers.len(), 1, "the peer is still there");

    // After a handoff the successor answers, and the old ingress's exit left
    // the successor's socket in place.
    let (next, _) = world.node.hand_off(&mut world.ingress);
    world.ingress = next;
    assert_eq!(world.fetch("/bytes/1000", &[]).len(), 1000);
    let after = dump(&socket);
    assert_eq!(after.public_key, node_key);
    assert_eq!(after.peers.len(), 1, "{after:?}");
    assert_eq!(after.peers[0].public_key, peer.public_key);
    assert!(after.peers[0].endpoint.is_some(), "{after:?}");
}
