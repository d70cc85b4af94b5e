//! `blipless-bench`: connection rate and latency, bulk throughput and
//! memory of a real blipless node on loopback, each beside the same load
//! sent straight to the origin, then deploys under open tunnels and
//! pre-warm, then SOCKS5 UDP ASSOCIATE beside direct UDP; writes
//! docs/BENCHMARKS.md (sections 1–6, each measured and written by its
//! module in `blipless_bench::scenarios`).
//!
//! Run it with `make bench` (release binaries; `scripts/bench.sh` sets
//! `BLIPLESS_PROFILE=release`). Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (tiny bounds, for checking the bench),
//! `--deploy-only` (section 4 alone, for working on it), `--prewarm-only`
//! (section 5 alone), `--udp-only` (section 6 alone, on a node of its
//! own), `--deploy-max N` (section 4's largest size, run even where the
//! open-file limit cannot hold it).
//! Every loop is bounded in count and time; all traffic stays on 127.0.0.1.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use blipless_bench::client::{Https, Mode, Proxies};
use blipless_bench::document::{self, Results};
use blipless_bench::echo;
use blipless_bench::logs::warning_count;
use blipless_bench::procfs::Pids;
use blipless_bench::report::Machine;
use blipless_bench::scenarios::rate::Bounds;
use blipless_bench::scenarios::{bulk, deploy, memory, prewarm, rate, udp};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::tls::TestCa;
use clap::Parser;

/// How much work each section does.
#[derive(Debug, Clone, Copy)]
struct Plan {
    sequential: Bounds,
    concurrent: Bounds,
    bulk_size: u64,
    bulk_runs: usize,
    bulk_bound: Duration,
    tunnels: usize,
    deploy: deploy::Plan,
    prewarm: prewarm::Plan,
    udp: udp::Plan,
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
            deploy: deploy::Plan {
                sizes: [0, 1_000, 10_000],
                runs: 3,
                active: 200,
                cadence: Duration::from_millis(10),
                baseline: Duration::from_secs(2),
                tail: Duration::from_secs(1),
                section_bound: Duration::from_secs(100),
                force_sizes: false,
                busy_runs: 5,
            },
            prewarm: prewarm::Plan {
                clients: 50,
                rounds: 3,
                section_bound: Duration::from_secs(30),
            },
            udp: udp::Plan {
                latency_datagrams: 10_000,
                latency_time: Duration::from_secs(3),
                window: 32,
                rate_time: Duration::from_secs(3),
                payloads: [64, 1200],
            },
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
            deploy: deploy::Plan {
                sizes: [0, 100, 1_000],
                runs: 1,
                active: 50,
                cadence: Duration::from_millis(10),
                baseline: Duration::from_millis(500),
                tail: Duration::from_millis(500),
                section_bound: Duration::from_secs(30),
                force_sizes: false,
                busy_runs: 1,
            },
            prewarm: prewarm::Plan {
                clients: 10,
                rounds: 1,
                section_bound: Duration::from_secs(15),
            },
            udp: udp::Plan {
                latency_datagrams: 1_000,
                latency_time: Duration::from_millis(500),
                window: 32,
                rate_time: Duration::from_millis(500),
                payloads: [64, 1200],
            },
        }
    }
}

/// Connection rate, throughput, memory, deploys, pre-warm and SOCKS5 UDP
/// ASSOCIATE of a blipless node on loopback; writes the whole document.
#[derive(Debug, Parser)]
#[command(name = "blipless-bench", args_override_self = true)]
struct Args {
    /// The document written (all of it: the other benches then rewrite
    /// their own sections in it).
    #[arg(long, value_name = "PATH", default_value = "docs/BENCHMARKS.md")]
    out: PathBuf,
    /// Tiny bounds, to check the bench itself.
    #[arg(long)]
    quick: bool,
    /// Section 4 (deploys under open tunnels) alone, for working on it.
    #[arg(long)]
    deploy_only: bool,
    /// Section 5 (pre-warm) alone.
    #[arg(long)]
    prewarm_only: bool,
    /// Section 6 (SOCKS5 UDP ASSOCIATE) alone, on a node of its own.
    #[arg(long)]
    udp_only: bool,
    /// Section 4's largest size, run even where the open-file limit cannot
    /// hold it.
    #[arg(long, value_name = "N")]
    deploy_max: Option<usize>,
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(echo::ECHO_SERVER_ARG) {
        return echo::serve_echo();
    }
    let args = Args::parse();
    let out = args.out;
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let (deploy_only, prewarm_only, udp_only) =
        (args.deploy_only, args.prewarm_only, args.udp_only);
    if let Some(max) = args.deploy_max {
        plan.deploy.sizes[2] = max;
        plan.deploy.force_sizes = true;
    }
    // 10,000 tunnels need some 40,000 fds across the processes (children inherit the limit).
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now("make bench".into());
    if deploy_only || prewarm_only || udp_only {
        let deploy = if deploy_only {
            eprintln!("deploy under open tunnels (section 4 only)");
            deploy::run(plan.deploy)
        } else {
            deploy::Section::default()
        };
        let prewarm = if prewarm_only {
            eprintln!("pre-warm (section 5 only)");
            prewarm::run(plan.prewarm)
        } else {
            prewarm::Section::default()
        };
        let (udp, udp_warnings) = if udp_only {
            eprintln!("UDP ASSOCIATE beside direct UDP (section 6 only)");
            match udp_alone(plan.udp) {
                Ok(measured) => measured,
                Err(error) => {
                    eprintln!("blipless-bench: {error}");
                    return ExitCode::FAILURE;
                }
            }
        } else {
            (udp::Section::default(), 0)
        };
        machine.finish();
        let results = Results {
            machine,
            rate: rate::Section {
                sequential: Vec::new(),
                concurrent: Vec::new(),
            },
            bulk: Vec::new(),
            bulk_size: plan.bulk_size,
            bulk_bound_s: plan.bulk_bound.as_secs(),
            memory: Vec::new(),
            daemon_warnings: deploy.daemon_warnings + prewarm.daemon_warnings + udp_warnings,
            deploy,
            prewarm,
            udp,
        };
        return write_report(&out, &results);
    }
    eprintln!(
        "blipless-bench: {} CPUs, {}, kernel {}, load {}",
        machine.cpus, machine.model, machine.kernel, machine.load_before
    );
    // The harness's origin and node run their own threads and block: start
    // them outside the benchmark's runtime.
    let origin = Origin::start();
    let mut node = Node::new("");
    // The HTTPS proxy listener too, with a CA of the bench's own (openssl).
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let https = node.enable_https(&leaf.certificate, &leaf.key);
    let (ingress, device, client) = node.start();
    let mut proxies = Proxies::of(&node, &client);
    proxies.https = match Https::new(https, &ca.certificate) {
        Ok(https) => Some(https),
        Err(error) => {
            eprintln!("blipless-bench: the HTTPS client: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut pids = Pids {
        ingress: ingress.pid().as_raw(),
        device: device.pid().as_raw(),
    };

    let runtime = match blipless_bench::runtime(2) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("blipless-bench: starting a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let memory = match memory::run(
        &runtime,
        &mut node,
        device,
        &proxies,
        &mut pids,
        plan.tunnels,
    ) {
        Ok(memory) => memory,
        Err(error) => {
            eprintln!("blipless-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let measured = runtime.block_on(async {
        eprintln!("connection rate and latency");
        let rate = rate::run(&proxies, origin.address, plan.sequential, plan.concurrent).await;
        eprintln!("bulk throughput");
        let streaming = bulk::StreamOrigin::start().await?;
        let bulk = bulk::run(
            &proxies,
            pids,
            streaming.address,
            &Mode::available(&proxies),
            plan.bulk_size,
            plan.bulk_runs,
            plan.bulk_bound,
        )
        .await;
        eprintln!("UDP ASSOCIATE beside direct UDP");
        let udp = udp::run(&proxies, plan.udp).await;
        Ok::<_, std::io::Error>((rate, bulk, udp))
    });
    drop(runtime);
    let (rate, bulk, udp) = match measured {
        Ok(measured) => measured,
        Err(error) => {
            eprintln!("blipless-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The other sections' node stays up but idle while this one runs its own.
    eprintln!("deploy under open tunnels");
    let deploy = deploy::run(plan.deploy);
    eprintln!("pre-warm: first request after a deploy");
    let prewarm = prewarm::run(plan.prewarm);
    machine.finish();
    let daemon_warnings = warning_count(std::iter::once(&ingress).chain(&memory.devices))
        + deploy.daemon_warnings
        + prewarm.daemon_warnings;
    let results = Results {
        machine,
        rate,
        bulk,
        bulk_size: plan.bulk_size,
        bulk_bound_s: plan.bulk_bound.as_secs(),
        memory: memory.held,
        daemon_warnings,
        deploy,
        prewarm,
        udp,
    };
    write_report(&out, &results)
}

/// Section 6 alone, on a node of its own: what it measured and how many
/// warnings its daemons logged (printed, since the node's logs go with it).
fn udp_alone(plan: udp::Plan) -> std::io::Result<(udp::Section, usize)> {
    let mut node = Node::new("");
    let (ingress, device, client) = node.start();
    let proxies = Proxies::of(&node, &client);
    let runtime = blipless_bench::runtime(2)?;
    let section = runtime.block_on(udp::run(&proxies, plan));
    drop(runtime);
    for line in blipless_bench::logs::warning_lines(node.path()) {
        eprintln!("  daemon: {line}");
    }
    Ok((section, warning_count([&ingress, &device])))
}

fn write_report(out: &std::path::Path, results: &Results) -> ExitCode {
    let text = document::render(results);
    if let Err(error) = std::fs::write(out, text) {
        eprintln!("blipless-bench: writing {}: {error}", out.display());
        return ExitCode::FAILURE;
    }
    eprintln!("wrote {}", out.display());
    ExitCode::SUCCESS
}
