//! `blipless-bench-wg`: TCP throughput (iperf3) and ping latency through a
//! WireGuard tunnel, blipless beside wireguard-go as the server, in network
//! namespaces (`blipless_bench::scenarios::wireguard`). Writes its section
//! of docs/BENCHMARKS.md, between `<!-- wireguard:begin -->` and
//! `<!-- wireguard:end -->`.
//!
//! Needs root (namespaces, TUN, nftables), `iperf3`, `ping`, `wireguard-go`,
//! `wg`, `nft`, and the release binaries: `make bench` builds them and runs
//! it from `scripts/bench.sh` after the main bench (which rewrites the whole
//! file). Options: `--out PATH` (default `docs/BENCHMARKS.md`), `--quick`
//! (2-second runs, once each, to check the bench itself), `--no-offload`
//! (blipless without `egress.tun.offload`, which it otherwise turns on),
//! `--workers N` (blipless's `wireguard.workers`; default one per core). It sets
//! `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` (the production
//! log level) unless they are set.

use std::process::ExitCode;

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::wireguard::{self, Plan, MARKERS};
use clap::Parser;

/// WireGuard throughput and latency, blipless beside wireguard-go.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-wg", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
    /// blipless without `egress.tun.offload` (otherwise on).
    #[arg(long)]
    no_offload: bool,
    /// blipless's `wireguard.workers` (default: one per core).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut plan = args.section.plan(Plan::quick, Plan::full);
    plan.offload = !args.no_offload;
    plan.workers = args.workers;
    Section {
        name: "blipless-bench-wg",
        title: "WireGuard",
        markers: MARKERS,
        privileges: Privileges::Root,
        tools: &[
            "iperf3",
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
        ],
    }
    .run(
        &args.section.out,
        |machine| {
            eprintln!(
                "blipless-bench-wg: {} CPUs, {}, kernel {}, load {}; {} s runs, {} repeat(s)",
                machine.cpus,
                machine.model,
                machine.kernel,
                machine.load_before,
                plan.seconds,
                plan.repeats
            );
            wireguard::measure(plan)
        },
        |machine, (blipless, baseline)| wireguard::render(machine, plan, blipless, baseline),
    )
}
