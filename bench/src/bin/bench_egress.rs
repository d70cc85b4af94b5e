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

use blipless_bench::cli::{Section, SectionArgs};
use blipless_bench::report::Privileges;
use blipless_bench::scenarios::egress::{self, inside, Plan, MARKERS};
use clap::Parser;

/// Egress through a SOCKS5 upstream and a WireGuard exit, beside direct.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench-egress", args_override_self = true)]
struct Args {
    #[command(flatten)]
    section: SectionArgs,
    /// Keep the daemons' logs in this folder (otherwise they are not kept).
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
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
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some(inside::FLAG) {
        return inside::main(&raw[1..]);
    }
    let args = Args::parse();
    let plan = args.section.plan(Plan::quick, Plan::full);
    Section {
        name: "blipless-bench-egress",
        title: "egress",
        markers: MARKERS,
        privileges: Privileges::Root,
        tools: &["wireguard-go", "wg", "wg-quick", "nft", "ip", "curl"],
    }
    .run(
        &args.section.out,
        |machine| {
            // danted is in /usr/sbin, which a PATH may lack (so not among
            // the tools checked on PATH): the harness looks there too.
            if !has_dante() {
                return Err("missing danted (Debian's dante-server): `make deps` installs it".into());
            }
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
            // The harness panics on what it cannot set up; the world is
            // torn down (namespaces, dantes, daemons) while the panic unwinds.
            egress::measure(plan, args.logs.as_deref())
        },
        |machine, results| egress::render(machine, plan, results),
    )
}
