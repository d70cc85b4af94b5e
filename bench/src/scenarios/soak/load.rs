//! The soak's load, all on the tokio runtime and bounded: steady short
//! requests over SOCKS5, HTTP and HTTPS (absolute-form), each failure
//! recorded with its start and end; long byte-checked echo tunnels over
//! SOCKS5, HTTP CONNECT and HTTPS CONNECT ([`super::stream`]), each replaced
//! by a new one when it ends; and a `/status` watcher. [`Load::finish`] stops it and hands back
//! what happened.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::rng::{mix, Rng};
use super::stream::{self, StreamRecord};
use super::Clock;
use crate::client::{self, Mode, Proxies};

/// The paths of the short requests.
pub const REQUEST_MODES: [Mode; 3] = [Mode::Socks5, Mode::HttpAbsolute, Mode::HttpsAbsolute];
/// The paths of the long tunnels.
pub const STREAM_MODES: [Mode; 3] = [Mode::Socks5, Mode::HttpConnect, Mode::HttpsConnect];

/// One short request at most.
const REQUEST_BOUND: Duration = Duration::from_secs(20);
/// The shortest stream worth starting.
const SHORTEST_STREAM: f64 = 2.0;

/// How much load, and until when.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Short-request workers per mode ([`REQUEST_MODES`]).
    pub workers: usize,
    /// Each worker's pause between two requests.
    pub pause: Duration,
    /// Echo tunnels open at once per mode ([`STREAM_MODES`]).
    pub streams: usize,
    /// Each tunnel's upload rate, bytes per second.
    pub rate: u64,
    /// Each tunnel lasts this long (seconds, drawn from the range) ...
    pub stream_seconds: (f64, f64),
    /// ... and ends by this clock time: no stream outlives the load.
    pub until: f64,
    /// Keys the load's randomness (stream lengths and contents).
    pub seed: u64,
}

/// A short request that failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// SOCKS5 or HTTP absolute-form.
    pub mode: Mode,
    /// When it started (clock seconds).
    pub start: f64,
    /// When it failed.
    pub end: f64,
    /// What went wrong.
    pub error: String,
}

/// Everything the load saw.
#[derive(Debug, Default, Clone)]
pub struct Records {
    /// Short requests made, per mode: (mode, requests, failed).
    pub requests: Vec<(Mode, u64, u64)>,
    /// Every failed short request.
    pub failures: Vec<Failure>,
    /// Every echo tunnel.
    pub streams: Vec<StreamRecord>,
}

impl Records {
    fn count(&mut self, mode: Mode, failed: bool) {
        match self.requests.iter_mut().find(|(m, _, _)| *m == mode) {
            Some((_, total, failures)) => {
                *total += 1;
                *failures += u64::from(failed);
            }
            None => self.requests.push((mode, 1, u64::from(failed))),
        }
    }

    /// Adds `other`'s records to these.
    pub fn extend(&mut self, other: Records) {
        for (mode, total, failed) in other.requests {
            match self.requests.iter_mut().find(|(m, _, _)| *m == mode) {
                Some(entry) => {
                    entry.1 += total;
                    entry.2 += failed;
                }
                None => self.requests.push((mode, total, failed)),
            }
        }
        self.failures.extend(other.failures);
        self.streams.extend(other.streams);
    }
}

/// The load while it runs.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Records>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `plan` on `runtime` against `origin` through `proxies`.
    pub fn start(
        runtime: &Handle,
        proxies: &Proxies,
        origin: SocketAddr,
        plan: Plan,
        clock: Clock,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Records::default()));
        let mut tasks = Vec::new();
        for mode in REQUEST_MODES {
            for _ in 0..plan.workers {
                let (proxies, stop, records) = (proxies.clone(), stop.clone(), records.clone());
                tasks.push(runtime.spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let start = clock.now();
                        let result = request(&proxies, mode, origin).await;
                        let end = clock.now();
                        {
                            let mut records = lock(&records);
                            records.count(mode, result.is_err());
                            if let Err(error) = result {
                                records.failures.push(Failure {
                                    mode,
                                    start,
                                    end,
                                    error,
                                });
                            }
                        }
                        tokio::time::sleep(plan.pause).await;
                    }
                }));
            }
        }
        let mut slot = 0u64;
        for mode in STREAM_MODES {
            for _ in 0..plan.streams {
                slot += 1;
                let (proxies, stop, records) = (proxies.clone(), stop.clone(), records.clone());
                let mut rng = Rng::new(mix(plan.seed ^ slot));
                tasks.push(runtime.spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let left = plan.until - clock.now();
                        let seconds = rng
                            .between(plan.stream_seconds.0, plan.stream_seconds.1)
                            .min(left - 1.0);
                        if seconds < SHORTEST_STREAM {
                            break;
                        }
                        n += 1;
                        let stream_plan = stream::Plan {
                            mode,
                            size: (seconds * plan.rate as f64) as u64,
                            rate: plan.rate,
                            key: mix(plan.seed ^ (slot << 32) ^ n),
                        };
                        let record = stream::run(&proxies, origin, stream_plan, clock).await;
                        let broke = !record.survived();
                        lock(&records).streams.push(record);
                        if broke {
                            // Not in a tight loop while the node recovers.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }));
            }
        }
        Load {
            stop,
            records,
            tasks,
        }
    }

    /// Stops starting requests and streams, waits for the open streams to
    /// end (each was sized to end by `plan.until`; `bound` after that at
    /// most), and returns the records.
    pub fn finish(self, runtime: &Handle, bound: Duration) -> Records {
        self.stop.store(true, Ordering::SeqCst);
        let tasks = self.tasks;
        runtime.block_on(async move {
            let deadline = tokio::time::Instant::now() + bound;
            for task in tasks {
                let abort = task.abort_handle();
                if tokio::time::timeout_at(deadline, task).await.is_err() {
                    abort.abort();
                }
            }
        });
        std::mem::take(&mut *lock(&self.records))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One short request (`GET /`, "hello") by `mode`, bounded.
pub async fn request(proxies: &Proxies, mode: Mode, origin: SocketAddr) -> Result<(), String> {
    let exchange = async {
        let mut opened = client::open(proxies, mode, origin).await?;
        client::tiny_exchange(&mut opened, proxies, mode, origin).await
    };
    match tokio::time::timeout(REQUEST_BOUND, exchange).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {REQUEST_BOUND:?}")),
    }
}

/// Whether the status listener at `status` answers `/status` with 200
/// within `bound`.
pub async fn status_ok(status: SocketAddr, bound: Duration) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(status).await?;
        stream
            .write_all(b"GET /status HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buffer = Vec::with_capacity(256);
        client::read_head(&mut stream, &mut buffer).await
    };
    matches!(tokio::time::timeout(bound, probe).await, Ok(Ok(_)))
}

/// Polls `/status` every 20 ms from now until it answers 200 or `bound`
/// passes: the clock time of the first 200.
pub async fn first_ok(status: SocketAddr, clock: Clock, bound: Duration) -> Option<f64> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let attempt = clock.now();
        if status_ok(status, Duration::from_millis(500)).await {
            return Some(attempt);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/status` every 100 ms until stopped: each answer's time and whether it
/// was 200.
#[derive(Debug)]
pub struct StatusWatch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<(f64, bool)>>,
}

impl StatusWatch {
    /// Starts watching `status`.
    pub fn start(runtime: &Handle, status: SocketAddr, clock: Clock) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = runtime.spawn(async move {
            let mut seen = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                let at = clock.now();
                seen.push((at, status_ok(status, Duration::from_secs(1)).await));
            }
            seen
        });
        Self { stop, task }
    }

    /// Stops and returns what it saw.
    pub fn finish(self, runtime: &Handle) -> Vec<(f64, bool)> {
        self.stop.store(true, Ordering::SeqCst);
        runtime.block_on(self.task).unwrap_or_default()
    }
}
