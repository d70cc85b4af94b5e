//! Fleet-wide visibility: three nodes (an ingress and a device plane each) on one
//! store; clients added in turn on each with `blipless-ctl client add`, each timed
//! from the moment the command returns until it logs in (SOCKS5, RFC 1929) on both
//! other nodes; then removed, timed until both others refuse it.

use std::time::{Duration, Instant};

use blipless_tests::fleet::{login_once, usable};
use blipless_tests::node::Node;

use super::topology::{Kind, Topology};
use super::Plan;
use crate::stats::Percentiles;

/// What one topology measured.
#[derive(Debug, Default)]
pub struct Visibility {
    /// Clients added (and removed).
    pub clients: usize,
    /// How long `blipless-ctl client add` took (it returns once its own node
    /// applied the change).
    pub ctl_add: Percentiles,
    /// From `client add` returning until the client logs in on both other nodes.
    pub added: Percentiles,
    /// The slowest of those.
    pub added_max: Duration,
    /// From `client remove` returning until both other nodes refuse the client.
    pub removed: Percentiles,
}

/// Measures one topology, started for it and stopped after.
pub fn measure(kind: Kind, plan: Plan) -> Visibility {
    let topology = Topology::start(kind);
    let (nodes, daemons) = blipless_tests::fleet::three_nodes(&topology.url());
    let (mut ctl_add, mut added, mut removed) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..plan.visibility_adds {
        let from = &nodes[n % nodes.len()];
        let others: Vec<&Node> = nodes
            .iter()
            .filter(|node| node.socks != from.socks)
            .collect();
        let started = Instant::now();
        let client = from.add_client(&format!("visible{n}"));
        ctl_add.push(started.elapsed());
        let returned = Instant::now();
        for other in &others {
            usable(other, &client.name, &client.secret, Duration::from_secs(30));
        }
        added.push(returned.elapsed());
        let output = from.ctl(&["client", "remove", &client.name]);
        assert!(output.status.success(), "client remove: {output:?}");
        let returned = Instant::now();
        for other in &others {
            while login_once(other, &client.name, &client.secret) == 0 {
                assert!(
                    returned.elapsed() < Duration::from_secs(30),
                    "{} still logs in after its removal",
                    client.name
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        removed.push(returned.elapsed());
    }
    drop(daemons);
    drop(topology);
    Visibility {
        clients: plan.visibility_adds,
        ctl_add: Percentiles::of(ctl_add),
        added_max: added.iter().copied().max().unwrap_or_default(),
        added: Percentiles::of(added),
        removed: Percentiles::of(removed),
    }
}
