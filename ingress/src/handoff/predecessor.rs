//! The predecessor's side of a handoff: the running ingress answers would-be
//! successors on `handoff.sock`, offers one of them every listening socket,
//! its peers and their endpoints, and once that one serves, steps aside: it
//! stops accepting, sends its device planes Goaway, and goes on decrypting its
//! own WireGuard sessions until nothing depends on it any more
//! ([`super::departure`]), or takes everything back if the successor dies.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_link::LinkError;
use blipless_protocol::channel::{
    EndpointEntry, EndpointPart, Handoff, HandoffOffer, Hello, PeerEntry, PeerUpdate, SocketName,
    ToDevice, MAX_FRAME,
};
use tokio::sync::mpsc;
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};
use tokio_util::sync::CancellationToken;

use super::departure::{Departure, Look, Verdict};
use super::{check_peer, receive, Busy, Lineage};
use crate::listeners::Listeners;
use crate::node::Node;
use crate::peercred;
use crate::planes::Planes;
use crate::serving::Running;
use crate::wg::{steer, Wireguard};

/// How long a predecessor waits for its successor to take the offer and
/// start serving.
const SERVING_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a predecessor makes no WireGuard session while its successor
/// has not served yet (normally tens of milliseconds): past it, sessions
/// are made again until the successor serves, as before the offer, so that
/// peers are not kept waiting on a successor that is slow or stuck (the
/// price: a session made then may be one the successor does not call back,
/// as it was before this bound existed).
const STEPPED_ASIDE_BEFORE_SERVING: Duration = Duration::from_secs(5);
/// How often a predecessor that stepped aside checks whether it may leave.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// What the handoff listener offers, and whom it tells when a successor
/// serves.
#[derive(Debug)]
pub struct Handoffs {
    /// The offer and duplicates of its sockets' fds, in the offer's order;
    /// replaced when a drain withdraws the customer listeners.
    offer: std::sync::Mutex<Arc<Offered>>,
    node: Arc<Node>,
    lineage: Arc<Lineage>,
    /// Where a successor that serves goes: the run loop steps aside for it.
    takeovers: mpsc::Sender<UnixSeqpacket>,
}

/// What a successor is offered: the sockets and their fds, in step.
#[derive(Debug)]
struct Offered {
    offer: HandoffOffer,
    fds: Vec<OwnedFd>,
}

impl Handoffs {
    /// Offers `listeners` (duplicated fds a successor can own) and this
    /// ingress's WireGuard `generation`.
    pub fn new(
        listeners: &Listeners,
        generation: u32,
        node: Arc<Node>,
        lineage: Arc<Lineage>,
        takeovers: mpsc::Sender<UnixSeqpacket>,
    ) -> Self {
        let (sockets, fds) = listeners.offer();
        // A socket whose fd cannot be duplicated (EMFILE) is left out of the
        // offer with its fd, so that names and fds stay in step.
        let (sockets, owned) = sockets
            .into_iter()
            .zip(fds)
            .filter_map(|(socket, fd)| match fd.try_clone_to_owned() {
                Ok(owned) => Some((socket, owned)),
                Err(error) => {
                    tracing::warn!(socket = %socket.name, %error, "cannot duplicate a socket to offer: a successor binds it afresh");
                    None
                }
            })
            .unzip();
        let offer = HandoffOffer {
            sockets,
            wg_generation: generation,
            counters: Default::default(),
        };
        Self {
            offer: std::sync::Mutex::new(Arc::new(Offered { offer, fds: owned })),
            node,
            lineage,
            takeovers,
        }
    }

    /// What is offered now.
    fn offered(&self) -> Arc<Offered> {
        self.offer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Takes the `names` sockets out of the offer and closes its copies of
    /// them: a draining ingress offers nothing any more, and its customer
    /// listeners must close with its own copies, so that new customers are
    /// refused rather than queued (docs/ARCHITECTURE.md, "Ingress shutdown").
    pub fn withdraw(&self, names: &[SocketName]) {
        let mut current = self
            .offer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (sockets, fds) = current
            .offer
            .sockets
            .iter()
            .zip(&current.fds)
            .filter(|(socket, _)| !names.contains(&socket.name))
            .filter_map(|(socket, fd)| Some((socket.clone(), fd.try_clone().ok()?)))
            .unzip();
        let offer = HandoffOffer {
            sockets,
            ..current.offer.clone()
        };
        *current = Arc::new(Offered { offer, fds });
    }

    /// Steers WireGuard initiations back to this ingress's own member of
    /// the port's group: a successor that went away before serving may have
    /// steered them to its own already (it does before it serves), and
    /// nobody reads that member now.
    fn steer_back(&self) {
        let offered = self.offered();
        let Offered { offer, fds } = &*offered;
        let wg0 = offer
            .sockets
            .iter()
            .zip(fds)
            .find(|(socket, _)| socket.name == SocketName::Wg0);
        let Some((_, wg0)) = wg0 else {
            tracing::warn!("no WireGuard socket offered: cannot steer WireGuard back");
            return;
        };
        if let Err(error) = steer::steer(wg0.as_fd(), offer.wg_generation) {
            tracing::error!(%error, "could not steer WireGuard back to this ingress");
        }
    }
}

/// Accepts would-be successors on the handoff socket until `stop`.
pub async fn serve(
    listener: UnixSeqpacketListener,
    handoffs: Arc<Handoffs>,
    stop: CancellationToken,
) {
    crate::sockets::accept_each(listener, stop, "handoff", "handoff failed", move |socket| {
        let handoffs = handoffs.clone();
        async move { hand_off(socket, &handoffs).await }
    })
    .await;
}

/// Why a successor is refused by an ingress that drains.
const DRAINING: &str =
    "this ingress is draining (a drain was asked for); start afresh once it has exited";

/// One would-be successor: refuse it, or offer it everything and, once it
/// serves, tell the run loop to step aside.
async fn hand_off(socket: UnixSeqpacket, handoffs: &Handoffs) -> anyhow::Result<()> {
    let hello = read_hello(&socket).await?;
    // A drain was asked for (SIGTERM, `blipless-ctl drain`): the node is
    // going away, its socket files with it, so nothing is offered; the
    // successor asks again until this ingress has gone, then starts afresh.
    if handoffs.node.shutdown.is_cancelled() {
        tracing::info!(
            pid = hello.pid,
            "a successor asks to take over while this ingress drains: it starts once this one has exited"
        );
        peercred::refuse_ingress(&socket, DRAINING.to_string(), true).await;
        return Ok(());
    }
    if handoffs.lineage.beside_predecessor.load(Ordering::SeqCst) {
        let reason =
            "this ingress is still taking over from its own predecessor (two generations at most)"
                .to_string();
        tracing::info!(
            pid = hello.pid,
            "a third ingress asks to take over: it waits for its turn"
        );
        peercred::refuse_ingress(&socket, reason, true).await;
        return Ok(());
    }
    let handing_off = match handoffs.lineage.begin_handoff() {
        Ok(()) => HandingOff(&handoffs.lineage),
        Err(busy) => {
            let reason = match busy {
                Busy::HandingOff => "another successor is taking over this ingress",
                Busy::Draining => DRAINING,
            };
            tracing::info!(
                pid = hello.pid,
                reason,
                "a successor asks to take over: it waits for its turn"
            );
            peercred::refuse_ingress(&socket, reason.to_string(), true).await;
            return Ok(());
        }
    };
    tracing::info!(pid = hello.pid, software = %hello.software, "a successor ingress asks to take over");
    let offered = handoffs.offered();
    let Offered { offer, fds } = &*offered;
    let mut offer = offer.clone();
    offer.counters = handoffs.node.metrics.handoff_counters();
    // No session is made from before the snapshot on: one made after it
    // would be unknown to the successor, which calls back only the peers
    // it was given, and one made once the successor calls back would be
    // the peer's newest, on an ingress about to exit. An initiation that
    // arrives meanwhile goes unanswered (the peer tries again in 5 s and
    // reaches the successor, whose steering takes initiations from before
    // it serves); a successor that does not serve gives it back.
    handoffs.node.wireguard.set_stepped_aside(true);
    let (peers, endpoints) = handoffs.node.wireguard.snapshot();
    let offering = Offering {
        offer,
        fds: fds.iter().map(AsFd::as_fd).collect(),
        peers,
        endpoints,
        taken_at_ms: handoffs.node.wireguard.now_ms(),
    };
    // Bounded as a whole: a drain asked for meanwhile waits for this.
    let answer = {
        let offered = tokio::time::timeout(SERVING_TIMEOUT, send_offer(&socket, offering));
        tokio::pin!(offered);
        tokio::select! {
            // The answer first: a successor that serves as the bound ends
            // has served.
            biased;
            answer = &mut offered => answer,
            () = tokio::time::sleep(STEPPED_ASIDE_BEFORE_SERVING) => {
                // Its peers are not kept waiting on a successor that is
                // slow to serve: sessions are made here again meanwhile.
                tracing::warn!(
                    "the successor has not served within {STEPPED_ASIDE_BEFORE_SERVING:?}; \
                     answering handshakes again until it does"
                );
                handoffs.node.wireguard.set_stepped_aside(false);
                offered.await
            }
        }
    };
    let serves = match answer {
        Ok(serves) => serves.unwrap_or(false),
        Err(_) => {
            tracing::warn!("the successor did not serve within {SERVING_TIMEOUT:?}");
            false
        }
    };
    if !serves {
        handoffs.node.wireguard.set_stepped_aside(false);
        handoffs.steer_back();
        tracing::warn!(
            pid = hello.pid,
            "the successor went away before serving; carrying on"
        );
        return Ok(());
    }
    // At once, not when the run loop steps aside: no session is started
    // meanwhile (`Wireguard::set_stepped_aside`; since the snapshot,
    // unless the successor was slow to serve).
    handoffs.node.wireguard.set_stepped_aside(true);
    if handoffs.takeovers.send(socket).await.is_ok() {
        // The run loop steps aside; it ends the handoff if it serves again.
        std::mem::forget(handing_off);
    } else {
        handoffs.node.wireguard.set_stepped_aside(false);
    }
    Ok(())
}

/// A handoff under way: ends it ([`Lineage::end_handoff`]) when dropped,
/// however `hand_off` leaves (the successor went away, an error, a panic),
/// unless the run loop took the successor over. A drain waiting for the
/// handoff's outcome must never wait for one that will not come.
struct HandingOff<'a>(&'a Lineage);

impl Drop for HandingOff<'_> {
    fn drop(&mut self) {
        self.0.end_handoff();
    }
}

/// What a predecessor offers.
#[derive(Debug)]
struct Offering<'a> {
    /// The offer (sockets, generation, counters).
    offer: HandoffOffer,
    /// The sockets' fds, in the offer's order.
    fds: Vec<BorrowedFd<'a>>,
    /// The WireGuard peer set.
    peers: Vec<PeerEntry>,
    /// The peers' endpoints.
    endpoints: Vec<EndpointEntry>,
    /// When the endpoint snapshot was taken (ms since the epoch).
    taken_at_ms: u64,
}

/// Reads a would-be successor's hello; `Err` with the reason when it must be
/// refused (credentials), after telling it so.
async fn read_hello(socket: &UnixSeqpacket) -> anyhow::Result<Hello> {
    let _ = blipless_link::size_buffers(socket);
    let mut buffer = vec![0u8; MAX_FRAME];
    let hello = match receive(socket, &mut buffer, "HandoffHello").await? {
        (Handoff::Hello(hello), _) => hello,
        (other, _) => {
            let reason = format!("expected HandoffHello, got {}", other.name());
            peercred::refuse_ingress(socket, reason.clone(), false).await;
            anyhow::bail!(reason);
        }
    };
    if let Err(error) = check_peer(socket) {
        peercred::refuse_ingress(socket, error.to_string(), false).await;
        return Err(error);
    }
    Ok(hello)
}

/// Sends the offer, the peer set and the endpoints, then waits for the
/// successor to serve. `Ok(true)`: it serves (the caller steps aside);
/// `Ok(false)`: it went away first (the caller carries on as before).
async fn send_offer(socket: &UnixSeqpacket, offering: Offering<'_>) -> Result<bool, LinkError> {
    blipless_link::send(socket, &Handoff::Offer(offering.offer), &offering.fds).await?;
    for part in PeerUpdate::split_full(offering.peers) {
        blipless_link::send(socket, &Handoff::Peers(part), &[]).await?;
    }
    for part in EndpointPart::split(offering.taken_at_ms, &offering.endpoints) {
        blipless_link::send(socket, &Handoff::Endpoints(part), &[]).await?;
    }
    let mut buffer = vec![0u8; MAX_FRAME];
    match blipless_link::receive::<Handoff>(socket, &mut buffer).await {
        Ok(Some((Handoff::Serving, _))) => Ok(true),
        Ok(Some((other, _))) => {
            tracing::warn!(
                "the successor sent {} instead of HandoffServing",
                other.name()
            );
            Ok(false)
        }
        Ok(None) | Err(_) => Ok(false),
    }
}

/// How stepping aside for a successor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteppedAside {
    /// Nothing depends on this ingress any more (or the drain grace passed,
    /// or a stop was asked for): the successor has everything; exit.
    Exit,
    /// The successor died: serve again (steer WireGuard back, restart the
    /// listener tasks). Another successor may take over from then on.
    ServeAgain,
}

/// A successor serves (`successor` is its handoff connection): stops every
/// listener task of `running`, sends every device plane Goaway, and keeps
/// decrypting this ingress's own WireGuard sessions until nothing depends on
/// this ingress any more ([`Departure`]: peers moved or idle, planes rejoined,
/// its socket drained), the successor dies, `grace` passes or `shutdown` is
/// cancelled.
pub async fn step_aside(
    successor: &UnixSeqpacket,
    running: Running,
    planes: &Planes,
    wireguard: &Wireguard,
    lineage: &Lineage,
    grace: Duration,
    shutdown: &CancellationToken,
) -> SteppedAside {
    let overlap = Instant::now();
    tracing::info!("a successor ingress serves; stepping aside");
    wireguard.set_stepped_aside(true);
    running.stop_accepting();
    running.stop_serving();
    running.wait().await;
    // Every plane at once (a wedged one, whose channel is full, must not
    // keep the others from their Goaway, and so from activating on the
    // successor), and bounded by the grace: it must not keep this ingress
    // from its departure checks either.
    let mut goaway = Planes::send_orders(
        planes
            .all()
            .into_iter()
            .map(|p| (p, ToDevice::Goaway))
            .collect(),
    );
    if tokio::time::timeout(grace, &mut goaway).await.is_err() {
        // Withdrawn: a wedged plane that reads again after this ingress
        // serves again (its successor died) must not find a stale Goaway.
        goaway.give_up();
        tracing::warn!("drain grace over while telling the device planes Goaway");
    }
    let mut departure = Departure::new(grace);
    let mut buffer = vec![0u8; MAX_FRAME];
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = blipless_link::receive::<Handoff>(successor, &mut buffer) => match received {
                Ok(Some((Handoff::Progress(progress), _))) => departure.on_progress(progress),
                // The successor drains the node (and removes the socket
                // files): serving again would be serving nowhere.
                Ok(Some((Handoff::Stopping, _))) => {
                    tracing::info!(overlap = ?overlap.elapsed(), "the successor ingress was asked to stop and drains the node: exiting");
                    return SteppedAside::Exit;
                }
                Ok(Some((other, _))) => {
                    tracing::debug!("the successor sent {} during the overlap; ignored", other.name());
                }
                Err(LinkError::Io(_)) | Ok(None) => break,
                Err(error) => tracing::warn!(%error, "a bad message from the successor; ignored"),
            },
            _ = check.tick() => {
                let peers = wireguard.activity();
                let traffic = planes.carrying_traffic();
                let look = Look {
                    elapsed: overlap.elapsed(),
                    now_ms: wireguard.now_ms(),
                    peers: &peers,
                    planes: &traffic,
                    migrations: planes.migrations_in_flight(),
                    queued: wireguard.has_queued(),
                };
                match departure.check(&look) {
                    Verdict::Stay(_) => continue,
                    Verdict::Settled => {
                        tracing::info!(overlap = ?overlap.elapsed(), moved = departure.moved(), idle = ?wireguard.idle_for(), "nothing depends on this ingress any more (peers moved or idle, device planes rejoined): exiting");
                    }
                    Verdict::GraceOver(waiting) => {
                        tracing::warn!(overlap = ?overlap.elapsed(), peers = waiting.peers, planes = waiting.planes, migrations = waiting.migrations, "drain grace over while peers, device planes or migrations still depended on this ingress: exiting");
                    }
                }
                return SteppedAside::Exit;
            }
            () = shutdown.cancelled() => {
                tracing::info!(overlap = ?overlap.elapsed(), "asked to stop during the overlap: exiting");
                return SteppedAside::Exit;
            }
        }
    }
    tracing::warn!("the successor ingress died after taking over; serving again");
    wireguard.set_stepped_aside(false);
    lineage.end_handoff();
    SteppedAside::ServeAgain
}
