//! Where the CPU went during one iperf3 run of the WireGuard bench: the
//! server's processes, its busiest thread, the client's wireguard-go and the
//! whole machine, from readings before and after the run.

use std::time::Instant;

use crate::procfs::{cpu_times, machine_ticks, thread_cpu, Times};

/// CPU readings at one moment.
#[derive(Debug, Clone)]
pub(super) struct CpuSnapshot {
    at: Instant,
    server: Vec<(&'static str, Times)>,
    threads: Vec<(&'static str, i32, String, Times)>,
    client: Times,
    machine: (u64, u64, u64),
}

impl CpuSnapshot {
    /// Reads the CPU time of the `server` processes (and their threads),
    /// the `client` processes and the machine.
    pub fn take(server: &[(&'static str, i32)], client: &[i32]) -> Self {
        let mut threads = Vec::new();
        for (label, pid) in server {
            for (tid, name, times) in thread_cpu(*pid) {
                threads.push((*label, tid, name, times));
            }
        }
        let client = client
            .iter()
            .filter_map(|pid| cpu_times(&pid.to_string()))
            .fold(Times::default(), Times::plus);
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
pub(super) struct CpuUse {
    /// Each server process.
    pub server: Vec<(&'static str, Times)>,
    /// The busiest server thread: process, thread name, share of one core.
    pub busiest: Option<(&'static str, String, f64)>,
    /// The customer's wireguard-go.
    pub client: Times,
    /// The whole machine, busy, of all cores.
    pub machine: f64,
    /// The whole machine, softirq, of all cores.
    pub softirq: f64,
}

impl CpuUse {
    /// From `before` to `after`.
    pub fn between(before: &CpuSnapshot, after: &CpuSnapshot) -> Self {
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
    pub fn server_total(&self) -> f64 {
        self.server.iter().map(|(_, t)| t.total()).sum()
    }
}
