//! `blipless-bench-peers`: blipless beside dante, microsocks, tinyproxy,
//! haproxy and nginx (`blipless_bench::scenarios::peers`): the same load
//! from the same client through each, interleaved run by run: connection
//! rate, p50/p99, proxy CPU per connection, one connection's throughput and
//! proxy CPU per GiB, as ratios to direct. Writes its section of
//! docs/BENCHMARKS.md, between `<!-- peers:begin -->` and `<!-- peers:end -->`.
//!
//! Needs the release binaries and Debian's `dante-server`, `microsocks`,
//! `tinyproxy`, `haproxy`, `nginx` and `libnginx-mod-stream` (`make bench`
//! builds and installs them; `scripts/bench.sh` runs this after the scale
//! bench). A peer that is missing or does not start is left out, with the
//! reason in the section; dante needs root (its harness creates a system
//! user), so without root it is left out. Loopback only. Options: `--out
//! PATH` (default `docs/BENCHMARKS.md`), `--quick`, `--only direct,blipless`
//! (measure only those servers; the others still start). It sets
//! `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` unless they are set.

use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::peers::{self, Plan, MARKERS};
use clap::Parser;

/// blipless beside dante, microsocks, tinyproxy, haproxy and nginx.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-peers", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
    /// Measure only these servers (direct, blipless, dante, microsocks,
    /// tinyproxy, haproxy, nginx); the others still start.
    #[arg(long, value_name = "SERVER,SERVER,...", value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = args.section.plan(Plan::quick, Plan::full);
    Section {
        name: "blipless-bench-peers",
        title: "peers",
        markers: MARKERS,
        // dante needs root (its harness creates a system user): without
        // it, dante is left out and the rest measured.
        privileges: Privileges::Any,
        tools: &[],
    }
    .run(
        &args.section.out,
        |_| {
            let results = peers::measure(plan, &args.only);
            for stopped in &results.stopped {
                eprintln!("blipless-bench-peers: stopped {stopped}");
            }
            Ok(results)
        },
        |machine, results| peers::render(machine, plan, results),
    )
}
