//! `blipless-bench-peers`: blipless beside dante, microsocks, tinyproxy,
//! haproxy and nginx (`blipless_bench::scenarios::peers`): the same load
//! from the same client through each, interleaved run by run: connection
//! rate, p50/p99, proxy CPU per connection, one connection's throughput and
//! proxy CPU per GiB, as ratios to direct. Writes its section of
//! docs/BENCHMARKS.md, between `<!-- peers:begin -->` and `<!-- peers:end -->`.
//!
//! Needs the release binaries and Debian's `dante-server`, `microsocks`,
//! `tinyproxy`, `haproxy`, `nginx` and `libnginx-mod-stream` (`make bench`
//! builds and installs them; `scripts/bench.sh` runs this after the limits
//! bench). A peer that is missing or does not start is left out, with the
//! reason in the section; dante needs root (its harness creates a system
//! user), so without root it is left out. Loopback only. Options: `--out
//! PATH` (default `docs/BENCHMARKS.md`), `--quick`, `--only direct,blipless`
//! (measure only those servers; the others still start). It sets
//! `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` unless they are set.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::Machine;
use blipless_bench::scenarios::peers::{self, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-peers [--out PATH] [--quick] [--only SERVER,SERVER,...]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut shown_args = Vec::new();
    let mut only: Vec<String> = Vec::new();
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
            "--only" => match args.next() {
                Some(list) => {
                    shown_args.push(format!("--only {list}"));
                    only = list.split(',').map(str::to_string).collect();
                }
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    for (key, value) in [
        ("BLIPLESS_PROFILE", "release"),
        ("BLIPLESS_TEST_LOG", "info"),
    ] {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, value);
        }
    }
    let profile = std::env::var("BLIPLESS_PROFILE").unwrap_or_default();
    if profile != "release" {
        eprintln!("blipless-bench-peers: warning: BLIPLESS_PROFILE={profile}: figures from a non-release build are not comparable");
    }
    for binary in ["blipless-ingress", "blipless-device", "blipless-ctl"] {
        let path = blipless_tests::bin_dir().join(binary);
        if !path.exists() {
            eprintln!(
                "blipless-bench-peers: {} is missing: run `make bench` (it builds the release binaries)",
                path.display()
            );
            return ExitCode::FAILURE;
        }
    }
    let command = format!(
        "BLIPLESS_PROFILE={profile} BLIPLESS_TEST_LOG={} target/release/blipless-bench-peers{}{}",
        std::env::var("BLIPLESS_TEST_LOG").unwrap_or_default(),
        if shown_args.is_empty() { "" } else { " " },
        shown_args.join(" ")
    );
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now(command);
    let started = std::time::Instant::now();
    let results = match std::panic::catch_unwind(|| peers::measure(plan, &only)) {
        Ok(results) => results,
        Err(_) => {
            eprintln!("blipless-bench-peers: the bench failed (see the panic above)");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    for stopped in &results.stopped {
        eprintln!("blipless-bench-peers: stopped {stopped}");
    }
    let section = peers::render(&machine, plan, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-peers: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "wrote the peers section of {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
