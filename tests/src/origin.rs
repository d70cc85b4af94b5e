//! A small HTTP/1.1 origin on loopback for the tests to proxy to.
//!
//! - `GET /bytes/N`: N bytes of [`crate::pattern`] (public, so tests can
//!   compute the expected body);
//! - `GET /slow/MS`: "ok" after MS milliseconds;
//! - `PUT /echo` (or POST): streams the request body back as it arrives;
//! - `GET /whoami`: the address the request came from (the proxy's egress source);
//! - anything else: "hello".
//!
//! Every response closes its connection. The origin counts connections,
//! the requests whose head it read, and the most connections it ever held
//! at once, so tests can tell real concurrency.
//!
//! The `blipless-test-origin` binary (`src/bin/origin.rs`) serves the same
//! origin on a given address, for tests that run it inside a network
//! namespace.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A running origin; stops when dropped.
#[derive(Debug)]
pub struct Origin {
    /// Where it listens.
    pub address: SocketAddr,
    stats: Arc<Stats>,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Debug, Default)]
struct Stats {
    connections: AtomicUsize,
    requests: AtomicUsize,
    open: AtomicUsize,
    peak: AtomicUsize,
}

impl Origin {
    /// Starts an origin on 127.0.0.1 with a free port.
    pub fn start() -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).expect("origin start")
    }

    /// Starts an origin listening on `listen` (port 0: a free port; see
    /// [`Origin::address`] for the one it got).
    pub fn start_on(listen: SocketAddr) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(listen))?;
        let address = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let shared = stats.clone();
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let stats = shared.clone();
                let peer = stream
                    .peer_addr()
                    .map(|a| a.ip().to_string())
                    .unwrap_or_default();
                tokio::spawn(async move {
                    stats.connections.fetch_add(1, Ordering::SeqCst);
                    let open = stats.open.fetch_add(1, Ordering::SeqCst) + 1;
                    stats.peak.fetch_max(open, Ordering::SeqCst);
                    let _ = serve(stream, peer, &stats.requests).await;
                    stats.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(Self {
            address,
            stats,
            _runtime: runtime,
        })
    }

    /// A URL on this origin.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.address, path)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// Requests whose head arrived so far. Through a proxy's tunnel this
    /// says the tunnel was established end to end, where
    /// [`Origin::connections`] only says the proxy (or its upstream)
    /// connected.
    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    /// The most connections open at once so far.
    pub fn peak(&self) -> usize {
        self.stats.peak.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut stream: tokio::net::TcpStream,
    peer: String,
    requests: &AtomicUsize,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || request.len() > 16 * 1024 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let head_end = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(request.len(), |p| p + 4);
    requests.fetch_add(1, Ordering::SeqCst);
    let line = String::from_utf8_lossy(&request[..head_end]).into_owned();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    if path == "/echo" {
        let length: usize = line
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())
                    .flatten()
            })
            .unwrap_or(0);
        let head =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let early = &request[head_end..];
        stream.write_all(early).await?;
        let mut left = length.saturating_sub(early.len());
        let mut buffer = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = stream.read(&mut buffer[..left.min(64 * 1024)]).await?;
            if n == 0 {
                break;
            }
            stream.write_all(&buffer[..n]).await?;
            left -= n;
        }
        return stream.shutdown().await;
    }
    let body = if let Some(n) = path.strip_prefix("/bytes/") {
        crate::pattern(n.parse().unwrap_or(0))
    } else if path == "/whoami" {
        peer.into_bytes()
    } else if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        b"ok".to_vec()
    } else {
        b"hello".to_vec()
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}
