//! Section 2: one long download through one tunnel, beside the same
//! download straight from the origin; and the section's table.
//!
//! The harness's origin builds a whole body in memory, so this section has
//! its own: `GET /stream/N` answers N bytes by writing one fixed 64 KiB
//! buffer again and again.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::client::{self, Mode, Proxies};
use crate::format::verdict;
use crate::procfs::{Cpu, Pids};
use crate::stats::upper_median;

/// The target: one tunnel's throughput as a share of direct.
pub const THROUGHPUT_TARGET: f64 = 0.70;

/// The streaming origin's write size (its body repeats every this many bytes).
pub const CHUNK: usize = 64 * 1024;
/// The client's read buffer.
const READ_BUFFER: usize = 256 * 1024;

/// A streaming origin on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct StreamOrigin {
    /// Where it listens.
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StreamOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StreamOrigin {
    /// Binds a free port and serves until dropped.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = serve(stream).await;
                });
            }
        });
        Ok(Self { address, task })
    }
}

async fn serve(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || request.len() > 16 * 1024 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("/");
    let total: u64 = path
        .strip_prefix("/stream/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let buffer: Vec<u8> = (0..CHUNK).map(|i| (i * 131 % 251) as u8).collect();
    let mut left = total;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        // Fails once the client stops reading and closes: that ends us.
        stream.write_all(&buffer[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await
}

/// One download.
#[derive(Debug, Clone, Copy)]
pub struct Download {
    /// Body bytes received.
    pub bytes: u64,
    /// From sending the request until the last byte (or the time bound).
    pub elapsed: Duration,
    /// True when the whole body arrived within the bound.
    pub complete: bool,
    /// CPU time each process used during the download.
    pub cpu: Cpu,
}

impl Download {
    /// MB/s (10^6 bytes per second).
    pub fn megabytes_per_second(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }

    /// A CPU time during the download as a share of one core.
    pub fn share(&self, seconds: f64) -> f64 {
        seconds / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Downloads `size` bytes by `mode`, stopping at `bound`.
pub async fn download(
    proxies: &Proxies,
    pids: Pids,
    mode: Mode,
    origin: SocketAddr,
    size: u64,
    bound: Duration,
) -> std::io::Result<Download> {
    let setup_bound = Duration::from_secs(5);
    let mut opened = tokio::time::timeout(setup_bound, client::open(proxies, mode, origin))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "setup timed out"))??;
    let stream = &mut opened.stream;
    let request = client::request(proxies, mode, origin, &format!("/stream/{size}"));
    let cpu = Cpu::now(pids);
    let started = Instant::now();
    let deadline = started + bound;
    stream.write_all(request.as_bytes()).await?;
    let mut buffer = Vec::with_capacity(4096);
    let head = tokio::time::timeout_at(deadline, client::read_head(stream, &mut buffer))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no response head"))??;
    let mut bytes = (buffer.len() - head.len) as u64;
    let mut read = vec![0u8; READ_BUFFER];
    while bytes < head.body {
        match tokio::time::timeout_at(deadline, stream.read(&mut read)).await {
            Err(_) => break,
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => bytes += n as u64,
            Ok(Err(error)) => return Err(error),
        }
    }
    let elapsed = started.elapsed();
    Ok(Download {
        bytes,
        elapsed,
        complete: bytes >= head.body,
        cpu: Cpu::now(pids).since(cpu),
    })
}

/// One mode's result: the median of its runs.
#[derive(Debug, Clone)]
pub struct Measured {
    /// How it went.
    pub mode: Mode,
    /// Each run, in order.
    pub runs: Vec<Download>,
    /// A failure, if any run failed.
    pub error: Option<String>,
}

impl Measured {
    /// The run with the median MB/s (the upper middle of an even count).
    pub fn median_run(&self) -> Option<&Download> {
        let mut runs: Vec<&Download> = self.runs.iter().collect();
        runs.sort_by(|a, b| {
            a.megabytes_per_second()
                .total_cmp(&b.megabytes_per_second())
        });
        upper_median(&runs)
    }

    /// The median run's MB/s (0 when no run worked).
    pub fn median(&self) -> f64 {
        self.median_run()
            .map(Download::megabytes_per_second)
            .unwrap_or(0.0)
    }

    /// Every run's MB/s, for the report.
    pub fn each(&self) -> String {
        let rates: Vec<String> = self
            .runs
            .iter()
            .map(|d| format!("{:.0}", d.megabytes_per_second()))
            .collect();
        rates.join(" / ")
    }
}

/// Runs section 2: for each mode, a small warm-up, then `runs` downloads
/// of `size` bytes, each bounded by `bound`. Modes are interleaved run by
/// run so that drift on a shared machine touches them alike.
pub async fn run(
    proxies: &Proxies,
    pids: Pids,
    origin: SocketAddr,
    modes: &[Mode],
    size: u64,
    runs: usize,
    bound: Duration,
) -> Vec<Measured> {
    let mut measured: Vec<Measured> = modes
        .iter()
        .map(|&mode| Measured {
            mode,
            runs: Vec::new(),
            error: None,
        })
        .collect();
    for entry in &mut measured {
        let warm = download(proxies, pids, entry.mode, origin, 64 << 20, bound).await;
        if let Err(error) = warm {
            entry.error = Some(error.to_string());
        }
    }
    for run in 0..runs {
        for entry in &mut measured {
            match download(proxies, pids, entry.mode, origin, size, bound).await {
                Ok(done) => {
                    eprintln!(
                        "  {:<19} run {}: {:>6} MiB in {:.2?} = {:>6.0} MB/s, CPU device {:.0}% bench {:.0}%{}",
                        entry.mode.label(),
                        run + 1,
                        done.bytes >> 20,
                        done.elapsed,
                        done.megabytes_per_second(),
                        done.share(done.cpu.device) * 100.0,
                        done.share(done.cpu.bench) * 100.0,
                        if done.complete { "" } else { " (time bound hit)" }
                    );
                    entry.runs.push(done);
                }
                Err(error) => {
                    eprintln!(
                        "  {:<19} run {}: failed: {error}",
                        entry.mode.label(),
                        run + 1
                    );
                    entry.error.get_or_insert(error.to_string());
                }
            }
        }
    }
    measured
}

// ---- the report ----

/// Section 2 of docs/BENCHMARKS.md: `bulk` measured with downloads of
/// `size` bytes bounded at `bound_s` seconds (nothing when it did not run).
pub fn render(out: &mut String, bulk: &[Measured], size: u64, bound_s: u64) {
    if bulk.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## 2. Bulk throughput of one connection\n\n\
         One download of {} MiB per run (each run bounded at {} s), from a streaming origin inside the bench \
         that writes one 64 KiB buffer repeatedly; the client reads with a 256 KiB buffer. Paths are interleaved run by run \
         after a 64 MiB warm-up each; the median run counts. MB/s is 10^6 bytes per second, from sending the request \
         until the last byte.\n",
        size >> 20,
        bound_s
    );
    let direct = bulk
        .iter()
        .find(|m| m.mode == Mode::Direct)
        .map(Measured::median);
    out.push_str("| path | runs (MB/s) | median MB/s | vs direct | target | met | CPU in the median run: device plane / ingress / bench (client + origin) |\n");
    out.push_str("|---|---|---:|---:|---:|---|---|\n");
    for measured in bulk {
        let ratio = direct.filter(|d| *d > 0.0).map(|d| measured.median() / d);
        let (target, met) = match measured.mode {
            Mode::Direct => ("—".to_string(), "—"),
            Mode::HttpAbsolute | Mode::HttpsAbsolute => ("none (not a tunnel)".to_string(), "—"),
            _ => (
                format!("≥ {:.0}%", THROUGHPUT_TARGET * 100.0),
                ratio
                    .map(|r| verdict(r >= THROUGHPUT_TARGET))
                    .unwrap_or("—"),
            ),
        };
        let incomplete = measured.runs.iter().filter(|d| !d.complete).count();
        let note = if incomplete > 0 {
            format!(" ({incomplete} run(s) hit the time bound)")
        } else {
            String::new()
        };
        let cpu = match measured.median_run() {
            Some(run) => format!(
                "{:.0}% / {:.0}% / {:.0}% of one core",
                run.share(run.cpu.device) * 100.0,
                run.share(run.cpu.ingress) * 100.0,
                run.share(run.cpu.bench) * 100.0
            ),
            None => "—".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {}{note} | {:.0} | {} | {target} | {met} | {cpu} |",
            measured.mode.label(),
            measured.each(),
            measured.median(),
            ratio
                .map(|r| format!("{:.0}%", r * 100.0))
                .unwrap_or_else(|| "—".into()),
        );
    }
    for measured in bulk.iter().filter(|m| m.error.is_some()) {
        let _ = writeln!(
            out,
            "\n{} failed: `{}`",
            measured.mode.label(),
            measured.error.as_deref().unwrap_or("")
        );
    }
    out.push('\n');
}
