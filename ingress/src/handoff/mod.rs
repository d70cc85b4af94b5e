//! Ingress restart-by-handoff (docs/ARCHITECTURE.md, "Ingress
//! restart-by-handoff"): the conversation on `handoff.sock`, and what each
//! side does around it.
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
//!                                     decrypts its sessions until nothing
//!   HandoffProgress (peers moved, ─▶   depends on it ([`departure`])
//!     planes attached), repeated
//!   (connection held open)           exits: the connection closes
//! ```
//!
//! - [`successor`]: the new ingress taking the sockets ([`find_predecessor`],
//!   [`Predecessor`]).
//! - [`predecessor`]: the running ingress giving them away ([`serve`] on the
//!   handoff socket, [`step_aside`] once a successor serves).
//! - [`departure`]: when the predecessor may exit (no I/O).
//!
//! The socket is SOCK_SEQPACKET and the frames are the device channel's (the
//! same codec, the same fd passing), so a snapshot too large for one frame
//! travels in parts as it does to device planes. Both sides check the other's
//! credentials (same uid, or root). A successor that goes away before
//! `HandoffServing` leaves the predecessor serving as if nothing happened; one
//! that goes away after it makes the predecessor take everything back (the
//! connection closing is how each side learns the other is gone).

pub mod departure;
pub mod predecessor;
pub mod successor;

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use blipless_protocol::channel::Handoff;
use tokio_seqpacket::UnixSeqpacket;

use crate::peercred;

pub use predecessor::{serve, step_aside, Handoffs, SteppedAside};
pub use successor::{find_predecessor, Predecessor};

/// How long each side waits for the other's next message.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where this ingress stands with the ingresses before and after it.
#[derive(Debug, Default)]
pub struct Lineage {
    /// Our predecessor still runs (its handoff connection is open): a third
    /// ingress is refused.
    beside_predecessor: AtomicBool,
    /// A successor is taking over (or has): no other may.
    handing_off: AtomicBool,
}

impl Lineage {
    /// The lineage of an ingress that took an offer from `predecessor`
    /// (`None`: it started afresh). Taking over counts as being beside the
    /// predecessor from the moment the offer is taken, not only once this
    /// ingress serves: the handoff socket it inherited may hand it a third
    /// ingress before then, which must wait for its turn.
    pub fn new(predecessor: Option<&Predecessor>) -> Self {
        Self {
            beside_predecessor: AtomicBool::new(predecessor.is_some()),
            handing_off: AtomicBool::new(false),
        }
    }
}

async fn receive(
    socket: &UnixSeqpacket,
    buffer: &mut [u8],
    what: &str,
) -> anyhow::Result<(Handoff, Vec<OwnedFd>)> {
    match tokio::time::timeout(
        STEP_TIMEOUT,
        blipless_link::receive::<Handoff>(socket, buffer),
    )
    .await
    {
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
