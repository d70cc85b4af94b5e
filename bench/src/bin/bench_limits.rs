//! `blipless-bench-limits`: per-client limits (`blipless_bench::scenarios::limits`):
//! a rate limit's accuracy at 1, 10 and 100 Mbit/s, and the limiter's cost
//! on a client it does not hold back. Writes its section of
//! docs/BENCHMARKS.md, between `<!-- limits:begin -->` and `<!-- limits:end -->`.
//!
//! Needs `curl` and the release binaries (`make bench` builds them;
//! `scripts/bench.sh` runs this after the fleet bench). No root; loopback
//! only. Options: `--out PATH` (default `docs/BENCHMARKS.md`), `--quick`. It
//! sets `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` unless they are set.

use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::limits::{self, Plan, MARKERS};
use clap::Parser;

/// Per-client limits: a rate limit's accuracy, and the limiter's cost.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-limits", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = args.section.plan(Plan::quick, Plan::full);
    Section {
        name: "blipless-bench-limits",
        title: "limits",
        markers: MARKERS,
        privileges: Privileges::Any,
        tools: &["curl"],
    }
    .run(
        &args.section.out,
        |_| Ok(limits::measure(plan)),
        |machine, results| limits::render(machine, plan, results),
    )
}
