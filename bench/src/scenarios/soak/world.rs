//! The soak's node: one `redis-server` of its own (append-only, fsync on
//! every write, so a SIGKILL and restart keep every client), one ingress and
//! one device plane on it (with an HTTPS proxy listener, its certificate
//! from a CA of the soak's own), the proxy client "alice", and an origin. Without
//! WireGuard it all runs on the host's loopback with the harness's
//! in-process origin; with WireGuard, inside the node namespace of a
//! [`Topology`] (the soak's thread has entered it, so Redis, `blipless-ctl`
//! and the load live there too), with the topology's origin in the
//! internet namespace and a wireguard-go client ("wgalice") in the customer
//! namespace. Also: the daemons' fd counts and RSS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use blipless_tests::node::{ClientUrls, Daemon, Node};
use blipless_tests::origin::Origin;
use blipless_tests::redis::Redis;
use blipless_tests::tls::TestCa;
use blipless_tests::topology::{add_wg_client, Topology, POOL};
use blipless_tests::wireguard::WireguardGoPeer;

use crate::client::{Https, Proxies};
use crate::procfs;

/// Everything the soak runs; fields drop in order, so the client and the
/// daemons go before Redis and the node's folder.
#[derive(Debug)]
pub struct World {
    /// The wireguard-go client in the customer namespace (WireGuard only).
    pub wg_client: Option<WireguardGoPeer>,
    /// The device plane (replaced at each deploy or kill).
    pub device: Daemon,
    /// The ingress (replaced at each handoff or kill).
    pub ingress: Daemon,
    /// The store.
    pub redis: Redis,
    /// The node's files, config and `blipless-ctl`.
    pub node: Node,
    /// The proxy client the load uses.
    pub client: ClientUrls,
    /// The HTTPS proxy listener, and a TLS client that trusts its CA.
    pub https: Https,
    /// Where the load's requests and tunnels go.
    pub origin: SocketAddr,
    /// The in-process origin (without WireGuard), held while the node runs.
    _local_origin: Option<Origin>,
    /// The namespaces (WireGuard only; the soak's caller removes them).
    pub net: Option<Arc<Topology>>,
}

/// A daemon's open fds and resident memory at one moment.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Which daemon.
    pub role: &'static str,
    /// Its process id.
    pub pid: i32,
    /// Open file descriptors.
    pub fds: Option<usize>,
    /// VmRSS, KiB.
    pub rss_kib: Option<u64>,
}

impl World {
    /// Starts Redis, the node and the client; with `net`, inside its node
    /// namespace (the calling thread must have entered it) with WireGuard.
    pub fn build(net: Option<Arc<Topology>>) -> Result<World, String> {
        let redis = Redis::start(true);
        let store = format!("[store]\nurl = \"{}\"\n", redis.url());
        let (mut node, origin, local_origin) = match &net {
            None => {
                let origin = Origin::start();
                (Node::new(&store), origin.address, Some(origin))
            }
            Some(net) => {
                let node = Node::in_netns(
                    net.node_ns.name(),
                    &format!("allow = [\"{}\"]", net.internet_net),
                    &format!(
                        "{store}\n[egress.tun]\nname = \"blip0\"\nout_interface = \"{}\"\nmanage = true\n\n\
                         [wireguard]\nendpoint = \"{}\"\npool = \"{POOL}\"\n",
                        net.uplink,
                        net.endpoint()
                    ),
                );
                (node, net.origin, None)
            }
        };
        let ca = TestCa::new(&node.path().join("ca"));
        let leaf = ca.leaf("proxy", 30);
        let address = node.enable_https(&leaf.certificate, &leaf.key);
        let https =
            Https::new(address, &ca.certificate).map_err(|e| format!("the HTTPS client: {e}"))?;
        let ingress = node.start_ingress();
        let client = node.add_client("alice");
        let wg_config = net.as_ref().map(|_| add_wg_client(&node, "wgalice"));
        let device = node.start_device();
        node.wait_ready();
        let wg_client = match (&net, wg_config) {
            (Some(net), Some(config)) => Some(
                WireguardGoPeer::start(&net.customer, &config, &[net.internet_net.as_str()])
                    .map_err(|e| format!("the wireguard-go client: {e}"))?,
            ),
            _ => None,
        };
        Ok(World {
            wg_client,
            device,
            ingress,
            redis,
            node,
            client,
            https,
            origin,
            _local_origin: local_origin,
            net,
        })
    }

    /// The proxies and alice's credentials, for the load.
    pub fn proxies(&self) -> Proxies {
        Proxies {
            https: Some(self.https.clone()),
            ..Proxies::of(&self.node, &self.client)
        }
    }

    /// The status listener.
    pub fn status(&self) -> SocketAddr {
        self.node.status
    }

    /// Every daemon's fd count and RSS now.
    pub fn figures(&self) -> Vec<Figures> {
        let redis = self
            .redis
            .pid()
            .and_then(|pid| i32::try_from(pid).ok())
            .unwrap_or(0);
        [
            ("blipless-ingress", self.ingress.pid().as_raw()),
            ("blipless-device", self.device.pid().as_raw()),
            ("redis-server", redis),
        ]
        .into_iter()
        .map(|(role, pid)| Figures {
            role,
            pid,
            fds: procfs::fd_count(pid),
            rss_kib: procfs::rss_kib(pid),
        })
        .collect()
    }

    /// Copies the daemons' logs, the ping output and wireguard-go's output
    /// into `target`.
    pub fn keep_logs(&self, target: &Path) {
        let _ = std::fs::remove_dir_all(target);
        if let Err(error) = crate::logs::copy_logs(self.node.path(), target, true) {
            eprintln!(
                "blipless-soak: keeping the logs in {}: {error}",
                target.display()
            );
        }
        if let Some(client) = &self.wg_client {
            let _ = std::fs::write(target.join("wireguard-go.txt"), client.log());
        }
    }
}

/// The pid of the device plane `blipless-ctl status` says is active.
pub fn active_plane_pid(node: &Node) -> Option<u64> {
    node.status_json()["device_planes"]
        .as_array()?
        .iter()
        .find(|plane| plane["state"] == "active")?["pid"]
        .as_u64()
}
