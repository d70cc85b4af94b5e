//! `blipless-bench-fleet`: the store on one Redis, on Sentinel and on Cluster
//! (`blipless_bench::scenarios::fleet`): store operations from one node, how soon
//! a client added on one of three nodes is usable on the others, and failovers
//! under load. Writes its section of docs/BENCHMARKS.md, between
//! `<!-- fleet:begin -->` and `<!-- fleet:end -->`.
//!
//! Needs `redis-server`, `redis-cli` and `curl` (`make deps` installs them) and
//! the release binaries (`make bench` builds them; `scripts/bench.sh` runs this
//! after the main bench). No root. Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (fewer clients and one failover each, to
//! check the bench itself). It sets `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info` unless they are set.

use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::fleet::{self, Plan, MARKERS};
use clap::Parser;

/// The store on one Redis, on Sentinel and on Cluster.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-fleet", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = args.section.plan(Plan::quick, Plan::full);
    Section {
        name: "blipless-bench-fleet",
        title: "fleet",
        markers: MARKERS,
        privileges: Privileges::Any,
        tools: &["redis-server", "redis-cli", "curl"],
    }
    .run(
        &args.section.out,
        |_| Ok(fleet::measure(plan)),
        |machine, results| fleet::render(machine, plan, results),
    )
}
