//! `blipless-bench-egress`: egress through an upstream SOCKS5 provider
//! (dante) and through a WireGuard exit (wireguard-go), beside direct, on
//! one node in network namespaces (`blipless_bench::scenarios::egress`):
//! connection rate and latency, one-tunnel throughput, the stall of an inner
//! TCP flow through the exit across device-plane deploys, and failover
//! between two upstreams. Writes its section of docs/BENCHMARKS.md, between
//! `<!-- egress:begin -->` and `<!-- egress:end -->`.
//!
//! Needs root (namespaces, TUN, nftables, dante), `danted` (Debian's
//! dante-server), `wireguard-go`, `wg`, `wg-quick`, `nft`, `ip`, `curl` and
//! the release binaries: `make bench` builds them and `scripts/bench.sh`
//! runs it after the handoff bench. Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (50 connections, 32 MiB, 2 deploys, 1
//! failover, to check the bench itself), `--logs DIR` (keep the daemons'
//! logs there). It sets `BLIPLESS_PROFILE=release` and
//! `BLIPLESS_TEST_LOG=info` (the production log level) unless they are set.
//!
//! `--inside ROLE ...` is this binary re-executed inside a namespace by the
//! bench itself (`scenarios::egress::inside`), not for people.

use std::path::PathBuf;
use std::process::ExitCode;

use blipless_bench::report::{self, Machine, Privileges};
use blipless_bench::scenarios::egress::{self, inside, Plan, MARKERS};

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-egress [--out PATH] [--quick] [--logs DIR]");
    ExitCode::from(2)
}

/// What a panic said.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Whether danted (or upstream's sockd) is on PATH or in an sbin folder,
/// where `blipless_tests::dante::binary` looks.
fn has_dante() -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    ["danted", "sockd"]
        .iter()
        .any(|name| dirs.iter().any(|dir| dir.join(name).is_file()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(inside::FLAG) {
        return inside::main(&args[1..]);
    }
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut logs = None;
    let mut shown_args = Vec::new();
    let mut args = args.into_iter();
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
            "--logs" => match args.next() {
                Some(path) => logs = Some(PathBuf::from(path)),
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    let command = match report::prepare(
        "blipless-bench-egress",
        Privileges::Root,
        &["wireguard-go", "wg", "wg-quick", "nft", "ip", "curl"],
        &shown_args,
    ) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    // danted is in /usr/sbin, which a PATH may lack: the harness looks there too.
    if !has_dante() {
        eprintln!(
            "blipless-bench-egress: missing danted (Debian's dante-server): `make deps` installs it"
        );
        return ExitCode::FAILURE;
    }
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now(command);
    eprintln!(
        "blipless-bench-egress: {} CPUs, {}, kernel {}, load {}; {} connections x {} round(s), {} MiB, {} deploy(s), {} failover(s)",
        machine.cpus,
        machine.model,
        machine.kernel,
        machine.load_before,
        plan.connections,
        plan.rounds,
        plan.download / (1024 * 1024),
        plan.deploys,
        plan.failovers
    );
    // The harness panics on what it cannot set up; the world is torn down
    // (namespaces, dantes, daemons) while the panic unwinds.
    let measured = std::panic::catch_unwind(|| egress::measure(plan, logs.as_deref()));
    let results = match measured {
        Ok(Ok(results)) => results,
        Ok(Err(error)) => {
            eprintln!("blipless-bench-egress: {error}");
            return ExitCode::FAILURE;
        }
        Err(panic) => {
            eprintln!(
                "blipless-bench-egress: the bench failed: {}",
                panic_text(panic.as_ref())
            );
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = egress::render(&machine, plan, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-egress: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the egress section of {}", out.display());
    ExitCode::SUCCESS
}
