//! `blipless-bench-wg`: TCP throughput (iperf3) and ping latency through a
//! WireGuard tunnel, blipless beside wireguard-go as the server, on the same
//! machine, in the same network namespaces with the same addresses
//! ([`blipless_tests::topology`]: customer, node, internet; the customer's
//! client is wireguard-go in both). Writes its section of
//! docs/BENCHMARKS.md, between `<!-- wireguard:begin -->` and
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
//! where the time goes.
//!
//! Needs root (namespaces, TUN, nftables), `iperf3`, `ping`, `wireguard-go`,
//! `wg`, `nft`, and the release binaries: `make bench` builds them and runs
//! it from `scripts/bench.sh` after the main bench (which rewrites the whole
//! file). Options: `--out PATH` (default `docs/BENCHMARKS.md`), `--quick`
//! (2-second runs, once each, to check the bench itself). It sets
//! `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` (the production
//! log level) unless they are set. Before each run it waits while cargo or
//! rustc runs on the machine (5 minutes at most over the whole bench); a run
//! that still had one beside it is marked `*` in the report.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::bench_doc::{self, compilers_running, Machine, Markers};
use blipless_tests::netns::{Background, Netns};
use blipless_tests::topology::{Topology, WgGoWorld, WgWorld};

/// The section's markers in docs/BENCHMARKS.md.
const MARKERS: Markers = Markers {
    begin: "<!-- wireguard:begin -->",
    end: "<!-- wireguard:end -->",
};
/// The subnet number S of both worlds (10.S.1.0/24, 10.S.2.0/24). They live
/// in namespaces of their own, so both can use the same addresses at once.
const SUBNET: u8 = 81;

/// How much work the bench does.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// `iperf3 -t`.
    seconds: u32,
    /// Runs of each measurement per server; the median counts.
    repeats: usize,
    /// `ping -c`.
    pings: u32,
}

impl Plan {
    fn full() -> Self {
        Self {
            seconds: 10,
            repeats: 3,
            pings: 200,
        }
    }

    fn quick() -> Self {
        Self {
            seconds: 2,
            repeats: 1,
            pings: 50,
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

/// A world under test with iperf3 serving in its internet namespace.
// Dropped in this order: iperf3, then the world (client, server, namespaces).
#[derive(Debug)]
struct Bed {
    kind: Kind,
    iperf: Background,
    world: World,
}

#[derive(Debug)]
enum World {
    Blipless(Box<WgWorld>),
    WireguardGo(Box<WgGoWorld>),
}

impl World {
    fn net(&self) -> &Topology {
        match self {
            World::Blipless(world) => &world.net,
            World::WireguardGo(world) => &world.net,
        }
    }

    /// The server's processes, named.
    fn server_pids(&self) -> Vec<(&'static str, i32)> {
        match self {
            World::Blipless(world) => vec![
                ("ingress", world.ingress.pid().as_raw()),
                ("device", world.device.pid().as_raw()),
            ],
            World::WireguardGo(world) => pids_named(&world.net.node_ns, "wireguard-go")
                .into_iter()
                .map(|pid| ("wireguard-go", pid))
                .collect(),
        }
    }

    fn diagnostics(&self) -> String {
        match self {
            World::Blipless(world) => world.diagnostics(),
            World::WireguardGo(world) => world.diagnostics(),
        }
    }

    /// Lines with WARN or ERROR in the daemons' logs (blipless only).
    fn daemon_warnings(&self) -> usize {
        match self {
            World::Blipless(world) => [&world.ingress, &world.device]
                .iter()
                .map(|daemon| {
                    daemon
                        .log_text()
                        .lines()
                        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                        .count()
                })
                .sum(),
            World::WireguardGo(_) => 0,
        }
    }
}

/// Processes in `netns` whose command name is `name`.
fn pids_named(netns: &Netns, name: &str) -> Vec<i32> {
    netns
        .pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == name)
        })
        .collect()
}

/// User and system CPU time, in seconds (or, for a [`CpuUse`], shares of
/// one core).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Times {
    user: f64,
    system: f64,
}

impl Times {
    fn total(self) -> f64 {
        self.user + self.system
    }

    /// `self - earlier`, per second of `wall`.
    fn rate_since(self, earlier: Times, wall: f64) -> Times {
        Times {
            user: (self.user - earlier.user) / wall,
            system: (self.system - earlier.system) / wall,
        }
    }
}

/// utime and stime of a process (all its threads, `PID`) or of one thread
/// (`PID/task/TID`), from /proc/.../stat.
fn cpu_times(path: &str) -> Option<Times> {
    let stat = std::fs::read_to_string(format!("/proc/{path}/stat")).ok()?;
    parse_stat(&stat)
}

/// utime and stime (fields 14 and 15) of a /proc stat line, in seconds.
fn parse_stat(stat: &str) -> Option<Times> {
    // The command name is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index)?.parse::<u64>().ok();
    // Clock ticks of USER_HZ, which is 100 on Linux.
    Some(Times {
        user: ticks(11)? as f64 / 100.0,
        system: ticks(12)? as f64 / 100.0,
    })
}

/// CPU time of every thread of `pid`, with the thread's id and name.
fn thread_cpu(pid: i32) -> Vec<(i32, String, Times)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let tid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let times = cpu_times(&format!("{pid}/task/{tid}"))?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            Some((tid, name, times))
        })
        .collect()
}

/// The machine's CPU time from the first line of /proc/stat, in ticks:
/// (busy, softirq, total).
fn machine_ticks() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0, 0);
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    let softirq = fields.get(6).copied().unwrap_or(0);
    (total.saturating_sub(idle), softirq, total)
}

/// CPU readings at one moment.
#[derive(Debug, Clone)]
struct CpuSnapshot {
    at: Instant,
    server: Vec<(&'static str, Times)>,
    threads: Vec<(&'static str, i32, String, Times)>,
    client: Times,
    machine: (u64, u64, u64),
}

impl CpuSnapshot {
    fn take(server: &[(&'static str, i32)], client: &[i32]) -> Self {
        let mut threads = Vec::new();
        for (label, pid) in server {
            for (tid, name, times) in thread_cpu(*pid) {
                threads.push((*label, tid, name, times));
            }
        }
        let client = client
            .iter()
            .filter_map(|pid| cpu_times(&pid.to_string()))
            .fold(Times::default(), |sum, t| Times {
                user: sum.user + t.user,
                system: sum.system + t.system,
            });
        Self {
            at: Instant::now(),
            server: server
                .iter()
                .map(|(label, pid)| (*label, cpu_times(&pid.to_string()).unwrap_or_default()))
                .collect(),
            threads,
            client,
            machine: machine_ticks(),
        }
    }
}

/// Where the CPU went during one iperf3 run, as shares of one core
/// (machine figures: of all cores).
#[derive(Debug, Clone, Default)]
struct CpuUse {
    /// Each server process.
    server: Vec<(&'static str, Times)>,
    /// The busiest server thread: process, thread name, share of one core.
    busiest: Option<(&'static str, String, f64)>,
    /// The customer's wireguard-go.
    client: Times,
    /// The whole machine, busy, of all cores.
    machine: f64,
    /// The whole machine, softirq, of all cores.
    softirq: f64,
}

impl CpuUse {
    fn between(before: &CpuSnapshot, after: &CpuSnapshot) -> Self {
        let wall = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let server = after
            .server
            .iter()
            .map(|(label, times)| {
                let earlier = before
                    .server
                    .iter()
                    .find(|(l, _)| l == label)
                    .map_or(Times::default(), |(_, t)| *t);
                (*label, times.rate_since(earlier, wall))
            })
            .collect::<Vec<_>>();
        let busiest = after
            .threads
            .iter()
            .map(|(label, tid, name, times)| {
                let earlier = before
                    .threads
                    .iter()
                    .find(|(_, t, _, _)| t == tid)
                    .map_or(Times::default(), |(_, _, _, t)| *t);
                (
                    *label,
                    name.clone(),
                    times.rate_since(earlier, wall).total(),
                )
            })
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let (busy0, soft0, total0) = before.machine;
        let (busy1, soft1, total1) = after.machine;
        let ticks = (total1.saturating_sub(total0)).max(1) as f64;
        Self {
            server,
            busiest,
            client: after.client.rate_since(before.client, wall),
            machine: busy1.saturating_sub(busy0) as f64 / ticks,
            softirq: soft1.saturating_sub(soft0) as f64 / ticks,
        }
    }

    /// The server's processes together, in cores.
    fn server_total(&self) -> f64 {
        self.server.iter().map(|(_, t)| t.total()).sum()
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

/// ping's summary: sent, received, and rtt min/avg/max/mdev in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ping {
    sent: u64,
    received: u64,
    min: f64,
    avg: f64,
    max: f64,
    mdev: f64,
    /// cargo or rustc was seen running just before or after (runs counted,
    /// for a median: how many of its runs).
    disturbed: u64,
}

fn parse_ping(text: &str) -> Result<Ping, String> {
    let counts = text
        .lines()
        .find(|line| line.contains("packets transmitted"))
        .ok_or_else(|| format!("no ping summary in: {text}"))?;
    let numbers: Vec<u64> = counts
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect();
    let rtt = text
        .lines()
        .find_map(|line| line.split_once("min/avg/max/mdev = ").map(|(_, r)| r))
        .ok_or_else(|| format!("no rtt line in: {text}"))?;
    // "0.101/0.254/1.302/0.093 ms", sometimes followed by ", pipe 2".
    let values: Vec<f64> = rtt
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .split('/')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    match (numbers.as_slice(), values.as_slice()) {
        ([sent, received, ..], [min, avg, max, mdev]) => Ok(Ping {
            sent: *sent,
            received: *received,
            min: *min,
            avg: *avg,
            max: *max,
            mdev: *mdev,
            disturbed: 0,
        }),
        _ => Err(format!("unreadable ping summary: {text}")),
    }
}

impl Bed {
    fn start(kind: Kind) -> Result<Self, String> {
        let world = match kind {
            Kind::Blipless => World::Blipless(Box::new(WgWorld::new(SUBNET))),
            Kind::WireguardGo => World::WireguardGo(Box::new(WgGoWorld::new(SUBNET))),
        };
        let net = world.net();
        let host = net.origin.ip().to_string();
        let mut command = net.internet.command("iperf3");
        command.args(["-s", "-B", &host, "--forceflush"]);
        let iperf = Background::spawn(command, Some("Server listening"), Duration::from_secs(10))
            .map_err(|e| format!("iperf3 -s in the internet namespace: {e}"))?;
        let bed = Self { kind, iperf, world };
        // The first packet makes the handshake; nothing measured waits for it.
        let warm = bed.ping(5, "0.2")?;
        if warm.received == 0 {
            return Err(format!(
                "{}: no ping through the tunnel\n{}",
                kind.name(),
                bed.world.diagnostics()
            ));
        }
        Ok(bed)
    }

    fn host(&self) -> String {
        self.world.net().origin.ip().to_string()
    }

    fn ping(&self, count: u32, interval: &str) -> Result<Ping, String> {
        let before = compilers_running();
        let output = self
            .world
            .net()
            .ping(count, interval)
            .wait_with_output()
            .map_err(|e| format!("ping: {e}"))?;
        let mut ping = parse_ping(&String::from_utf8_lossy(&output.stdout))?;
        ping.disturbed = u64::from(before || compilers_running());
        Ok(ping)
    }

    /// One `iperf3 -c` run from the customer namespace, with the CPU
    /// readings around it.
    fn iperf(&mut self, test: Test, seconds: u32) -> Result<Run, String> {
        let server = self.world.server_pids();
        let client = pids_named(&self.world.net().customer, "wireguard-go");
        let output = tempfile::tempfile().map_err(|e| format!("a temporary file: {e}"))?;
        let stdout = output
            .try_clone()
            .map_err(|e| format!("a temporary file: {e}"))?;
        let mut command = self.world.net().customer.command("iperf3");
        command.args(test.args(&self.host(), seconds));
        let before = CpuSnapshot::take(&server, &client);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting iperf3 -c: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(u64::from(seconds) + 30);
        let mut disturbed = compilers_running();
        let mut looked = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                    if !disturbed && looked.elapsed() >= Duration::from_secs(1) {
                        disturbed = compilers_running();
                        looked = Instant::now();
                    }
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "iperf3 -c did not finish within {seconds} s + 30 s\n{}",
                        self.world.diagnostics()
                    ));
                }
            }
        };
        let after = CpuSnapshot::take(&server, &client);
        let json = read_all(output);
        if !self.iperf.running() {
            return Err(format!("iperf3 -s exited: {}", self.iperf.output()));
        }
        let mut run = parse_iperf(&json)
            .map_err(|e| format!("{e} (exit {status})\n{}", self.world.diagnostics()))?;
        run.cpu = CpuUse::between(&before, &after);
        run.disturbed = disturbed;
        Ok(run)
    }
}

fn read_all(mut file: std::fs::File) -> String {
    use std::io::{Read as _, Seek as _};
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    text
}

/// Every run of one server.
#[derive(Debug, Default)]
struct Results {
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
        runs.get(runs.len().checked_sub(1)? / 2).copied()
    }

    /// The median of each ping figure across runs, and the losses in total.
    fn ping(&self) -> Option<Ping> {
        if self.pings.is_empty() {
            return None;
        }
        let median = |pick: fn(&Ping) -> f64| {
            let mut values: Vec<f64> = self.pings.iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            values[(values.len() - 1) / 2]
        };
        Some(Ping {
            sent: self.pings.iter().map(|p| p.sent).sum(),
            received: self.pings.iter().map(|p| p.received).sum(),
            min: median(|p| p.min),
            avg: median(|p| p.avg),
            max: median(|p| p.max),
            mdev: median(|p| p.mdev),
            disturbed: self.pings.iter().map(|p| p.disturbed).sum(),
        })
    }
}

fn mbit(bits_per_second: f64) -> String {
    format!("{:.0}", bits_per_second / 1e6)
}

fn percent(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

/// Server CPU-seconds per GB (10^9 bytes) iperf3 moved in `run`.
fn cpu_per_gb(run: &Run) -> f64 {
    run.cpu.server_total() / (run.bits_per_second / 8e9).max(1e-12)
}

/// The runs of a test as "a / b / c" Mbit/s.
/// A run marked `*` had cargo or rustc running beside it.
fn runs_text(runs: &[Run]) -> String {
    runs.iter()
        .map(|r| {
            format!(
                "{}{}",
                mbit(r.bits_per_second),
                if r.disturbed { "*" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The markdown section, markers included.
fn render(machine: &Machine, plan: Plan, blipless: &Results, baseline: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", MARKERS.begin);
    out.push_str(
        "## WireGuard: throughput and latency through the tunnel, beside wireguard-go\n\n",
    );
    let _ = writeln!(
        out,
        "Generated by `blipless-bench-wg` (`tests/src/bin/bench_wg.rs`), which `make bench` runs after the main \
         bench (`scripts/bench.sh`); it rewrites only this section, between the `wireguard` markers. Do not edit by \
         hand, run it again.\n"
    );
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| command | `{}` |", machine.command);
    let _ = writeln!(out, "| date | {} |", machine.date);
    let _ = writeln!(out, "| commit | {} |", machine.commit);
    let _ = writeln!(
        out,
        "| machine | {} CPUs (`nproc`), {}, kernel {} |",
        machine.cpus, machine.model, machine.kernel
    );
    let _ = writeln!(
        out,
        "| load average (1, 5, 15 min) | before: {}; after: {} |",
        machine.load_before, machine.load_after
    );
    let _ = writeln!(
        out,
        "| tools | {}, {}; blipless binaries: `{}` profile |",
        machine.iperf3, machine.wireguard_go, machine.profile
    );
    let _ = writeln!(
        out,
        "| blipless daemon log warnings/errors during the run | {} |",
        blipless.daemon_warnings
    );
    let _ = writeln!(
        out,
        "\n### Setup\n\n\
         ```text\n\
         customer 10.{s}.1.2 ── 10.{s}.1.1 node 10.{s}.2.1 ── 10.{s}.2.2 internet (iperf3 -s)\n  \
         wireguard-go client, tunnel 10.64.0.2 ──UDP 51820──▶ server ──▶ masquerade out of the uplink\n\
         ```\n\n\
         - Three network namespaces joined by veth pairs, built by `tests/src/topology.rs` exactly as the \
           WireGuard end-to-end tests build them. The customer's client is wireguard-go (MTU 1420, `AllowedIPs = \
           0.0.0.0/0`, 25 s keepalive; it routes the internet subnet through the tunnel).\n\
         - **blipless**: `blipless-ingress` (boringtun sessions, UDP via quinn-udp) and `blipless-device` (TUN \
           egress, nftables masquerade, `egress.tun.manage = true`, default 2 TUN queues) in the node namespace, the \
           client configured from `blipless-ctl client add --wg`, daemons logging at `info`.\n\
         - **wireguard-go** (the baseline): wireguard-go as a plain WireGuard server in the node namespace (its own \
           TUN interface, forwarding, nftables masquerade out of the uplink), the client configured the same way.\n\
         - Both worlds are up for the whole run and the runs are interleaved (each repeat measures blipless, then \
           wireguard-go), so a change in the machine's load hits both alike. Everything shares the machine's {cpus} \
           CPUs: iperf3 at both ends, the client's wireguard-go, the server and the kernel's forwarding.\n\
         - Throughput: `iperf3 -c 10.{s}.2.2 -t {t} -J` from the customer namespace (TCP; `-R`: the internet side \
           sends; `-P 4`: four streams), `end.sum_received.bits_per_second`, Mbit/s = 10^6 bit/s; {r} run(s) per \
           test and server, the median counts. Latency: `ping -c {p} -i 0.01` toward 10.{s}.2.2, {r} run(s), the \
           median of each figure.\n\
         - CPU: utime + stime of the server's processes (blipless: ingress and device plane; baseline: the \
           wireguard-go server) and of the client's wireguard-go over the iperf3 run, from /proc/PID/stat, as a \
           share of one core; the busiest single server thread from /proc/PID/task/TID/stat; the machine's busy and \
           softirq time from /proc/stat as a share of all {cpus} cores; iperf3's own CPU as it reports it. All from \
           the median run.\n",
        s = SUBNET,
        t = plan.seconds,
        r = plan.repeats,
        p = plan.pings,
        cpus = machine.cpus,
    );

    out.push_str("### Throughput\n\n");
    let host = format!("10.{SUBNET}.2.2");
    out.push_str(
        "| test | command (customer namespace) | blipless runs (Mbit/s) | blipless median | wireguard-go runs (Mbit/s) | \
         wireguard-go median | blipless / wireguard-go | target ≥ 1.00 |\n\
         |---|---|---|---:|---|---:|---:|---|\n",
    );
    let mut verdicts = Vec::new();
    for (index, test) in TESTS.iter().enumerate() {
        let ours = blipless.median(index);
        let theirs = baseline.median(index);
        let ratio = ours
            .zip(theirs)
            .map(|(a, b)| a.bits_per_second / b.bits_per_second.max(1.0));
        let met = ratio.map(|r| r >= 1.0);
        verdicts.push((*test, ratio, met));
        let _ = writeln!(
            out,
            "| {} | `iperf3 {}` | {} | {} | {} | {} | {} | {} |",
            test.label(),
            test.args(&host, plan.seconds).join(" "),
            runs_text(&blipless.runs[index]),
            ours.map_or("—".into(), |r| mbit(r.bits_per_second)),
            runs_text(&baseline.runs[index]),
            theirs.map_or("—".into(), |r| mbit(r.bits_per_second)),
            ratio.map_or("—".into(), |r| format!("{r:.2}")),
            match met {
                Some(true) => "**met**",
                Some(false) => "**not met**",
                None => "—",
            }
        );
    }

    let all_runs = || {
        blipless
            .runs
            .iter()
            .chain(&baseline.runs)
            .flat_map(|runs| runs.iter())
    };
    let disturbed = all_runs().filter(|r| r.disturbed).count();
    let _ = writeln!(
        out,
        "\n{}",
        if disturbed == 0 {
            "No cargo, rustc or clippy-driver process ran on the machine during any run."
                .to_string()
        } else {
            format!(
                "`*`: cargo, rustc or clippy-driver ran on the machine during that run ({disturbed} of {} runs), \
                 taking CPU from both sides: those figures are low, and the load average above shows how busy the \
                 machine was.",
                all_runs().count()
            )
        }
    );
    out.push_str("\n### Latency (ping through the tunnel, idle)\n\n");
    out.push_str(
        "| server | min | avg | max | mdev | lost | runs with cargo or rustc beside |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (kind, results) in [(Kind::Blipless, blipless), (Kind::WireguardGo, baseline)] {
        match results.ping() {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "| {} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {} of {} | {} of {} |",
                    kind.name(),
                    p.min,
                    p.avg,
                    p.max,
                    p.mdev,
                    p.sent - p.received,
                    p.sent,
                    p.disturbed,
                    results.pings.len()
                );
            }
            None => {
                let _ = writeln!(out, "| {} | — | — | — | — | — | — |", kind.name());
            }
        }
    }

    out.push_str("\n### CPU during the median run\n\n");
    out.push_str(
        "| test | server | server CPU, of one core (of it system time) | busiest server thread | \
         server CPU-seconds per GB moved | client wireguard-go | iperf3 client / server | machine busy (all cores) | \
         of it softirq | TCP retransmits |\n\
         |---|---|---|---|---:|---:|---|---:|---:|---:|\n",
    );
    for (index, test) in TESTS.iter().enumerate() {
        for (kind, results) in [(Kind::Blipless, blipless), (Kind::WireguardGo, baseline)] {
            let Some(run) = results.median(index) else {
                continue;
            };
            let cpu = &run.cpu;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} |",
                test.label(),
                kind.name(),
                server_text(cpu),
                busiest_text(cpu),
                cpu_per_gb(run),
                percent(cpu.client.total()),
                run.iperf_cpu.map_or("—".into(), |(host, remote)| format!(
                    "{host:.0}% / {remote:.0}%"
                )),
                percent(cpu.machine),
                percent(cpu.softirq),
                run.retransmits.map_or("—".into(), |r| r.to_string()),
            );
        }
    }

    out.push_str("\n### Target: \"at least wireguard-go's throughput\"\n\n");
    let measured: Vec<_> = verdicts.iter().filter(|(_, r, _)| r.is_some()).collect();
    let met = measured.iter().filter(|(_, _, m)| *m == Some(true)).count();
    let single: Vec<_> = measured.iter().filter(|(t, _, _)| t.streams == 1).collect();
    let single_met = !single.is_empty() && single.iter().all(|(_, _, m)| *m == Some(true));
    let _ = writeln!(
        out,
        "One stream each way (the target's measure): **{}**. All tests: met in {met} of {}.\n",
        if single_met { "met" } else { "not met" },
        measured.len()
    );
    for (test, ratio, _) in &measured {
        if let Some(ratio) = ratio {
            let _ = writeln!(
                out,
                "- {}: blipless moves {:.0}% of wireguard-go's throughput.",
                test.label(),
                ratio * 100.0
            );
        }
    }
    out.push('\n');
    explain(&mut out, machine, blipless, baseline);
    let _ = writeln!(out, "{}", MARKERS.end);
    out
}

/// "ingress 28% (sys 18%) + device 46% (sys 40%)".
fn server_text(cpu: &CpuUse) -> String {
    cpu.server
        .iter()
        .map(|(label, times)| {
            let share = format!("{} ({})", percent(times.total()), percent(times.system));
            if cpu.server.len() > 1 {
                format!("{label} {share}")
            } else {
                share
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// "35% (device, `tokio-runtime-w`)".
fn busiest_text(cpu: &CpuUse) -> String {
    cpu.busiest
        .as_ref()
        .map_or("—".into(), |(label, name, share)| {
            if *label == name.as_str() {
                format!("{} (`{name}`)", percent(*share))
            } else {
                format!("{} ({label}, `{name}`)", percent(*share))
            }
        })
}

/// The smallest and largest of `values` as "a–b%" (or "a%" when equal).
fn span(values: impl IntoIterator<Item = f64>) -> String {
    let values: Vec<f64> = values.into_iter().collect();
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        "—".into()
    } else if (low * 100.0).round() == (high * 100.0).round() {
        percent(low)
    } else {
        format!("{:.0}–{}", low * 100.0, percent(high))
    }
}

/// "Where the time goes": this run's figures, what they say, and the
/// structural reasons from the code.
fn explain(out: &mut String, machine: &Machine, blipless: &Results, baseline: &Results) {
    out.push_str("### Where the time goes\n\n");
    let pairs: Vec<(Test, &Run, &Run)> = TESTS
        .iter()
        .enumerate()
        .filter(|(_, t)| t.streams == 1)
        .filter_map(|(index, test)| Some((*test, blipless.median(index)?, baseline.median(index)?)))
        .collect();
    for (test, ours, theirs) in &pairs {
        let _ = writeln!(
            out,
            "- {}: blipless {} Mbit/s with its server on {} of a core ({}), wireguard-go {} Mbit/s on {}: \
             **{:.2} against {:.2} CPU-seconds per GB** moved. Machine busy {} / {}; the client's wireguard-go {} / \
             {} of a core; the busiest server thread {} / {} of a core (blipless / wireguard-go).",
            test.label(),
            mbit(ours.bits_per_second),
            percent(ours.cpu.server_total()),
            server_text(&ours.cpu),
            mbit(theirs.bits_per_second),
            percent(theirs.cpu.server_total()),
            cpu_per_gb(ours),
            cpu_per_gb(theirs),
            percent(ours.cpu.machine),
            percent(theirs.cpu.machine),
            percent(ours.cpu.client.total()),
            percent(theirs.cpu.client.total()),
            ours.cpu.busiest.as_ref().map_or("—".into(), |b| percent(b.2)),
            theirs.cpu.busiest.as_ref().map_or("—".into(), |b| percent(b.2)),
        );
    }
    if pairs.is_empty() {
        return;
    }
    out.push_str("\nWhat that says:\n\n");
    let ours = || pairs.iter().map(|(_, a, _)| *a);
    let theirs = || pairs.iter().map(|(_, _, b)| *b);
    let low = |runs: &mut dyn Iterator<Item = &Run>| {
        runs.map(|r| r.cpu.machine).fold(f64::INFINITY, f64::min)
    };
    if low(&mut ours()) >= 0.85 {
        let _ = writeln!(
            out,
            "- **blipless is CPU-bound here.** The machine's {} cores were {} busy in its one-stream runs, and \
             everything on the path shares them: the client's wireguard-go alone took {} of a core, iperf3 and the \
             kernel's veth, forwarding and NAT work (softirq {} of the machine, plus the system time of whoever \
             writes into a TUN device) the rest. Its throughput follows the CPU cost per byte of the whole path; the \
             server's CPU-seconds per GB is the figure that carries over to other machines.",
            machine.cpus,
            span(ours().map(|r| r.cpu.machine)),
            span(ours().map(|r| r.cpu.client.total())),
            span(ours().map(|r| r.cpu.softirq)),
        );
    } else {
        let _ = writeln!(
            out,
            "- **blipless is not CPU-bound overall**: the machine was {} busy in its one-stream runs, so its limit \
             is a serial stage or a wait, not the CPU as a whole; see the busiest thread.",
            span(ours().map(|r| r.cpu.machine)),
        );
    }
    let _ = writeln!(
        out,
        "- Under wireguard-go the machine was {} busy{}.",
        span(theirs().map(|r| r.cpu.machine)),
        if low(&mut theirs()) >= 0.85 {
            ": CPU-bound as well"
        } else {
            ": it leaves CPU idle, so part of its limit is inside its own pipeline (hand-offs between its \
             receive, crypto and TUN goroutines), not the CPU as a whole"
        }
    );
    let busiest = pairs
        .iter()
        .filter_map(|(_, ours, _)| ours.cpu.busiest.clone())
        .max_by(|a, b| a.2.total_cmp(&b.2));
    if let Some((process, name, share)) = busiest {
        if share >= 0.9 {
            let _ = writeln!(
                out,
                "- **A blipless thread was saturated**: {} of a core ({process}, `{name}`). The serial stages \
                 below are the limit.",
                percent(share)
            );
        } else {
            let _ = writeln!(
                out,
                "- **No blipless thread was saturated** (busiest: {} of a core, {process}, `{name}`), so the \
                 serial stages below did not set the limit on this machine. Each caps its direction at one \
                 core's worth of work; that matters on a host where the server is not starved of CPU.",
                percent(share)
            );
        }
    }
    for (test, ours, theirs) in &pairs {
        let (a, b) = (cpu_per_gb(ours), cpu_per_gb(theirs));
        let verdict = if a <= b {
            format!(
                "{:.0}% less CPU per byte than wireguard-go",
                (1.0 - a / b) * 100.0
            )
        } else {
            format!(
                "{:.0}% more CPU per byte than wireguard-go",
                (a / b - 1.0) * 100.0
            )
        };
        let why = if test.reverse {
            "the device plane reads the TUN device one packet per `read` like wireguard-go, but the ingress \
             encrypts a whole frame and sends each run of same-size datagrams with one GSO `sendmsg`, where this \
             wireguard-go makes one `sendmsg` per packet; against that, the channel hop and its copies"
        } else {
            "both make one `write` per packet into a TUN device (the kernel's forwarding and NAT run inside that \
             write, billed to the writer: see the system time of the device plane and of wireguard-go); blipless \
             adds the channel hop and its copies, and saves on the receive side (`recvmmsg` batches)"
        };
        let _ = writeln!(out, "- {}: blipless spent {verdict}: {why}.", test.label());
    }
    if let (Some(ours), Some(theirs)) = (blipless.ping(), baseline.ping()) {
        let difference = ours.avg - theirs.avg;
        let comparison = if difference.abs() < 0.0005 {
            "the same as".to_string()
        } else if difference > 0.0 {
            format!("{difference:.3} ms more than")
        } else {
            format!("{:.3} ms less than", -difference)
        };
        let _ = writeln!(
            out,
            "- **Latency**: blipless's average round trip was {comparison} wireguard-go's ({:.3} against {:.3} \
             ms; minimum {:.3} against {:.3} ms). Each echo and its reply cross the ingress–device channel (a \
             SOCK_SEQPACKET send and the wake-up of another process each way), on top of the UDP and TUN hops both \
             servers make; on a busy machine each extra wake-up may also wait for a CPU, which shows in the average \
             and the maximum more than in the minimum.",
            ours.avg, theirs.avg, ours.min, theirs.min
        );
    }
    out.push_str(
        "\nSerial stages and copies in blipless's packet path (from the code, not measured one by one):\n\n\
         - **Upload** (customer → internet). In the ingress, one task, `Wireguard::serve` \
           (`ingress/src/wg/mod.rs`), receives a batch (`recvmmsg`), decrypts every datagram in turn, and then \
           awaits the channel send of the resulting `Packets` frames before it receives again: decryption runs on \
           one thread at a time, and receiving, decrypting and sending to the device plane do not overlap. Each \
           inner packet is copied into its batch (`InnerBatches::push`), again when `send_to_active` clones the \
           batch (`Message::Packets(batch.clone())`), a third time into the encoded frame, and a fourth time out of \
           it by the device plane's decode (`Packets::try_push`, one heap allocation per packet in three of the \
           four). In the device plane, the session loop (`session`, `device-plane/src/lib.rs`) awaits \
           `PacketPath::to_tun` (`device-plane/src/wireguard.rs`), one `write` per packet, before it reads the \
           next frame from the channel. wireguard-go decrypts in place on parallel goroutines and writes to its TUN \
           device from there: no channel, no copies.\n\
         - **Download** (internet → customer). The device plane reads each TUN queue one packet per `read` \
           (`read_queue`), copies each into a `Packets` frame (up to 256 packets) and sends it; the ingress's \
           reader task for that plane (`device_link.rs`) decodes it (a copy per packet) and awaits \
           `Wireguard::from_plane`, which encrypts the packets in turn, copies each into its GSO group \
           (`Outgoing::push`) and sends, before it reads the next frame: the download's crypto, too, runs on one \
           thread at a time.\n\
         - blipless runs from release builds here (`BLIPLESS_PROFILE=release`, see the tools line above); the \
           debug builds `make test` uses are not comparable.\n\n",
    );
}

fn usage() -> ExitCode {
    eprintln!("usage: blipless-bench-wg [--out PATH] [--quick]");
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
    let command = match bench_doc::prepare(
        "blipless-bench-wg",
        &[
            "iperf3",
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
        ],
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
    eprintln!(
        "blipless-bench-wg: {} CPUs, {}, kernel {}, load {}; {} s runs, {} repeat(s)",
        machine.cpus,
        machine.model,
        machine.kernel,
        machine.load_before,
        plan.seconds,
        plan.repeats
    );

    let measured = measure(plan);
    let (blipless, baseline) = match measured {
        Ok(results) => results,
        Err(error) => {
            eprintln!("blipless-bench-wg: {error}");
            return ExitCode::FAILURE;
        }
    };
    machine.finish();
    let section = render(&machine, plan, &blipless, &baseline);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-wg: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the WireGuard section of {}", out.display());
    ExitCode::SUCCESS
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

/// Builds both worlds and runs every measurement, interleaved.
fn measure(plan: Plan) -> Result<(Results, Results), String> {
    eprintln!("building the blipless world");
    let mut beds = vec![Bed::start(Kind::Blipless)?];
    eprintln!("building the wireguard-go world");
    beds.push(Bed::start(Kind::WireguardGo)?);
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
                    mbit(run.bits_per_second),
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
                ping.min,
                ping.avg,
                ping.max,
                ping.mdev,
                ping.received,
                ping.sent
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
    fn reads_ping_summaries() {
        let text = "PING 10.81.2.2 (10.81.2.2) 56(84) bytes of data.\n\n--- 10.81.2.2 ping statistics ---\n\
                    200 packets transmitted, 199 received, 0.5% packet loss, time 2211ms\n\
                    rtt min/avg/max/mdev = 0.101/0.254/1.302/0.093 ms\n";
        let ping = parse_ping(text).expect("parses");
        assert_eq!(
            ping,
            Ping {
                sent: 200,
                received: 199,
                min: 0.101,
                avg: 0.254,
                max: 1.302,
                mdev: 0.093,
                disturbed: 0
            }
        );
        assert!(parse_ping("3 packets transmitted, 0 received, 100% packet loss").is_err());
        let piped = "50 packets transmitted, 50 received, 0% packet loss, time 741ms\n\
                     rtt min/avg/max/mdev = 0.199/1.518/20.911/3.178 ms, pipe 2\n";
        assert_eq!(parse_ping(piped).map(|p| p.max), Ok(20.911));
    }

    #[test]
    fn reads_proc_stat_lines() {
        let line = "1234 (tokio (w) x) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 4 0 100\n";
        assert_eq!(
            parse_stat(line),
            Some(Times {
                user: 2.5,
                system: 0.75
            })
        );
        assert_eq!(parse_stat("1234 (x) S 1 2"), None);
        assert!(cpu_times("self").is_some());
    }

    #[test]
    fn renders_a_section_between_the_markers() {
        let run = |mbit: f64| Run {
            bits_per_second: mbit * 1e6,
            retransmits: Some(3),
            iperf_cpu: Some((10.0, 20.0)),
            cpu: CpuUse {
                server: vec![(
                    "wireguard-go",
                    Times {
                        user: 0.3,
                        system: 0.4,
                    },
                )],
                busiest: Some(("wireguard-go", "wireguard-go".into(), 0.2)),
                client: Times {
                    user: 0.2,
                    system: 0.5,
                },
                machine: 0.95,
                softirq: 0.2,
            },
            disturbed: false,
        };
        let mut ours = Results::new();
        let mut theirs = Results::new();
        for index in 0..TESTS.len() {
            ours.runs[index].push(run(900.0));
            theirs.runs[index].push(run(if index == 0 { 1000.0 } else { 600.0 }));
        }
        let ping = Ping {
            sent: 200,
            received: 200,
            min: 0.1,
            avg: 0.2,
            max: 0.3,
            mdev: 0.01,
            disturbed: 0,
        };
        ours.pings.push(ping);
        theirs.pings.push(ping);
        let machine = Machine {
            cpus: 2,
            model: "CPU".into(),
            kernel: "6".into(),
            date: "today".into(),
            commit: "abc".into(),
            load_before: "0".into(),
            load_after: "0".into(),
            wireguard_go: "wg".into(),
            iperf3: "iperf".into(),
            profile: "release".into(),
            command: "bench".into(),
            compilers: false,
        };
        let text = render(&machine, Plan::quick(), &ours, &theirs);
        assert!(text.starts_with(MARKERS.begin) && text.trim_end().ends_with(MARKERS.end));
        assert!(
            text.contains("| 900 | 1000 | 1000 | 0.90 | **not met** |"),
            "{text}"
        );
        assert!(
            text.contains("(the target's measure): **not met**"),
            "{text}"
        );
        assert!(text.contains("**blipless is CPU-bound here.**"), "{text}");
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
                sent: 10,
                received: 10,
                min,
                avg: 0.4,
                max,
                mdev: 0.1,
                disturbed: 1,
            });
        }
        let ping = results.ping().expect("pings");
        assert_eq!(
            (ping.min, ping.max, ping.sent, ping.disturbed),
            (0.2, 0.7, 30, 3)
        );
    }
}
