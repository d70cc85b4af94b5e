//! Section 3: resident memory of the ingress and the device plane, idle and
//! while holding many open, idle tunnels.
//!
//! The tunnels go to a holding origin: the client sends a 4-byte length and
//! that many bytes, the origin echoes them (so each tunnel has carried
//! traffic both ways) and then keeps the connection open without a word
//! until the client closes it.
//!
//! Each batch runs on a freshly deployed device plane (the caller deploys
//! one between batches): memory one batch freed stays with the allocator
//! and would make the next batch look cheaper (reused, already resident) or
//! dearer (calloc zeroes reused chunks, making them resident) than it is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::client::{self, Mode, Proxies};
use crate::procfs::{rss_kib, Pids};

/// Resident memory of both, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    /// The ingress.
    pub ingress: u64,
    /// The device plane.
    pub device: u64,
}

impl Rss {
    fn now(pids: Pids) -> Self {
        Self {
            ingress: rss_kib(pids.ingress).unwrap_or(0),
            device: rss_kib(pids.device).unwrap_or(0),
        }
    }
}

/// One kind of batch.
#[derive(Debug, Clone, Copy)]
pub struct Batch {
    /// Its name in the report.
    pub label: &'static str,
    /// How its tunnels are opened.
    pub mode: Mode,
    /// Bytes each tunnel carries each way before it idles.
    pub carried: usize,
}

/// The batches, each on a fresh device plane.
pub const BATCHES: [Batch; 3] = [
    Batch {
        label: "SOCKS5, 4 bytes each way",
        mode: Mode::Socks5,
        carried: 4,
    },
    Batch {
        label: "HTTP CONNECT, 4 bytes each way",
        mode: Mode::HttpConnect,
        carried: 4,
    },
    Batch {
        label: "SOCKS5, 128 KiB each way",
        mode: Mode::Socks5,
        carried: 128 * 1024,
    },
];

/// What one batch measured.
#[derive(Debug, Clone)]
pub struct Held {
    /// What was held.
    pub batch: Batch,
    /// Tunnels asked for.
    pub wanted: usize,
    /// Tunnels open and verified at the measurement.
    pub open: usize,
    /// The fresh plane after two warm-up tunnels, before the batch.
    pub idle: Rss,
    /// While holding them.
    pub holding: Rss,
    /// 1.5 s after closing them.
    pub after: Rss,
    /// A failure, if any tunnel failed.
    pub error: Option<String>,
}

impl Held {
    /// Bytes per tunnel (ingress, device plane) from the growth while holding.
    pub fn per_tunnel(&self) -> (f64, f64) {
        let per = |holding: u64, idle: u64| {
            (holding as f64 - idle as f64) * 1024.0 / self.open.max(1) as f64
        };
        (
            per(self.holding.ingress, self.idle.ingress),
            per(self.holding.device, self.idle.device),
        )
    }
}

/// The holding origin; stops when dropped.
#[derive(Debug)]
pub struct HoldOrigin {
    /// Where it listens.
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HoldOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HoldOrigin {
    /// Binds a free port on 127.0.0.1.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(hold(stream));
            }
        });
        Ok(Self { address, task })
    }
}

async fn hold(mut stream: TcpStream) -> std::io::Result<()> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).await?;
    let mut left = u32::from_be_bytes(length) as usize;
    let mut buffer = vec![0u8; 16 * 1024];
    while left > 0 {
        let n = stream.read(&mut buffer[..left.min(16 * 1024)]).await?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buffer[..n]).await?;
        left -= n;
    }
    while stream.read(&mut buffer).await? > 0 {}
    Ok(())
}

async fn one_tunnel(
    proxies: &Proxies,
    batch: Batch,
    origin: SocketAddr,
) -> std::io::Result<TcpStream> {
    let mut stream = client::open(proxies, batch.mode, origin).await?.stream;
    let mut payload = (batch.carried as u32).to_be_bytes().to_vec();
    payload.extend((0..batch.carried).map(|i| (i % 251) as u8));
    let mut echo = vec![0u8; batch.carried];
    {
        let (mut read, mut write) = stream.split();
        tokio::try_join!(write.write_all(&payload), read.read_exact(&mut echo))?;
    }
    if echo[..] != payload[4..] {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad echo",
        ));
    }
    Ok(stream)
}

/// Measures one batch on a fresh device plane: idle (after two warm-up
/// tunnels), while holding `count` tunnels (opened 32 at a time within
/// `bound`), and after closing them.
pub async fn measure(
    proxies: &Proxies,
    origin: SocketAddr,
    pids: Pids,
    batch: Batch,
    count: usize,
    bound: Duration,
) -> Held {
    for _ in 0..2 {
        let _ =
            tokio::time::timeout(Duration::from_secs(5), one_tunnel(proxies, batch, origin)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let idle = Rss::now(pids);
    let deadline = Instant::now() + bound;
    let gate = Arc::new(Semaphore::new(32));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (proxies, gate) = (proxies.clone(), gate.clone());
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            match tokio::time::timeout_at(deadline, one_tunnel(&proxies, batch, origin)).await {
                Ok(result) => result,
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "tunnel setup timed out",
                )),
            }
        });
    }
    let mut tunnels = Vec::with_capacity(count);
    let mut error = None;
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok(Ok(stream)) => tunnels.push(stream),
            Ok(Err(e)) => {
                error.get_or_insert(e.to_string());
            }
            Err(e) => {
                error.get_or_insert(e.to_string());
            }
        }
    }
    // Let the device plane settle (its report tick, lazily freed memory).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let holding = Rss::now(pids);
    let open = tunnels.len();
    drop(tunnels);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = Rss::now(pids);
    eprintln!(
        "  {:<31} {open} tunnels: device {} -> {} -> {} KiB, ingress {} -> {} -> {} KiB",
        batch.label,
        idle.device,
        holding.device,
        after.device,
        idle.ingress,
        holding.ingress,
        after.ingress
    );
    Held {
        batch,
        wanted: count,
        open,
        idle,
        holding,
        after,
        error,
    }
}
