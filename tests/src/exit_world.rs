//! The WireGuard-exit topology of the end-to-end tests, as root, in network
//! namespaces it creates and removes: [`crate::topology::Topology`]'s
//! customer, node and internet namespaces, plus an "exit" namespace between
//! the node and the internet that runs the node's upstream WireGuard server
//! (wireguard-go, or a second blipless node), and optionally a second exit
//! namespace ([`SecondExit`], [`TwoExitWorld`]) beside it.
//!
//! ```text
//! customer 10.S.1.2 ── 10.S.1.1 node 10.S.2.1 ───────────────── 10.S.2.2 internet (origin :8000)
//!                               node 10.S.3.1 ── 10.S.3.2 exit 10.S.4.1 ── 10.S.4.2 internet
//!   wg 10.64.0.2 ──UDP 51820──▶ node ──(blx0, 10.200.0.2)──UDP 51820──▶ exit ──▶ masquerade
//! ```
//!
//! The node egresses directly out of 10.S.2.1 (masquerade of its client
//! pool, and proxy sockets from its own address), or through the exit: the
//! exit masquerades out of 10.S.4.1, so the origin's `/whoami` tells the two
//! apart. The node's end of the exit tunnel is [`EXIT_ADDRESS`], the exit's
//! [`EXIT_SERVER_ADDRESS`].

use std::process::Stdio;
use std::time::Duration;

use crate::netns::{veth, Netns};
use crate::node::{ClientUrls, Daemon, Node};
use crate::topology::{add_wg_client, tail, Topology, POOL, WG_PORT};
use crate::wireguard::{client_config, server_config, Egress, Keypair, WireguardGoPeer};

/// The node's tunnel address toward the exit (what the exit knows it as).
pub const EXIT_ADDRESS: &str = "10.200.0.2/32";
/// The exit's own tunnel address (wireguard-go's interface, or a blipless
/// exit's TUN device: the first host of [`EXIT_POOL`]).
pub const EXIT_SERVER_ADDRESS: &str = "10.200.0.1/24";
/// The client pool of a blipless node acting as the exit: its first client
/// (the node) gets [`EXIT_ADDRESS`].
pub const EXIT_POOL: &str = "10.200.0.0/24";
/// The exit's upstream name in the node's configuration.
pub const EXIT_NAME: &str = "wg-exit";
/// The exit's TUN device on the node (the default for the first exit).
pub const EXIT_TUN: &str = "blx0";
/// The first exit's firewall mark and routing table
/// (`blipless_config::upstreams::FIRST_MARK`).
pub const EXIT_MARK: u32 = 0x0b1e_5500;

/// The four namespaces, their links and the origin.
#[derive(Debug)]
pub struct ExitNet {
    /// The exit's namespace (dropped first: it kills what runs inside).
    pub exit: Netns,
    /// customer, node, internet and the origin (10.S.2.2:8000).
    pub net: Topology,
    /// The exit's address toward the node, "10.S.3.2": its WireGuard
    /// endpoint's host.
    pub exit_ip: String,
    /// The exit's interface toward the internet (it masquerades out of it).
    pub exit_uplink: String,
    /// The address the origin sees for traffic through the exit (10.S.4.1).
    pub exit_public: String,
    /// The address the origin sees for the node's direct egress (10.S.2.1).
    pub node_public: String,
}

impl ExitNet {
    /// The namespaces on subnets 10.`s`.1–4.0/24, the origin serving.
    pub fn new(s: u8) -> ExitNet {
        let net = Topology::new(s);
        let exit = Netns::new("exit").expect("exit namespace");
        let exit_ip = format!("10.{s}.3.2");
        veth(
            &net.node_ns,
            &format!("10.{s}.3.1/24"),
            &exit,
            &format!("{exit_ip}/24"),
        )
        .expect("node–exit link");
        let exit_uplink = veth(
            &exit,
            &format!("10.{s}.4.1/24"),
            &net.internet,
            &format!("10.{s}.4.2/24"),
        )
        .expect("exit–internet link")
        .a;
        // The origin (10.S.2.2) lives in the internet namespace, which owns
        // that address on its other link.
        exit.route_via(&net.internet_net, &format!("10.{s}.4.2"))
            .expect("the exit's route to the origin");
        ExitNet {
            exit,
            net,
            exit_ip,
            exit_uplink,
            exit_public: format!("10.{s}.4.1"),
            node_public: format!("10.{s}.2.1"),
        }
    }

    /// The exit's WireGuard endpoint, "10.S.3.2:51820".
    pub fn exit_endpoint(&self) -> String {
        format!("{}:{WG_PORT}", self.exit_ip)
    }
}

/// wireguard-go as the node's exit: a plain WireGuard server in the exit
/// namespace whose one peer is the node (AllowedIPs [`EXIT_ADDRESS`]),
/// masquerading out of the exit's uplink. Stoppable and restartable with
/// the same keys.
#[derive(Debug)]
pub struct WgGoExit {
    server: Option<WireguardGoPeer>,
    config: String,
    /// The exit's keys.
    pub keys: Keypair,
    /// The node's keys toward the exit.
    pub node_keys: Keypair,
    /// The wg-quick file for the node.
    pub node_file: String,
}

impl WgGoExit {
    /// Starts the server in `net`'s exit namespace with fresh keys for
    /// both ends.
    pub fn start(net: &ExitNet, node_keepalive: Option<u16>) -> WgGoExit {
        Self::start_in(
            &net.exit,
            &net.exit_uplink,
            &net.exit_endpoint(),
            EXIT_SERVER_ADDRESS,
            EXIT_ADDRESS,
            node_keepalive,
        )
    }

    /// Starts the server in `netns` (masquerading out of `uplink`,
    /// listening on `endpoint`'s port, tunnel address `server_address`)
    /// whose one peer is the node at `node_address`, with fresh keys.
    pub fn start_in(
        netns: &Netns,
        uplink: &str,
        endpoint: &str,
        server_address: &str,
        node_address: &str,
        node_keepalive: Option<u16>,
    ) -> WgGoExit {
        let keys = Keypair::generate().expect("exit keys");
        let node_keys = Keypair::generate().expect("node keys");
        let port: u16 = endpoint
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .expect("an endpoint host:port");
        let config = server_config(
            &keys,
            server_address,
            port,
            &[(&node_keys.public_key, node_address)],
        );
        let server = WireguardGoPeer::server(
            netns,
            &config,
            &Egress::Masquerade {
                out_interface: uplink.to_string(),
            },
        )
        .expect("wireguard-go exit");
        let node_file = client_config(
            &node_keys,
            node_address,
            &keys.public_key,
            endpoint,
            "0.0.0.0/0",
            node_keepalive,
        );
        WgGoExit {
            server: Some(server),
            config,
            keys,
            node_keys,
            node_file,
        }
    }

    /// The running server (panics when stopped).
    pub fn server(&self) -> &WireguardGoPeer {
        self.server.as_ref().expect("the exit runs")
    }

    /// Stops wireguard-go (its interface goes with it).
    pub fn stop(&mut self) {
        self.server = None;
    }

    /// Starts wireguard-go again with the same keys and peer (forwarding
    /// and masquerade are still in place).
    pub fn restart(&mut self, netns: &Netns) {
        assert!(self.server.is_none(), "stop it first");
        self.server =
            Some(WireguardGoPeer::start(netns, &self.config, &[]).expect("wireguard-go exit"));
    }

    /// The node as the server sees it (`wg show dump`), if it is a peer.
    pub fn node_peer(&self) -> Option<crate::wireguard::PeerStatus> {
        let dump = self.server.as_ref()?.status().ok()?;
        dump.peers
            .into_iter()
            .find(|p| p.public_key == self.node_keys.public_key)
    }

    /// The server's log (empty when stopped).
    pub fn log(&self) -> String {
        self.server
            .as_ref()
            .map(WireguardGoPeer::log)
            .unwrap_or_default()
    }
}

/// A blipless node's daemons.
#[derive(Debug)]
pub struct Blipless {
    /// The device plane (replace it after a deploy).
    pub device: Daemon,
    /// The ingress.
    pub ingress: Daemon,
    /// Its files, config and `blipless-ctl`.
    pub node: Node,
}

impl Blipless {
    /// The last lines of its logs.
    pub fn logs(&self, name: &str) -> String {
        format!(
            "--- {name} ingress log:\n{}\n--- {name} device log:\n{}",
            tail(&self.ingress.log_text()),
            tail(&self.device.log_text()),
        )
    }
}

/// The TOML of a node with packet egress managed by its device plane (TUN
/// `blip0`, masquerade out of `out_interface`), WireGuard on `endpoint`
/// with `pool`, fast probes, and `upstreams` (TOML `[[egress.upstream]]`
/// tables, possibly empty).
pub fn node_extra(out_interface: &str, endpoint: &str, pool: &str, upstreams: &str) -> String {
    format!(
        "[egress.tun]\nname = \"blip0\"\nout_interface = \"{out_interface}\"\nmanage = true\n\n\
         [egress.probe]\ninterval = \"1s\"\ntimeout = \"2s\"\nfailures = 2\n\n\
         {upstreams}\n\
         [wireguard]\nendpoint = \"{endpoint}\"\npool = \"{pool}\"\n"
    )
}

/// A client to add to the node before its device plane starts.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// Its name.
    pub name: &'static str,
    /// A WireGuard client (`--wg`), or a proxy client.
    pub wg: bool,
    /// `--egress` (None: the default, `any`).
    pub egress: Option<&'static str>,
}

/// A client that was added: its proxy URLs, and its wg-quick config for a
/// WireGuard client.
#[derive(Debug, Clone)]
pub struct Added {
    /// The proxy URLs and secret.
    pub urls: ClientUrls,
    /// The wg-quick config (`--wg` only).
    pub wg_config: Option<String>,
}

/// `blipless-ctl --json client add NAME [--wg] [--egress POLICY]` on `node`.
pub fn add_client(node: &Node, spec: &ClientSpec) -> Added {
    let mut args = vec!["--json", "client", "add", spec.name];
    if spec.wg {
        args.push("--wg");
    }
    if let Some(egress) = spec.egress {
        args.extend(["--egress", egress]);
    }
    let output = node.ctl(&args);
    assert!(
        output.status.success(),
        "client add {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("client add --json");
    Added {
        urls: ClientUrls::from_json(&value),
        wg_config: value["wireguard"]["config"].as_str().map(str::to_string),
    }
}

/// The TOML of one WireGuard exit upstream.
pub fn exit_upstream(name: &str, file: &std::path::Path) -> String {
    format!(
        "[[egress.upstream]]\nname = \"{name}\"\nkind = \"wireguard\"\nconfig = \"{}\"\n",
        file.display()
    )
}

/// An IPv6 network the node's egress allows but no namespace routes: a
/// destination in it is one a WireGuard exit (IPv4 inside) cannot carry,
/// and nothing sent to it leaves the node.
pub const UNROUTED_V6: &str = "fd00:b1ee::/64";

/// The node (blipless in the node namespace) with one WireGuard exit whose
/// wg-quick file is `exit_file`, `clients` added before its device plane
/// starts, and ready.
pub fn start_node(
    net: &ExitNet,
    exit_file: &std::path::Path,
    clients: &[ClientSpec],
) -> (Blipless, Vec<Added>) {
    start_node_with(net, &exit_upstream(EXIT_NAME, exit_file), clients)
}

/// [`start_node`] with `upstreams` (TOML `[[egress.upstream]]` tables).
pub fn start_node_with(
    net: &ExitNet,
    upstreams: &str,
    clients: &[ClientSpec],
) -> (Blipless, Vec<Added>) {
    let mut node = Node::in_netns(
        net.net.node_ns.name(),
        &format!("allow = [\"{}\", \"{UNROUTED_V6}\"]", net.net.internet_net),
        &node_extra(&net.net.uplink, &net.net.endpoint(), POOL, upstreams),
    );
    let ingress = node.start_ingress();
    let added = clients.iter().map(|spec| add_client(&node, spec)).collect();
    let device = node.start_device();
    node.wait_ready();
    (
        Blipless {
            device,
            ingress,
            node,
        },
        added,
    )
}

/// Another exit namespace beside [`ExitNet::exit`]: node ── 10.S.5.0/24 ──
/// exit2 ── 10.S.6.0/24 ── internet; the origin sees 10.S.6.1 through it.
#[derive(Debug)]
pub struct SecondExit {
    /// Its namespace.
    pub netns: Netns,
    /// Its address toward the node, "10.S.5.2".
    pub ip: String,
    /// Its interface toward the internet.
    pub uplink: String,
    /// What the origin sees through it (10.S.6.1).
    pub public: String,
}

impl SecondExit {
    /// Links a second exit namespace into `net` (subnet number `s`).
    pub fn new(net: &ExitNet, s: u8) -> SecondExit {
        let netns = Netns::new("exit2").expect("second exit namespace");
        let ip = format!("10.{s}.5.2");
        veth(
            &net.net.node_ns,
            &format!("10.{s}.5.1/24"),
            &netns,
            &format!("{ip}/24"),
        )
        .expect("node–exit2 link");
        let uplink = veth(
            &netns,
            &format!("10.{s}.6.1/24"),
            &net.net.internet,
            &format!("10.{s}.6.2/24"),
        )
        .expect("exit2–internet link")
        .a;
        netns
            .route_via(&net.net.internet_net, &format!("10.{s}.6.2"))
            .expect("the second exit's route to the origin");
        SecondExit {
            netns,
            ip,
            uplink,
            public: format!("10.{s}.6.1"),
        }
    }

    /// Its WireGuard endpoint, "10.S.5.2:51820".
    pub fn endpoint(&self) -> String {
        format!("{}:{WG_PORT}", self.ip)
    }
}

/// A second blipless node in the exit namespace, the first one's exit:
/// WireGuard on 10.S.3.2:51820 with pool [`EXIT_POOL`], masquerading out of
/// the exit's uplink, with client "nodeA" (`--wg`) added; returns it and
/// the wg-quick text `client add --wg` printed for nodeA.
pub fn start_blipless_exit(net: &ExitNet) -> (Blipless, String) {
    let mut node = Node::in_netns(
        net.exit.name(),
        &format!("allow = [\"{}\"]", net.net.internet_net),
        &node_extra(&net.exit_uplink, &net.exit_endpoint(), EXIT_POOL, ""),
    );
    let ingress = node.start_ingress();
    let config = add_wg_client(&node, "nodeA");
    let device = node.start_device();
    node.wait_ready();
    (
        Blipless {
            device,
            ingress,
            node,
        },
        config,
    )
}

/// Writes `text` as a root-only file `name` in `dir`; returns its path.
pub fn write_exit_file(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("creating the exit file");
    file.write_all(text.as_bytes())
        .expect("writing the exit file");
    path
}

/// The whole world: a wireguard-go client in the customer namespace, the
/// node, and wireguard-go as its exit.
#[derive(Debug)]
pub struct ExitWorld {
    // Dropped in this order: the client, the node's daemons, the exit,
    // namespaces last.
    /// The customer's wireguard-go client (None without a WireGuard client).
    pub peer: Option<WireguardGoPeer>,
    /// The node.
    pub node: Blipless,
    /// The clients added (in the order asked).
    pub clients: Vec<Added>,
    /// The exit.
    pub exit: WgGoExit,
    files: tempfile::TempDir,
    /// The namespaces and the origin.
    pub net: ExitNet,
}

impl ExitWorld {
    /// Subnets 10.`s`.1–4.0/24; wireguard-go as the exit; the node with
    /// `clients` (the first `--wg` one, if any, gets a wireguard-go client
    /// in the customer namespace routing the internet subnet through the
    /// node).
    pub fn new(s: u8, clients: &[ClientSpec]) -> ExitWorld {
        Self::with_exit_file(s, clients, |_, file| file.to_owned())
    }

    /// [`ExitWorld::new`] with the node's wg-quick file for the exit as
    /// `edit` makes it (from the namespaces, before the node starts, and
    /// the file as the exit wrote it).
    pub fn with_exit_file(
        s: u8,
        clients: &[ClientSpec],
        edit: impl FnOnce(&ExitNet, &str) -> String,
    ) -> ExitWorld {
        let net = ExitNet::new(s);
        let exit = WgGoExit::start(&net, None);
        let files = tempfile::Builder::new()
            .prefix("blipless-exit-")
            .tempdir()
            .expect("temporary folder");
        let file = edit(&net, &exit.node_file);
        let path = write_exit_file(files.path(), "exit.conf", &file);
        let (node, added) = start_node(&net, &path, clients);
        let peer = added
            .iter()
            .find_map(|a| a.wg_config.as_deref())
            .map(|config| {
                WireguardGoPeer::start(&net.net.customer, config, &[net.net.internet_net.as_str()])
                    .expect("wireguard-go client")
            });
        ExitWorld {
            peer,
            node,
            clients: added,
            exit,
            files,
            net,
        }
    }

    /// Where the exit file and other test files are.
    pub fn files(&self) -> &std::path::Path {
        self.files.path()
    }

    /// curl in the customer namespace (through the WireGuard client); the
    /// body, or a panic with curl's error and every log.
    pub fn fetch(&self, path: &str) -> Vec<u8> {
        self.net
            .net
            .try_fetch(path, &[])
            .unwrap_or_else(|error| panic!("{error}\n{}", self.diagnostics()))
    }

    /// The last lines of every log, and the node's kernel state.
    pub fn diagnostics(&self) -> String {
        format!(
            "{}\n--- wireguard-go client:\n{}\n--- wireguard-go exit:\n{}\n{}",
            self.node.logs("node"),
            tail(
                &self
                    .peer
                    .as_ref()
                    .map(WireguardGoPeer::log)
                    .unwrap_or_default()
            ),
            tail(&self.exit.log()),
            kernel_state(&self.net.net.node_ns)
        )
    }
}

/// `ip rule`, `ip route show table <mark>`, `ip addr`, `nft list ruleset`
/// of a namespace, for error messages and reports.
pub fn kernel_state(netns: &Netns) -> String {
    let show = |program: &str, args: &[&str]| {
        netns
            .exec(program, args)
            .unwrap_or_else(|error| format!("({error})"))
    };
    format!(
        "--- ip rule:\n{}--- ip route show table {EXIT_MARK}:\n{}--- ip -br addr:\n{}--- nft list ruleset:\n{}",
        show("ip", &["rule"]),
        show("ip", &["route", "show", "table", &EXIT_MARK.to_string()]),
        show("ip", &["-br", "addr"]),
        show("nft", &["list", "ruleset"]),
    )
}

/// `blipless-ctl --json egress` of `node`, parsed (Null when it fails).
pub fn egress_json(node: &Node) -> serde_json::Value {
    let output = node.ctl(&["--json", "egress"]);
    serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
}

/// The route called `name` in `blipless-ctl --json egress` of `node`.
pub fn egress_route(node: &Node, name: &str) -> Option<serde_json::Value> {
    egress_json(node)["routes"]
        .as_array()?
        .iter()
        .find(|route| route["name"] == name)
        .cloned()
}

/// curl in `netns` for `url` through the proxy `proxy` (`-x`); the body,
/// or curl's error.
pub fn curl_via(netns: &Netns, proxy: &str, url: &str) -> Result<Vec<u8>, String> {
    let output = netns
        .command("curl")
        .args([
            "--silent",
            "--show-error",
            "--max-time",
            "120",
            "-x",
            proxy,
            url,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running curl: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "curl -x {proxy} {url} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(output.stdout)
}

/// Polls `condition` every 200 ms until it holds or `timeout` passes;
/// returns how long it took, or None.
pub fn within(timeout: Duration, mut condition: impl FnMut() -> bool) -> Option<Duration> {
    let started = std::time::Instant::now();
    loop {
        if condition() {
            return Some(started.elapsed());
        }
        if started.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A counter of the node's packets that leave *directly* (out of its
/// uplink) with a source in the WireGuard client pool: packets of clients
/// that should have gone through the exit. Counted before NAT (postrouting,
/// priority -400), in a table of its own (`inet bltest_leak`) that the
/// node's `net setup` and `teardown` do not touch.
#[derive(Debug)]
pub struct LeakCounter<'a> {
    netns: &'a Netns,
}

impl<'a> LeakCounter<'a> {
    /// Installs the counter in `net`'s node namespace.
    pub fn install(net: &'a ExitNet) -> LeakCounter<'a> {
        let netns = &net.net.node_ns;
        let script = format!(
            "table inet bltest_leak {{\n\tcounter leaked {{ }}\n\tchain postrouting {{\n\t\ttype filter hook postrouting priority -400; policy accept;\n\t\toifname \"{}\" ip saddr {POOL} counter name \"leaked\"\n\t}}\n}}\n",
            net.net.uplink
        );
        crate::netns::run_with_input(netns.command("nft").args(["-f", "-"]), &script)
            .expect("installing the leak counter");
        LeakCounter { netns }
    }

    /// Packets counted so far.
    pub fn packets(&self) -> u64 {
        let text = self
            .netns
            .exec("nft", &["list", "counter", "inet", "bltest_leak", "leaked"])
            .expect("reading the leak counter");
        let mut words = text.split_whitespace();
        while let Some(word) = words.next() {
            if word == "packets" {
                return words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("leak counter: {text}"));
            }
        }
        panic!("no packet count in {text}")
    }
}

/// The second exit's name in the node's configuration (its TUN is `blx1`).
pub const EXIT2_NAME: &str = "wg-exit2";
/// The node's tunnel address toward the second exit.
pub const EXIT2_ADDRESS: &str = "10.201.0.2/32";

/// A node with two wireguard-go exits ([`EXIT_NAME`] in the exit namespace,
/// [`EXIT2_NAME`] in a second one), so that a window holds both.
#[derive(Debug)]
pub struct TwoExitWorld {
    // Dropped in this order: the client, the node's daemons, the exits,
    // namespaces last.
    /// The customer's wireguard-go client (None without a WireGuard client).
    pub peer: Option<WireguardGoPeer>,
    /// The node.
    pub node: Blipless,
    /// The clients added (in the order asked).
    pub clients: Vec<Added>,
    /// The exits, in configuration order.
    pub exits: [WgGoExit; 2],
    _files: tempfile::TempDir,
    /// The second exit's namespace.
    pub second: SecondExit,
    /// The namespaces and the origin.
    pub net: ExitNet,
}

impl TwoExitWorld {
    /// Subnets 10.`s`.1–6.0/24, both exits up, the node with `clients`
    /// (the first `--wg` one gets a wireguard-go client).
    pub fn new(s: u8, clients: &[ClientSpec]) -> TwoExitWorld {
        let net = ExitNet::new(s);
        let second = SecondExit::new(&net, s);
        let first = WgGoExit::start(&net, None);
        let other = WgGoExit::start_in(
            &second.netns,
            &second.uplink,
            &second.endpoint(),
            "10.201.0.1/24",
            EXIT2_ADDRESS,
            None,
        );
        let files = tempfile::Builder::new()
            .prefix("blipless-exits-")
            .tempdir()
            .expect("temporary folder");
        let upstreams = format!(
            "{}\n{}",
            exit_upstream(
                EXIT_NAME,
                &write_exit_file(files.path(), "exit1.conf", &first.node_file)
            ),
            exit_upstream(
                EXIT2_NAME,
                &write_exit_file(files.path(), "exit2.conf", &other.node_file)
            )
        );
        let (node, added) = start_node_with(&net, &upstreams, clients);
        let peer = added
            .iter()
            .find_map(|a| a.wg_config.as_deref())
            .map(|config| {
                WireguardGoPeer::start(&net.net.customer, config, &[net.net.internet_net.as_str()])
                    .expect("wireguard-go client")
            });
        TwoExitWorld {
            peer,
            node,
            clients: added,
            exits: [first, other],
            _files: files,
            second,
            net,
        }
    }

    /// What the origin sees through exit `i` (0 or 1).
    pub fn public(&self, i: usize) -> &str {
        [&self.net.exit_public, &self.second.public][i]
    }

    /// Which exit an origin's `/whoami` answer names (None: neither).
    pub fn exit_of(&self, seen: &str) -> Option<usize> {
        (0..2).find(|&i| self.public(i) == seen)
    }

    /// The last lines of every log, and the node's kernel state.
    pub fn diagnostics(&self) -> String {
        format!(
            "{}\n--- wireguard-go client:\n{}\n--- exit 1:\n{}\n--- exit 2:\n{}\n{}",
            self.node.logs("node"),
            tail(
                &self
                    .peer
                    .as_ref()
                    .map(WireguardGoPeer::log)
                    .unwrap_or_default()
            ),
            tail(&self.exits[0].log()),
            tail(&self.exits[1].log()),
            kernel_state(&self.net.net.node_ns)
        )
    }
}
