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

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine};
use blipless_bench::scenarios::wireguard::{self, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-wg [--out PATH] [--quick] [--no-offload] [--workers N]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut shown_args = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => match args.next() {
                Some(path) => {
                    shown_args.push(format!("--out {path}"));
                    out = PathBuf::from(path);
                }
                None => return usage(),
            },
            "--quick" => {
                shown_args.push(arg.clone());
                plan = Plan {
                    offload: plan.offload,
                    workers: plan.workers,
                    ..Plan::quick()
                };
            }
            "--no-offload" => {
                shown_args.push(arg.clone());
                plan.offload = false;
            }
            "--workers" => match args.next().and_then(|n| n.parse().ok()) {
                Some(workers) => {
                    shown_args.push(format!("--workers {workers}"));
                    plan.workers = Some(workers);
                }
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    let command = match report::prepare(
        "blipless-bench-wg",
        &[
            "iperf3",
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
        ],
        &shown_args,
    ) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now(command);
    eprintln!(
        "blipless-bench-wg: {} CPUs, {}, kernel {}, load {}; {} s runs, {} repeat(s)",
        machine.cpus,
        machine.model,
        machine.kernel,
        machine.load_before,
        plan.seconds,
        plan.repeats
    );

    let (blipless, baseline) = match wireguard::measure(plan) {
        Ok(results) => results,
        Err(error) => {
            eprintln!("blipless-bench-wg: {error}");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = wireguard::render(&machine, plan, &blipless, &baseline);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-wg: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the WireGuard section of {}", out.display());
    ExitCode::SUCCESS
}
