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
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use anyhow::Context;
use blipless_protocol::channel::Handoff;
use tokio::sync::{mpsc, Notify};
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
    /// What this ingress does with its place ([`STAYING`], [`HANDING_OFF`],
    /// [`DRAINING`]): one at a time, changed only by compare-and-swap, so a
    /// drain and a handoff never both go ahead.
    leaving: AtomicU8,
    /// Woken when a handoff ends without the successor serving: a drain
    /// waiting for its outcome goes ahead.
    handoff_ended: Notify,
}

/// Serving, with no successor taking over and no drain asked for.
const STAYING: u8 = 0;
/// A successor was offered the sockets (and, once it serves, has them).
const HANDING_OFF: u8 = 1;
/// The node drains: no successor is offered anything any more.
const DRAINING: u8 = 2;

/// Why a would-be successor cannot take over now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Another successor is taking over (or has).
    HandingOff,
    /// The node drains.
    Draining,
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
            leaving: AtomicU8::new(STAYING),
            handoff_ended: Notify::new(),
        }
    }

    /// A successor may be offered the sockets: `Err` when another is taking
    /// over or the node drains.
    fn begin_handoff(&self) -> Result<(), Busy> {
        match self.leaving.compare_exchange(
            STAYING,
            HANDING_OFF,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => Ok(()),
            Err(DRAINING) => Err(Busy::Draining),
            Err(_) => Err(Busy::HandingOff),
        }
    }

    /// The successor went away (before serving, or after: this ingress
    /// serves again); another may take over, and a drain waiting for this
    /// handoff's outcome goes ahead.
    fn end_handoff(&self) {
        let _ =
            self.leaving
                .compare_exchange(HANDING_OFF, STAYING, Ordering::SeqCst, Ordering::SeqCst);
        self.handoff_ended.notify_waiters();
    }

    /// A drain was asked for. `None`: this ingress drains the node (no
    /// successor is taking over, and none will be offered anything from now
    /// on). `Some(successor)`: a handoff was under way and the successor
    /// serves, so this ingress steps aside for it instead (the drain was
    /// this ingress's, not the node's: the successor serves on, and stops
    /// when it is asked to). A handoff under way ends within the
    /// predecessor's serving timeout: the successor serves, goes away, or
    /// is given up on.
    pub async fn drain_or_step_aside(
        &self,
        takeovers: &mut mpsc::Receiver<UnixSeqpacket>,
    ) -> Option<UnixSeqpacket> {
        let mut told = false;
        loop {
            let ended = self.handoff_ended.notified();
            tokio::pin!(ended);
            // Registered before the state is read: an end in between wakes it.
            ended.as_mut().enable();
            if let Ok(successor) = takeovers.try_recv() {
                return Some(successor);
            }
            if self
                .leaving
                .compare_exchange(STAYING, DRAINING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return None;
            }
            if !told {
                told = true;
                tracing::info!("a drain was asked for while a successor takes over: this ingress waits for its outcome");
            }
            tokio::select! {
                biased;
                successor = takeovers.recv() => return successor,
                () = ended => {}
            }
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
