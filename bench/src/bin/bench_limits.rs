//! `blipless-bench-limits`: per-client limits (`blipless_bench::scenarios::limits`):
//! a rate limit's accuracy at 1, 10 and 100 Mbit/s, and the limiter's cost
//! on a client it does not hold back. Writes its section of
//! docs/BENCHMARKS.md, between `<!-- limits:begin -->` and `<!-- limits:end -->`.
//!
//! Needs `curl` and the release binaries (`make bench` builds them;
//! `scripts/bench.sh` runs this after the fleet bench). No root; loopback
//! only. Options: `--out PATH` (default `docs/BENCHMARKS.md`), `--quick`. It
//! sets `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` unless they are set.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine};
use blipless_bench::scenarios::limits::{self, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-limits [--out PATH] [--quick]");
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
    let command = match report::prepare("blipless-bench-limits", &["curl"], &shown_args) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let mut machine = Machine::now(command);
    let results = match std::panic::catch_unwind(|| limits::measure(plan)) {
        Ok(results) => results,
        Err(_) => {
            eprintln!("blipless-bench-limits: the bench failed (see the panic above)");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = limits::render(&machine, plan, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-limits: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the limits section of {}", out.display());
    ExitCode::SUCCESS
}
