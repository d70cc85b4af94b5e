//! The customer-facing TCP listeners: accept only while a device plane is
//! active, and hand each accepted socket to it.
//!
//! While no plane is active the loop does not call accept at all, so new
//! connections wait in the kernel's listen backlog (the client sees a
//! completed TCP handshake and simply waits) until a plane attaches.
//!
//! A plain connection is never read or written here: it is accepted without
//! being registered with epoll ([`WatchedListener`]); only an HTTPS
//! connection, whose TLS the ingress terminates, becomes a tokio socket.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::{self, Accepted, ListenerKind, ToDevice, MAX_ACCEPTED_MANY};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::dispatch::{self, Wait};
use crate::metrics::Metrics;
use crate::planes::{Frame, PlaneLink, Planes};
use crate::watched_listener::WatchedListener;

/// Numbers every accepted connection, across listeners, for logs on both
/// planes and as the key a device plane keeps a migrating connection under.
/// Device planes outlive an ingress (a handoff, a crash restart), so numbers
/// must not repeat from one ingress to the next: each ingress counts from
/// its start time in milliseconds times 2^20, and two ingresses' ranges
/// meet only if one accepts more than 2^20 connections per millisecond
/// between their starts.
#[derive(Debug)]
pub struct ConnectionIds(AtomicU64);

/// The bits below an ingress's start time in its first connection number.
const IDS_PER_MILLISECOND_BITS: u32 = 20;

impl ConnectionIds {
    /// Numbering that starts from `started_ms` (milliseconds since the epoch).
    pub fn starting_at(started_ms: u64) -> Self {
        Self(AtomicU64::new(started_ms << IDS_PER_MILLISECOND_BITS))
    }

    /// Numbering for an ingress starting now.
    pub fn now() -> Self {
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        Self::starting_at(started_ms)
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

#[cfg(test)]
mod ids_tests {
    use super::ConnectionIds;

    #[test]
    fn two_ingresses_a_millisecond_apart_never_share_a_number() {
        let first = ConnectionIds::starting_at(1_764_900_000_000);
        let second = ConnectionIds::starting_at(1_764_900_000_001);
        let mut last_of_first = 0;
        for _ in 0..(1 << 20) - 1 {
            last_of_first = first.next();
        }
        assert!(last_of_first < second.next());
    }
}

/// Everything an accept loop needs.
#[derive(Debug, Clone)]
pub struct AcceptContext {
    /// The attached planes.
    pub planes: Arc<Planes>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Shared connection numbering.
    pub ids: Arc<ConnectionIds>,
    /// The HTTPS listener's TLS edge, when `listen.https` is on.
    pub tls: Option<Arc<crate::tls::TlsEdge>>,
}

/// Accepts on `listener` until `shutdown`, then returns (dropping the
/// listener closes it).
pub async fn serve(
    kind: ListenerKind,
    listener: TcpListener,
    context: AcceptContext,
    shutdown: CancellationToken,
) {
    let listener = match WatchedListener::new(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listener = ?kind, %error, "cannot watch the listener: not accepting on it");
            return;
        }
    };
    let mut active = context.planes.subscribe();
    let mut burst = Vec::new();
    loop {
        let Some(plane) = wait_for_plane(&mut active, &shutdown).await else {
            return;
        };
        // A burst travels in one frame to a plane that reads AcceptedMany;
        // an HTTPS connection goes through its own TLS task, one by one.
        let max = if plane.accepts_many && kind != ListenerKind::Https {
            MAX_ACCEPTED_MANY
        } else {
            1
        };
        let accepted = tokio::select! {
            accepted = listener.accept_burst(max, &mut burst) => accepted,
            _ = active.changed() => continue,
            () = plane.closed.cancelled() => continue,
            () = shutdown.cancelled() => return,
        };
        if let Err(error) = accepted {
            if error.raw_os_error() == Some(libc::EINVAL) {
                // Shut by a successor that bound another address for it
                // (`listeners::stop_listening`); this loop stops with the
                // step aside, or accepts again once the listener reopens.
                tracing::debug!(listener = ?kind, "the listener is shut");
            } else {
                // EMFILE, ENOBUFS, ECONNABORTED: transient; the backlog keeps the rest.
                tracing::warn!(listener = ?kind, %error, "accept failed");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let mut handed = Vec::with_capacity(burst.len());
        for (stream, peer) in burst.drain(..) {
            context.metrics.count_accepted(kind);
            let local = match listener.local_addr_of(&stream) {
                Ok(local) => local,
                Err(error) => {
                    tracing::debug!(%error, "accepted socket already gone");
                    continue;
                }
            };
            let accepted = Accepted {
                listener: kind,
                connection_id: context.ids.next(),
                peer,
                local,
            };
            match (&context.tls, kind) {
                // The handshake runs in its own task: a slow client never
                // holds up the accept loop.
                (Some(edge), ListenerKind::Https) => {
                    let stream = std::net::TcpStream::from(stream);
                    match tokio::net::TcpStream::from_std(stream) {
                        Ok(stream) => {
                            crate::tls::relay::spawn(edge, stream, accepted, context.clone())
                        }
                        Err(error) => tracing::warn!(%error, "cannot watch an HTTPS connection"),
                    }
                }
                _ => handed.push((stream, accepted)),
            }
        }
        match handed.len() {
            0 => {}
            1 => {
                let (stream, accepted) = &handed[0];
                hand_over(stream.as_fd(), *accepted, &context, &shutdown).await;
            }
            _ => hand_over_burst(&plane, &handed, &context, &shutdown).await,
        }
    }
}

/// Sends a burst of connections to `plane` in one `AcceptedMany` if it is
/// still the active one; otherwise (or if the send fails) each goes on its
/// own to whichever plane is active next, as [`hand_over`] sends it.
async fn hand_over_burst(
    plane: &PlaneLink,
    handed: &[(mio::net::TcpStream, Accepted)],
    context: &AcceptContext,
    shutdown: &CancellationToken,
) {
    let message = ToDevice::AcceptedMany(handed.iter().map(|(_, accepted)| *accepted).collect());
    let encoded = channel::encode(&message);
    let fds: Vec<BorrowedFd<'_>> = handed.iter().map(|(stream, _)| stream.as_fd()).collect();
    match plane
        .send_if_active(Frame::of(&message, &encoded), &fds)
        .await
    {
        Ok(true) => {
            context.metrics.count_burst_handed();
            for (_, accepted) in handed {
                plane.count_handed();
                context.metrics.count_handed();
                tracing::debug!(id = accepted.connection_id, peer = %accepted.peer, generation = plane.generation, "handed connection");
            }
            return;
        }
        // Another plane took over meanwhile.
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(generation = plane.generation, %error, "could not send AcceptedMany to the device plane");
            // Only a channel that is gone is closed; otherwise (no kernel
            // buffer for the frame) each connection goes on its own below.
            if crate::planes::SendFailure::of(&error) == crate::planes::SendFailure::ChannelGone {
                plane.closed.cancel();
            }
        }
    }
    for (stream, accepted) in handed {
        // One that no plane took closes; the next is tried, unless the
        // ingress is shutting down: then the rest close with the burst.
        if !hand_over(stream.as_fd(), *accepted, context, shutdown).await && shutdown.is_cancelled()
        {
            return;
        }
    }
}

async fn wait_for_plane(
    active: &mut tokio::sync::watch::Receiver<Option<Arc<PlaneLink>>>,
    shutdown: &CancellationToken,
) -> Option<Arc<PlaneLink>> {
    loop {
        if let Some(plane) = active.borrow_and_update().clone() {
            if !plane.closed.is_cancelled() {
                return Some(plane);
            }
        }
        tokio::select! {
            changed = active.changed() => if changed.is_err() { return None },
            () = shutdown.cancelled() => return None,
        }
    }
}

/// Sends the connection (`fd`: the accepted socket, or for HTTPS the device
/// plane's end of the socket pair) to the active plane, waiting for one as
/// long as it takes (the customer has a TCP connection and waits): it is
/// only dropped at shutdown. Whether a plane took it.
pub(crate) async fn hand_over(
    fd: BorrowedFd<'_>,
    accepted: Accepted,
    context: &AcceptContext,
    shutdown: &CancellationToken,
) -> bool {
    let message = ToDevice::Accepted(accepted);
    let encoded = channel::encode(&message);
    let taken = dispatch::to_active(
        &context.planes,
        Frame::of(&message, &encoded),
        &[fd],
        None,
        Wait::Forever(shutdown),
    )
    .await;
    let Some(plane) = taken else { return false };
    plane.count_handed();
    context.metrics.count_handed();
    tracing::debug!(id = accepted.connection_id, peer = %accepted.peer, generation = plane.generation, "handed connection");
    true
}
