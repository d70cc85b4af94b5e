//! The handoff bench's world: the namespaces, a blipless node with a /16
//! WireGuard pool, the wireguard-go client and the credentials of the
//! boringtun peers (from the wg-quick texts `client add --wg` prints), the
//! peers' sessions, the handoff itself and what the successor's metrics and
//! log say about it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use base64::Engine as _;
use blipless_tests::node::{Daemon, Node};
use blipless_tests::topology::{add_wg_client, tail, Topology};
use blipless_tests::wg_peer::{in_netns, TestPeer};
use blipless_tests::wireguard::WireguardGoPeer;

use super::analysis::Handoff;
use super::{timed_lines, Clock, Knobs, POOL, SUBNET};
use crate::logs::{debug_duration, field, first_after};
use crate::metrics;

/// A client's WireGuard settings, from the wg-quick text `client add --wg`
/// prints.
#[derive(Debug, Clone)]
pub(super) struct Credentials {
    private_key: [u8; 32],
    server_public: [u8; 32],
    address: Ipv4Addr,
    endpoint: SocketAddr,
}

fn key(text: &str) -> Result<[u8; 32], String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("key {text:?}: {e}"))?;
    bytes
        .try_into()
        .map_err(|_| format!("key {text:?}: not 32 bytes"))
}

fn parse_credentials(config: &str) -> Result<Credentials, String> {
    let mut private_key = None;
    let mut server_public = None;
    let mut address = None;
    let mut endpoint = None;
    for line in config.lines() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        // Split at the first '=': base64 keys end in '=' padding.
        let value = value.trim();
        match name.trim() {
            "PrivateKey" => private_key = Some(key(value)?),
            "PublicKey" => server_public = Some(key(value)?),
            "Address" => {
                let host = value.split('/').next().unwrap_or(value);
                address = Some(
                    host.parse::<Ipv4Addr>()
                        .map_err(|e| format!("Address {value:?}: {e}"))?,
                );
            }
            "Endpoint" => {
                endpoint = Some(
                    value
                        .parse::<SocketAddr>()
                        .map_err(|e| format!("Endpoint {value:?}: {e}"))?,
                )
            }
            _ => {}
        }
    }
    match (private_key, server_public, address, endpoint) {
        (Some(private_key), Some(server_public), Some(address), Some(endpoint)) => {
            Ok(Credentials {
                private_key,
                server_public,
                address,
                endpoint,
            })
        }
        _ => Err(format!("an incomplete wg-quick config: {config}")),
    }
}

/// One customer namespace with N WireGuard peers, one blipless node, one
/// internet; the fields drop in order (clients and daemons before the
/// namespaces).
#[derive(Debug)]
pub(super) struct World {
    /// The customer's wireguard-go.
    pub alice: WireguardGoPeer,
    /// The device plane.
    pub device: Daemon,
    /// The serving ingress (the successor after each handoff).
    pub ingress: Daemon,
    /// The node's files and addresses.
    pub node: Node,
    /// The namespaces.
    pub net: Topology,
}

impl World {
    /// The world with `peers` WireGuard clients: alice (wireguard-go, up)
    /// and the credentials of `peers - 1` more, every one known to the
    /// ingress.
    pub fn build(peers: usize, knobs: &Knobs) -> Result<(World, Vec<Credentials>), String> {
        let net = Topology::new(SUBNET);
        let limit = knobs
            .handshake_limit
            .map(|n| format!("handshake_limit = {n}\n"))
            .unwrap_or_default();
        let mut node = Node::in_netns(
            net.node_ns.name(),
            &format!("allow = [\"{}\"]", net.internet_net),
            &format!(
                "[egress.tun]\nname = \"blip0\"\nout_interface = \"{}\"\nmanage = true\n\n\
                 [wireguard]\nendpoint = \"{}\"\npool = \"{POOL}\"\n{limit}",
                net.uplink,
                net.endpoint()
            ),
        );
        let ingress = node.start_ingress();
        let alice_config = add_wg_client(&node, "alice");
        let device = node.start_device();
        node.wait_ready();
        blipless_tests::netns::run_with_input(
            net.customer.command("nft").args(["-f", "-"]),
            COUNTERS,
        )
        .map_err(|e| format!("nftables counters in the customer namespace: {e}"))?;
        let alice =
            WireguardGoPeer::start(&net.customer, &alice_config, &[net.internet_net.as_str()])
                .map_err(|e| format!("the wireguard-go client: {e}"))?;
        let started = Instant::now();
        let names: Vec<String> = (1..peers).map(|i| format!("peer{i:04}")).collect();
        // Two `blipless-ctl` at a time: the embedded store takes several writers.
        let node_ref = &node;
        let configs: Vec<String> = std::thread::scope(|scope| {
            let halves: Vec<_> = names
                .chunks(names.len().div_ceil(2).max(1))
                .map(|chunk| {
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|name| add_wg_client(node_ref, name))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            halves
                .into_iter()
                .flat_map(|half| half.join().unwrap_or_default())
                .collect()
        });
        if configs.len() != names.len() {
            return Err(format!(
                "added {} of {} clients",
                configs.len(),
                names.len()
            ));
        }
        let credentials = configs
            .iter()
            .map(|config| parse_credentials(config))
            .collect::<Result<Vec<_>, _>>()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let known = node.metric("blipless_wg_peers");
            if known == peers as f64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the ingress knows {known} WireGuard peers, not {peers}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if peers > 1 {
            eprintln!(
                "  {} clients added, all known to the ingress, in {:.1?}",
                peers - 1,
                started.elapsed()
            );
        }
        Ok((
            World {
                alice,
                device,
                ingress,
                node,
                net,
            },
            credentials,
        ))
    }

    pub fn origin_ip(&self) -> Result<Ipv4Addr, String> {
        match self.net.origin.ip() {
            std::net::IpAddr::V4(ip) => Ok(ip),
            other => Err(format!("an IPv6 origin {other}")),
        }
    }

    /// The last lines of the current ingress's and the device plane's logs.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- ingress log:\n{}\n--- device log:\n{}\n--- wireguard-go:\n{}",
            tail(&self.ingress.log_text()),
            tail(&self.device.log_text()),
            tail(&self.alice.log())
        )
    }

    /// Warning and error lines in every daemon log of the node.
    pub fn daemon_warnings(&self) -> Vec<String> {
        crate::logs::warning_lines(self.node.path())
    }
}

/// Makes the boringtun peers in the customer namespace (their sockets live
/// there) and a session for each.
pub(super) fn make_peers(
    customer: &str,
    credentials: Vec<Credentials>,
) -> Result<Vec<TestPeer>, String> {
    let started = Instant::now();
    let peers = in_netns(customer, move || {
        credentials
            .iter()
            .enumerate()
            .map(|(i, c)| {
                TestPeer::new(
                    c.private_key,
                    c.server_public,
                    c.address,
                    c.endpoint,
                    i as u32 + 1,
                )
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .map_err(|e| format!("making the boringtun peers: {e}"))?;
    let mut peers = peers;
    for peer in &mut peers {
        // Above `wireguard.handshake_limit` the ingress asks for cookies:
        // `handshake` answers them (a second round trip). Then every peer
        // here, all at one source address, shares that source's 20
        // initiations a second while the node is under load
        // (docs/WIREGUARD.md, "Load"): at 1,000 peers this setup took 9.9 s
        // (0.9 s before that limit); the handoffs are measured after it, and
        // measured the same (docs/DECISIONS.md). Each peer on an address of
        // its own made the setup 1 s again, but the successor served about
        // 30 ms later, so the figures would not compare with earlier runs.
        peer.handshake(Duration::from_secs(20))
            .map_err(|e| format!("handshake of {peer:?}: {e}"))?;
    }
    if !peers.is_empty() {
        eprintln!(
            "  {} boringtun sessions made in {:.1?}",
            peers.len(),
            started.elapsed()
        );
    }
    Ok(peers)
}

/// Spawns a successor beside `world.ingress`, waits for the old one to exit
/// (status 0); the timings, the successor now `world.ingress`.
pub(super) fn hand_off(
    world: &mut World,
    clock: Clock,
    peers: usize,
    run: usize,
) -> Result<Handoff, String> {
    let initiations_at_spawn = world.initiations();
    let spawned_at = clock.now();
    let mut successor = world.node.spawn_ingress();
    let deadline = Instant::now() + Duration::from_secs(150);
    let status = loop {
        if let Ok(Some(status)) = world.ingress.child.try_wait() {
            break status;
        }
        if let Ok(Some(status)) = successor.child.try_wait() {
            return Err(format!(
                "the successor ingress exited with {status}: {}",
                tail(&successor.log_text())
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the old ingress did not exit within 150 s: {}",
                tail(&world.ingress.log_text())
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let exited_at = clock.now();
    if !status.success() {
        return Err(format!(
            "the old ingress exited with {status}: {}",
            tail(&world.ingress.log_text())
        ));
    }
    let old_log = timed_lines(&world.ingress.log_text(), clock);
    let new_log = timed_lines(&successor.log_text(), clock);
    let since = |at: f64| at - spawned_at;
    let mut handoff = Handoff {
        peers,
        run,
        exit: exited_at - spawned_at,
        initiations_at_spawn,
        spawned_at,
        exited_at,
        ..Handoff::default()
    };
    handoff.serving =
        first_after(&new_log, spawned_at, "ingress serving").map(|(at, _)| since(*at));
    handoff.device_moved =
        first_after(&new_log, spawned_at, "device plane ready").map(|(at, _)| since(*at));
    if let Some((at, line)) = first_after(&old_log, spawned_at, "nothing depends on this ingress") {
        handoff.quiet = field(line, "idle").and_then(debug_duration);
        handoff.last_old_packet = handoff.quiet.map(|quiet| since(*at) - quiet);
    }
    handoff.called = first_after(&new_log, spawned_at, "WireGuard endpoints seeded")
        .and_then(|(_, line)| field(line, "calling_back")?.parse().ok());
    world.ingress = successor;
    Ok(handoff)
}

/// nftables counters in the customer namespace: WireGuard handshake
/// initiations (message type 1, the first payload byte) arriving from the
/// node's port.
const COUNTERS: &str = "table inet blbench {
    counter initiations { }
    chain input {
        type filter hook input priority 0; policy accept;
        udp sport 51820 @th,64,8 1 counter name \"initiations\"
    }
}
";

impl World {
    /// Handshake initiations the customer namespace has received from the
    /// node so far (None: the counter cannot be read).
    fn initiations(&self) -> Option<u64> {
        let text = blipless_tests::netns::run(self.net.customer.command("nft").args([
            "list",
            "counter",
            "inet",
            "blbench",
            "initiations",
        ]))
        .ok()?;
        let mut words = text.split_whitespace();
        words.find(|w| *w == "packets")?;
        words.next()?.parse().ok()
    }

    /// Reads the serving ingress's WireGuard counters and its call-back line
    /// into `handoff` (done just before the next handoff, or at the end).
    pub fn successor_figures(&self, handoff: &mut Handoff, clock: Clock) {
        handoff.initiations = self
            .initiations()
            .zip(handoff.initiations_at_spawn)
            .map(|(now, then)| now.saturating_sub(then));
        let text = self.node.metrics();
        let value = |series: &str| metrics::value(&text, series).unwrap_or(0.0);
        handoff.handoff_metric = Some(value("blipless_ingress_handoff_duration_seconds"));
        handoff.cookie_replies = value("blipless_wg_cookie_replies_total");
        handoff.handshakes = value("blipless_wg_handshakes_total");
        handoff.drops = metrics::by_label(&text, "blipless_wg_dropped_total")
            .into_iter()
            .filter(|(_, value)| *value > 0.0)
            .collect();
        let log = timed_lines(&self.ingress.log_text(), clock);
        if let Some((_, line)) = first_after(&log, handoff.spawned_at, "WireGuard call-back done") {
            handoff.call_back = field(line, "took").and_then(debug_duration);
            handoff.unanswered = field(line, "unanswered").and_then(|n| n.parse().ok());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_a_wg_quick_text() {
        let text = "[Interface]\nPrivateKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\nAddress = 10.64.3.7/32\n\n\
                    [Peer]\nPublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\nEndpoint = 10.91.1.1:51820\n\
                    AllowedIPs = 0.0.0.0/0\nPersistentKeepalive = 25\n";
        let c = parse_credentials(text).expect("parsed");
        assert_eq!(c.address, Ipv4Addr::new(10, 64, 3, 7));
        assert_eq!(c.server_public, [1u8; 32]);
        assert_eq!(c.endpoint.port(), 51820);
    }
}
