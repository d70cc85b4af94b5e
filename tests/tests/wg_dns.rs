//! DNS for WireGuard clients (docs/WIREGUARD.md, "DNS"): the config
//! `client add --wg` prints names the node's tunnel address in `DNS =`, and a
//! query a real client (`dig`, in the customer namespace, through
//! wireguard-go) sends there is answered by the device plane, which resolves
//! through a real DNS server (dnsmasq, in the internet namespace) named in
//! `wireguard.dns_upstreams` — before and after a device-plane deploy.
//! A name the server does not know comes back NXDOMAIN, not a timeout; the
//! same query over TCP is answered too. The node's own /etc/hosts is not
//! served.
//! As root, in namespaces the test creates and removes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blipless_tests::dns::dnsmasq_args;
use blipless_tests::netns::Background;
use blipless_tests::topology::WgWorld;

/// The subnet number of this test's namespaces (10.88.1.0/24, 10.88.2.0/24).
const SUBNET: u8 = 88;
/// The node's tunnel address: the first host of the harness's pool.
const GATEWAY: &str = "10.64.0.1";

/// A name only the node's /etc/hosts knows (dnsmasq answers REFUSED).
const INTERNAL: &str = "internal.blipless.test";

/// `/etc/netns/NAME/hosts`, which `ip netns exec NAME` binds over
/// `/etc/hosts` for what it starts; removed on drop, with `/etc/netns` when
/// this made it.
struct NodeHosts {
    folder: PathBuf,
    made_parent: bool,
}

impl NodeHosts {
    fn write(namespace: &str, hosts: &str) -> Self {
        let parent = Path::new("/etc/netns");
        let made_parent = !parent.exists();
        let folder = parent.join(namespace);
        std::fs::create_dir_all(&folder).expect("creating /etc/netns/NAME");
        std::fs::write(folder.join("hosts"), hosts).expect("writing its hosts");
        Self {
            folder,
            made_parent,
        }
    }
}

impl Drop for NodeHosts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.folder);
        if self.made_parent {
            let _ = std::fs::remove_dir(Path::new("/etc/netns"));
        }
    }
}

/// `dig @GATEWAY NAME` (with `extra` options) in the customer namespace:
/// dig's whole answer.
fn dig(world: &WgWorld, name: &str, extra: &[&str]) -> String {
    let server = format!("@{GATEWAY}");
    let mut args = vec![server.as_str(), name, "A", "+time=3", "+tries=2"];
    args.extend_from_slice(extra);
    world
        .net
        .customer
        .exec("dig", &args)
        .unwrap_or_else(|error| panic!("dig {name}: {error}\n{}", world.diagnostics()))
}

/// Waits until `/metrics` counts at least `queries` answered by the gateway.
fn answered_at_least(world: &WgWorld, queries: f64) {
    blipless_tests::wait_until(Duration::from_secs(10), "the answers in /metrics", || {
        world
            .node
            .metric("blipless_wg_dns_queries_total{result=\"answered\"}")
            >= queries
    });
}

#[test]
fn a_wireguard_client_resolves_through_the_gateway_across_a_deploy() {
    let upstream = format!("10.{SUBNET}.2.2");
    let mut world = WgWorld::with(
        SUBNET,
        &format!("dns_upstreams = [\"{upstream}:53\"]\n"),
        &[&format!("{GATEWAY}/32")],
    );
    assert!(
        world
            .client_config
            .contains(&format!("\nDNS = {GATEWAY}\n")),
        "the client's config names the gateway:\n{}",
        world.client_config
    );
    let mut command = world.net.internet.command("dnsmasq");
    command.args(dnsmasq_args(&upstream, 53, &["--address=/gone.example/"]));
    let dnsmasq = Background::spawn(command, None, Duration::from_secs(5)).expect("dnsmasq");
    // dnsmasq serves once it answers in its own namespace.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = world.net.internet.exec(
            "dig",
            &[
                &format!("@{upstream}"),
                "shop.example",
                "+short",
                "+time=1",
                "+tries=1",
            ],
        );
        if answer.is_ok_and(|a| a.contains("192.0.2.77")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dnsmasq did not answer: {}",
            dnsmasq.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    world
        .peer
        .wait_handshake(Duration::from_secs(20))
        .unwrap_or_else(|error| panic!("handshake: {error}\n{}", world.diagnostics()));

    for round in ["before the deploy", "after the deploy"] {
        let answer = dig(&world, "shop.example", &[]);
        assert!(
            answer.contains("status: NOERROR") && answer.contains("192.0.2.77"),
            "{round}: shop.example through the gateway:\n{answer}\n--- dnsmasq:\n{}\n{}",
            dnsmasq.output(),
            world.diagnostics()
        );
        assert!(
            answer.contains(&format!("SERVER: {GATEWAY}#53")),
            "{round}: answered by the gateway:\n{answer}"
        );
        let missing = dig(&world, "www.gone.example", &[]);
        assert!(
            missing.contains("status: NXDOMAIN"),
            "{round}: an unknown name is NXDOMAIN:\n{missing}"
        );
        // The same over TCP: redirected by the node's nftables table to the
        // device plane's listener.
        let over_tcp = dig(&world, "shop.example", &["+tcp"]);
        assert!(
            over_tcp.contains("status: NOERROR")
                && over_tcp.contains("192.0.2.77")
                && over_tcp.contains("(TCP)"),
            "{round}: shop.example over TCP:\n{over_tcp}\n{}",
            world.diagnostics()
        );
        if round == "before the deploy" {
            // The ingress counts what the plane answered, from its reports.
            answered_at_least(&world, 3.0);
            let (new, _) = world.node.deploy(&mut world.device);
            world.device = new;
        }
    }
    // Three more from the new plane.
    answered_at_least(&world, 6.0);
    // The node's own /etc/hosts is not served: `ip netns exec` shows the
    // node's processes /etc/netns/NAME/hosts as /etc/hosts, so a plane
    // started now sees a node-internal name there.
    let _hosts = NodeHosts::write(
        world.net.node_ns.name(),
        &format!("192.0.2.55 {INTERNAL}\n"),
    );
    let (new, _) = world.node.deploy(&mut world.device);
    world.device = new;
    let internal = dig(&world, INTERNAL, &[]);
    assert!(
        internal.contains(&format!("SERVER: {GATEWAY}#53")) && !internal.contains("192.0.2.55"),
        "the node's /etc/hosts answered a customer:\n{internal}"
    );
    // Every query dig sent reached dnsmasq from the node (the device plane's
    // resolver), none from the client's own address.
    let log = dnsmasq.output();
    assert!(
        log.contains(&format!("from 10.{SUBNET}.2.1")),
        "the node queried dnsmasq:\n{log}"
    );
    assert!(!log.contains("from 10.64.0.2"), "{log}");
}
