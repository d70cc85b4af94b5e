//! A Redis Cluster of six nodes (three masters, one replica each) made by
//! `redis-cli --cluster create`, with a 1 s node timeout so that a killed master fails
//! over in a few seconds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{cli, cli_json, free_port, info_field, logs, wait_until, Mode, Node, SETTLE_TIMEOUT};

/// How many slots a cluster has.
const SLOTS: usize = 16384;

/// A running Redis Cluster; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// The initial masters' ports: the seed list of [`RedisCluster::url`].
    seeds: Vec<u16>,
    /// When each node was killed by [`RedisCluster::kill`].
    killed_at: HashMap<u16, Instant>,
}

impl RedisCluster {
    /// Starts six nodes, makes them a cluster (three masters with a replica each) and
    /// waits until every node sees all slots served and every replica is in sync.
    pub fn start() -> Self {
        let nodes: Vec<Node> = (0..6)
            .map(|_| {
                Node::start(Mode::Server, |port| {
                    let bus = loop {
                        let bus = free_port();
                        if bus != port {
                            break bus;
                        }
                    };
                    format!(
                        "cluster-enabled yes\ncluster-config-file nodes.conf\n\
                         cluster-port {bus}\ncluster-node-timeout 1000\n\
                         cluster-replica-validity-factor 0\n"
                    )
                })
            })
            .collect();
        let mut cluster = Self {
            nodes,
            seeds: Vec::new(),
            killed_at: HashMap::new(),
        };
        let mut create = std::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        create.args(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port())),
        );
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        if let Err(err) = super::run_cli(create, None) {
            panic!("redis-cli --cluster create: {err}\n{}", cluster.logs());
        }
        wait_until(
            SETTLE_TIMEOUT,
            "the new cluster settled",
            || cluster.check(Some(3)),
            || cluster.logs(),
        );
        let masters = cluster.masters().unwrap_or_else(|err| panic!("{err}"));
        cluster.seeds = cluster
            .ports()
            .into_iter()
            .filter(|port| masters.contains(port))
            .collect();
        cluster
    }

    /// The store URL: `redis+cluster://` and the initial masters as seeds.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .seeds
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Every node's port, killed ones included, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }

    /// The port of the master that serves `key`'s slot now, as a live node sees it.
    pub fn master_of_slot_for_key(&self, key: &str) -> u16 {
        self.master_of_slot_for_key_asking(self.live_port(), key)
    }

    /// The port of the master that serves `key`'s slot, as the node on `port`
    /// sees it (one that answers: a stopped node would not).
    pub fn master_of_slot_for_key_asking(&self, port: u16, key: &str) -> u16 {
        let slot: u16 = cli(port, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a slot number");
        let slots = cluster_slots(port).unwrap_or_else(|err| panic!("{err}"));
        slots
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, master)| *master)
            .unwrap_or_else(|| panic!("no master serves slot {slot} ({key:?}): {slots:?}"))
    }

    /// The ports of the nodes that are masters now.
    pub fn master_ports(&self) -> Vec<u16> {
        self.masters().unwrap_or_else(|err| panic!("{err}"))
    }

    /// The pid of the node on `port`, if it runs.
    pub fn pid_of(&self, port: u16) -> Option<i32> {
        self.nodes.iter().find(|node| node.port() == port)?.pid()
    }

    /// Kills the node on `port` (SIGKILL, as a crash would) and waits for it to exit.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
        self.killed_at.insert(port, Instant::now());
    }

    /// Starts the killed node on `port` again (same port, dir and `nodes.conf`); a
    /// master that was failed over meanwhile rejoins as a replica.
    pub fn restart_node(&mut self, port: u16) {
        self.node_mut(port).restart();
    }

    /// Waits until every surviving node reports `cluster_state:ok` with all slots
    /// served, no slot is served by `dead_port` any more, and each serving master says
    /// it is one (`ROLE`). The time since [`RedisCluster::kill`] killed it (or since
    /// this call, for a node it did not kill).
    pub fn wait_for_failover(&self, dead_port: u16) -> Duration {
        let since = self
            .killed_at
            .get(&dead_port)
            .copied()
            .unwrap_or_else(Instant::now);
        wait_until(
            SETTLE_TIMEOUT,
            &format!("failover of the node on port {dead_port}"),
            || {
                self.check(None)?;
                for node in self.live() {
                    for (start, end, master) in cluster_slots(node.port())? {
                        if master == dead_port || !self.is_live(master) {
                            return Err(format!(
                                "port {} says slots {start}-{end} are on {master}",
                                node.port()
                            ));
                        }
                    }
                }
                self.masters().map(drop)
            },
            || self.logs(),
        );
        since.elapsed()
    }

    /// Deletes every key (`FLUSHALL` on each master; replicas follow), so that one
    /// cluster can serve several tests in turn.
    pub fn flush_all(&self) {
        for port in self.masters().unwrap_or_else(|err| panic!("{err}")) {
            cli(port, &["FLUSHALL"]);
        }
    }

    /// Waits until every live node reports `cluster_state:ok` with all slots served and
    /// every live replica is in sync with its master.
    pub fn wait_ok(&self) {
        wait_until(
            SETTLE_TIMEOUT,
            "cluster ok",
            || self.check(None),
            || self.logs(),
        );
    }

    /// Whether the cluster is ok on every live node, each live replica's link is up,
    /// and (if given) that many replicas are live.
    fn check(&self, replicas: Option<usize>) -> Result<(), String> {
        let mut live_replicas = 0;
        for node in self.live() {
            let port = node.port();
            let info = super::try_cli(port, &["CLUSTER", "INFO"], None)?;
            let state = info_field(&info, "cluster_state");
            let served = info_field(&info, "cluster_slots_ok");
            if state != Some("ok") || served != Some(&SLOTS.to_string()) {
                return Err(format!("port {port}: state {state:?}, {served:?} slots ok"));
            }
            let replication = super::try_cli(port, &["INFO", "replication"], None)?;
            if info_field(&replication, "role") == Some("slave") {
                live_replicas += 1;
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica on port {port}: master link {link:?}"));
                }
            }
        }
        match replicas {
            Some(wanted) if wanted != live_replicas => {
                Err(format!("{live_replicas} replicas, not {wanted}"))
            }
            _ => Ok(()),
        }
    }

    /// The ports of the live nodes whose `ROLE` is master.
    fn masters(&self) -> Result<Vec<u16>, String> {
        let mut masters = Vec::new();
        for node in self.live() {
            let role = cli_json(node.port(), &["ROLE"])?;
            if role.get(0).and_then(|r| r.as_str()) == Some("master") {
                masters.push(node.port());
            }
        }
        Ok(masters)
    }

    fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|node| node.is_running())
    }

    fn is_live(&self, port: u16) -> bool {
        self.live().any(|node| node.port() == port)
    }

    fn live_port(&self) -> u16 {
        self.live()
            .next()
            .map(Node::port)
            .expect("a live node in the cluster")
    }

    fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn logs(&self) -> String {
        logs(&self.nodes)
    }
}

/// `CLUSTER SLOTS` as a node sees it: (first slot, last slot, master's port) per range.
fn cluster_slots(port: u16) -> Result<Vec<(u16, u16, u16)>, String> {
    let reply = cli_json(port, &["CLUSTER", "SLOTS"])?;
    let ranges = reply.as_array().ok_or("CLUSTER SLOTS is not an array")?;
    ranges
        .iter()
        .map(|range| {
            let number = |value: Option<&serde_json::Value>| {
                value
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| format!("port {port}: odd CLUSTER SLOTS entry {range}"))
            };
            let master_port = range.get(2).and_then(|master| master.get(1));
            Ok((
                number(range.get(0))?,
                number(range.get(1))?,
                number(master_port)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{cli, cli_script};
    use super::RedisCluster;

    /// A key written (and replicated, `WAIT`) before its master is killed is read back
    /// from the replica promoted in its place.
    #[test]
    fn failover_keeps_a_replicated_key() {
        let started = std::time::Instant::now();
        let mut cluster = RedisCluster::start();
        let ready = started.elapsed();
        assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
        let entry = cluster.ports()[0];
        // One session: -c follows the redirect to k's master, and WAIT runs there.
        let wrote = cli_script(entry, &["-c"], "SET k v\nWAIT 1 5000\n");
        let replies: Vec<&str> = wrote.lines().filter(|l| !l.starts_with("->")).collect();
        assert_eq!(replies, ["OK", "1"], "SET and WAIT answered {wrote:?}");
        assert_eq!(cli(entry, &["-c", "GET", "k"]).trim(), "v");
        let old = cluster.master_of_slot_for_key("k");
        cluster.kill(old);
        let took = cluster.wait_for_failover(old);
        let new = cluster.master_of_slot_for_key("k");
        assert_ne!(new, old, "k's slot is still on the killed master");
        assert_eq!(cli(new, &["-c", "GET", "k"]).trim(), "v");
        cluster.restart_node(old);
        cluster.wait_ok();
        eprintln!(
            "cluster: started in {ready:?}, failover in {took:?}, test in {:?}",
            started.elapsed()
        );
    }
}
