//! Section 4's tunnels: opening them through the SOCKS5 proxy to the echo
//! server, [`IN_FLIGHT`] at a time, each checked with one echo; the
//! ping-pong of the active ones through a deploy; the check of every one
//! after it; and the gaps between echoes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::{Gaps, STALL_TARGET};
use crate::client::{self, Mode, Proxies};
use crate::stats::nearest_rank;

/// Tunnels being set up (or checked) at once.
pub const IN_FLIGHT: usize = 256;
/// Limit on one echo (setup check, ping, final check).
pub(super) const ECHO_BOUND: Duration = Duration::from_secs(10);

/// The 16 bytes a tunnel sends for round trip `seq`: its slot, the
/// sequence number and a check word, so a misplaced or stale echo shows.
fn message(slot: usize, seq: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    let slot = slot as u32;
    out[..4].copy_from_slice(&slot.to_be_bytes());
    out[4..12].copy_from_slice(&seq.to_be_bytes());
    let check = (u64::from(slot).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq.rotate_left(17)) as u32;
    out[12..].copy_from_slice(&check.to_be_bytes());
    out
}

/// One round trip, checked byte for byte (a difference is `InvalidData`).
async fn echo_once(stream: &mut TcpStream, slot: usize, seq: u64) -> std::io::Result<()> {
    let sent = message(slot, seq);
    let exchange = async {
        stream.write_all(&sent).await?;
        let mut got = [0u8; 16];
        stream.read_exact(&mut got).await?;
        Ok::<_, std::io::Error>(got)
    };
    let got = match tokio::time::timeout(ECHO_BOUND, exchange).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no echo within {ECHO_BOUND:?}"),
            ))
        }
    };
    if got != sent {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("echo differs: sent {sent:02x?}, got {got:02x?}"),
        ));
    }
    Ok(())
}

async fn open_one(proxies: &Proxies, echo: SocketAddr, slot: usize) -> std::io::Result<TcpStream> {
    let mut stream = client::open(proxies, Mode::Socks5, echo)
        .await?
        .stream
        .into_tcp()?;
    echo_once(&mut stream, slot, 0).await?;
    Ok(stream)
}

/// Opens `count` tunnels, [`IN_FLIGHT`] at a time, within `bound`; returns
/// them by slot, the failures and the first failure's text.
pub(super) async fn open_all(
    proxies: &Proxies,
    echo: SocketAddr,
    count: usize,
    bound: Duration,
) -> (Vec<Option<TcpStream>>, usize, Option<String>) {
    let deadline = tokio::time::Instant::now() + bound;
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut opening = tokio::task::JoinSet::new();
    for slot in 0..count {
        let (proxies, gate) = (proxies.clone(), gate.clone());
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let opened = tokio::time::timeout_at(deadline, open_one(&proxies, echo, slot)).await;
            let opened = opened.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "tunnel setup timed out",
                ))
            });
            (slot, opened)
        });
    }
    let mut tunnels: Vec<Option<TcpStream>> = (0..count).map(|_| None).collect();
    let (mut errors, mut first) = (0, None);
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok((slot, Ok(stream))) => tunnels[slot] = Some(stream),
            Ok((_, Err(error))) => {
                errors += 1;
                first.get_or_insert(error.to_string());
            }
            Err(error) => {
                errors += 1;
                first.get_or_insert(error.to_string());
            }
        }
    }
    (tunnels, errors, first)
}

/// One more echo on every open tunnel, [`IN_FLIGHT`] at a time; returns the
/// failures (those tunnels are closed) and the first failure's text.
pub(super) async fn check_all(tunnels: &mut [Option<TcpStream>]) -> (usize, Option<String>) {
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut checking = tokio::task::JoinSet::new();
    for (slot, tunnel) in tunnels.iter_mut().enumerate() {
        let Some(mut stream) = tunnel.take() else {
            continue;
        };
        let gate = gate.clone();
        checking.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let checked = echo_once(&mut stream, slot, u64::MAX).await;
            (slot, stream, checked)
        });
    }
    let (mut failed, mut first) = (0, None);
    while let Some(joined) = checking.join_next().await {
        match joined {
            Ok((slot, stream, Ok(()))) => tunnels[slot] = Some(stream),
            Ok((slot, _, Err(error))) => {
                failed += 1;
                first.get_or_insert(format!("tunnel {slot}: {error}"));
            }
            Err(error) => {
                failed += 1;
                first.get_or_insert(error.to_string());
            }
        }
    }
    (failed, first)
}

/// One completed round trip of an active tunnel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// The tunnel.
    pub slot: usize,
    /// When the echo was back.
    pub end: Instant,
    /// Since the tunnel's previous echo was back.
    pub gap: Duration,
    /// Since this round trip's write started.
    pub round_trip: Duration,
}

/// How one ping-pong ended: its tunnel (None when it failed), its round
/// trips, its failure.
pub(super) struct PingerEnd {
    /// The tunnel's slot.
    pub slot: usize,
    /// The tunnel, unless the ping-pong failed.
    pub stream: Option<TcpStream>,
    /// Every completed round trip after the first.
    pub samples: Vec<Sample>,
    /// The failure, if any.
    pub error: Option<std::io::Error>,
}

/// Ping-pongs on one tunnel, one round trip per `cadence` tick (a late
/// round trip delays the next tick rather than bunching), until `stop`.
pub(super) async fn pinger(
    slot: usize,
    mut stream: TcpStream,
    cadence: Duration,
    offset: Duration,
    stop: Arc<AtomicBool>,
) -> PingerEnd {
    tokio::time::sleep(offset).await;
    let mut tick = tokio::time::interval(cadence);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples = Vec::with_capacity(1024);
    let mut last: Option<Instant> = None;
    let mut seq = 1u64;
    loop {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sent = Instant::now();
        if let Err(error) = echo_once(&mut stream, slot, seq).await {
            return PingerEnd {
                slot,
                stream: None,
                samples,
                error: Some(error),
            };
        }
        let end = Instant::now();
        if let Some(last) = last {
            samples.push(Sample {
                slot,
                end,
                gap: end - last,
                round_trip: end - sent,
            });
        }
        last = Some(end);
        seq += 1;
    }
    PingerEnd {
        slot,
        stream: Some(stream),
        samples,
        error: None,
    }
}

pub(super) fn gaps<'a>(samples: impl Iterator<Item = &'a Sample>) -> Gaps {
    let mut gaps = Vec::new();
    let mut max_round_trip: Option<Duration> = None;
    let mut stalled = std::collections::HashSet::new();
    for sample in samples {
        gaps.push(sample.gap);
        if sample.gap >= STALL_TARGET {
            stalled.insert(sample.slot);
        }
        max_round_trip =
            Some(max_round_trip.map_or(sample.round_trip, |m| m.max(sample.round_trip)));
    }
    gaps.sort_unstable();
    let p99 = nearest_rank(&gaps, 0.99);
    Gaps {
        count: gaps.len(),
        p99,
        max: gaps.last().copied(),
        max_round_trip,
        tunnels_stalled: stalled.len(),
    }
}
