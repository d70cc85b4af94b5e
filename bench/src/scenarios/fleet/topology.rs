//! The three store topologies the fleet bench runs on, started from Debian's
//! `redis-server` by `blipless_store::testing`, and the memory their masters use.

use blipless_store::testing::{cli, Mode, Node, RedisCluster, RedisSentinel};

/// Which topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One `redis-server`.
    One,
    /// A master, a replica and three sentinels.
    Sentinel,
    /// Three masters, each with a replica.
    Cluster,
}

impl Kind {
    /// Every topology, in the order the report lists them.
    pub const ALL: [Kind; 3] = [Kind::One, Kind::Sentinel, Kind::Cluster];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::One => "one Redis",
            Kind::Sentinel => "Sentinel (master + replica, 3 sentinels)",
            Kind::Cluster => "Cluster (3 masters + 3 replicas)",
        }
    }
}

/// A running topology.
#[derive(Debug)]
pub enum Topology {
    /// One server.
    One(Node),
    /// Sentinel.
    Sentinel(RedisSentinel),
    /// Cluster.
    Cluster(RedisCluster),
}

impl Topology {
    /// Starts one of `kind`.
    pub fn start(kind: Kind) -> Self {
        match kind {
            Kind::One => Topology::One(Node::start(Mode::Server, |_| String::new())),
            Kind::Sentinel => Topology::Sentinel(RedisSentinel::start()),
            Kind::Cluster => Topology::Cluster(RedisCluster::start()),
        }
    }

    /// The store URL.
    pub fn url(&self) -> String {
        match self {
            Topology::One(node) => format!("redis://127.0.0.1:{}/0", node.port()),
            Topology::Sentinel(sentinel) => sentinel.url(),
            Topology::Cluster(cluster) => cluster.url(),
        }
    }

    /// The masters' ports.
    fn masters(&self) -> Vec<u16> {
        match self {
            Topology::One(node) => vec![node.port()],
            Topology::Sentinel(sentinel) => vec![sentinel.master_port()],
            Topology::Cluster(cluster) => cluster
                .ports()
                .into_iter()
                .filter(|port| {
                    blipless_store::testing::try_cli(*port, &["ROLE"], None)
                        .is_ok_and(|role| role.lines().next() == Some("master"))
                })
                .collect(),
        }
    }

    /// Bytes of data the masters hold (`used_memory` less `used_memory_startup`).
    pub fn data_bytes(&self) -> u64 {
        self.masters()
            .into_iter()
            .map(|port| {
                let info = cli(port, &["INFO", "memory"]);
                let field = |name: &str| {
                    info.lines()
                        .find_map(|line| line.strip_prefix(&format!("{name}:")))
                        .and_then(|value| value.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                field("used_memory").saturating_sub(field("used_memory_startup"))
            })
            .sum()
    }
}
