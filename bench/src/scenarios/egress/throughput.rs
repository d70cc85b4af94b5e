//! Section 2 of the egress bench: one large download per route through one
//! SOCKS5 tunnel (curl in the node namespace, `-x socks5://…`), from the
//! bench's origin (`GET /stream/N`, one fixed 64 KiB buffer written again
//! and again, so the origin costs little), with the CPU of the processes on
//! the path. Routes and runs are interleaved.

use std::collections::BTreeMap;
use std::time::Instant;

use blipless_tests::netns::Netns;

use super::world::World;
use super::{Plan, Route};
use crate::procfs::{cpu_seconds, machine_ticks};

/// One download.
#[derive(Debug, Clone)]
pub(super) struct Run {
    /// curl's `speed_download`, bytes per second.
    pub bytes_per_second: f64,
    /// Wall time of the download (curl's `time_total`), seconds.
    pub seconds: f64,
    /// CPU of the processes on the path, as shares of one core, busiest
    /// first (processes alive before and after the download).
    pub cpu: Vec<(String, f64)>,
    /// The machine's busy share of all its cores.
    pub busy: f64,
}

/// Every download of one route.
#[derive(Debug, Clone)]
pub(super) struct Download {
    /// The route.
    pub route: Route,
    /// In the order run.
    pub runs: Vec<Run>,
}

impl Download {
    /// The run with the median speed (the lower middle of an even count).
    pub fn median(&self) -> Option<&Run> {
        let mut runs: Vec<&Run> = self.runs.iter().collect();
        runs.sort_by(|a, b| a.bytes_per_second.total_cmp(&b.bytes_per_second));
        runs.get(runs.len().saturating_sub(1) / 2).copied()
    }
}

/// What a process is called in the report.
fn display_name(comm: &str, role: &str) -> String {
    match comm {
        "blipless-ingres" => "blipless-ingress".into(),
        "blipless-bench-" => "origin".into(),
        "wireguard-go" => format!("wireguard-go ({role})"),
        other => other.into(),
    }
}

/// CPU seconds of every process in `namespaces`, by pid, with its name.
fn snapshot(namespaces: &[&Netns]) -> BTreeMap<i32, (String, f64)> {
    let mut all = BTreeMap::new();
    for netns in namespaces {
        for pid in netns.pids() {
            let path = pid.to_string();
            if let (Some(comm), Some(cpu)) = (crate::procfs::comm(&path), cpu_seconds(&path)) {
                all.insert(pid, (display_name(&comm, netns.role()), cpu));
            }
        }
    }
    all
}

/// Runs every download.
pub(super) fn measure(world: &World, plan: Plan) -> Result<Vec<Download>, String> {
    let origin = world.bench_origin()?;
    let url = format!("http://{origin}/stream/{}", plan.download);
    let mut downloads: Vec<Download> = Route::ALL
        .iter()
        .map(|&route| Download {
            route,
            runs: Vec::new(),
        })
        .collect();
    let net = &world.net;
    let namespaces = [&net.net.node_ns, &net.exit, &net.net.internet];
    for run in 1..=plan.downloads {
        for download in &mut downloads {
            let mut command = net.net.node_ns.command("curl");
            command.args([
                "--silent",
                "--show-error",
                "--max-time",
                "600",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{size_download} %{speed_download} %{time_total}",
            ]);
            if let Some(proxy) = world.proxy_url(download.route) {
                command.args(["-x", &proxy]);
            }
            command.arg(&url);
            let before = snapshot(&namespaces);
            let ticks = machine_ticks();
            let wall = Instant::now();
            let output = blipless_tests::netns::run(&mut command)
                .map_err(|e| format!("{}: {e}", download.route.label()))?;
            let wall = wall.elapsed().as_secs_f64();
            let after = snapshot(&namespaces);
            let ticks_after = machine_ticks();
            let words: Vec<&str> = output.split_whitespace().collect();
            let (code, size, speed, total) = match words[..] {
                [code, size, speed, total] => (
                    code,
                    size.parse::<f64>().unwrap_or(0.0),
                    speed.parse::<f64>().unwrap_or(0.0),
                    total.parse::<f64>().unwrap_or(f64::NAN),
                ),
                _ => return Err(format!("curl printed {output:?}")),
            };
            if code != "200" || size as u64 != plan.download {
                return Err(format!(
                    "{}: curl got HTTP {code} and {size} of {} bytes",
                    download.route.label(),
                    plan.download
                ));
            }
            let mut by_name: BTreeMap<String, f64> = BTreeMap::new();
            for (pid, (name, cpu)) in &after {
                if let Some((_, earlier)) = before.get(pid) {
                    *by_name.entry(name.clone()).or_default() += (cpu - earlier) / wall;
                }
            }
            let mut cpu: Vec<(String, f64)> = by_name.into_iter().collect();
            cpu.sort_by(|a, b| b.1.total_cmp(&a.1));
            let busy = (ticks_after.0.saturating_sub(ticks.0)) as f64
                / (ticks_after.2.saturating_sub(ticks.2)).max(1) as f64;
            eprintln!(
                "  {:<38} run {run}: {:.0} MB/s in {total:.2} s; machine {:.0}% busy",
                download.route.label(),
                speed / 1e6,
                busy * 100.0
            );
            download.runs.push(Run {
                bytes_per_second: speed,
                seconds: total,
                cpu,
                busy,
            });
        }
    }
    Ok(downloads)
}
