//! Ingress restart-by-handoff (DESIGN §5): the conversation on `handoff.sock`.
//!
//! A new ingress (the successor) connects to the handoff socket of the running
//! one (the predecessor) before it binds anything:
//!
//! ```text
//! successor                         predecessor
//!   HandoffHello ─────────────────▶   checks credentials; refuses a third
//!               ◀─────────────────   HandoffOffer + every listening fd
//!               ◀─────────────────   Peers (full set), Endpoints (snapshot)
//!   serves on the sockets
//!   HandoffServing ───────────────▶   stops accepting, Goaway to device planes,
//!                                     decrypts its sessions until they go quiet
//!   (connection held open)           exits: the connection closes
//! ```
//!
//! The socket is SOCK_SEQPACKET and the frames are the device channel's (the
//! same codec, the same fd passing), so a snapshot too large for one frame
//! travels in parts as it does to device planes. Both sides check the other's
//! credentials (same uid, or root). A successor that goes away before
//! `HandoffServing` leaves the predecessor serving as if nothing happened; one
//! that goes away after it makes the predecessor take everything back (the
//! connection closing is how each side learns the other is gone).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use anyhow::Context;
use blipless_config::Config;
use blipless_link::LinkError;
use blipless_protocol::channel::{
    EndpointEntry, EndpointPart, HandoffOffer, Hello, Message, PeerEntry, PeerUpdate, Refused,
    MAX_FRAME,
};
use tokio_seqpacket::UnixSeqpacket;

use crate::peercred;

/// How long each side waits for the other's next message.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a predecessor waits for its successor to start serving.
const SERVING_TIMEOUT: Duration = Duration::from_secs(60);

/// What a successor got from its predecessor.
#[derive(Debug)]
pub struct Predecessor {
    socket: UnixSeqpacket,
    /// The offer: sockets, the predecessor's WireGuard generation, counters.
    pub offer: HandoffOffer,
    /// The offered sockets' fds, in the offer's order.
    pub fds: Vec<OwnedFd>,
    /// The WireGuard peer set.
    pub peers: Vec<PeerEntry>,
    /// Where the peers were last heard from.
    pub endpoints: Vec<EndpointEntry>,
}

async fn receive(
    socket: &UnixSeqpacket,
    buffer: &mut [u8],
    what: &str,
) -> anyhow::Result<(Message, Vec<OwnedFd>)> {
    match tokio::time::timeout(STEP_TIMEOUT, blipless_link::receive(socket, buffer)).await {
        Err(_) => anyhow::bail!("no {what} within {STEP_TIMEOUT:?}"),
        Ok(Err(error)) => Err(error).with_context(|| format!("reading {what}")),
        Ok(Ok(None)) => anyhow::bail!("the other ingress closed the handoff before {what}"),
        Ok(Ok(Some(received))) => Ok(received),
    }
}

fn check_peer(socket: &UnixSeqpacket) -> anyhow::Result<()> {
    let credentials = socket
        .peer_cred()
        .context("reading the other ingress's credentials")?;
    anyhow::ensure!(
        peercred::is_allowed(credentials.uid()),
        "{}",
        peercred::refusal(credentials.uid())
    );
    Ok(())
}

/// How long a predecessor may take to answer when the handoff socket itself
/// came back from the service manager's fd store: then the socket accepts
/// connections even with no ingress behind it (the one that crashed).
const KEPT_SOCKET_ANSWER: Duration = Duration::from_secs(2);

/// Connects to the handoff socket of a running ingress and takes its offer;
/// `None` when no ingress answers there (a first start, or after a crash). A
/// refusal (a third ingress while two serve) is an error that says so.
/// `socket_kept`: the service manager passed the handoff socket back, so a
/// connection may succeed with nobody listening; no offer within
/// [`KEPT_SOCKET_ANSWER`] then means no predecessor.
pub async fn find_predecessor(
    config: &Config,
    socket_kept: bool,
) -> anyhow::Result<Option<Predecessor>> {
    let path = config.handoff_socket();
    let socket = match UnixSeqpacket::connect(&path).await {
        Ok(socket) => socket,
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(error) => {
            return Err(error).with_context(|| format!("connecting to {}", path.display()))
        }
    };
    check_peer(&socket)?;
    let _ = blipless_link::size_buffers(&socket);
    blipless_link::send(
        &socket,
        &Message::HandoffHello(Hello {
            pid: std::process::id(),
            software: env!("CARGO_PKG_VERSION").to_string(),
        }),
        &[],
    )
    .await
    .context("saying hello to the running ingress")?;
    let mut buffer = vec![0u8; MAX_FRAME];
    let first = if socket_kept {
        match tokio::time::timeout(
            KEPT_SOCKET_ANSWER,
            receive(&socket, &mut buffer, "the handoff offer"),
        )
        .await
        {
            Ok(first) => first?,
            Err(_) => {
                tracing::info!("no ingress answers on the kept handoff socket: starting afresh");
                return Ok(None);
            }
        }
    } else {
        receive(&socket, &mut buffer, "the handoff offer").await?
    };
    let (offer, fds) = match first {
        (Message::HandoffOffer(offer), fds) => (offer, fds),
        (Message::Refused(Refused { reason }), _) => {
            anyhow::bail!("the running ingress refused to hand off: {reason}")
        }
        (other, _) => anyhow::bail!("expected HandoffOffer, got {}", other.name()),
    };
    let mut peers = Vec::new();
    loop {
        match receive(&socket, &mut buffer, "the peer set").await? {
            (Message::Peers(update), _) => {
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
            (Message::Endpoints(part), _) => {
                endpoints.extend_from_slice(part.entries());
                if part.end {
                    break;
                }
            }
            (other, _) => anyhow::bail!("expected Endpoints, got {}", other.name()),
        }
    }
    Ok(Some(Predecessor {
        socket,
        offer,
        fds,
        peers,
        endpoints,
    }))
}

impl Predecessor {
    /// Tells the predecessor this ingress serves now; returns the connection,
    /// which closes when the predecessor exits.
    pub async fn serving(self) -> anyhow::Result<UnixSeqpacket> {
        blipless_link::send(&self.socket, &Message::HandoffServing, &[])
            .await
            .context("telling the predecessor we serve")?;
        Ok(self.socket)
    }
}

/// Completes when the other end of a handoff connection has closed (its
/// process exited or gave up).
pub async fn closed(socket: &UnixSeqpacket) {
    let mut buffer = [0u8; 64];
    loop {
        match socket.recv(&mut buffer).await {
            Ok(info) if info.bytes_read() > 0 => {}
            _ => return,
        }
    }
}

/// What a predecessor offers.
#[derive(Debug)]
pub struct Offering<'a> {
    /// The offer (sockets, generation, counters).
    pub offer: HandoffOffer,
    /// The sockets' fds, in the offer's order.
    pub fds: Vec<BorrowedFd<'a>>,
    /// The WireGuard peer set.
    pub peers: Vec<PeerEntry>,
    /// The peers' endpoints.
    pub endpoints: Vec<EndpointEntry>,
    /// When the endpoint snapshot was taken (ms since the epoch).
    pub taken_at_ms: u64,
}

/// Reads a would-be successor's hello; `Err` with the reason when it must be
/// refused (credentials), after telling it so.
pub async fn hello(socket: &UnixSeqpacket) -> anyhow::Result<Hello> {
    let _ = blipless_link::size_buffers(socket);
    let mut buffer = vec![0u8; MAX_FRAME];
    let hello = match receive(socket, &mut buffer, "HandoffHello").await? {
        (Message::HandoffHello(hello), _) => hello,
        (other, _) => {
            let reason = format!("expected HandoffHello, got {}", other.name());
            peercred::refuse(socket, reason.clone()).await;
            anyhow::bail!(reason);
        }
    };
    if let Err(error) = check_peer(socket) {
        peercred::refuse(socket, error.to_string()).await;
        return Err(error);
    }
    Ok(hello)
}

/// Sends the offer, the peer set and the endpoints, then waits for the
/// successor to serve. `Ok(true)`: it serves (the caller steps aside);
/// `Ok(false)`: it went away first (the caller carries on as before).
pub async fn offer(socket: &UnixSeqpacket, offering: Offering<'_>) -> Result<bool, LinkError> {
    blipless_link::send(
        socket,
        &Message::HandoffOffer(offering.offer),
        &offering.fds,
    )
    .await?;
    for part in PeerUpdate::split_full(offering.peers) {
        blipless_link::send(socket, &Message::Peers(part), &[]).await?;
    }
    for part in EndpointPart::split(offering.taken_at_ms, &offering.endpoints) {
        blipless_link::send(socket, &Message::Endpoints(part), &[]).await?;
    }
    let mut buffer = vec![0u8; MAX_FRAME];
    match tokio::time::timeout(SERVING_TIMEOUT, blipless_link::receive(socket, &mut buffer)).await {
        Ok(Ok(Some((Message::HandoffServing, _)))) => Ok(true),
        Ok(Ok(Some((other, _)))) => {
            tracing::warn!(
                "the successor sent {} instead of HandoffServing",
                other.name()
            );
            Ok(false)
        }
        Ok(Ok(None)) | Ok(Err(_)) => Ok(false),
        Err(_) => {
            tracing::warn!("the successor did not serve within {SERVING_TIMEOUT:?}");
            Ok(false)
        }
    }
}
