//! The egress bench's world: [`blipless_tests::exit_world`]'s namespaces
//! (customer, node, exit, internet) with wireguard-go as the exit, three
//! dante servers without authentication on the node namespace's loopback
//! (one for the SOCKS5 route, two for failover), one blipless node whose
//! routes are direct, those upstreams and the exit, a client per route, a
//! wireguard-go client in the customer namespace steered to the exit, and
//! the bench's own origin (itself, re-executed) in the internet namespace.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::dante::Dante;
use blipless_tests::exit_world::{
    egress_route, exit_upstream, start_node_with, write_exit_file, Added, Blipless, ClientSpec,
    ExitNet, WgGoExit, EXIT_NAME,
};
use blipless_tests::netns::{Background, Netns};
use blipless_tests::topology::tail;
use blipless_tests::wg_peer::in_netns;
use blipless_tests::wireguard::WireguardGoPeer;

use super::inside;
use super::{Route, ORIGIN_PORT, SUBNET};

/// The SOCKS5 route's upstream.
pub(super) const DANTE: &str = "dante";
/// The failover pair (both tagged [`FAILOVER_TAG`]).
pub(super) const FAILOVER: [&str; 2] = ["fo-a", "fo-b"];
/// The tag the failover client's policy selects.
const FAILOVER_TAG: &str = "failover";

/// The proxy clients, one per route, then the failover client and the
/// WireGuard client; added before the device plane starts.
const CLIENTS: [ClientSpec; 5] = [
    ClientSpec {
        name: "via-direct",
        wg: false,
        egress: Some("direct"),
    },
    ClientSpec {
        name: "via-dante",
        wg: false,
        egress: Some("upstream:dante"),
    },
    ClientSpec {
        name: "via-exit",
        wg: false,
        egress: Some("upstream:wg-exit"),
    },
    ClientSpec {
        name: "failover",
        wg: false,
        egress: Some("tags:failover"),
    },
    ClientSpec {
        name: "alice",
        wg: true,
        egress: Some("upstream:wg-exit"),
    },
];

/// The address dante number `i` (0: the SOCKS5 route, 1 and 2: failover)
/// leaves from: 10.S.2.11 + i, a second address on the node's uplink.
pub(super) fn dante_external(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, SUBNET, 2, 11 + i)
}

/// Everything, dropped in order: the WireGuard client, the node's daemons,
/// the dantes, the origin, the exit, the files, the namespaces last.
#[derive(Debug)]
pub(super) struct World {
    /// The customer's wireguard-go (client "alice", steered to the exit).
    pub peer: WireguardGoPeer,
    /// The node.
    pub node: Blipless,
    /// The clients, in [`CLIENTS`] order.
    pub clients: Vec<Added>,
    /// The SOCKS5 route's dante.
    pub dante: Dante,
    /// The failover pair (None while being restarted).
    pub failover: [Option<Dante>; 2],
    /// The bench's origin in the internet namespace.
    pub origin: Background,
    /// The exit.
    pub exit: WgGoExit,
    _files: tempfile::TempDir,
    /// The namespaces and the harness's origin (port 8000).
    pub net: ExitNet,
}

/// Starts dante in `netns` (its loopback, its free port), egressing from
/// `external`.
fn dante_in(netns: &str, external: Ipv4Addr) -> Dante {
    in_netns(netns, move || Dante::start_without_auth(external))
}

/// `ip netns exec NS <this binary> --inside ROLE ARGS...`.
pub(super) fn inside_command(netns: &Netns, role: &str, args: &[String]) -> Command {
    let program = std::env::current_exe().unwrap_or_else(|_| "blipless-bench-egress".into());
    let mut command = netns.command(program);
    command.arg(inside::FLAG).arg(role).args(args);
    command
}

/// Runs a role inside `netns` to its end; its JSON.
pub(super) fn run_inside(
    netns: &Netns,
    role: &str,
    args: &[String],
) -> Result<serde_json::Value, String> {
    let output = inside_command(netns, role, args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {role} in {}: {e}", netns.name()))?;
    if !output.status.success() {
        return Err(format!(
            "{role} in {} failed ({}): {}",
            netns.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "{role} in {}: not JSON ({e}): {}",
            netns.name(),
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

impl World {
    /// Builds it all and waits until every route is up and each client
    /// leaves where its route says.
    pub fn build() -> Result<World, String> {
        let net = ExitNet::new(SUBNET);
        let node_ns = net.net.node_ns.name().to_string();
        for i in 0..3 {
            net.net
                .node_ns
                .ip(&[
                    "addr",
                    "add",
                    &format!("{}/24", dante_external(i)),
                    "dev",
                    &net.net.uplink,
                ])
                .map_err(|e| format!("a dante address on the uplink: {e}"))?;
        }
        let dante = dante_in(&node_ns, dante_external(0));
        let failover = [
            Some(dante_in(&node_ns, dante_external(1))),
            Some(dante_in(&node_ns, dante_external(2))),
        ];
        let exit = WgGoExit::start(&net, None);
        let files = tempfile::Builder::new()
            .prefix("blipless-bench-egress-")
            .tempdir()
            .map_err(|e| format!("temporary folder: {e}"))?;
        let exit_file = write_exit_file(files.path(), "exit.conf", &exit.node_file);
        let socks = |name: &str, address: SocketAddr, tag: Option<&str>| {
            format!(
                "[[egress.upstream]]\nname = \"{name}\"\nkind = \"socks5\"\naddress = \"{address}\"\n{}\n",
                tag.map(|t| format!("tags = [\"{t}\"]\n")).unwrap_or_default()
            )
        };
        let mut upstreams = socks(DANTE, dante.address, None);
        for (name, d) in FAILOVER.iter().zip(&failover) {
            let d = d.as_ref().ok_or("no failover dante")?;
            upstreams.push_str(&socks(name, d.address, Some(FAILOVER_TAG)));
        }
        upstreams.push_str(&exit_upstream(EXIT_NAME, &exit_file));
        let (node, clients) = start_node_with(&net, &upstreams, &CLIENTS);
        let listen = SocketAddr::from((origin_ip(&net)?, ORIGIN_PORT));
        let origin = Background::spawn(
            inside_command(
                &net.net.internet,
                "origin",
                &["--listen".into(), listen.to_string()],
            ),
            Some("listening on"),
            Duration::from_secs(10),
        )
        .map_err(|e| format!("the bench's origin: {e}"))?;
        let config = clients[4]
            .wg_config
            .clone()
            .ok_or("client add --wg printed no wg-quick config")?;
        let peer = WireguardGoPeer::start(&net.net.customer, &config, &[&net.net.internet_net])
            .map_err(|e| format!("the wireguard-go client: {e}"))?;
        let world = World {
            peer,
            node,
            clients,
            dante,
            failover,
            origin,
            exit,
            _files: files,
            net,
        };
        for name in [DANTE, FAILOVER[0], FAILOVER[1], EXIT_NAME] {
            world
                .wait_route(name, true, Duration::from_secs(30))
                .ok_or_else(|| {
                    format!(
                        "route {name} not up within 30 s: {}\n{}",
                        blipless_tests::exit_world::egress_json(&world.node.node),
                        world.diagnostics()
                    )
                })?;
        }
        Ok(world)
    }

    /// The proxy client of `route` (None: no proxy).
    pub fn client(&self, route: Route) -> Option<&Added> {
        match route {
            Route::NoProxy | Route::DanteAlone => None,
            Route::Direct => Some(&self.clients[0]),
            Route::Socks => Some(&self.clients[1]),
            Route::Exit => Some(&self.clients[2]),
        }
    }

    /// The failover client.
    pub fn failover_client(&self) -> &Added {
        &self.clients[3]
    }

    /// The harness origin (10.S.2.2:8000: `/`, `/whoami`).
    pub fn harness_origin(&self) -> SocketAddr {
        self.net.net.origin
    }

    /// The bench's origin (10.S.2.2:[`ORIGIN_PORT`]: streams).
    pub fn bench_origin(&self) -> Result<SocketAddr, String> {
        Ok(SocketAddr::from((origin_ip(&self.net)?, ORIGIN_PORT)))
    }

    /// The address the origin sees for `route`.
    pub fn public(&self, route: Route) -> String {
        match route {
            Route::NoProxy | Route::Direct => self.net.node_public.clone(),
            Route::Socks | Route::DanteAlone => dante_external(0).to_string(),
            Route::Exit => self.net.exit_public.clone(),
        }
    }

    /// `--socks --user --secret` for a role run inside the node namespace
    /// as `client`.
    pub fn proxy_args(&self, client: &Added) -> Vec<String> {
        vec![
            "--socks".into(),
            self.node.node.socks.to_string(),
            "--user".into(),
            client.urls.name.clone(),
            "--secret".into(),
            client.urls.secret.clone(),
        ]
    }

    /// `--socks --user --secret --mode` of the `rate` role for `route`.
    pub fn rate_args(&self, route: Route) -> Vec<String> {
        let (mut args, mode) = match (route, self.client(route)) {
            (_, Some(client)) => (self.proxy_args(client), "socks5"),
            (Route::DanteAlone, None) => (
                vec![
                    "--socks".into(),
                    self.dante.address.to_string(),
                    "--user".into(),
                    "-".into(),
                    "--secret".into(),
                    "-".into(),
                ],
                "dante",
            ),
            (_, None) => (self.proxy_args(self.failover_client()), "none"),
        };
        args.extend(["--mode".into(), mode.into()]);
        args
    }

    /// The SOCKS5 proxy URL for curl on `route` (None: no proxy): the
    /// client's, resolved by curl (CONNECT by IPv4, as the bench's own
    /// client does).
    pub fn proxy_url(&self, route: Route) -> Option<String> {
        match (route, self.client(route)) {
            (_, Some(client)) => Some(client.urls.socks.replacen("socks5h://", "socks5://", 1)),
            (Route::DanteAlone, None) => Some(format!("socks5://{}", self.dante.address)),
            (_, None) => None,
        }
    }

    /// `/whoami` through the SOCKS5 `proxy` with curl in the node namespace
    /// (or straight, without one).
    pub fn whoami_via(&self, proxy: Option<&str>) -> Result<String, String> {
        let url = format!("http://{}/whoami", self.harness_origin());
        let body = match proxy {
            Some(proxy) => {
                blipless_tests::exit_world::curl_via(&self.net.net.node_ns, proxy, &url)?
            }
            None => blipless_tests::netns::output(self.net.net.node_ns.command("curl").args([
                "--silent",
                "--show-error",
                "--max-time",
                "20",
                &url,
            ]))
            .map_err(|e| e.to_string())?,
        };
        Ok(String::from_utf8_lossy(&body).trim().to_string())
    }

    /// `/whoami` from the customer namespace, through the WireGuard client.
    pub fn whoami_customer(&self) -> Result<String, String> {
        self.net
            .net
            .try_fetch("/whoami", &["--max-time", "10"])
            .map(|body| String::from_utf8_lossy(&body).trim().to_string())
    }

    /// Whether route `name` is up in `blipless-ctl egress` (None: not listed).
    pub fn route_up(&self, name: &str) -> Option<bool> {
        egress_route(&self.node.node, name).and_then(|route| route["up"].as_bool())
    }

    /// Polls every 50 ms until route `name` is `up` (or `timeout`); how long
    /// it took.
    pub fn wait_route(&self, name: &str, up: bool, timeout: Duration) -> Option<Duration> {
        let started = Instant::now();
        loop {
            if self.route_up(name) == Some(up) {
                return Some(started.elapsed());
            }
            if started.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Restarts failover dante `i` in the node namespace (same port).
    pub fn restart_failover(&mut self, i: usize) -> Result<(), String> {
        let mut dante = self.failover[i].take().ok_or("no such dante")?;
        let netns = self.net.net.node_ns.name().to_string();
        let dante = in_netns(&netns, move || {
            dante.restart();
            dante
        });
        self.failover[i] = Some(dante);
        Ok(())
    }

    /// The last lines of every log, and the node's kernel state.
    pub fn diagnostics(&self) -> String {
        format!(
            "{}\n--- wireguard-go client:\n{}\n--- wireguard-go exit:\n{}\n--- bench origin:\n{}\n{}",
            self.node.logs("node"),
            tail(&self.peer.log()),
            tail(&self.exit.log()),
            tail(&self.origin.output()),
            blipless_tests::exit_world::kernel_state(&self.net.net.node_ns)
        )
    }

    /// Warning and error lines of the node's daemons (every log file).
    pub fn daemon_warnings(&self) -> Vec<String> {
        crate::logs::warning_lines(self.node.node.path())
    }
}

fn origin_ip(net: &ExitNet) -> Result<Ipv4Addr, String> {
    match net.net.origin.ip() {
        std::net::IpAddr::V4(ip) => Ok(ip),
        other => Err(format!("an IPv6 origin {other}")),
    }
}
