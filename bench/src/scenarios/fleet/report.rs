//! The fleet bench's section of docs/BENCHMARKS.md, markers included.

use std::fmt::Write as _;
use std::time::Duration;

use super::failover::PROBE_EVERY;
use super::ops::CONCURRENCY;
use super::{Plan, Results, MARKERS};
use crate::format::{millis, verdict, whole_millis};
use crate::report::Machine;

/// Fleet-wide visibility target: a client added on one node is usable on the
/// others within this (issue 16).
pub const VISIBILITY_TARGET: Duration = Duration::from_millis(100);

fn rate(per_second: f64) -> String {
    format!("{per_second:.0}")
}

fn yes(exact: bool) -> &'static str {
    if exact {
        "yes"
    } else {
        "**no**"
    }
}

/// The section for `results`.
pub fn render(machine: &Machine, plan: Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", MARKERS.begin);
    out.push_str("## Fleet store: one Redis, Sentinel, Cluster\n\n");
    out.push_str(
        "Each topology is started for the bench from Debian's `redis-server` on \
         loopback (`blipless_store::testing`: Sentinel is a master, one replica and \
         three sentinels with `down-after-milliseconds 1000`; Cluster is three masters \
         with a replica each and `cluster-node-timeout 1000`). Authentication never \
         touches the store: a device plane holds every client in memory and follows \
         the change feed, so nothing here is on a request's path. Produced by \
         `blipless-bench-fleet` (`make bench` runs it from `scripts/bench.sh`).\n\n",
    );
    machine.header(&mut out);
    out.push('\n');

    out.push_str("### Store operations from one node\n\n");
    let _ = writeln!(
        out,
        "{} clients added one at a time; then 5 flushes of every client's usage, one \
         add after the other as a device plane sends them (on Sentinel and Cluster each \
         add is confirmed by a replica: `WAIT 1` in the same pipeline); then {} usage \
         adds and {} client reads, {CONCURRENCY} at once. Bytes per client: the \
         masters' `used_memory` growth over those clients (record, usage hash, index \
         and feed entries, one usage batch key), divided by their number; on Sentinel \
         and Cluster that growth includes the replication buffers the writes filled, so \
         the one-Redis figure is the closest to the data itself.\n",
        plan.clients, plan.concurrent_ops, plan.concurrent_ops
    );
    out.push_str(
        "| topology | client add p50 / p99 | usage add p50 / p99 | one flush of every client | usage adds/s (32 at once) | client reads/s (32 at once) | bytes per client |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for (kind, ops) in &results.ops {
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} / {} | {} for {} | {} | {} | {:.0} |",
            kind.name(),
            millis(ops.add.p50),
            millis(ops.add.p99),
            millis(ops.usage.p50),
            millis(ops.usage.p99),
            millis(Some(ops.flush_round)),
            ops.clients,
            rate(ops.usage_per_second),
            rate(ops.reads_per_second),
            ops.bytes_per_client,
        );
    }

    out.push_str("\n### A client added on one node, usable on the others\n\n");
    out.push_str(
        "Three nodes (an ingress and a device plane each, release build) on one store. \
         Each client is added with `blipless-ctl client add` on the nodes in turn and \
         timed from the moment the command returns until it logs in (SOCKS5 with \
         RFC 1929) on both other nodes, polled every 2 ms; then removed, timed until \
         both refuse it.\n\n",
    );
    out.push_str(
        "| topology | clients | `client add` takes p50 | usable on both others p50 / p99 / max | refused on both others p50 / p99 | target ≤ 100 ms |\n\
         |---|---|---|---|---|---|\n",
    );
    for (kind, seen) in &results.visibility {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} / {} / {} | {} / {} | {} |",
            kind.name(),
            seen.clients,
            millis(seen.ctl_add.p50),
            millis(seen.added.p50),
            millis(seen.added.p99),
            millis(Some(seen.added_max)),
            millis(seen.removed.p50),
            millis(seen.removed.p99),
            verdict(seen.added_max <= VISIBILITY_TARGET),
        );
    }

    out.push_str("\n### Failover\n\n");
    let _ = writeln!(
        out,
        "Store level: a master SIGKILLed while one store handle adds usage every {} ms \
         to a key it serves, each failed add repeated with its batch number; \
         \"writes resumed\" is from the kill until such an add succeeded again. \
         End to end: `blipless_tests::fleet::failover_under_load` — curl load through \
         SOCKS5 and HTTP CONNECT on one node, clients added with `blipless-ctl` until \
         stored, the master of the SOCKS5 client's usage killed, usage flushed every \
         second; the stored usage is compared with what curl reports moving.\n",
        PROBE_EVERY.as_millis()
    );
    out.push_str(
        "| topology | new master after | writes resumed after | usage adds repeated | usage exact | requests (SOCKS5 + HTTP) | failed | clients added (retried) | usage exact end to end |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (kind, runs) in &results.failovers {
        let resumes = &runs.resumes;
        let list = |f: &dyn Fn(&super::failover::Resume) -> String| {
            resumes.iter().map(f).collect::<Vec<_>>().join(", ")
        };
        let e2e = &runs.end_to_end;
        let _ = writeln!(
            out,
            "| {} | {} (end to end: {}) | {} | {} | {} | {} + {} | {} | {} ({}) | {} |",
            kind.name(),
            list(&|r| whole_millis(r.failover)),
            whole_millis(e2e.failover),
            list(&|r| whole_millis(r.writes_resumed)),
            list(&|r| r.failed_adds.to_string()),
            yes(resumes.iter().all(|r| r.exact)),
            e2e.requests.0,
            e2e.requests.1,
            e2e.failed,
            e2e.added.0,
            e2e.added.1,
            yes(e2e.exact),
        );
    }
    out.push_str(
        "\nWhat the figures say: the time a failover costs writes is Redis's own \
         detection and election (Sentinel's `down-after-milliseconds`, Cluster's \
         `cluster-node-timeout`, here 1 s each; production defaults are 30 s and 15 s, \
         see docs/FLEET.md) plus the next retry; during it no request fails, because \
         nothing on a request's path waits for the store, and held usage lands once \
         when it resumes. A confirmed write costs a replica round trip (`WAIT 1`), \
         which is what the usage add columns show beside one Redis.\n",
    );
    let _ = writeln!(out, "\n{}", MARKERS.end);
    out
}
