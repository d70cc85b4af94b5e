//! Side by side: blipless beside Debian's dante (SOCKS5), microsocks
//! (SOCKS5), tinyproxy (HTTP CONNECT), haproxy and nginx (plain TCP
//! forwarders), all on 127.0.0.1 to the bench's own origins, driven by the
//! one load client of [`crate::client`], interleaved run by run.
//!
//! Per path and run: the connection rate of 32 workers (each connection
//! new, with the proxy's handshake and credentials and one tiny `GET /`, as
//! in [`crate::scenarios::rate`]), the round trip's p50/p99, the proxy's
//! CPU per connection; then one connection's download (as in
//! [`crate::scenarios::bulk`]) and the proxy's CPU per GiB. The median run
//! counts. The proxy's CPU is utime + stime from /proc: of the ingress and
//! the device plane for blipless, of every process in the peer's process
//! group (children it reaped included) for the others.
//!
//! Each peer runs in the foreground with its config in a temporary folder,
//! on a free port, in a process group of its own, and is killed (its group,
//! and only it) when dropped. Dante runs through the end-to-end harness
//! (`blipless_tests::dante`), which needs root for its system user.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use blipless_tests::dante::Dante;
use blipless_tests::node::{Daemon, Node};
use blipless_tests::origin::Origin;

use crate::client::{self, Mode, Proxies};
use crate::format::{micros, verdict};
use crate::procfs::Pids;
use crate::report::{Machine, Markers};
use crate::scenarios::bulk::{self, StreamOrigin};
use crate::scenarios::rate::{self, Bounds};
use crate::stats::{upper_median, Percentiles};

/// The section's markers in docs/BENCHMARKS.md.
pub const MARKERS: Markers = Markers {
    begin: "<!-- peers:begin -->",
    end: "<!-- peers:end -->",
};

/// Issue 13 item 1: each proxy protocol with credentials at this share of
/// the direct connection rate or more ...
pub const RATE_TARGET: f64 = 0.6;
/// ... with at most this much proxy CPU per connection, µs.
pub const CPU_PER_CONNECTION_TARGET_US: f64 = 100.0;
/// Issue 13 item 3: one tunnel at this share of direct throughput or more ...
pub const BULK_TARGET: f64 = 0.5;
/// ... at most this much proxy CPU per GiB, seconds.
pub const CPU_PER_GIB_TARGET_S: f64 = 0.5;

/// The Debian packages of the peers (package, program).
pub const PACKAGES: [(&str, &str); 6] = [
    ("dante-server", "danted"),
    ("microsocks", "microsocks"),
    ("tinyproxy", "tinyproxy"),
    ("haproxy", "haproxy"),
    ("nginx", "nginx"),
    ("libnginx-mod-stream", "ngx_stream_module.so"),
];

/// Debian's dynamic stream module for nginx.
const NGINX_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Runs per path (the median counts).
    pub runs: usize,
    /// Workers of the connection-rate phase.
    pub workers: usize,
    /// How long each connection-rate phase lasts.
    pub rate_time: Duration,
    /// Bytes of each download.
    pub bulk_bytes: u64,
    /// Time bound of each download.
    pub bulk_bound: Duration,
}

impl Plan {
    /// The figures in docs/BENCHMARKS.md.
    pub fn full() -> Self {
        Self {
            runs: 3,
            workers: 32,
            rate_time: Duration::from_secs(3),
            bulk_bytes: 1 << 30,
            bulk_bound: Duration::from_secs(10),
        }
    }

    /// Checks the bench itself.
    pub fn quick() -> Self {
        Self {
            runs: 1,
            workers: 32,
            rate_time: Duration::from_millis(500),
            bulk_bytes: 64 << 20,
            bulk_bound: Duration::from_secs(5),
        }
    }
}

mod report;
mod servers;

pub use report::render;
use servers::*;
pub use servers::{group_cpu_seconds, package_version};

/// One way to reach the origins.
#[derive(Debug, Clone)]
pub struct PathInfo {
    /// The server ("direct", "blipless", "dante", ...).
    pub server: &'static str,
    /// What the client speaks to it, with credentials.
    pub protocol: &'static str,
    /// Whether the client sends credentials.
    pub credentials: bool,
}

/// One connection-rate run.
#[derive(Debug, Clone)]
pub struct RateRun {
    /// Connections per second.
    pub rate: f64,
    /// Connections completed.
    pub completed: u64,
    /// Connections failed.
    pub errors: u64,
    /// Round trip percentiles.
    pub round_trip: Percentiles,
    /// Proxy CPU per completed connection, µs (None for direct).
    pub cpu_us: Option<f64>,
    /// The bench's own CPU per completed connection, µs: the load client
    /// and the origins, which run in this process.
    pub client_us: Option<f64>,
}

/// One download.
#[derive(Debug, Clone)]
pub struct BulkRun {
    /// MB/s (10^6 bytes per second).
    pub mb_s: f64,
    /// Body bytes received.
    pub bytes: u64,
    /// Whether the whole body arrived within the bound.
    pub complete: bool,
    /// Proxy CPU per GiB received, s (None for direct).
    pub cpu_s_per_gib: Option<f64>,
}

/// Everything one path measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Which path.
    pub info: PathInfo,
    /// Each connection-rate run, in order.
    pub rate: Vec<RateRun>,
    /// Each download, in order.
    pub bulk: Vec<BulkRun>,
    /// Whether a connection with a wrong password was refused (None: no credentials).
    pub refuses_wrong_credentials: Option<bool>,
    /// The first failure seen.
    pub first_error: Option<String>,
}

impl Measured {
    /// The rate run with the median rate.
    pub fn median_rate(&self) -> Option<&RateRun> {
        let mut runs: Vec<&RateRun> = self.rate.iter().collect();
        runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        upper_median(&runs)
    }

    /// The download with the median MB/s.
    pub fn median_bulk(&self) -> Option<&BulkRun> {
        let mut runs: Vec<&BulkRun> = self.bulk.iter().collect();
        runs.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
        upper_median(&runs)
    }
}

/// A peer that could not be measured, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The peer.
    pub server: &'static str,
    /// Why.
    pub reason: String,
}

/// Everything the bench found.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Per path, in table order.
    pub paths: Vec<Measured>,
    /// Peers left out.
    pub skipped: Vec<Skipped>,
    /// Installed versions (package, version).
    pub versions: Vec<(String, String)>,
    /// How the peers were stopped.
    pub stopped: Vec<String>,
    /// dante's user's password hash scheme (its `username` method checks it per connection).
    pub dante_hash: Option<String>,
}

/// A path as the measuring loop drives it.
struct Driven {
    info: PathInfo,
    mode: Mode,
    proxies: Proxies,
    targets: Targets,
    cpu: CpuOf,
}

/// The password hash scheme of a system user, from /etc/shadow (`$y$`: yescrypt).
fn hash_scheme(user: &str) -> Option<String> {
    let shadow = std::fs::read_to_string("/etc/shadow").ok()?;
    let hash = shadow
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{user}:")))?
        .split(':')
        .next()?;
    let id = hash.strip_prefix('$')?.split('$').next()?;
    Some(
        match id {
            "y" => "yescrypt ($y$)",
            "6" => "SHA-512 crypt ($6$)",
            "5" => "SHA-256 crypt ($5$)",
            "1" => "MD5 crypt ($1$)",
            "2b" | "2y" => "bcrypt",
            other => return Some(format!("${other}$")),
        }
        .to_string(),
    )
}

/// Runs the whole comparison.
/// `only`: the servers to measure (`direct` among them for the ratios);
/// empty: all of them.
pub fn measure(plan: Plan, only: &[String]) -> Results {
    let mut results = Results {
        versions: PACKAGES
            .iter()
            .map(|(package, _)| (package.to_string(), package_version(package)))
            .collect(),
        ..Results::default()
    };
    let runtime = crate::runtime(2).expect("a runtime");
    let origin = Origin::start();
    let stream = runtime
        .block_on(StreamOrigin::start())
        .expect("the streaming origin");
    let targets = Targets {
        tiny: origin.address,
        stream: stream.address,
    };
    let mut node = Node::new("");
    let (ingress, device, client): (Daemon, Daemon, _) = node.start();
    let blipless = Proxies::of(&node, &client);
    let blipless_cpu = CpuOf::Processes(vec![ingress.pid().as_raw(), device.pid().as_raw()]);
    let password = peer_password();

    let mut paths = vec![
        Driven {
            info: PathInfo {
                server: "direct",
                protocol: "TCP straight to the origin (the baseline)",
                credentials: false,
            },
            mode: Mode::Direct,
            proxies: blipless.clone(),
            targets,
            cpu: CpuOf::Nothing,
        },
        Driven {
            info: PathInfo {
                server: "blipless",
                protocol: "SOCKS5 + RFC 1929",
                credentials: true,
            },
            mode: Mode::Socks5,
            proxies: blipless.clone(),
            targets,
            cpu: blipless_cpu.clone(),
        },
        Driven {
            info: PathInfo {
                server: "blipless",
                protocol: "HTTP CONNECT + Basic",
                credentials: true,
            },
            mode: Mode::HttpConnect,
            proxies: blipless.clone(),
            targets,
            cpu: blipless_cpu,
        },
    ];
    let peer_proxies = |address: SocketAddr, user: &str, secret: &str| Proxies {
        socks: address,
        http: address,
        https: None,
        user: user.to_string(),
        secret: secret.to_string(),
    };
    let mut peers: Vec<Peer> = Vec::new();

    // dante, through the tests' harness (a system user of its own: root).
    let mut dante = None;
    if !nix::unistd::geteuid().is_root() {
        results.skipped.push(Skipped {
            server: "dante",
            reason: "needs root (its RFC 1929 check uses a system user the harness creates); run as root".into(),
        });
    } else if program("danted").is_none() && program("sockd").is_none() {
        results.skipped.push(Skipped {
            server: "dante",
            reason: "dante-server is not installed".into(),
        });
    } else {
        match std::panic::catch_unwind(|| Dante::start(Ipv4Addr::LOCALHOST)) {
            Ok(started) => {
                results.dante_hash = hash_scheme(&started.username);
                paths.push(Driven {
                    info: PathInfo {
                        server: "dante",
                        protocol: "SOCKS5 + RFC 1929",
                        credentials: true,
                    },
                    mode: Mode::Socks5,
                    proxies: peer_proxies(started.address, &started.username, &started.password),
                    targets,
                    cpu: CpuOf::Group(started.pid() as i32),
                });
                dante = Some(started);
            }
            Err(_) => results.skipped.push(Skipped {
                server: "dante",
                reason: "did not start (see the bench's stderr)".into(),
            }),
        }
    }
    match start_microsocks(&password) {
        Ok((peer, address)) => {
            paths.push(Driven {
                info: PathInfo {
                    server: "microsocks",
                    protocol: "SOCKS5 + RFC 1929",
                    credentials: true,
                },
                mode: Mode::Socks5,
                proxies: peer_proxies(address, PEER_USER, &password),
                targets,
                cpu: CpuOf::Group(peer.group()),
            });
            peers.push(peer);
        }
        Err(reason) => results.skipped.push(Skipped {
            server: "microsocks",
            reason,
        }),
    }
    match start_tinyproxy(&password, targets) {
        Ok((peer, address)) => {
            paths.push(Driven {
                info: PathInfo {
                    server: "tinyproxy",
                    protocol: "HTTP CONNECT + Basic",
                    credentials: true,
                },
                mode: Mode::HttpConnect,
                proxies: peer_proxies(address, PEER_USER, &password),
                targets,
                cpu: CpuOf::Group(peer.group()),
            });
            peers.push(peer);
        }
        Err(reason) => results.skipped.push(Skipped {
            server: "tinyproxy",
            reason,
        }),
    }
    for (server, started) in [
        ("haproxy", start_haproxy(targets)),
        ("nginx", start_nginx(targets)),
    ] {
        match started {
            Ok((peer, listen)) => {
                paths.push(Driven {
                    info: PathInfo {
                        server,
                        protocol: "plain TCP forward (no handshake, no credentials)",
                        credentials: false,
                    },
                    mode: Mode::Direct,
                    proxies: blipless.clone(),
                    targets: listen,
                    cpu: CpuOf::Group(peer.group()),
                });
                peers.push(peer);
            }
            Err(reason) => results.skipped.push(Skipped { server, reason }),
        }
    }
    for skipped in &results.skipped {
        eprintln!("peers: leaving out {}: {}", skipped.server, skipped.reason);
    }
    if !only.is_empty() {
        paths.retain(|path| only.iter().any(|server| server == path.info.server));
    }

    let mut measured: Vec<Measured> = paths
        .iter()
        .map(|path| Measured {
            info: path.info.clone(),
            rate: Vec::new(),
            bulk: Vec::new(),
            refuses_wrong_credentials: None,
            first_error: None,
        })
        .collect();
    let no_pids = Pids {
        ingress: 0,
        device: 0,
    };

    // Credentials are checked, and every path warmed up once.
    for (path, entry) in paths.iter().zip(&mut measured) {
        if path.info.credentials {
            let mut wrong = path.proxies.clone();
            wrong.secret = format!("{}x", wrong.secret);
            let attempt = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), async {
                    let mut opened = client::open(&wrong, path.mode, path.targets.tiny).await?;
                    client::tiny_exchange(&mut opened, &wrong, path.mode, path.targets.tiny).await
                })
                .await
            });
            entry.refuses_wrong_credentials = Some(!matches!(attempt, Ok(Ok(_))));
        }
        let warm = Bounds {
            workers: plan.workers,
            connections: 512,
            time: Duration::from_secs(1),
        };
        let phase = runtime.block_on(rate::phase(
            &path.proxies,
            path.mode,
            path.targets.tiny,
            warm,
        ));
        if let Some(error) = phase.first_error {
            entry.first_error.get_or_insert(format!("warm-up: {error}"));
        }
        let download = runtime.block_on(bulk::download(
            &path.proxies,
            no_pids,
            path.mode,
            path.targets.stream,
            64 << 20,
            plan.bulk_bound,
        ));
        if let Err(error) = download {
            entry
                .first_error
                .get_or_insert(format!("warm-up download: {error}"));
        }
        eprintln!(
            "peers: {} {}: warmed up{}",
            path.info.server,
            path.info.protocol,
            match entry.refuses_wrong_credentials {
                Some(true) => ", a wrong password is refused",
                Some(false) => ", A WRONG PASSWORD IS ACCEPTED",
                None => "",
            }
        );
    }

    let count = paths.len();
    for run in 0..plan.runs {
        // Each run starts one path further on.
        let order: Vec<usize> = (0..count).map(|i| (i + run) % count).collect();
        for &index in &order {
            let (path, entry) = (&paths[index], &mut measured[index]);
            let bounds = Bounds {
                workers: plan.workers,
                connections: u64::MAX / 2,
                time: plan.rate_time,
            };
            let before = path.cpu.seconds();
            let client_before = crate::procfs::cpu_seconds("self");
            let phase = runtime.block_on(rate::phase(
                &path.proxies,
                path.mode,
                path.targets.tiny,
                bounds,
            ));
            let after = path.cpu.seconds();
            let per_connection = |(b, a): (f64, f64)| (a - b) * 1e6 / phase.completed.max(1) as f64;
            let cpu_us = before.zip(after).map(per_connection);
            let client_us = client_before
                .zip(crate::procfs::cpu_seconds("self"))
                .map(per_connection);
            eprintln!(
                "peers: run {} {:<10} {:<22} {:>6.0} conn/s, p50 {}, p99 {}, proxy CPU {} µs/conn, {} errors",
                run + 1,
                path.info.server,
                short_protocol(&path.info),
                phase.rate(),
                micros(phase.round_trip.p50),
                micros(phase.round_trip.p99),
                cpu_us.map_or("—".into(), |us| format!("{us:.0}")),
                phase.errors
            );
            if let Some(error) = &phase.first_error {
                entry.first_error.get_or_insert(error.clone());
            }
            entry.rate.push(RateRun {
                rate: phase.rate(),
                completed: phase.completed,
                errors: phase.errors,
                round_trip: phase.round_trip,
                cpu_us,
                client_us,
            });
        }
        for &index in &order {
            let (path, entry) = (&paths[index], &mut measured[index]);
            let before = path.cpu.seconds();
            let download = runtime.block_on(bulk::download(
                &path.proxies,
                no_pids,
                path.mode,
                path.targets.stream,
                plan.bulk_bytes,
                plan.bulk_bound,
            ));
            let after = path.cpu.seconds();
            match download {
                Ok(done) => {
                    let gib = done.bytes as f64 / f64::from(1u32 << 30);
                    let cpu_s_per_gib = before.zip(after).map(|(b, a)| (a - b) / gib.max(1e-9));
                    eprintln!(
                        "peers: run {} {:<10} {:<22} {:>6.0} MB/s ({} MiB in {:.2?}{}), proxy CPU {} s/GiB",
                        run + 1,
                        path.info.server,
                        short_protocol(&path.info),
                        done.megabytes_per_second(),
                        done.bytes >> 20,
                        done.elapsed,
                        if done.complete { "" } else { ", time bound hit" },
                        cpu_s_per_gib.map_or("—".into(), |s| format!("{s:.2}")),
                    );
                    entry.bulk.push(BulkRun {
                        mb_s: done.megabytes_per_second(),
                        bytes: done.bytes,
                        complete: done.complete,
                        cpu_s_per_gib,
                    });
                }
                Err(error) => {
                    eprintln!(
                        "peers: run {} {} {}: download failed: {error}",
                        run + 1,
                        path.info.server,
                        short_protocol(&path.info)
                    );
                    entry
                        .first_error
                        .get_or_insert(format!("download: {error}"));
                }
            }
        }
    }

    for mut peer in peers {
        results.stopped.push(peer.stop());
    }
    if let Some(mut dante) = dante {
        let group = dante.pid() as i32;
        dante.kill();
        results.stopped.push(format!(
            "dante: SIGKILL to process group {group} (the harness's kill), its system user removed"
        ));
        drop(dante);
    }
    drop((ingress, device));
    drop(stream);
    drop(runtime);
    results.paths = measured;
    results
}

fn short_protocol(info: &PathInfo) -> &'static str {
    if info.server == "direct" {
        "(baseline)"
    } else if info.credentials {
        info.protocol
    } else {
        "TCP forward"
    }
}
