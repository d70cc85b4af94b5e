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

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine};
use blipless_bench::scenarios::fleet::{self, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-fleet [--out PATH] [--quick]");
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
                plan = Plan::quick();
            }
            _ => return usage(),
        }
    }
    if std::env::var_os("BLIPLESS_PROFILE").is_none() {
        std::env::set_var("BLIPLESS_PROFILE", "release");
    }
    if std::env::var_os("BLIPLESS_TEST_LOG").is_none() {
        std::env::set_var("BLIPLESS_TEST_LOG", "info");
    }
    let command = match report::prepare(
        "blipless-bench-fleet",
        &["redis-server", "redis-cli", "curl"],
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
    let results = match std::panic::catch_unwind(|| fleet::measure(plan)) {
        Ok(results) => results,
        Err(_) => {
            eprintln!("blipless-bench-fleet: the bench failed (see the panic above)");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = fleet::render(&machine, plan, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-fleet: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the fleet section of {}", out.display());
    ExitCode::SUCCESS
}
