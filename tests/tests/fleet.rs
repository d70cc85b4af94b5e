//! Fleets on Redis Sentinel and Redis Cluster (issue 16), with the real daemons
//! and curl as the client (`blipless_tests::fleet`): a master SIGKILLed while
//! SOCKS5 and HTTP CONNECT load runs and clients are added costs no request, no
//! client and no byte of usage, and on a Cluster of three nodes a client added on
//! one is usable on the others at once.
//!
//! Each test starts its own topology (`blipless_store::testing`) on free loopback
//! ports and kills every process it started when it ends.

use std::time::{Duration, Instant};

use blipless_store::testing::{RedisCluster, RedisSentinel};
use blipless_tests::fleet::{failover_under_load, login_once, usable, FailoverReport};

/// What every failover must show: no failed request, usage exact, and (where
/// `a_flush_fails`) the repeat of a failed flush exercised. On a Cluster the
/// redis crate's client retries a request to a failing slot by itself for a few
/// seconds, so a flush may only be slow there, not fail.
fn check(report: &FailoverReport, a_flush_fails: bool) {
    assert!(
        report.socks.failures.is_empty(),
        "SOCKS5 failures: {:?}",
        report.socks.failures
    );
    assert!(
        report.http.failures.is_empty(),
        "HTTP failures: {:?}",
        report.http.failures
    );
    assert!(
        !report.added.is_empty(),
        "no client was added during the failover"
    );
    assert_eq!(
        report.stored_usage,
        Some(report.expected_usage),
        "alice's usage (up, down, connections)"
    );
    assert!(
        report.a_flush_failed || !a_flush_fails,
        "no usage flush failed during the failover: its repeat was not tested"
    );
    let retried = report.added.iter().filter(|(_, tries)| *tries > 1).count();
    eprintln!(
        "failover: new master {} ms after the kill; {} SOCKS5 and {} HTTP requests, 0 failed; \
         {} clients added ({retried} needed a retry), each usable within {:?}; usage exact",
        report.failover.as_millis(),
        report.socks.requests,
        report.http.requests,
        report.added.len(),
        report.slowest_usable,
    );
}

#[test]
fn a_sentinel_failover_under_load_fails_no_request_and_loses_no_usage() {
    let mut sentinel = RedisSentinel::start();
    let url = sentinel.url();
    let report = failover_under_load(&url, || {
        let old = sentinel.kill_master();
        sentinel.wait_for_new_master(old)
    });
    check(&report, true);
}

#[test]
fn a_cluster_failover_under_load_fails_no_request_and_loses_no_usage() {
    let mut cluster = RedisCluster::start();
    let url = cluster.url();
    let report = failover_under_load(&url, || {
        // The master of alice's usage (a third of the new clients' records too).
        let port = cluster.master_of_slot_for_key("{pc_alice}:usage");
        cluster.kill(port);
        cluster.wait_for_failover(port)
    });
    check(&report, false);
}

#[test]
fn on_a_cluster_a_client_added_on_one_node_is_usable_on_the_others_at_once() {
    let cluster = RedisCluster::start();
    let (nodes, _daemons) = blipless_tests::fleet::three_nodes(&cluster.url());
    let mut slowest = Duration::ZERO;
    for n in 0..10 {
        let from = &nodes[n % 3];
        let client = from.add_client(&format!("everywhere{n}"));
        for other in nodes.iter().filter(|node| node.socks != from.socks) {
            let took = usable(other, &client.name, &client.secret, Duration::from_secs(10));
            slowest = slowest.max(took);
        }
        // Removal likewise: refused on every node once the remove returns.
        let output = from.ctl(&["client", "remove", &client.name]);
        assert!(output.status.success(), "remove: {output:?}");
        for other in nodes.iter() {
            let started = Instant::now();
            while login_once(other, &client.name, &client.secret) == 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{} still works after its removal",
                    client.name
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    eprintln!(
        "cluster fleet: a client added on one node was usable on the others within {slowest:?}"
    );
}
