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
//! after the limits bench). Loopback only, no TUN device; `report::prepare`
//! asks for root as for the other benches. Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (1,000 and 10,000 clients, one start each,
//! to check the bench itself). It sets `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info` unless they are set.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine};
use blipless_bench::scenarios::scale::{self, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-scale [--out PATH] [--quick]");
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
        "blipless-bench-scale",
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
    let started = std::time::Instant::now();
    let results = match std::panic::catch_unwind(|| scale::measure(plan)) {
        Ok(results) => results,
        Err(_) => {
            eprintln!("blipless-bench-scale: the bench failed (see the panic above)");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = scale::render(&machine, plan, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-scale: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "wrote the scale section of {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
