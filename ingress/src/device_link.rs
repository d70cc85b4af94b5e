//! The device socket: device planes connect here, say Hello, and then
//! receive customer connections as file descriptors.
//!
//! Each connected plane gets a reader task that handles what the plane says
//! (Ready, Report, Drained, Migrate, and WireGuard's Packets and Peers). A plane that sends a frame this ingress cannot
//! read, or the wrong message, is disconnected; the others are untouched.

use std::sync::Arc;
use std::time::Duration;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::Context;
use blipless_link::LinkError;
use blipless_protocol::channel::{
    self, DecodeError, Rejoin, ToDevice, ToIngress, Welcome, MAX_FRAME,
};
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};
use tokio_util::sync::CancellationToken;

use crate::dispatch::{self, Wait};
use crate::metrics::Metrics;
use crate::peercred;
use crate::planes::process::PlaneProcess;
use crate::planes::{send_frame, Confirmation, Frame, PlaneLink, Planes};
use crate::wg::workers::Span;
use crate::wg::Wireguard;

/// How long a new plane has to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What every device-plane connection shares.
#[derive(Debug, Clone)]
pub struct DeviceContext {
    /// The attached planes.
    pub planes: Arc<Planes>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// WireGuard: packets and peer sets from the planes go here.
    pub wireguard: Arc<Wireguard>,
    /// How long a plane has from Hello to Ready.
    pub ready_budget: Duration,
}

/// Accepts device planes until `shutdown`. A plane that is not Ready
/// within `ready_budget` of its Hello is told to go away.
pub async fn serve(
    listener: UnixSeqpacketListener,
    context: DeviceContext,
    shutdown: CancellationToken,
) {
    crate::sockets::accept_each(
        listener,
        shutdown,
        "device",
        "device plane connection ended",
        move |socket| serve_plane(socket, context.clone()),
    )
    .await;
}

/// What a plane's next frame turned out to be.
enum Received<'b> {
    Message(ToIngress<'b>, Vec<OwnedFd>),
    Closed,
}

async fn receive<'b>(
    socket: &UnixSeqpacket,
    buffer: &'b mut [u8],
) -> Result<Received<'b>, LinkError> {
    Ok(
        match blipless_link::receive::<ToIngress>(socket, buffer).await? {
            Some((message, fds)) => Received::Message(message, fds),
            None => Received::Closed,
        },
    )
}

async fn refuse(socket: &UnixSeqpacket, reason: String) {
    tracing::error!("refusing a device plane: {reason}");
    peercred::refuse_plane(socket, reason).await;
}

async fn serve_plane(socket: UnixSeqpacket, context: DeviceContext) -> anyhow::Result<()> {
    let DeviceContext {
        planes,
        ready_budget,
        ..
    } = context.clone();
    if let Err(error) = blipless_link::size_buffers(&socket) {
        tracing::warn!(%error, "could not size the device channel's send buffer");
    }
    crate::fault::shrink_channel_buffer(&socket);
    let mut buffer = vec![0u8; MAX_FRAME];
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, receive(&socket, &mut buffer)).await {
        Err(_) => anyhow::bail!("no Hello within {HELLO_TIMEOUT:?}"),
        Ok(Ok(Received::Message(ToIngress::Hello(hello), _))) => hello,
        Ok(Ok(Received::Message(other, _))) => {
            refuse(&socket, format!("expected Hello, got {}", other.name())).await;
            return Ok(());
        }
        Ok(Ok(Received::Closed)) => return Ok(()),
        Ok(Err(LinkError::Decode(DecodeError::NotInConversation { message, .. }))) => {
            refuse(&socket, format!("expected Hello, got {message}")).await;
            return Ok(());
        }
        Ok(Err(LinkError::Decode(DecodeError::VersionMismatch { ours, theirs }))) => {
            refuse(
                &socket,
                format!(
                    "protocol version mismatch: this ingress speaks v{ours}, the device plane v{theirs}; deploy a device plane built for v{ours}"
                ),
            )
            .await;
            return Ok(());
        }
        Ok(Err(error)) => return Err(error.into()),
    };
    // Checked after the Hello is read, so the refusal reaches a peer that is
    // still writing rather than breaking its pipe.
    let credentials = socket
        .peer_cred()
        .context("reading the device plane's credentials")?;
    if !peercred::is_allowed(credentials.uid()) {
        refuse(&socket, peercred::refusal(credentials.uid())).await;
        return Ok(());
    }
    let generation = planes.next_generation();
    send_frame(
        &socket,
        &ToDevice::Welcome(Welcome {
            generation,
            ingress_pid: std::process::id(),
            successor: planes.active().is_some(),
            wants_endpoints: context.wireguard.wants_endpoints(),
            udp_associations: true,
            accepted_nodelay: true,
        }),
        &[],
    )
    .await
    .context("welcoming the device plane")?;
    let rejoin = hello.rejoin;
    let process = PlaneProcess::open(credentials.pid());
    let link = Arc::new(PlaneLink::new(generation, hello, socket, process));
    if rejoin == Rejoin::Draining {
        planes.attach_draining(link.clone());
        tracing::info!(generation, pid = link.pid, software = %link.software, "device plane attached (draining: it carries on from the previous ingress)");
    } else {
        planes.attach(link.clone());
        tracing::info!(generation, pid = link.pid, software = %link.software, "device plane attached (standby)");
    }
    let budget_planes = planes.clone();
    let budget_link = link.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(ready_budget) => {
                drop(Planes::send_orders(budget_planes.on_ready_timeout(generation, ready_budget)));
            }
            () = budget_link.closed.cancelled() => {}
        }
    });

    let outcome = read_loop(&link, &context, &mut buffer).await;
    if outcome.is_ok() {
        link.mark_read_to_end();
    }
    let detached = planes.detach(generation, link.drained());
    link.closed.cancel();
    match &outcome {
        Ok(()) => tracing::info!(generation, "device plane detached"),
        Err(error) => tracing::warn!(generation, "device plane disconnected: {error:#}"),
    }
    // Queued before the answers below, which each plane's queue keeps after
    // them.
    drop(Planes::send_orders(detached.orders));
    link.detach_orders_sent.cancel();
    answer_for_gone(&planes, &link, detached.unconfirmed).await;
    outcome
}

/// Answers the senders of connections the gone plane `gone` never confirmed
/// ([`Planes::answers_for_gone`]), after the orders its detach gave: a
/// sender given the node back serves again before it hears "not taken".
async fn answer_for_gone(
    planes: &Planes,
    gone: &PlaneLink,
    unconfirmed: Vec<(Arc<PlaneLink>, u64)>,
) {
    if unconfirmed.is_empty() {
        return;
    }
    gone.detach_orders_sent.cancelled().await;
    let never_taken = gone.never_took_unconfirmed(EXIT_WAIT).await;
    let (generation, count) = (gone.generation, unconfirmed.len());
    if never_taken {
        tracing::warn!(
            generation,
            count,
            "device plane gone before taking connections handed to it; their sender keeps them"
        );
    } else {
        tracing::warn!(
            generation,
            count,
            "device plane gone with connections handed to it unconfirmed; they are lost with it"
        );
    }
    // Awaited: until sent, they are in flight for an ingress deciding
    // whether it may exit.
    Planes::send_orders(Planes::answers_for_gone(unconfirmed, never_taken)).await;
    planes.answered(count);
}

/// How long a plane whose channel closed is given to be seen exited, when it
/// left connections unconfirmed: a crashing process closes its descriptors
/// a moment before it exits.
const EXIT_WAIT: Duration = Duration::from_secs(1);

async fn read_loop(
    link: &Arc<PlaneLink>,
    context: &DeviceContext,
    buffer: &mut Vec<u8>,
) -> anyhow::Result<()> {
    let planes = &*context.planes;
    // Worker 0's share of the returned packets is encrypted here.
    let mut lane = context.wireguard.lane(0);
    loop {
        // Where the buffer lies, to find the packets a Packets frame borrows
        // from it; the WireGuard workers are then lent the whole buffer.
        let span = Span::of(buffer);
        let (message, fds) = match receive(link.socket(), buffer).await? {
            Received::Closed => return Ok(()),
            Received::Message(message, fds) => (message, fds),
        };
        match message {
            ToIngress::Ready => {
                tracing::info!(generation = link.generation, "device plane ready");
                // Queued, not awaited: the old plane's Drain must not keep
                // this reader from its own plane's frames if the old one
                // stopped reading.
                drop(Planes::send_orders(planes.on_ready(link.generation)));
            }
            ToIngress::Report(report) => {
                context.metrics.count_reported(&link.report(), &report);
                link.set_report(*report);
            }
            ToIngress::Packets(batch) => {
                let routed = context.wireguard.route_from_plane(&batch, span);
                context
                    .wireguard
                    .from_plane(routed, buffer, &mut lane)
                    .await;
            }
            ToIngress::Peers(update) => context.wireguard.on_peers(link, update),
            ToIngress::Endpoints(part) => context.wireguard.on_endpoints(link, part),
            ToIngress::Drain(_) => {
                tracing::info!(generation = link.generation, "device plane asked to drain");
                drop(Planes::send_orders(planes.on_leaving(link.generation)));
            }
            ToIngress::Drained(summary) => {
                link.mark_drained();
                tracing::info!(
                    generation = link.generation,
                    ?summary,
                    "device plane drained"
                );
            }
            ToIngress::Migrate(migrate) => {
                let id = migrate.connection_id;
                planes.migration_sent(id, link);
                // Passing on may wait for an active plane: never in this
                // reader, which also carries the plane's return packets.
                let (planes, from) = (context.planes.clone(), link.clone());
                tokio::spawn(async move {
                    let message = ToDevice::Migrate(migrate);
                    forward_migration(&planes, &from, id, message, fds).await;
                });
            }
            ToIngress::TunQueues(count) => {
                tracing::info!(
                    generation = link.generation,
                    queues = count,
                    "passing TUN queues to the active plane"
                );
                let (planes, from) = (context.planes.clone(), link.clone());
                tokio::spawn(async move {
                    pass_on(&planes, &from, &ToDevice::TunQueues(count), &fds).await;
                });
            }
            ToIngress::ExitQueues(exit) => {
                tracing::info!(
                    generation = link.generation,
                    exit = %exit.exit,
                    "passing a WireGuard exit's descriptors to the active plane"
                );
                let (planes, from) = (context.planes.clone(), link.clone());
                tokio::spawn(async move {
                    pass_on(&planes, &from, &ToDevice::ExitQueues(exit), &fds).await;
                });
            }
            ToIngress::MigrateDone(id) => {
                let Confirmation::Confirmed(from) = planes.migration_done(id, link) else {
                    // (Also a confirmation that crossed an ingress handoff:
                    // the predecessor kept the record.)
                    tracing::debug!(
                        generation = link.generation,
                        id,
                        "device plane confirmed a connection not passed to it here; ignored"
                    );
                    continue;
                };
                // Counted when the receiver confirms, not when passed (a
                // pass its receiver died before taking stays with its
                // sender and may move later), and not when the sender
                // takes back what found no other plane.
                if !from.as_ref().is_some_and(|from| Arc::ptr_eq(from, link)) {
                    context.metrics.count_migrated();
                }
                // Queued (as orders are), not sent from this reader: the
                // sender's channel may be full or busy, and this reader also
                // carries the receiver's packets, reports and confirmations.
                if let Some(from) = from {
                    drop(from.order(ToDevice::MigrateDone(id)));
                }
            }
            ToIngress::Synced(synced) => {
                planes
                    .syncs
                    .on_synced(link.generation, synced.token, synced.applied);
            }
            ToIngress::Hello(_) => anyhow::bail!("a device plane said Hello twice"),
        }
    }
}

/// Passes what a plane gives up (a migrating connection, its TUN queues) to
/// the active plane, waiting up to [`MIGRATION_WAIT`] for one other than the
/// sender; returns it. When none takes it, it goes back to the
/// sender, which then keeps it (`None`). Fds are never dropped here.
async fn pass_on(
    planes: &Planes,
    from: &Arc<PlaneLink>,
    message: &ToDevice<'_>,
    fds: &[OwnedFd],
) -> Option<Arc<PlaneLink>> {
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
    let deadline = tokio::time::Instant::now() + MIGRATION_WAIT;
    let wait = Wait::Until(deadline);
    let encoded = channel::encode(message);
    let frame = Frame::of(message, &encoded);
    if let Some(to) =
        dispatch::to_active(planes, frame, &borrowed, Some(from.generation), wait).await
    {
        return Some(to);
    }
    if let Err(error) = from.send(message, &borrowed).await {
        tracing::warn!(generation = from.generation, %error, "could not return {}; it is lost", message.name());
    }
    None
}

/// How long a migrating connection waits for an active plane before it is
/// sent back to the plane it came from (which then keeps serving it).
const MIGRATION_WAIT: Duration = Duration::from_secs(10);

/// Passes a migrating connection to the active plane (see [`pass_on`]) and
/// records where it went, for the successor's MigrateDone.
async fn forward_migration(
    planes: &Planes,
    from: &Arc<PlaneLink>,
    id: u64,
    message: ToDevice<'static>,
    fds: Vec<OwnedFd>,
) {
    let to = pass_on(planes, from, &message, &fds)
        .await
        .unwrap_or_else(|| from.clone());
    // Recorded after the pass: the receiver may have gone meanwhile.
    if let Some(id) = planes.migration_passed(id, from, &to) {
        if Arc::ptr_eq(&to, from) {
            planes.answered(1);
        } else {
            answer_for_gone(planes, &to, vec![(from.clone(), id)]).await;
        }
    }
}
