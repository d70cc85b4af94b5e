//! Per-client limits (docs/LIMITS.md): how close a rate limit holds at 1,
//! 10 and 100 Mbit/s, and what the limiter costs a client it does not hold
//! back: an unlimited client beside one limited to 100 Gbit/s each way (the
//! limiter's path taken on every read, its limit never reached), interleaved
//! run by run, for one tunnel's bulk and for new connections.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::node::{ClientUrls, Node};
use blipless_tests::origin::Origin;

use crate::client::{self, Mode, Proxies};
use crate::procfs::{Cpu, Pids};
use crate::report::{Machine, Markers};
use crate::scenarios::bulk::StreamOrigin;
use crate::stats::upper_median;

/// The upper median of `values` (0 when empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    upper_median(values).unwrap_or(0.0)
}

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- limits:begin -->",
    end: "<!-- limits:end -->",
};

/// The rates whose accuracy is measured, Mbit/s.
pub const RATES: [u64; 3] = [1, 10, 100];

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Seconds each accuracy download lasts at its rate.
    pub seconds: u64,
    /// Runs of each measurement (the median is shown).
    pub runs: usize,
    /// Bytes of each bulk download.
    pub bulk_bytes: u64,
    /// How long each connection-rate run lasts.
    pub connection_time: Duration,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            seconds: 8,
            runs: 3,
            bulk_bytes: 1 << 30,
            connection_time: Duration::from_secs(3),
        }
    }

    /// Checks the bench itself.
    pub fn quick() -> Self {
        Self {
            seconds: 2,
            runs: 1,
            bulk_bytes: 64 << 20,
            connection_time: Duration::from_millis(500),
        }
    }
}

/// One rate's accuracy.
#[derive(Debug, Clone)]
pub struct Accuracy {
    /// The limit, Mbit/s.
    pub limit_mbit: u64,
    /// What the downloads achieved, Mbit/s (median).
    pub achieved_mbit: f64,
}

/// One client's cost figures.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    /// One tunnel's bulk, MB/s (median).
    pub bulk_mb_s: f64,
    /// Proxy CPU (ingress + device plane) per GiB of bulk, s (median).
    pub cpu_s_per_gib: f64,
    /// New SOCKS5 connections per second, one at a time (median).
    pub connections_s: f64,
    /// Proxy CPU per connection, µs (median).
    pub cpu_us_per_connection: f64,
}

/// Everything measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Per rate.
    pub accuracy: Vec<Accuracy>,
    /// The unlimited client.
    pub unlimited: Cost,
    /// The client limited to 100 Gbit/s each way.
    pub unbinding: Cost,
}

fn ctl(node: &Node, args: &[&str]) {
    let output = node.ctl(args);
    assert!(
        output.status.success(),
        "blipless-ctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// curl through `client`'s SOCKS5 URL for `url`, body discarded; the wall time.
fn download(client: &ClientUrls, url: &str) -> Duration {
    let started = Instant::now();
    let status = Command::new("curl")
        .args([
            "-s",
            "-S",
            "--max-time",
            "300",
            "-o",
            "/dev/null",
            "--proxy",
        ])
        .arg(&client.socks)
        .arg(url)
        .stdin(Stdio::null())
        .status()
        .expect("running curl");
    assert!(status.success(), "curl {url} failed: {status}");
    started.elapsed()
}

fn proxy_cpu(cpu: Cpu) -> f64 {
    cpu.device + cpu.ingress
}

/// Sequential SOCKS5 connections with a tiny exchange for `time`: (per
/// second, proxy CPU µs per connection).
fn connections(
    runtime: &tokio::runtime::Runtime,
    proxies: &Proxies,
    origin: std::net::SocketAddr,
    pids: Pids,
    time: Duration,
) -> (f64, f64) {
    let before = Cpu::now(pids);
    let started = Instant::now();
    let count = runtime.block_on(async {
        let mut count = 0u64;
        while started.elapsed() < time {
            let mut opened = client::open(proxies, Mode::Socks5, origin)
                .await
                .expect("a SOCKS5 connection");
            client::tiny_exchange(&mut opened, proxies, Mode::Socks5, origin)
                .await
                .expect("a tiny exchange");
            count += 1;
        }
        count
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = proxy_cpu(Cpu::now(pids).since(before));
    (count as f64 / wall, cpu * 1e6 / count.max(1) as f64)
}

/// Runs every measurement on one node on loopback.
pub fn measure(plan: Plan) -> Results {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (ingress, device, unlimited) = node.start();
    let pids = Pids {
        ingress: ingress.pid().as_raw(),
        device: device.pid().as_raw(),
    };
    let runtime = crate::runtime(1).expect("a runtime");
    let stream = runtime
        .block_on(StreamOrigin::start())
        .expect("the streaming origin");

    let mut results = Results::default();
    for rate in RATES {
        let name = format!("r{rate}");
        let client = node.add_client(&name);
        ctl(
            &node,
            &[
                "client",
                "set",
                &name,
                "--rate-down",
                &format!("{rate}Mbit"),
            ],
        );
        let bytes = rate * 1_000_000 / 8 * plan.seconds;
        let mut achieved: Vec<f64> = (0..plan.runs)
            .map(|_| {
                let took = download(&client, &origin.url(&format!("/bytes/{bytes}")));
                bytes as f64 * 8.0 / took.as_secs_f64() / 1e6
            })
            .collect();
        eprintln!("limits: {rate} Mbit/s → {achieved:?}");
        results.accuracy.push(Accuracy {
            limit_mbit: rate,
            achieved_mbit: median(&mut achieved),
        });
    }

    let unbinding = node.add_client("unbinding");
    ctl(
        &node,
        &[
            "client",
            "set",
            "unbinding",
            "--rate-up",
            "100Gbit",
            "--rate-down",
            "100Gbit",
        ],
    );
    let bulk_url = format!("http://{}/stream/{}", stream.address, plan.bulk_bytes);
    let mut samples: [Vec<(f64, f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for run in 0..plan.runs {
        // Each run in the other order, so neither client always goes first.
        let mut order = [(0, &unlimited), (1, &unbinding)];
        if !run.is_multiple_of(2) {
            order.reverse();
        }
        for (slot, client) in order {
            let before = Cpu::now(pids);
            let took = download(client, &bulk_url).as_secs_f64();
            let cpu = proxy_cpu(Cpu::now(pids).since(before));
            let gib = plan.bulk_bytes as f64 / f64::from(1u32 << 30);
            let proxies = Proxies::of(&node, client);
            let (rate, per_connection) = connections(
                &runtime,
                &proxies,
                origin.address,
                pids,
                plan.connection_time,
            );
            samples[slot].push((
                plan.bulk_bytes as f64 / took / 1e6,
                cpu / gib,
                rate,
                per_connection,
            ));
        }
    }
    let cost = |samples: &[(f64, f64, f64, f64)]| {
        let pick = |f: fn(&(f64, f64, f64, f64)) -> f64| {
            let mut values: Vec<f64> = samples.iter().map(f).collect();
            median(&mut values)
        };
        Cost {
            bulk_mb_s: pick(|s| s.0),
            cpu_s_per_gib: pick(|s| s.1),
            connections_s: pick(|s| s.2),
            cpu_us_per_connection: pick(|s| s.3),
        }
    };
    results.unlimited = cost(&samples[0]);
    results.unbinding = cost(&samples[1]);
    drop((stream, device, ingress));
    results
}

/// The section, markers included.
pub fn render(machine: &Machine, plan: Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", MARKERS.begin);
    out.push_str("## Per-client limits\n\n");
    out.push_str(
        "How close a client's rate limit holds (docs/LIMITS.md), and what the limiter costs \
         a client it does not hold back. One node on loopback; curl downloads through \
         SOCKS5 (body discarded); the limited client's bucket starts empty, so each \
         download's first 50 ms of tokens are part of its time.\n\n",
    );
    machine.header(&mut out);
    let _ = writeln!(
        out,
        "| runs | {} per figure (median); accuracy downloads of {} s at the limit; bulk {} MiB; connection runs {:?} |\n",
        plan.runs,
        plan.seconds,
        plan.bulk_bytes >> 20,
        plan.connection_time
    );
    out.push_str("| limit (down) | achieved | error |\n|---|---|---|\n");
    for accuracy in &results.accuracy {
        let error = (accuracy.achieved_mbit / accuracy.limit_mbit as f64 - 1.0) * 100.0;
        let _ = writeln!(
            out,
            "| {} Mbit/s | {:.2} Mbit/s | {error:+.1}% |",
            accuracy.limit_mbit, accuracy.achieved_mbit
        );
    }
    out.push_str(
        "\nThe limiter's cost: an unlimited client beside one limited to 100 Gbit/s each way \
         (every read takes and refunds tokens; the limit is never reached), interleaved run \
         by run, in alternating order. Proxy CPU is the ingress's and the device plane's.\n\n",
    );
    out.push_str(
        "| client | one tunnel's bulk | proxy CPU per GiB | new SOCKS5 connections, one at a time | proxy CPU per connection |\n|---|---|---|---|---|\n",
    );
    for (label, cost) in [
        ("unlimited", &results.unlimited),
        ("limited to 100 Gbit/s", &results.unbinding),
    ] {
        let _ = writeln!(
            out,
            "| {label} | {:.0} MB/s | {:.2} s | {:.0}/s | {:.0} µs |",
            cost.bulk_mb_s, cost.cpu_s_per_gib, cost.connections_s, cost.cpu_us_per_connection
        );
    }
    out.push_str(
        "\nAn unlimited client's path differs from the code before limits existed by one \
         atomic load per read and one per written chunk (the quota check); this bench \
         cannot run the older build beside it, so that difference is not measured here.\n",
    );
    let _ = writeln!(out, "{}", MARKERS.end);
    out
}
