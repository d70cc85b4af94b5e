//! The WireGuard bench (`blipless-bench-wg`): TCP throughput (iperf3) and
//! ping latency through a WireGuard tunnel, blipless beside wireguard-go as
//! the server, on the same machine, in the same network namespaces with the
//! same addresses ([`blipless_tests::topology`]: customer, node, internet;
//! the customer's client is wireguard-go in both). Its section of
//! docs/BENCHMARKS.md lies between `<!-- wireguard:begin -->` and
//! `<!-- wireguard:end -->` (replaced when present, appended otherwise; the
//! rest of the file is left alone).
//!
//! For each server, interleaved run by run, [`Plan::repeats`] times:
//! `iperf3 -c HOST -t 10 -J` from the customer namespace to `iperf3 -s` in
//! the internet namespace (one stream up, one stream down with `-R`, and the
//! same with `-P 4`), then `ping -c 200 -i 0.01`. The median run counts.
//! During each iperf3 run it reads the CPU time (utime + stime, from
//! /proc/PID/stat and /proc/PID/task/TID/stat) of the server's processes, of
//! the client's wireguard-go and of the whole machine (/proc/stat), to show
//! where the time goes. Before each run it waits while cargo or rustc runs
//! on the machine (5 minutes at most over the whole bench); a run that still
//! had one beside it is marked `*` in the report.
//!
//! This file holds the plan, the tests, the results and the measuring loop;
//! `world.rs` builds the two worlds and runs iperf3 and ping in them, `cpu.rs`
//! reads where the CPU went, `report.rs` and `explain.rs` write the section.

mod cpu;
mod explain;
mod report;
mod world;

use std::time::{Duration, Instant};

use crate::ping::Summary;
use crate::procfs::compilers_running;
use crate::report::Markers;
use crate::stats::nearest_rank;

pub use report::render;

use cpu::CpuUse;
use world::Bed;

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- wireguard:begin -->",
    end: "<!-- wireguard:end -->",
};
/// The subnet number S of both worlds (10.S.1.0/24, 10.S.2.0/24). They live
/// in namespaces of their own, so both can use the same addresses at once.
const SUBNET: u8 = 81;

/// How much work the bench does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// `iperf3 -t`.
    pub seconds: u32,
    /// Runs of each measurement per server; the median counts.
    pub repeats: usize,
    /// `ping -c`.
    pub pings: u32,
    /// blipless with `egress.tun.offload = true` (TCP super-packets through
    /// its TUN device); `--no-offload` measures without.
    pub offload: bool,
    /// blipless's `wireguard.workers` (`None`: the default, one per core);
    /// `--workers N` sets it.
    pub workers: Option<usize>,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            seconds: 10,
            repeats: 3,
            pings: 200,
            offload: true,
            workers: None,
        }
    }

    /// 2-second runs, once each, to check the bench itself.
    pub fn quick() -> Self {
        Self {
            seconds: 2,
            repeats: 1,
            pings: 50,
            offload: true,
            workers: None,
        }
    }
}

/// One iperf3 measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Test {
    /// `-R`: the internet sends, the customer receives.
    reverse: bool,
    /// `-P`.
    streams: u32,
}

const TESTS: [Test; 4] = [
    Test {
        reverse: false,
        streams: 1,
    },
    Test {
        reverse: true,
        streams: 1,
    },
    Test {
        reverse: false,
        streams: 4,
    },
    Test {
        reverse: true,
        streams: 4,
    },
];

impl Test {
    fn label(self) -> String {
        let direction = if self.reverse {
            "download (internet → customer)"
        } else {
            "upload (customer → internet)"
        };
        let streams = if self.streams == 1 {
            "1 stream".to_string()
        } else {
            format!("{} streams", self.streams)
        };
        format!("{direction}, {streams}")
    }

    /// The arguments of `iperf3` for this test toward `host`.
    fn args(self, host: &str, seconds: u32) -> Vec<String> {
        let mut args: Vec<String> = ["-c", host, "-t", &seconds.to_string(), "-J"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        if self.reverse {
            args.push("-R".into());
        }
        if self.streams > 1 {
            args.extend(["-P".into(), self.streams.to_string()]);
        }
        args
    }
}

/// The two servers measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Blipless,
    WireguardGo,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Blipless => "blipless",
            Kind::WireguardGo => "wireguard-go",
        }
    }
}

/// One iperf3 run.
#[derive(Debug, Clone, Default)]
struct Run {
    /// `end.sum_received.bits_per_second`.
    bits_per_second: f64,
    /// `end.sum_sent.retransmits`.
    retransmits: Option<u64>,
    /// `end.cpu_utilization_percent`: (iperf3 client, iperf3 server), % of one core.
    iperf_cpu: Option<(f64, f64)>,
    cpu: CpuUse,
    /// cargo or rustc was seen running on the machine during the run.
    disturbed: bool,
}

/// What iperf3's JSON says; an error carries iperf3's own `error`.
fn parse_iperf(json: &str) -> Result<Run, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("iperf3 wrote no JSON ({e}): {json}"))?;
    if let Some(error) = value["error"].as_str() {
        return Err(format!("iperf3: {error}"));
    }
    let end = &value["end"];
    let bits_per_second = end["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| format!("no end.sum_received.bits_per_second in: {json}"))?;
    let cpu = &end["cpu_utilization_percent"];
    Ok(Run {
        bits_per_second,
        retransmits: end["sum_sent"]["retransmits"].as_u64(),
        iperf_cpu: cpu["host_total"].as_f64().zip(cpu["remote_total"].as_f64()),
        cpu: CpuUse::default(),
        disturbed: false,
    })
}
/// One ping run's summary, and whether a build ran beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ping {
    /// What ping printed.
    summary: Summary,
    /// cargo or rustc was seen running just before or after (runs counted,
    /// for a median: how many of its runs).
    disturbed: u64,
}

/// Every run of one server.
#[derive(Debug, Default)]
pub struct Results {
    /// Per test (in [`TESTS`] order), every run.
    runs: Vec<Vec<Run>>,
    pings: Vec<Ping>,
    daemon_warnings: usize,
}

impl Results {
    fn new() -> Self {
        Self {
            runs: vec![Vec::new(); TESTS.len()],
            pings: Vec::new(),
            daemon_warnings: 0,
        }
    }

    /// The median run of test `index` (by throughput).
    fn median(&self, index: usize) -> Option<&Run> {
        let mut runs: Vec<&Run> = self.runs.get(index)?.iter().collect();
        runs.sort_by(|a, b| a.bits_per_second.total_cmp(&b.bits_per_second));
        nearest_rank(&runs, 0.5)
    }

    /// The median of each ping figure across runs, and the losses in total.
    fn ping(&self) -> Option<Ping> {
        if self.pings.is_empty() {
            return None;
        }
        let median = |pick: fn(&Summary) -> f64| {
            crate::stats::median_f64(self.pings.iter().map(|p| pick(&p.summary)))
        };
        Some(Ping {
            summary: Summary {
                sent: self.pings.iter().map(|p| p.summary.sent).sum(),
                received: self.pings.iter().map(|p| p.summary.received).sum(),
                min: median(|p| p.min),
                avg: median(|p| p.avg),
                max: median(|p| p.max),
                mdev: median(|p| p.mdev),
            },
            disturbed: self.pings.iter().map(|p| p.disturbed).sum(),
        })
    }
}

/// How long, over the whole bench, it waits for builds beside it to finish.
const QUIET_PATIENCE: Duration = Duration::from_secs(300);

/// Waits while cargo or rustc runs on the machine, taking the time from
/// `patience` (what is left of [`QUIET_PATIENCE`]); a run that still has
/// them beside it is marked in the report.
fn wait_for_quiet(patience: &mut Duration) {
    if patience.is_zero() || !compilers_running() {
        return;
    }
    eprintln!(
        "cargo or rustc is running: waiting for it (up to {} s more in this bench)",
        patience.as_secs()
    );
    let started = Instant::now();
    while compilers_running() && started.elapsed() < *patience {
        std::thread::sleep(Duration::from_secs(1));
    }
    *patience = patience.saturating_sub(started.elapsed());
    // What the build left behind (page cache, a busy disk) settles first.
    std::thread::sleep(Duration::from_secs(1));
}

/// Builds both worlds and runs every measurement, interleaved: blipless's
/// results, then wireguard-go's.
pub fn measure(plan: Plan) -> Result<(Results, Results), String> {
    eprintln!("building the blipless world");
    let mut beds = vec![Bed::start(Kind::Blipless, plan.offload, plan.workers)?];
    eprintln!("building the wireguard-go world");
    beds.push(Bed::start(Kind::WireguardGo, false, None)?);
    let mut results = vec![Results::new(), Results::new()];
    // A short run each first: slow start, caches and page faults are not measured.
    for bed in &mut beds {
        bed.iperf(TESTS[0], 1)?;
    }
    let mut patience = QUIET_PATIENCE;
    for repeat in 1..=plan.repeats {
        for (bed, results) in beds.iter_mut().zip(&mut results) {
            for (index, test) in TESTS.iter().enumerate() {
                wait_for_quiet(&mut patience);
                let run = bed.iperf(*test, plan.seconds)?;
                eprintln!(
                    "run {repeat}/{}: {:<12} {:<40} {:>6} Mbit/s  server CPU {:.0}%  machine {:.0}%",
                    plan.repeats,
                    bed.kind.name(),
                    test.label(),
                    report::mbit(run.bits_per_second),
                    run.cpu.server_total() * 100.0,
                    run.cpu.machine * 100.0
                );
                results.runs[index].push(run);
                std::thread::sleep(Duration::from_millis(500));
            }
            wait_for_quiet(&mut patience);
            let ping = bed.ping(plan.pings, "0.01")?;
            eprintln!(
                "run {repeat}/{}: {:<12} ping min/avg/max/mdev {:.3}/{:.3}/{:.3}/{:.3} ms, {} of {} received",
                plan.repeats,
                bed.kind.name(),
                ping.summary.min,
                ping.summary.avg,
                ping.summary.max,
                ping.summary.mdev,
                ping.summary.received,
                ping.summary.sent
            );
            results.pings.push(ping);
        }
    }
    for (bed, results) in beds.iter().zip(&mut results) {
        results.daemon_warnings = bed.world.daemon_warnings();
    }
    let baseline = results.pop().unwrap_or_default();
    let blipless = results.pop().unwrap_or_default();
    Ok((blipless, baseline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_iperf3_json() {
        let json = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":2.1e9,"retransmits":7},
            "sum_received":{"bits_per_second":2.0e9},
            "cpu_utilization_percent":{"host_total":55.5,"remote_total":12.25}}}"#;
        let run = parse_iperf(json).expect("parses");
        assert_eq!(run.bits_per_second, 2.0e9);
        assert_eq!(run.retransmits, Some(7));
        assert_eq!(run.iperf_cpu, Some((55.5, 12.25)));
        let failed = parse_iperf(r#"{"start":{},"end":{},"error":"unable to connect"}"#);
        assert_eq!(failed.err().as_deref(), Some("iperf3: unable to connect"));
        assert!(parse_iperf("not json").is_err());
    }

    #[test]
    fn medians_pick_the_middle_run() {
        let mut results = Results::new();
        for bits in [3.0, 1.0, 2.0] {
            results.runs[0].push(Run {
                bits_per_second: bits,
                ..Run::default()
            });
        }
        assert_eq!(results.median(0).map(|r| r.bits_per_second), Some(2.0));
        assert!(results.median(1).is_none());
        for (min, max) in [(0.1, 0.9), (0.3, 0.5), (0.2, 0.7)] {
            results.pings.push(Ping {
                summary: Summary {
                    sent: 10,
                    received: 10,
                    min,
                    avg: 0.4,
                    max,
                    mdev: 0.1,
                },
                disturbed: 1,
            });
        }
        let ping = results.ping().expect("pings");
        assert_eq!(
            (
                ping.summary.min,
                ping.summary.max,
                ping.summary.sent,
                ping.disturbed
            ),
            (0.2, 0.7, 30, 3)
        );
    }
}
