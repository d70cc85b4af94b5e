//! The successor's side of a handoff: a new ingress finds the running one on
//! `handoff.sock`, takes its offer (sockets, peers, endpoints), serves on the
//! same sockets, and says so.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use blipless_config::Config;
use blipless_protocol::channel::{
    EndpointEntry, Handoff, HandoffOffer, HandoffProgress, Hello, PeerEntry, Refused, Rejoin,
    SocketName, MAX_FRAME,
};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use super::{check_peer, receive, Lineage};
use crate::fault;
use crate::listeners::{self, Adopted, Listeners};
use crate::metrics::Metrics;
use crate::planes::Planes;
use crate::wg::Wireguard;

/// How long a predecessor may take to answer when the handoff socket itself
/// came back from the service manager's fd store: then the socket accepts
/// connections even with no ingress behind it (the one that crashed).
const KEPT_SOCKET_ANSWER: Duration = Duration::from_secs(2);

/// What a successor got from its predecessor.
#[derive(Debug)]
pub struct Predecessor {
    socket: UnixSeqpacket,
    /// The offer: sockets, the predecessor's WireGuard generation, counters.
    pub offer: HandoffOffer,
    /// The offered sockets' fds, in the offer's order.
    fds: Vec<OwnedFd>,
    /// The WireGuard peer set.
    pub peers: Vec<PeerEntry>,
    /// Where the peers were last heard from.
    pub endpoints: Vec<EndpointEntry>,
    /// The predecessor's TCP listeners this ingress did not take, shut once
    /// it serves ([`listeners::stop_listening`]).
    left_behind: Vec<(SocketName, OwnedFd)>,
}

/// How often a successor asks again while the running ingress is busy with
/// another handoff.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// What one try at the handoff socket found.
enum Found {
    /// No ingress answers there.
    Nobody,
    /// The running ingress's offer.
    Predecessor(Box<Predecessor>),
    /// The running ingress is busy (another handoff, or draining): ask again.
    Busy(String),
    /// The connection closed before any answer: an ingress at the very end
    /// of its drain (its handoff server stopped and its sockets about to
    /// close, this connection in the handoff socket's backlog until they
    /// did), one that died, or one of another protocol version (it reads
    /// the hello and closes). Asked again once: nobody there (the first
    /// two) means start afresh; closed again (the last) is an error.
    Closed,
}

/// Connects to the handoff socket of a running ingress and takes its offer;
/// `None` when no ingress answers there (a first start, or after a crash).
/// While the running ingress is busy (still beside its
/// own predecessor: two restarts in a row; another successor taking
/// over; or draining, after which it is gone and this one starts afresh),
/// this one waits for its turn and asks again, for up to `drain.lame_duck`
/// plus `drain.grace` plus [`TURN_MARGIN`] (the predecessor's own overlap
/// ends within `drain.grace`); then, or on any other refusal, it is an error
/// that says why. `socket_kept`: the service manager passed the handoff
/// socket back, so a connection may succeed with nobody listening; no offer
/// within `KEPT_SOCKET_ANSWER` (2 s) then means no predecessor.
pub async fn find_predecessor(
    config: &Config,
    socket_kept: bool,
) -> anyhow::Result<Option<Predecessor>> {
    let started = Instant::now();
    // The longest a running ingress stays busy: a drain (lame duck, then
    // the grace) or its own overlap with a predecessor (within the grace).
    let patience = config.drain.lame_duck + config.drain.grace + TURN_MARGIN;
    let mut said = false;
    let mut closed_once = false;
    loop {
        match try_predecessor(config, socket_kept).await? {
            Found::Nobody => return Ok(None),
            Found::Predecessor(predecessor) => return Ok(Some(*predecessor)),
            Found::Busy(reason) if started.elapsed() < patience => {
                if !said {
                    tracing::info!(%reason, "the running ingress is busy (another handoff, or draining): waiting for its turn");
                    let _ = blipless_supervise::notify::notify(
                        "STATUS=waiting for the running ingress to finish its handoff",
                    );
                    said = true;
                }
                tokio::time::sleep(BUSY_RETRY).await;
            }
            Found::Closed if !closed_once => {
                tracing::info!("the running ingress closed the handoff socket before answering (it may be stopping): asking once more");
                closed_once = true;
                tokio::time::sleep(BUSY_RETRY).await;
            }
            Found::Closed => {
                anyhow::bail!("the other ingress closed the handoff before the handoff offer")
            }
            Found::Busy(reason) => anyhow::bail!(
                "the running ingress refused to hand off: {reason}, and was still busy after {patience:?}"
            ),
        }
    }
}

/// Whether `error` says the other end closed the connection.
fn closed_by_peer(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionAborted
    )
}

/// How much longer than `drain.grace` a successor waits for its turn.
pub const TURN_MARGIN: Duration = Duration::from_secs(5);

/// One try: connect, say hello, and read the offer (or the refusal).
async fn try_predecessor(config: &Config, socket_kept: bool) -> anyhow::Result<Found> {
    let path = config.handoff_socket();
    let socket = match UnixSeqpacket::connect(&path).await {
        Ok(socket) => socket,
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(Found::Nobody)
        }
        Err(error) => {
            return Err(error).with_context(|| format!("connecting to {}", path.display()))
        }
    };
    check_peer(&socket)?;
    let _ = blipless_link::size_buffers(&socket);
    let said_hello = blipless_link::send(
        &socket,
        &Handoff::Hello(Hello {
            pid: std::process::id(),
            software: blipless_config::build::VERSION.to_string(),
            rejoin: Rejoin::No,
            accepts_many: false,
            reads_not_taken: false,
            reads_udp_migrate: false,
        }),
        &[],
    )
    .await;
    match said_hello {
        Ok(()) => {}
        Err(blipless_link::LinkError::Io(error)) if closed_by_peer(&error) => {
            return Ok(Found::Closed)
        }
        Err(error) => return Err(error).context("saying hello to the running ingress"),
    }
    let mut buffer = vec![0u8; MAX_FRAME];
    let wait = if socket_kept {
        KEPT_SOCKET_ANSWER
    } else {
        super::STEP_TIMEOUT
    };
    let first = match tokio::time::timeout(
        wait,
        blipless_link::receive::<Handoff>(&socket, &mut buffer),
    )
    .await
    {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return Ok(Found::Closed),
        Ok(Err(blipless_link::LinkError::Io(error))) if closed_by_peer(&error) => {
            return Ok(Found::Closed)
        }
        Ok(Err(error)) => return Err(error).context("reading the handoff offer"),
        Err(_) if socket_kept => {
            tracing::info!("no ingress answers on the kept handoff socket: starting afresh");
            return Ok(Found::Nobody);
        }
        Err(_) => anyhow::bail!("no handoff offer within {:?}", super::STEP_TIMEOUT),
    };
    let (offer, fds) = match first {
        (Handoff::Offer(offer), fds) => (offer, fds),
        (Handoff::Refused(Refused { reason, busy: true }), _) => return Ok(Found::Busy(reason)),
        (Handoff::Refused(Refused { reason, .. }), _) => {
            anyhow::bail!("the running ingress refused to hand off: {reason}")
        }
        (other, _) => anyhow::bail!("expected HandoffOffer, got {}", other.name()),
    };
    let mut peers = Vec::new();
    loop {
        match receive(&socket, &mut buffer, "the peer set").await? {
            (Handoff::Peers(update), _) => {
                peers.extend_from_slice(update.upserts());
                if update.full_end {
                    break;
                }
            }
            (other, _) => anyhow::bail!("expected Peers, got {}", other.name()),
        }
    }
    let mut endpoints = Vec::new();
    loop {
        match receive(&socket, &mut buffer, "the endpoint snapshot").await? {
            (Handoff::Endpoints(part), _) => {
                endpoints.extend_from_slice(part.entries());
                if part.end {
                    break;
                }
            }
            (other, _) => anyhow::bail!("expected Endpoints, got {}", other.name()),
        }
    }
    Ok(Found::Predecessor(Box::new(Predecessor {
        socket,
        offer,
        fds,
        peers,
        endpoints,
        left_behind: Vec::new(),
    })))
}

impl Predecessor {
    /// Takes over the offered sockets (binding afresh those whose configured
    /// address changed, and parking those in the service manager's fd store).
    /// Returns them with this ingress's WireGuard generation: the other one.
    pub fn take_listeners(&mut self, config: &Config) -> anyhow::Result<(Listeners, u32)> {
        let fds = std::mem::take(&mut self.fds);
        let Adopted {
            listeners,
            rebound,
            left_behind,
        } = Listeners::adopt(config, &self.offer, fds)?;
        self.left_behind = left_behind;
        listeners.park(&rebound);
        let rebound: Vec<&str> = rebound.iter().map(|name| name.as_str()).collect();
        tracing::info!(
            predecessor_generation = self.offer.wg_generation,
            rebound = ?rebound,
            peers = self.peers.len(),
            "taking over from the running ingress"
        );
        Ok((listeners, 1 - (self.offer.wg_generation & 1)))
    }

    /// This ingress serves on the sockets: carries on the predecessor's
    /// counters, tells it so (it steps aside), then reports its progress
    /// (peers moved, device planes attached) until the connection closes,
    /// which it does when the predecessor exits; until then `lineage` refuses
    /// a third ingress. `started`: when this ingress started. When `shutdown`
    /// is cancelled meanwhile, tells the predecessor `HandoffStopping`, so it
    /// exits rather than serve again on socket files this drain removes.
    pub async fn serve_beside(
        self,
        metrics: &Metrics,
        lineage: &Arc<Lineage>,
        started: Instant,
        wireguard: Arc<Wireguard>,
        planes: Arc<Planes>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        fault::stall_handoff().await;
        metrics.carry_on(&self.offer.counters, started.elapsed());
        blipless_link::send(&self.socket, &Handoff::Serving, &[])
            .await
            .context("telling the predecessor we serve")?;
        // Ours take the connections from now on (the predecessor listens
        // again on these if we die beside it).
        for (name, listener) in self.left_behind {
            match listeners::stop_listening(listener.as_fd()) {
                Ok(()) => {
                    tracing::info!(listener = %name, "the predecessor's listener at the old address stops taking connections")
                }
                Err(error) => {
                    tracing::warn!(listener = %name, %error, "could not stop the predecessor's listener at the old address")
                }
            }
        }
        let connection = self.socket;
        lineage.beside_predecessor.store(true, Ordering::SeqCst);
        let lineage = lineage.clone();
        // A restart (SIGUSR2) meanwhile counts its grace once this ends.
        let beside = blipless_supervise::daemon::BesidePredecessor::mark();
        tokio::spawn(async move {
            report_progress(&connection, &wireguard, &planes, &shutdown).await;
            lineage.beside_predecessor.store(false, Ordering::SeqCst);
            drop(beside);
            tracing::info!("the predecessor ingress has exited");
        });
        fault::die_after_serving();
        Ok(())
    }
}

/// How often a successor tells its predecessor what moved.
const PROGRESS_EVERY: Duration = Duration::from_millis(10);

/// Tells the predecessor, every [`PROGRESS_EVERY`] while there is news, which
/// peers have sent this ingress data and which device planes have attached
/// here ([`HandoffProgress`]), and once that this ingress stops
/// (`HandoffStopping`, when `shutdown` is cancelled); returns when the
/// predecessor's connection closes (it exited).
async fn report_progress(
    connection: &UnixSeqpacket,
    wireguard: &Wireguard,
    planes: &Planes,
    shutdown: &CancellationToken,
) {
    let reports = fault::reports_progress();
    let mut moved = HashSet::new();
    let mut attached = HashSet::new();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut scratch = [0u8; 64];
    let mut stopping = false;
    loop {
        tokio::select! {
            received = connection.recv(&mut scratch) => match received {
                Ok(info) if info.bytes_read() > 0 => continue,
                _ => return,
            },
            () = shutdown.cancelled(), if !stopping => {
                stopping = true;
                tracing::info!("stopping beside the predecessor ingress: telling it to exit, not to serve again");
                if let Err(error) = blipless_link::send(connection, &Handoff::Stopping, &[]).await {
                    tracing::debug!(%error, "could not tell the predecessor we stop");
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        if !reports || stopping {
            continue;
        }
        let progress = HandoffProgress {
            moved: wireguard.newly_sending(&mut moved),
            planes: planes
                .all()
                .iter()
                .map(|plane| plane.pid)
                .filter(|pid| attached.insert(*pid))
                .collect(),
        };
        for part in progress.split() {
            if let Err(error) = blipless_link::send(connection, &Handoff::Progress(part), &[]).await
            {
                tracing::debug!(%error, "could not tell the predecessor our progress");
                return;
            }
        }
    }
}
