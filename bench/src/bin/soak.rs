//! `blipless-soak`: the chaos soak (`blipless_bench::scenarios::soak`).
//! Mixed load on one node while device-plane deploys, ingress handoffs,
//! SIGKILLs of either plane and of Redis, and client add/remove happen at
//! random (seeded) moments; then the checks. Writes docs/RELIABILITY.md and
//! exits 1 when a check fails.
//!
//! Options: `--seconds N` (600; `SOAK_SECONDS` in `make soak`), `--quick`
//! (60 s), `--seed N` (the schedule; printed, so a run can be repeated),
//! `--out PATH` (default `docs/RELIABILITY.md`), `--no-wg` (without the
//! WireGuard stream, which needs root), `--logs DIR` (where the daemons'
//! logs are kept, default `target/soak-logs`). `make soak` builds the
//! release binaries and runs it with `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info`, which it also sets itself unless they are set.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine, Privileges};
use blipless_bench::scenarios::soak::{self, Options};
use clap::Parser;

const NAME: &str = "blipless-soak";
/// What the WireGuard stream needs on PATH.
const WG_TOOLS: [&str; 7] = [
    "ping",
    "wireguard-go",
    "wg",
    "wg-quick",
    "nft",
    "ip",
    "curl",
];

/// The chaos soak: mixed load on one node while deploys, handoffs and
/// SIGKILLs happen at random; writes docs/RELIABILITY.md and exits 1 when a
/// check fails.
#[derive(Debug, Parser)]
#[command(name = NAME, args_override_self = true)]
struct Args {
    /// How long the load and the chaos last (10 or more).
    #[arg(long, value_name = "N", default_value_t = 600, value_parser = clap::value_parser!(u64).range(10..))]
    seconds: u64,
    /// 60 seconds, whatever `--seconds` says.
    #[arg(long)]
    quick: bool,
    /// The schedule's seed (printed, so a run can be repeated; default: the clock).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// The report written.
    #[arg(long, value_name = "PATH", default_value = "docs/RELIABILITY.md")]
    out: PathBuf,
    /// Without the WireGuard stream (which needs root).
    #[arg(long)]
    no_wg: bool,
    /// Where the daemons' logs are kept (default: target/soak-logs).
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seconds = if args.quick { 60 } else { args.seconds };
    let out = args.out;
    let no_wg = args.no_wg;
    let logs = args.logs.unwrap_or_else(|| {
        PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
            .join("soak-logs")
    });
    let seed = args.seed;
    let mut extra_args = Vec::new();
    if out != std::path::Path::new("docs/RELIABILITY.md") {
        extra_args.push(format!("--out {}", out.display()));
    }
    if no_wg {
        extra_args.push("--no-wg".to_string());
    }
    let seed = seed.unwrap_or_else(soak::clock_seed);
    let mut shown_args = vec![format!("--seconds {seconds}"), format!("--seed {seed}")];
    shown_args.extend(extra_args);
    let root = nix::unistd::geteuid().is_root();
    let missing: Vec<&str> = WG_TOOLS
        .iter()
        .copied()
        .filter(|tool| !report::on_path(tool))
        .collect();
    let wireguard = if no_wg {
        Err("`--no-wg`".to_string())
    } else if !root {
        Err(
            "not root (the WireGuard stream needs network namespaces, a TUN device and nftables)"
                .into(),
        )
    } else if !missing.is_empty() {
        Err(format!(
            "missing {} (`make deps` installs them)",
            missing.join(", ")
        ))
    } else {
        Ok(())
    };
    let prepared = if root {
        let mut tools = vec!["redis-server", "redis-cli"];
        if wireguard.is_ok() {
            tools.extend(WG_TOOLS);
        }
        report::prepare(NAME, Privileges::Root, &tools, &shown_args)
    } else {
        report::prepare(NAME, Privileges::Any, &[], &shown_args)
    };
    let command = match prepared {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(why) = &wireguard {
        eprintln!("{NAME}: without WireGuard: {why}");
    }
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now(command);
    eprintln!(
        "{NAME}: {} CPUs, {}, kernel {}, load {}; {seconds} s, seed {seed} (`--seed {seed}` repeats the schedule)",
        machine.cpus, machine.model, machine.kernel, machine.load_before
    );
    let options = Options {
        seconds,
        seed,
        wireguard,
        logs,
    };
    let outcome = match soak::run(&options) {
        Ok(outcome) => outcome,
        Err(error) => {
            eprintln!("{NAME}: {error}");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let summary = soak::summarise(&outcome);
    let checks = soak::checks(&outcome, &summary);
    let text = soak::render(&machine, &options, &outcome, &summary, &checks);
    if let Err(error) = std::fs::write(&out, text) {
        eprintln!("{NAME}: writing {}: {error}", out.display());
        return ExitCode::FAILURE;
    }
    for check in &checks {
        eprintln!(
            "{} {}: {}",
            if check.pass { "pass" } else { "FAIL" },
            check.what,
            check.seen.replace("<br>", "; ")
        );
    }
    eprintln!("wrote {}", out.display());
    if checks.iter().all(|c| c.pass) {
        ExitCode::SUCCESS
    } else {
        eprintln!("{NAME}: a check failed (seed {seed})");
        ExitCode::FAILURE
    }
}
