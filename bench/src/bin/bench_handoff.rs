//! `blipless-bench-handoff`: ingress restart-by-handoff under WireGuard
//! traffic, for 1, 100 and 1,000 WireGuard peers
//! (`blipless_bench::scenarios::handoff`). Writes its section of
//! docs/BENCHMARKS.md, between `<!-- handoff:begin -->` and
//! `<!-- handoff:end -->`.
//!
//! Needs root (namespaces, TUN, nftables), `ping`, `wireguard-go`, `wg`,
//! `wg-quick`, `nft`, `ip`, `curl` and the release binaries; `make bench`
//! builds them and `scripts/bench.sh` runs it after the other benches.
//! Options: `--out PATH` (default `docs/BENCHMARKS.md`), `--quick` (1 and 10
//! peers, one handoff each, to check the bench itself), `--peers N,N,...`
//! and `--runs N` (other sizes and handoff counts; the command line is in
//! the report), `--logs DIR` (keep the daemons' logs and the client's ping
//! output there), `--handshake-limit N` (the node's
//! `wireguard.handshake_limit`, to see what the handshake rate limit costs
//! a handoff). It sets `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info` (the production log level) unless they are set.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::handoff::{self, Clock, Knobs, Plan, MARKERS};
use clap::Parser;

/// Ingress handoffs under WireGuard traffic.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-handoff", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
    /// The numbers of WireGuard peers to measure at.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = at_least_one)]
    peers: Vec<usize>,
    /// Handoffs at each number of peers.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    runs: Option<usize>,
    /// Keep the daemons' logs in this folder (otherwise they are not kept).
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
    /// The node's `wireguard.handshake_limit` (default: the configuration's).
    #[arg(long, value_name = "N")]
    handshake_limit: Option<usize>,
}

/// A count of one or more.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be 1 or more".into()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut plan = args.section.plan(Plan::quick, Plan::full);
    if !args.peers.is_empty() {
        plan.sizes = &args.peers;
    }
    if let Some(runs) = args.runs {
        plan.runs = runs;
    }
    let knobs = Knobs {
        logs: args.logs.clone(),
        handshake_limit: args.handshake_limit,
    };
    Section {
        name: "blipless-bench-handoff",
        title: "handoff",
        markers: MARKERS,
        privileges: Privileges::Root,
        tools: &[
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
            "curl",
        ],
    }
    .run(
        &args.section.out,
        |machine| {
            eprintln!(
                "blipless-bench-handoff: {} CPUs, {}, kernel {}, load {}; peers {:?}, {} handoff(s) each",
                machine.cpus, machine.model, machine.kernel, machine.load_before, plan.sizes, plan.runs
            );
            let clock = Clock::new();
            plan.sizes
                .iter()
                .map(|&peers| {
                    handoff::measure_size(peers, plan.runs, clock, &knobs)
                        .map_err(|error| format!("{peers} peer(s): {error}"))
                })
                .collect::<Result<Vec<_>, String>>()
        },
        |machine, results| handoff::render(machine, plan, &knobs, results),
    )
}
