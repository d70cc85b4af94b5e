//! Section 1: new connections, each carrying one tiny request and answer,
//! first one at a time (latency without queueing), then from many workers
//! at once (connection rate under load).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{self, Mode, Proxies};
use crate::stats::Percentiles;

/// Bounds of one phase.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Workers opening connections in parallel.
    pub workers: usize,
    /// At most this many connections in the phase.
    pub connections: u64,
    /// At most this long.
    pub time: Duration,
}

/// Limit on any one connection, setup and exchange together.
const PER_CONNECTION: Duration = Duration::from_secs(5);
/// A phase stops early after this many failed connections.
const MAX_ERRORS: u64 = 50;

/// What one phase of one mode measured.
#[derive(Debug)]
pub struct Phase {
    /// How the connections went.
    pub mode: Mode,
    /// The bounds it ran under.
    pub bounds: Bounds,
    /// Connections that completed their exchange.
    pub completed: u64,
    /// Connections that failed or timed out.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Wall time of the phase.
    pub elapsed: Duration,
    /// Connect start until the connect returned.
    pub connected: Percentiles,
    /// SOCKS5: connect start until the method reply (includes the hand-off).
    pub greeted: Percentiles,
    /// SOCKS5: connect start until the auth status.
    pub authenticated: Percentiles,
    /// Connect start until the tunnel was usable.
    pub usable: Percentiles,
    /// Connect start until the whole answer arrived.
    pub round_trip: Percentiles,
}

impl Phase {
    /// Completed connections per second.
    pub fn rate(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Default)]
struct Samples {
    connected: Vec<Duration>,
    greeted: Vec<Duration>,
    authenticated: Vec<Duration>,
    usable: Vec<Duration>,
    round_trip: Vec<Duration>,
}

impl Samples {
    fn append(&mut self, other: Samples) {
        self.connected.extend(other.connected);
        self.greeted.extend(other.greeted);
        self.authenticated.extend(other.authenticated);
        self.usable.extend(other.usable);
        self.round_trip.extend(other.round_trip);
    }
}

async fn one(proxies: &Proxies, mode: Mode, origin: SocketAddr) -> std::io::Result<Samples> {
    let mut opened = client::open(proxies, mode, origin).await?;
    let round_trip = client::tiny_exchange(&mut opened, proxies, mode, origin).await?;
    let setup = opened.setup;
    Ok(Samples {
        connected: vec![setup.connected],
        greeted: setup.greeted.into_iter().collect(),
        authenticated: setup.authenticated.into_iter().collect(),
        usable: vec![setup.usable],
        round_trip: vec![round_trip],
    })
}

/// Runs one phase: `bounds.workers` workers open connections until
/// `bounds.connections` were started, `bounds.time` passed, or too many failed.
pub async fn phase(proxies: &Proxies, mode: Mode, origin: SocketAddr, bounds: Bounds) -> Phase {
    let tickets = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let started = Instant::now();
    let deadline = started + bounds.time;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..bounds.workers {
        let (proxies, tickets, errors) = (proxies.clone(), tickets.clone(), errors.clone());
        let first_error = first_error.clone();
        workers.spawn(async move {
            let mut samples = Samples::default();
            while Instant::now() < deadline
                && tickets.fetch_add(1, Ordering::Relaxed) < bounds.connections
                && errors.load(Ordering::Relaxed) < MAX_ERRORS
            {
                let error =
                    match tokio::time::timeout(PER_CONNECTION, one(&proxies, mode, origin)).await {
                        Ok(Ok(one)) => {
                            samples.append(one);
                            continue;
                        }
                        Ok(Err(error)) => error.to_string(),
                        Err(_) => format!("no answer within {PER_CONNECTION:?}"),
                    };
                errors.fetch_add(1, Ordering::Relaxed);
                let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(error);
            }
            samples
        });
    }
    let mut all = Samples::default();
    while let Some(joined) = workers.join_next().await {
        if let Ok(samples) = joined {
            all.append(samples);
        }
    }
    let elapsed = started.elapsed();
    let first_error = first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Phase {
        mode,
        bounds,
        completed: all.round_trip.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        first_error,
        elapsed,
        connected: Percentiles::of(all.connected),
        greeted: Percentiles::of(all.greeted),
        authenticated: Percentiles::of(all.authenticated),
        usable: Percentiles::of(all.usable),
        round_trip: Percentiles::of(all.round_trip),
    }
}

/// Both phases for every mode: sequential first, then concurrent.
#[derive(Debug)]
pub struct Section {
    /// One worker.
    pub sequential: Vec<Phase>,
    /// Many workers.
    pub concurrent: Vec<Phase>,
}

impl Section {
    /// The sequential phase of `mode`.
    pub fn sequential(&self, mode: Mode) -> Option<&Phase> {
        self.sequential.iter().find(|p| p.mode == mode)
    }
}

/// Runs section 1.
pub async fn run(
    proxies: &Proxies,
    origin: SocketAddr,
    sequential: Bounds,
    concurrent: Bounds,
) -> Section {
    let mut section = Section {
        sequential: Vec::new(),
        concurrent: Vec::new(),
    };
    for bounds in [sequential, concurrent] {
        for mode in Mode::ALL {
            // A short warm-up: first connections pay for lazy allocations.
            let warm = Bounds {
                workers: bounds.workers,
                connections: 64,
                time: Duration::from_secs(2),
            };
            let _ = phase(proxies, mode, origin, warm).await;
            let measured = phase(proxies, mode, origin, bounds).await;
            eprintln!(
                "  {:<19} {:>2} worker(s): {:>6} conns, {:>8.0}/s, usable p50 {:?}, round trip p50 {:?}, {} errors",
                mode.label(),
                bounds.workers,
                measured.completed,
                measured.rate(),
                measured.usable.p50,
                measured.round_trip.p50,
                measured.errors
            );
            if bounds.workers == 1 {
                section.sequential.push(measured);
            } else {
                section.concurrent.push(measured);
            }
        }
    }
    section
}
