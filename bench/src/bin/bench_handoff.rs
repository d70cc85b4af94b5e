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

use blipless_bench::report::{self, Machine, Privileges};
use blipless_bench::scenarios::handoff::{self, Clock, Knobs, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!(
        "usage: blipless-bench-handoff [--out PATH] [--quick] [--peers N,N,...] [--runs N] [--logs DIR] [--handshake-limit N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut sizes: Vec<usize> = Vec::new();
    let mut runs_override = None;
    let mut knobs = Knobs::default();
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
                plan = Plan::quick();
            }
            "--peers" => {
                let Some(list) = args.next() else {
                    return usage();
                };
                let parsed: Result<Vec<usize>, _> = list.split(',').map(str::parse).collect();
                match parsed {
                    Ok(parsed) if parsed.iter().all(|n| *n >= 1) && !parsed.is_empty() => {
                        shown_args.push(format!("--peers {list}"));
                        sizes = parsed;
                    }
                    _ => return usage(),
                }
            }
            "--logs" => match args.next() {
                Some(path) => knobs.logs = Some(PathBuf::from(path)),
                None => return usage(),
            },
            "--handshake-limit" => match args.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(limit) => {
                    shown_args.push(format!("--handshake-limit {limit}"));
                    knobs.handshake_limit = Some(limit);
                }
                None => return usage(),
            },
            "--runs" => match args.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(runs) if runs >= 1 => {
                    shown_args.push(format!("--runs {runs}"));
                    runs_override = Some(runs);
                }
                _ => return usage(),
            },
            _ => return usage(),
        }
    }
    if !sizes.is_empty() {
        plan.sizes = &sizes;
    }
    if let Some(runs) = runs_override {
        plan.runs = runs;
    }
    let command = match report::prepare(
        "blipless-bench-handoff",
        Privileges::Root,
        &[
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
            "curl",
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
        "blipless-bench-handoff: {} CPUs, {}, kernel {}, load {}; peers {:?}, {} handoff(s) each",
        machine.cpus, machine.model, machine.kernel, machine.load_before, plan.sizes, plan.runs
    );
    let clock = Clock::new();
    let mut results = Vec::new();
    for &peers in plan.sizes {
        match handoff::measure_size(peers, plan.runs, clock, &knobs) {
            Ok(result) => results.push(result),
            Err(error) => {
                eprintln!("blipless-bench-handoff: {peers} peer(s): {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    machine.finish();
    let section = handoff::render(&machine, plan, &knobs, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-handoff: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the handoff section of {}", out.display());
    ExitCode::SUCCESS
}
