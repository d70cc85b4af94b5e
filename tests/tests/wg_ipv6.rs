//! IPv6 inside the WireGuard tunnel (issue 12 §3, `wireguard.pool6`), as
//! root in namespaces the test creates: a wireguard-go client configured
//! from the config `blipless-ctl client add --wg` prints (an IPv4 and an
//! IPv6 address, `AllowedIPs = 0.0.0.0/0, ::/0`) downloads over IPv6 from
//! an origin in the internet namespace, byte-exact, through the node's TUN
//! device and IPv6 masquerade, resolves a name at the node's IPv6 tunnel
//! address (the DNS gateway, UDP and TCP, through dnsmasq upstream), and
//! pings the origin over IPv6 across a device-plane deploy with no reply lost.
//! The node runs with TUN offload (`egress.tun.offload = true`), so IPv6 TCP
//! crosses the TUN device as super-packets, cut and joined by the device
//! plane, both ways (an upload too); `tests/tests/wg_offload.rs` does IPv4.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use blipless_tests::dns::dnsmasq_args;
use blipless_tests::netns::{start_origin, Background};
use blipless_tests::node::Node;
use blipless_tests::topology::{add_wg_client, tail, Topology, POOL};
use blipless_tests::wireguard::WireguardGoPeer;
use blipless_tests::{missing_replies, packet_counter, pattern, ping_counts, sha256};

/// The subnet number of this test's namespaces (unique among the tests).
const SUBNET: u8 = 91;
/// The IPv6 client pool.
const POOL6: &str = "fd64:91::/64";
/// The node's IPv6 tunnel address: the twin of 10.64.0.1, the DNS gateway.
const GATEWAY6: &str = "fd64:91::1";

/// dnsmasq in the internet namespace on its IPv4 address, answering
/// `shop.example`: the gateway's upstream.
fn dnsmasq(net: &Topology) -> Background {
    let upstream = net.origin.ip().to_string();
    let mut command = net.internet.command("dnsmasq");
    command.args(dnsmasq_args(&upstream, 53, &[]));
    Background::spawn(command, None, Duration::from_secs(5)).expect("dnsmasq")
}

/// `dig @GATEWAY6 shop.example` in the customer namespace, through the
/// tunnel, with `extra` options; dig's whole output.
fn dig6(net: &Topology, extra: &[&str]) -> String {
    let output = net
        .customer
        .command("dig")
        .args([
            &format!("@{GATEWAY6}"),
            "shop.example",
            "+time=2",
            "+tries=3",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("dig");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// IPv6 on the node–internet link (fd00:91:2::1 and ::2, no duplicate
/// address detection) and an origin on the internet side; returns the
/// origin's process and address.
fn internet_over_ipv6(net: &Topology) -> (Background, SocketAddr) {
    // The veth pair is veNa (node side, the uplink) and veNb.
    let internet_side = format!("{}b", net.uplink.trim_end_matches('a'));
    net.node_ns
        .ip(&[
            "addr",
            "add",
            "fd00:91:2::1/64",
            "dev",
            &net.uplink,
            "nodad",
        ])
        .expect("node's IPv6 address");
    net.internet
        .ip(&[
            "addr",
            "add",
            "fd00:91:2::2/64",
            "dev",
            &internet_side,
            "nodad",
        ])
        .expect("internet's IPv6 address");
    let origin: SocketAddr = "[fd00:91:2::2]:8000".parse().expect("address");
    let process = start_origin(&net.internet, origin).expect("IPv6 origin");
    (process, origin)
}

fn fetch6(net: &Topology, origin: SocketAddr, size: usize) -> Result<Vec<u8>, String> {
    curl6(net, &format!("http://{origin}/bytes/{size}"), &[])
}

/// curl over IPv6 in the customer namespace with `extra` options; the body.
fn curl6(net: &Topology, url: &str, extra: &[&str]) -> Result<Vec<u8>, String> {
    let output = net
        .customer
        .command("curl")
        .args(["--silent", "--show-error", "-6", "--max-time", "60"])
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(output.stdout)
}

#[test]
fn a_wireguard_client_uses_ipv6_inside_the_tunnel_across_a_deploy() {
    let net = Topology::new(SUBNET);
    let (origin_process, origin) = internet_over_ipv6(&net);
    let mut node = Node::in_netns(
        net.node_ns.name(),
        // Both internet subnets are private ranges: allowed for the test.
        &format!("allow = [\"{}\", \"fd00:91:2::/64\"]", net.internet_net),
        &format!(
            "[egress.tun]\nname = \"blip0\"\nout_interface = \"{}\"\nmanage = true\noffload = true\n\n\
             [wireguard]\nendpoint = \"{}\"\npool = \"{POOL}\"\npool6 = \"{POOL6}\"\n\
             dns_upstreams = [\"{}:53\"]\n",
            net.uplink,
            net.endpoint(),
            net.origin.ip(),
        ),
    );
    let resolver = dnsmasq(&net);
    let ingress = node.start_ingress();
    let config = add_wg_client(&node, "alice");
    assert!(
        config.contains("\nAddress = 10.64.0.2/32, fd64:91::2/128\n"),
        "both addresses, the IPv6 one the twin of the IPv4 one:\n{config}"
    );
    assert!(
        config.contains("\nAllowedIPs = 0.0.0.0/0, ::/0\n"),
        "{config}"
    );
    assert!(
        config.contains(&format!("\nDNS = 10.64.0.1, {GATEWAY6}\n")),
        "the gateway at both tunnel addresses:\n{config}"
    );
    let mut device = node.start_device();
    node.wait_ready();
    let peer = WireguardGoPeer::start(
        &net.customer,
        &config,
        &[
            net.internet_net.as_str(),
            "fd00:91:2::/64",
            &format!("{GATEWAY6}/128"),
        ],
    )
    .expect("wireguard-go client");
    let diagnostics = |device: &blipless_tests::node::Daemon| {
        format!(
            "--- ingress:\n{}\n--- device:\n{}\n--- wireguard-go:\n{}\n--- origin:\n{}",
            tail(&ingress.log_text()),
            tail(&device.log_text()),
            tail(&peer.log()),
            tail(&origin_process.output()),
        )
    };

    let size = 3_000_000;
    let body =
        fetch6(&net, origin, size).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&device)));
    assert_eq!(body.len(), size);
    assert_eq!(sha256(&body), sha256(&pattern(size)), "bytes differ");
    assert!(
        device.log_text().contains("offload=true"),
        "the TUN queues should carry virtio-net headers\n{}",
        diagnostics(&device)
    );
    // Upload over IPv6: the origin echoes the body back as it arrives.
    let upload = node.path().join("upload6.bin");
    std::fs::write(&upload, pattern(size)).expect("writing the upload");
    let path = upload.to_string_lossy().into_owned();
    let echoed = curl6(
        &net,
        &format!("http://{origin}/echo"),
        &["-T", &path, "-H", "Expect:"],
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&device)));
    assert_eq!(
        sha256(&echoed),
        sha256(&pattern(size)),
        "upload bytes differ"
    );
    // The internet namespace has no route to the client pool: the answer
    // came back only because the node masqueraded the client's address.
    let check_dns = |round: &str, device: &blipless_tests::node::Daemon| {
        for extra in [&[][..], &["+tcp"][..]] {
            let answer = dig6(&net, extra);
            assert!(
                answer.contains("status: NOERROR")
                    && answer.contains("192.0.2.77")
                    && answer.contains(&format!("SERVER: {GATEWAY6}#53")),
                "{round}: shop.example at the IPv6 gateway {extra:?}:\n{answer}\n--- dnsmasq:\n{}\n{}",
                resolver.output(),
                diagnostics(device)
            );
        }
    };
    check_dns("before the deploy", &device);
    // The node's own IPv6 tunnel address is a private (ULA) address the
    // egress policy denies: without the policy the node's kernel would
    // answer an echo to it. Only DNS is taken there.
    let ping_gateway = net
        .customer
        .command("ping")
        .args([
            "-6", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", GATEWAY6,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("ping");
    assert_eq!(
        ping_counts(&ping_gateway).1,
        0,
        "{GATEWAY6} is denied by default:\n{}",
        String::from_utf8_lossy(&ping_gateway.stdout)
    );
    // Pings over IPv6 through a deploy: none lost.
    let count = 120;
    let ping = net
        .customer
        .command("ping")
        .args([
            "-6",
            "-n",
            "-D",
            "-i",
            "0.05",
            "-c",
            &count.to_string(),
            "-W",
            "2",
        ])
        .arg("fd00:91:2::2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ping");
    std::thread::sleep(Duration::from_millis(1500));
    let (next, took) = node.deploy(&mut device);
    let old_log = device.log_text();
    device = next;
    // IPv6 super-packets were really cut (the download) and joined (the upload).
    for counter in ["tun_super_reads", "tun_joined_writes"] {
        let value = packet_counter(&old_log, counter);
        assert!(
            value.is_some_and(|n| n > 0),
            "{counter}: {value:?}\n{old_log}"
        );
    }
    eprintln!("deploy took {took:?}");
    let output = ping.wait_with_output().expect("ping");
    let (sent, received) = ping_counts(&output);
    assert_eq!(sent, count, "{}", String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        received,
        sent,
        "IPv6 pings lost across the deploy: {:?}\n{}",
        missing_replies(&output, sent),
        diagnostics(&device)
    );
    let body =
        fetch6(&net, origin, size).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&device)));
    assert_eq!(sha256(&body), sha256(&pattern(size)), "after the deploy");
    check_dns("after the deploy", &device);
    // IPv4 still works beside it.
    let body = net
        .try_fetch("/bytes/1000", &[])
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&device)));
    assert_eq!(body, pattern(1000));
    drop((peer, device, ingress));
}
