//! `blipless-bench-scale`: the scale of one node
//! (`blipless_bench::scenarios::scale`): 10,000 and 100,000 clients, each a
//! WireGuard peer, on the embedded SQLite store and on one Redis; the device
//! plane's way to Ready and `/status` 200, both daemons' memory per client
//! and per peer, `client add` at that size and an ingress handoff. Writes its
//! section of docs/BENCHMARKS.md, between `<!-- scale:begin -->` and
//! `<!-- scale:end -->`.
//!
//! Needs `redis-server`, `redis-cli` and `curl` (`make deps` installs them) and
//! the release binaries (`make bench` builds them; `scripts/bench.sh` runs this
//! after the limits bench). Loopback only, no TUN device, no root. Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (1,000 and 10,000 clients, one start each,
//! to check the bench itself). It sets `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info` unless they are set.

use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::scale::{self, Plan, MARKERS};
use clap::Parser;

/// The scale of a node: 100,000 clients and peers in the store.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-scale", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = args.section.plan(Plan::quick, Plan::full);
    Section {
        name: "blipless-bench-scale",
        title: "scale",
        markers: MARKERS,
        privileges: Privileges::Any,
        tools: &["redis-server", "redis-cli", "curl"],
    }
    .run(
        &args.section.out,
        |_| Ok(scale::measure(plan)),
        |machine, results| scale::render(machine, plan, results),
    )
}
