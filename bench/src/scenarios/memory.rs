//! Section 3: resident memory of the ingress and the device plane, idle and
//! while holding many open, idle tunnels.
//!
//! The tunnels go to a holding origin: the client sends two 4-byte lengths
//! (what to echo, what to flood) and the first many bytes, the origin echoes
//! them (so each tunnel has carried traffic both ways), then writes the
//! flood, which the client never reads (a customer that stopped reading:
//! the relay holds what it read and could not write, the rest waits in the
//! kernel's socket buffers), and keeps the connection open until the client
//! closes it.
//!
//! Each batch runs on a freshly deployed device plane (the caller deploys
//! one between batches): memory one batch freed stays with the allocator
//! and would make the next batch look cheaper (reused, already resident) or
//! dearer (calloc zeroes reused chunks, making them resident) than it is.
//! [`run`] deploys between the batches; [`render`] writes the section's table.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blipless_tests::node::{Daemon, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::client::{self, Mode, Proxies};
use crate::format::mib;
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
    /// Bytes the origin then sends that the customer never reads.
    pub flood: usize,
}

/// What the flood batch's origin sends each stalled customer.
pub const FLOOD: usize = 4 << 20;

/// The relay's buffer per direction (`BUFFER` in
/// device-plane/src/conn/relay.rs): what a stalled tunnel may hold in the
/// plane beyond its sockets.
pub const RELAY_BUFFER: usize = 256 * 1024;

/// The batches, each on a fresh device plane.
pub const BATCHES: [Batch; 4] = [
    Batch {
        label: "SOCKS5, 4 bytes each way",
        mode: Mode::Socks5,
        carried: 4,
        flood: 0,
    },
    Batch {
        label: "HTTP CONNECT, 4 bytes each way",
        mode: Mode::HttpConnect,
        carried: 4,
        flood: 0,
    },
    Batch {
        label: "SOCKS5, 128 KiB each way",
        mode: Mode::Socks5,
        carried: 128 * 1024,
        flood: 0,
    },
    Batch {
        label: "SOCKS5, customer stops reading (4 MiB sent)",
        mode: Mode::Socks5,
        carried: 4,
        flood: FLOOD,
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
    let mut lengths = [0u8; 8];
    stream.read_exact(&mut lengths).await?;
    let mut left = u32::from_be_bytes([lengths[0], lengths[1], lengths[2], lengths[3]]) as usize;
    let mut flood = u32::from_be_bytes([lengths[4], lengths[5], lengths[6], lengths[7]]) as usize;
    let mut buffer = vec![0u8; 16 * 1024];
    while left > 0 {
        let n = stream.read(&mut buffer[..left.min(16 * 1024)]).await?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buffer[..n]).await?;
        left -= n;
    }
    // The flood blocks once every buffer on the way is full; it ends (with
    // an error) when the client closes.
    let chunk = [0x5au8; 16 * 1024];
    while flood > 0 {
        let n = flood.min(chunk.len());
        stream.write_all(&chunk[..n]).await?;
        flood -= n;
    }
    while stream.read(&mut buffer).await? > 0 {}
    Ok(())
}

async fn one_tunnel(
    proxies: &Proxies,
    batch: Batch,
    origin: SocketAddr,
) -> std::io::Result<TcpStream> {
    let mut stream = client::open(proxies, batch.mode, origin)
        .await?
        .stream
        .into_tcp()?;
    let mut payload = (batch.carried as u32).to_be_bytes().to_vec();
    payload.extend_from_slice(&(batch.flood as u32).to_be_bytes());
    payload.extend((0..batch.carried).map(|i| (i % 251) as u8));
    let mut echo = vec![0u8; batch.carried];
    {
        let (mut read, mut write) = stream.split();
        tokio::try_join!(write.write_all(&payload), read.read_exact(&mut echo))?;
    }
    if echo[..] != payload[8..] {
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

/// Section 3's figures and every device plane it started (the last one
/// serves the other sections).
#[derive(Debug)]
pub struct Section {
    /// One entry per batch.
    pub held: Vec<Held>,
    /// The device planes, the first one given, the last one serving.
    pub devices: Vec<Daemon>,
}

/// Runs each memory batch on a freshly deployed device plane: a second
/// `blipless-device` takes over and the old one, holding nothing, exits.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    node: &mut Node,
    first: Daemon,
    proxies: &Proxies,
    pids: &mut Pids,
    tunnels: usize,
) -> Result<Section, String> {
    eprintln!("memory: {tunnels} held tunnels per batch, each batch on a fresh device plane");
    let origin = runtime
        .block_on(HoldOrigin::start())
        .map_err(|e| format!("starting the holding origin: {e}"))?;
    let mut devices = vec![first];
    let mut held = Vec::new();
    for (index, batch) in BATCHES.into_iter().enumerate() {
        if index > 0 {
            let fresh = node.start_device();
            let retired = devices.last_mut().ok_or("no device plane")?;
            if retired.wait_exit(Duration::from_secs(30)).is_none() {
                return Err("the old device plane did not exit after a deploy".into());
            }
            node.wait_ready();
            devices.push(fresh);
        }
        pids.device = devices.last().ok_or("no device plane")?.pid().as_raw();
        let bound = Duration::from_secs(20);
        held.push(runtime.block_on(measure(
            proxies,
            origin.address,
            *pids,
            batch,
            tunnels,
            bound,
        )));
    }
    runtime.block_on(async move { drop(origin) });
    Ok(Section { held, devices })
}

// ---- the report ----

/// Section 3 of docs/BENCHMARKS.md (nothing when it did not run).
pub fn render(out: &mut String, memory: &[Held]) {
    let Some(first) = memory.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "## 3. Memory\n\n\
         VmRSS from /proc/PID/status. Each batch runs on a freshly deployed device plane (a second `blipless-device` \
         takes over, the old one drains and exits): memory that one batch freed stays with the allocator and would \
         make the next batch look cheaper or dearer than it is. *Idle*: the fresh plane after two warm-up tunnels. \
         The batch then opens its tunnels (32 at a time) to a holding origin that echoes what the tunnel carries once \
         and then stays silent; RSS is read while holding them and 1.5 s after closing them. \
         Per tunnel = (holding − idle) / tunnels open. The ingress is the same process throughout. \
         In the last batch the origin then sends {} MiB down each tunnel and the customer never reads it: the \
         relay holds at most one read per direction ({} KiB, `BUFFER` in `device-plane/src/conn/relay.rs`) that it could \
         not write, and the rest waits in the kernel's socket buffers (kernel memory, not in RSS) while TCP holds the \
         origin back.\n\n\
         Idle: device plane **{}**, ingress **{}**.\n",
        FLOOD >> 20,
        RELAY_BUFFER >> 10,
        mib(first.idle.device),
        mib(first.idle.ingress)
    );
    out.push_str("| batch | tunnels open | device plane idle → holding → closed | device plane per tunnel | ingress idle → holding → closed | ingress per tunnel |\n");
    out.push_str("|---|---:|---|---:|---|---:|\n");
    for held in memory {
        let (ingress, device) = held.per_tunnel();
        let _ = writeln!(
            out,
            "| {} | {} of {} | {} → {} → {} | {:.1} KiB | {} → {} → {} | {:.2} KiB |",
            held.batch.label,
            held.open,
            held.wanted,
            mib(held.idle.device),
            mib(held.holding.device),
            mib(held.after.device),
            device / 1024.0,
            mib(held.idle.ingress),
            mib(held.holding.ingress),
            mib(held.after.ingress),
            ingress / 1024.0,
        );
    }
    if let Some(stalled) = memory.iter().find(|h| h.batch.flood > 0 && h.open > 0) {
        let (_, device) = stalled.per_tunnel();
        let bound = (RELAY_BUFFER + 16 * 1024) as f64;
        let _ = writeln!(
            out,
            "\nTunnels whose customer stopped reading: **{} per 1,000** in the device plane. \
             Target (issue 13) \"a tunnel whose customer stops reading holds at most its two socket buffers plus a bounded \
             relay buffer\", judged as at most one relay buffer ({} KiB) and 16 KiB of bookkeeping per tunnel in the plane: \
             {:.1} KiB per tunnel, {}.",
            mib((device * 1000.0 / 1024.0) as u64),
            RELAY_BUFFER >> 10,
            device / 1024.0,
            crate::format::verdict(device <= bound && stalled.open == stalled.wanted),
        );
    }
    for held in memory.iter().filter(|h| h.error.is_some()) {
        let _ = writeln!(
            out,
            "\n{} tunnel failure: `{}`",
            held.batch.label,
            held.error.as_deref().unwrap_or("")
        );
    }
    out.push('\n');
}
