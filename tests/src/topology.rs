//! The WireGuard topology of the end-to-end tests and of the WireGuard
//! benchmark, as root, in network namespaces it creates and removes: a
//! "customer" namespace with the real client (wireguard-go and `wg`), a
//! "node" namespace with the server, and an "internet" namespace with an HTTP
//! origin ([`crate::origin`]) on port 8000.
//!
//! ```text
//! customer 10.S.1.2 ── 10.S.1.1 node 10.S.2.1 ── 10.S.2.2 internet (origin :8000)
//!   wg 10.64.0.2 ──UDP 51820──▶ server ──▶ masquerade out of the uplink
//! ```
//!
//! Two servers share the namespaces and addresses:
//!
//! - [`WgWorld`]: blipless, `blipless-ingress` and `blipless-device` (TUN
//!   egress with nftables masquerade, set up by the device plane:
//!   `egress.tun.manage`), the client configured from the wg-quick config
//!   `blipless-ctl client add --wg` prints.
//! - [`WgGoWorld`]: the baseline, wireguard-go as a plain WireGuard server
//!   ([`WireguardGoPeer::server`], masquerade out of the uplink), the client
//!   configured from a wg-quick text of the same shape (`AllowedIPs =
//!   0.0.0.0/0`, 25 s keepalive, tunnel address 10.64.0.2/32).
//!
//! In both, the client routes only the internet subnet (10.S.2.0/24) through
//! the tunnel. Every name the namespaces hold is their own, so two worlds
//! with the same subnet number `S` can exist at once.

use std::net::SocketAddr;
use std::process::{Child, Stdio};

use crate::netns::{self, start_origin, veth, Background, Netns};
use crate::node::{Daemon, Node};
use crate::wireguard::{client_config, server_config, Egress, Keypair, WireguardGoPeer};

/// The WireGuard pool of both servers; the node is its first host.
pub const POOL: &str = "10.64.0.0/24";
/// The client's tunnel address in both worlds (the first address blipless
/// hands out).
pub const CLIENT_ADDRESS: &str = "10.64.0.2/32";
/// The server's tunnel address in the baseline (blipless puts the same on
/// its TUN device).
pub const SERVER_ADDRESS: &str = "10.64.0.1/24";
/// The UDP port both servers listen on.
pub const WG_PORT: u16 = 51820;

/// The three namespaces, their links and the origin in the internet
/// namespace. Dropped in this order: the origin first, namespaces last
/// (which kills whatever still runs inside).
#[derive(Debug)]
pub struct Topology {
    origin_process: Background,
    /// The subnet number S of 10.S.1.0/24 and 10.S.2.0/24.
    pub subnet: u8,
    /// The origin's address in the internet namespace (10.S.2.2:8000).
    pub origin: SocketAddr,
    /// The internet subnet, "10.S.2.0/24": what the client routes through
    /// the tunnel and the node's egress allows.
    pub internet_net: String,
    /// The node's address toward the customer (10.S.1.1): the WireGuard
    /// endpoint's host.
    pub node_ip: String,
    /// The node's interface toward the internet (masquerade out of it).
    pub uplink: String,
    /// The customer's namespace (the client runs here).
    pub customer: Netns,
    /// The node's namespace (the server runs here).
    pub node_ns: Netns,
    /// The internet's namespace (the origin runs here).
    pub internet: Netns,
}

impl Topology {
    /// The namespaces on subnets 10.`s`.1.0/24 (customer–node) and
    /// 10.`s`.2.0/24 (node–internet), with the origin serving.
    pub fn new(s: u8) -> Topology {
        netns::require_root();
        let customer = Netns::new("customer").expect("customer namespace");
        let node_ns = Netns::new("node").expect("node namespace");
        let internet = Netns::new("internet").expect("internet namespace");
        let node_ip = format!("10.{s}.1.1");
        veth(
            &node_ns,
            &format!("{node_ip}/24"),
            &customer,
            &format!("10.{s}.1.2/24"),
        )
        .expect("customer link");
        let uplink = veth(
            &node_ns,
            &format!("10.{s}.2.1/24"),
            &internet,
            &format!("10.{s}.2.2/24"),
        )
        .expect("internet link");
        let origin: SocketAddr = format!("10.{s}.2.2:8000").parse().expect("origin address");
        let origin_process = start_origin(&internet, origin).expect("origin");
        Topology {
            origin_process,
            subnet: s,
            origin,
            internet_net: format!("10.{s}.2.0/24"),
            node_ip,
            uplink: uplink.a,
            customer,
            node_ns,
            internet,
        }
    }

    /// The WireGuard endpoint the client dials, "10.S.1.1:51820".
    pub fn endpoint(&self) -> String {
        format!("{}:{WG_PORT}", self.node_ip)
    }

    /// The origin's output so far (for error messages).
    pub fn origin_log(&self) -> String {
        self.origin_process.output()
    }

    /// Starts `ping -n -D -i INTERVAL -c COUNT -W 2` in the customer
    /// namespace toward the origin's host, stdout and stderr piped: one
    /// timestamped line per reply (so [`crate::missing_replies`] can say
    /// which were lost, and when), then the summary.
    pub fn ping(&self, count: u32, interval: &str) -> Child {
        let host = self.origin.ip().to_string();
        self.customer
            .command("ping")
            .args([
                "-n",
                "-D",
                "-i",
                interval,
                "-c",
                &count.to_string(),
                "-W",
                "2",
                &host,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ping")
    }

    /// curl in the customer namespace for `path` on the origin; the body,
    /// or an error with curl's message.
    pub fn try_fetch(&self, path: &str, extra: &[&str]) -> Result<Vec<u8>, String> {
        let url = format!("http://{}{path}", self.origin);
        let output = self
            .customer
            .command("curl")
            .args(["--silent", "--show-error", "--max-time", "120"])
            .args(extra)
            .arg(&url)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running curl: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "curl {url} through the tunnel failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(output.stdout)
    }
}

/// One customer, one blipless node, one internet, wired up and serving.
#[derive(Debug)]
pub struct WgWorld {
    // Dropped in this order: client and daemons first, namespaces last.
    /// The customer's wireguard-go client.
    pub peer: WireguardGoPeer,
    /// The device plane (replace it after a deploy).
    pub device: Daemon,
    /// The ingress.
    pub ingress: Daemon,
    /// The node's files, config and `blipless-ctl`.
    pub node: Node,
    /// The namespaces and the origin.
    pub net: Topology,
    /// The wg-quick config `client add --wg` printed for the client.
    pub client_config: String,
}

impl WgWorld {
    /// Builds the topology on subnets 10.`s`.1.0/24 and 10.`s`.2.0/24 with a
    /// blipless node (client "alice" added with `--wg`) and its client up.
    pub fn new(s: u8) -> WgWorld {
        Self::with(s, "", &[])
    }

    /// [`WgWorld::new`] with `wireguard` appended to the node's `[wireguard]`
    /// table and the client routing `routes` through the tunnel too.
    pub fn with(s: u8, wireguard: &str, routes: &[&str]) -> WgWorld {
        Self::with_tun(s, "", wireguard, routes)
    }

    /// [`WgWorld::with`] with `tun` appended to the node's `[egress.tun]`
    /// table too (`offload = true`, say).
    pub fn with_tun(s: u8, tun: &str, wireguard: &str, routes: &[&str]) -> WgWorld {
        let net = Topology::new(s);
        let mut node = Node::in_netns(
            net.node_ns.name(),
            &format!("allow = [\"{}\"]", net.internet_net),
            &format!(
                "[egress.tun]\nname = \"blip0\"\nout_interface = \"{}\"\nmanage = true\n{tun}\n\n\
                 [wireguard]\nendpoint = \"{}\"\npool = \"{POOL}\"\n{wireguard}",
                net.uplink,
                net.endpoint()
            ),
        );
        let ingress = node.start_ingress();
        let config = add_wg_client(&node, "alice");
        let device = node.start_device();
        node.wait_ready();
        let mut all_routes = vec![net.internet_net.as_str()];
        all_routes.extend_from_slice(routes);
        let peer = WireguardGoPeer::start(&net.customer, &config, &all_routes)
            .expect("wireguard-go client");
        WgWorld {
            peer,
            device,
            ingress,
            node,
            net,
            client_config: config,
        }
    }

    /// curl in the customer namespace; the body, or a panic with curl's
    /// error and the daemons' logs.
    pub fn fetch(&self, path: &str, extra: &[&str]) -> Vec<u8> {
        self.net
            .try_fetch(path, extra)
            .unwrap_or_else(|error| panic!("{error}\n{}", self.diagnostics()))
    }

    /// True while the ingress's `/status` answers 200.
    pub fn ingress_serving(&self) -> bool {
        self.node.status().0 == 200
    }

    /// The last lines of the ingress's, the device plane's and the client's
    /// logs.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- ingress log:\n{}\n--- device log:\n{}\n--- wireguard-go:\n{}",
            tail(&self.ingress.log_text()),
            tail(&self.device.log_text()),
            tail(&self.peer.log())
        )
    }
}

/// A rate-limited download through the tunnel, started by
/// [`WgWorld::start_download`], checked whole by [`Download::finish`].
#[derive(Debug)]
pub struct Download {
    child: Child,
    file: std::path::PathBuf,
    size: usize,
}

impl WgWorld {
    /// Starts curl in the customer namespace downloading `size` bytes of
    /// [`crate::pattern`] from the origin at `rate` (curl's `--limit-rate`),
    /// so the inner TCP stream outlasts what the test does meanwhile.
    pub fn start_download(&self, size: usize, rate: &str) -> Download {
        let file = self.node.path().join("stream.bin");
        let url = format!("http://{}/bytes/{size}", self.net.origin);
        let child = self
            .net
            .customer
            .command("curl")
            .args([
                "--silent",
                "--show-error",
                "--max-time",
                "300",
                "--limit-rate",
                rate,
                "-o",
            ])
            .arg(&file)
            .arg(&url)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting curl");
        Download { child, file, size }
    }
}

impl Download {
    /// Checks the stream was still running (it outlasted `what`), then that it
    /// ends with success and every byte exact; `diagnostics` for a failure.
    pub fn finish(mut self, what: &str, diagnostics: impl FnOnce() -> String) {
        if let Some(status) = self.child.try_wait().expect("curl state") {
            let mut stderr = String::new();
            if let Some(mut pipe) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            let got = std::fs::metadata(&self.file).map_or(0, |m| m.len());
            panic!(
                "the stream ended before the {what} did ({status}, {got} of {} bytes; \
                 make it longer if it succeeded): {stderr}\n{}",
                self.size,
                diagnostics()
            );
        }
        let status = self.child.wait().expect("curl");
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        assert!(
            status.success(),
            "the inner TCP stream broke: {stderr}\n{}",
            diagnostics()
        );
        let body = std::fs::read(&self.file).expect("downloaded file");
        assert_eq!(body.len(), self.size, "every byte arrives");
        assert_eq!(
            crate::sha256(&body),
            crate::sha256(&crate::pattern(self.size)),
            "bytes differ"
        );
    }
}

/// The baseline: the same namespaces and addresses with wireguard-go as the
/// server in the node namespace.
#[derive(Debug)]
pub struct WgGoWorld {
    // Dropped in this order: client and server first, namespaces last.
    /// The customer's wireguard-go client.
    pub peer: WireguardGoPeer,
    /// wireguard-go as the server, masquerading out of the uplink.
    pub server: WireguardGoPeer,
    /// The namespaces and the origin.
    pub net: Topology,
}

impl WgGoWorld {
    /// Builds the topology on subnets 10.`s`.1.0/24 and 10.`s`.2.0/24 with
    /// wireguard-go serving on 10.S.1.1:51820 and its client up.
    pub fn new(s: u8) -> WgGoWorld {
        let net = Topology::new(s);
        let server_keys = Keypair::generate().expect("server keys");
        let client_keys = Keypair::generate().expect("client keys");
        let server = WireguardGoPeer::server(
            &net.node_ns,
            &server_config(
                &server_keys,
                SERVER_ADDRESS,
                WG_PORT,
                &[(&client_keys.public_key, CLIENT_ADDRESS)],
            ),
            &Egress::Masquerade {
                out_interface: net.uplink.clone(),
            },
        )
        .expect("wireguard-go server");
        // The shape `blipless-ctl client add --wg` prints.
        let config = client_config(
            &client_keys,
            CLIENT_ADDRESS,
            &server_keys.public_key,
            &net.endpoint(),
            "0.0.0.0/0",
            Some(25),
        );
        let peer = WireguardGoPeer::start(&net.customer, &config, &[net.internet_net.as_str()])
            .expect("wireguard-go client");
        WgGoWorld { peer, server, net }
    }

    /// The last lines of the server's and the client's logs.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- wireguard-go server:\n{}\n--- wireguard-go client:\n{}",
            tail(&self.server.log()),
            tail(&self.peer.log())
        )
    }
}

/// The last 40 lines of `text`.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `blipless-ctl --json client add NAME --wg` on `node`: the wg-quick config
/// it printed (panics when it fails).
pub fn add_wg_client(node: &Node, name: &str) -> String {
    let output = node.ctl(&["--json", "client", "add", name, "--wg"]);
    assert!(
        output.status.success(),
        "client add --wg failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("client add --json");
    value["wireguard"]["config"]
        .as_str()
        .expect("a wg-quick config in the JSON")
        .to_string()
}
