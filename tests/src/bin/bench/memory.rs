//! Section 3: resident memory of the ingress and the device plane, idle and
//! while holding many open, idle tunnels.
//!
//! The tunnels go to a holding origin: it echoes the client's first few
//! bytes (so each tunnel has carried traffic both ways) and then keeps the
//! connection open without a word until the client closes it.

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

/// One batch of held tunnels.
#[derive(Debug, Clone)]
pub struct Held {
    /// The batch's name in the report.
    pub label: String,
    /// Tunnels asked for.
    pub wanted: usize,
    /// Tunnels open and verified at the measurement.
    pub open: usize,
    /// Just before opening them.
    pub before: Rss,
    /// While holding them.
    pub holding: Rss,
    /// A second after closing them.
    pub after: Rss,
    /// A failure, if any tunnel failed.
    pub error: Option<String>,
}

impl Held {
    /// Bytes per tunnel (ingress, device plane) from the growth while holding.
    pub fn per_tunnel(&self) -> (f64, f64) {
        let per = |holding: u64, before: u64| {
            (holding as f64 - before as f64) * 1024.0 / self.open.max(1) as f64
        };
        (
            per(self.holding.ingress, self.before.ingress),
            per(self.holding.device, self.before.device),
        )
    }
}

async fn hold(mut stream: TcpStream) -> std::io::Result<()> {
    let mut buffer = [0u8; 64];
    let n = stream.read(&mut buffer).await?;
    stream.write_all(&buffer[..n]).await?;
    while stream.read(&mut buffer).await? > 0 {}
    Ok(())
}

async fn one_tunnel(
    proxies: &Proxies,
    mode: Mode,
    origin: SocketAddr,
) -> std::io::Result<TcpStream> {
    let mut opened = client::open(proxies, mode, origin).await?;
    opened.stream.write_all(b"ping").await?;
    let mut echo = [0u8; 4];
    opened.stream.read_exact(&mut echo).await?;
    if &echo != b"ping" {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad echo",
        ));
    }
    Ok(opened.stream)
}

/// Opens `count` tunnels by `mode` (32 at a time, within `bound`), holds
/// them while measuring, then closes them.
async fn batch(
    label: &str,
    proxies: &Proxies,
    mode: Mode,
    origin: SocketAddr,
    pids: Pids,
    count: usize,
    bound: Duration,
) -> Held {
    let before = Rss::now(pids);
    let deadline = Instant::now() + bound;
    let gate = Arc::new(Semaphore::new(32));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (proxies, gate) = (proxies.clone(), gate.clone());
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            tokio::time::timeout_at(deadline, one_tunnel(&proxies, mode, origin))
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "tunnel setup timed out",
                    ))
                })
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
        "  {label:<26} {open} tunnels: device {} -> {} -> {} KiB, ingress {} -> {} -> {} KiB",
        before.device, holding.device, after.device, before.ingress, holding.ingress, after.ingress
    );
    Held {
        label: label.to_string(),
        wanted: count,
        open,
        before,
        holding,
        after,
        error,
    }
}

/// What section 3 measured.
#[derive(Debug, Clone)]
pub struct Section {
    /// Right after start and a few warm-up connections.
    pub idle: Rss,
    /// SOCKS5, HTTP CONNECT, then SOCKS5 again: the second SOCKS5 batch
    /// shows what reusing freed memory costs.
    pub batches: Vec<Held>,
}

/// Runs section 3 against a holding origin of its own.
pub async fn run(proxies: &Proxies, pids: Pids, count: usize) -> std::io::Result<Section> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let origin = listener.local_addr()?;
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(hold(stream));
        }
    });
    // A few tunnels first, so "idle" means a plane that has served something.
    for mode in [Mode::Socks5, Mode::HttpConnect] {
        for _ in 0..8 {
            let _ = tokio::time::timeout(Duration::from_secs(5), one_tunnel(proxies, mode, origin))
                .await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle = Rss::now(pids);
    eprintln!(
        "  idle: device {} KiB, ingress {} KiB",
        idle.device, idle.ingress
    );
    let mut batches = Vec::new();
    let plan = [
        ("SOCKS5 (1st batch)", Mode::Socks5),
        ("HTTP CONNECT", Mode::HttpConnect),
        ("SOCKS5 (2nd batch)", Mode::Socks5),
    ];
    for (label, mode) in plan {
        let bound = Duration::from_secs(20);
        batches.push(batch(label, proxies, mode, origin, pids, count, bound).await);
    }
    server.abort();
    Ok(Section { idle, batches })
}
