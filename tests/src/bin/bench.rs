//! `blipless-bench`: connection rate and latency, bulk throughput and
//! memory of a real blipless node on loopback, each beside the same load
//! sent straight to the origin; writes docs/BENCHMARKS.md.
//!
//! Run it with `make bench` (release binaries; `scripts/bench.sh` sets
//! `BLIPLESS_PROFILE=release`). Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (tiny bounds, for checking the bench).
//! Every loop is bounded in count and time; all traffic stays on 127.0.0.1.

#[path = "bench/bulk.rs"]
mod bulk;
#[path = "bench/client.rs"]
mod client;
#[path = "bench/memory.rs"]
mod memory;
#[path = "bench/procfs.rs"]
mod procfs;
#[path = "bench/rate.rs"]
mod rate;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/stats.rs"]
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use blipless_tests::node::Node;
use blipless_tests::origin::Origin;

use crate::client::{Mode, Proxies};
use crate::rate::Bounds;

/// How much work each section does.
#[derive(Debug, Clone, Copy)]
struct Plan {
    sequential: Bounds,
    concurrent: Bounds,
    bulk_size: u64,
    bulk_runs: usize,
    bulk_bound: Duration,
    tunnels: usize,
}

impl Plan {
    fn full() -> Self {
        Self {
            sequential: Bounds {
                workers: 1,
                connections: 3_000,
                time: Duration::from_secs(3),
            },
            concurrent: Bounds {
                workers: 32,
                connections: 20_000,
                time: Duration::from_secs(5),
            },
            bulk_size: 2 << 30,
            bulk_runs: 5,
            bulk_bound: Duration::from_secs(10),
            tunnels: 1_000,
        }
    }

    fn quick() -> Self {
        Self {
            sequential: Bounds {
                workers: 1,
                connections: 200,
                time: Duration::from_millis(500),
            },
            concurrent: Bounds {
                workers: 32,
                connections: 1_000,
                time: Duration::from_secs(1),
            },
            bulk_size: 256 << 20,
            bulk_runs: 1,
            bulk_bound: Duration::from_secs(5),
            tunnels: 100,
        }
    }
}

fn main() -> ExitCode {
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => match args.next() {
                Some(path) => out = PathBuf::from(path),
                None => return usage(),
            },
            "--quick" => plan = Plan::quick(),
            _ => return usage(),
        }
    }

    let mut machine = report::Machine::now();
    eprintln!(
        "blipless-bench: {} CPUs, {}, kernel {}, load {}",
        machine.cpus, machine.model, machine.kernel, machine.load_before
    );
    // The harness's origin and node run their own threads and block: start
    // them outside the benchmark's runtime.
    let origin = Origin::start();
    let mut node = Node::new("");
    let (ingress, device, client) = node.start();
    let proxies = Proxies {
        socks: node.socks,
        http: node.http,
        user: client.name.clone(),
        secret: client.secret.clone(),
    };
    let pids = procfs::Pids {
        ingress: ingress.pid().as_raw(),
        device: device.pid().as_raw(),
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("blipless-bench: starting a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let measured = runtime.block_on(async {
        eprintln!("memory: idle, then {} held tunnels per kind", plan.tunnels);
        let memory = memory::run(&proxies, pids, plan.tunnels).await?;
        eprintln!("connection rate and latency");
        let rate = rate::run(&proxies, origin.address, plan.sequential, plan.concurrent).await;
        eprintln!("bulk throughput");
        let streaming = bulk::StreamOrigin::start().await?;
        let bulk = bulk::run(
            &proxies,
            pids,
            streaming.address,
            &Mode::ALL,
            plan.bulk_size,
            plan.bulk_runs,
            plan.bulk_bound,
        )
        .await;
        Ok::<_, std::io::Error>((memory, rate, bulk))
    });
    drop(runtime);
    let (memory, rate, bulk) = match measured {
        Ok(measured) => measured,
        Err(error) => {
            eprintln!("blipless-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    machine.load_after = report::load_average();
    let daemon_warnings = [&ingress, &device]
        .iter()
        .map(|d| {
            d.log_text()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .count()
        })
        .sum();
    let results = report::Results {
        machine,
        rate,
        bulk,
        bulk_size: plan.bulk_size,
        bulk_bound_s: plan.bulk_bound.as_secs(),
        memory,
        daemon_warnings,
    };
    let text = report::render(&results);
    if let Err(error) = std::fs::write(&out, text) {
        eprintln!("blipless-bench: writing {}: {error}", out.display());
        return ExitCode::FAILURE;
    }
    eprintln!("wrote {}", out.display());
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench [--out PATH] [--quick]");
    ExitCode::from(2)
}
