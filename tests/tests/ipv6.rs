//! IPv6 end to end on the proxy listeners (issue 12 §3): a SOCKS5 listener
//! on `[::1]` and a dual-stack HTTP listener on `[::]`, used by curl over
//! IPv6 (`-6`) and over IPv4, to an origin on `[::1]`: SOCKS5 with an IPv6
//! destination (ATYP 4), HTTP absolute-form and CONNECT to `[::1]:port`,
//! byte-exact, before and after a device-plane deploy and an ingress
//! handoff (the IPv6 listening sockets pass to the successor).

use std::net::SocketAddr;

use blipless_tests::curl::fetch;
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{free_port, pattern, sha256};

/// Every way through the node: SOCKS5 over IPv6 to an IPv6 destination,
/// HTTP over IPv6 and over IPv4 (the same dual-stack listener), each as
/// absolute-form and as CONNECT.
fn every_way(socks: &str, http_v6: &str, http_v4: &str, origin: &Origin, round: &str) {
    let size = 200_000 + round.len();
    let url = origin.url(&format!("/bytes/{size}"));
    assert!(url.starts_with("http://[::1]:"), "{url}");
    let expected = sha256(&pattern(size));
    for (proxy, extra) in [
        (socks, &["-6"][..]),
        (http_v6, &["-6"][..]),
        (http_v6, &["-6", "--proxytunnel"][..]),
        (http_v4, &["-4"][..]),
        (http_v4, &["-4", "--proxytunnel"][..]),
    ] {
        let body = fetch(proxy, &url, extra);
        assert_eq!(body.len(), size, "{round}: via {proxy} {extra:?}");
        assert_eq!(sha256(&body), expected, "{round}: via {proxy} {extra:?}");
    }
}

#[test]
fn curl_over_ipv6_and_dual_stack_listeners_across_a_deploy_and_a_handoff() {
    let origin = Origin::start_on(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)))
        .expect("an origin on [::1] (IPv6 loopback)");
    let mut node = Node::new("");
    let (socks_port, http_port) = (free_port(), free_port());
    let config = std::fs::read_to_string(&node.config).expect("config");
    let config = config
        .replacen(
            &format!("socks = \"{}\"", node.socks),
            &format!("socks = \"[::1]:{socks_port}\""),
            1,
        )
        .replacen(
            &format!("http = \"{}\"", node.http),
            &format!("http = \"[::]:{http_port}\""),
            1,
        )
        .replacen(
            "allow = [\"127.0.0.1/32\"]",
            "allow = [\"127.0.0.1/32\", \"::1/128\"]",
            1,
        );
    assert!(
        config.contains("[::]:") && config.contains("::1/128"),
        "{config}"
    );
    std::fs::write(&node.config, config).expect("config");
    let (mut ingress, mut device, client) = node.start();
    // client add prints the addresses as listened on: IPv6 in brackets.
    assert!(
        client.socks.ends_with(&format!("@[::1]:{socks_port}")),
        "{}",
        client.socks
    );
    let credentials = format!("{}:{}", client.name, client.secret);
    let socks = format!("socks5://{credentials}@[::1]:{socks_port}");
    let http_v6 = format!("http://{credentials}@[::1]:{http_port}");
    let http_v4 = format!("http://{credentials}@127.0.0.1:{http_port}");
    every_way(&socks, &http_v6, &http_v4, &origin, "at start");

    let (next, took) = node.deploy(&mut device);
    eprintln!("deploy took {took:?}");
    device = next;
    every_way(&socks, &http_v6, &http_v4, &origin, "after a deploy");

    let (successor, took) = node.hand_off(&mut ingress);
    eprintln!("the old ingress left after {took:?}");
    ingress = successor;
    every_way(&socks, &http_v6, &http_v4, &origin, "after a handoff");
    drop((ingress, device));
}
