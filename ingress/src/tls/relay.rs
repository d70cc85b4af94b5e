//! One HTTPS proxy connection in the ingress: the TLS handshake (bounded by
//! `proxy.handshake_timeout`), a Unix stream socket pair whose one end goes
//! to the active device plane as an `Accepted` connection, and the relay
//! between the TLS stream and the other end until either side is done.
//!
//! Each side's end of stream is passed on as the other's: the device
//! plane's (the response is complete, the plane refused the request, or a
//! tunnel's destination finished sending) becomes a TLS close_notify and a
//! FIN to the customer; a customer that closes becomes a FIN on the pair. A handshake that fails (not TLS,
//! a name the certificate does not cover, too slow) closes the connection
//! and touches nothing else. A relay that moves no byte either way for
//! `proxy.idle_timeout` ends, as the plane's own tunnels do: a customer that
//! stops reading cannot hold it once the plane has given up on its end.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::Accepted;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;

use super::TlsEdge;
use crate::accept::{self, AcceptContext};

/// How long a customer may keep its side open once the device plane has
/// closed the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// How often a relay whose device plane has stopped sending looks whether
/// the plane has closed its whole end.
const PLANE_CLOSE_POLL: Duration = Duration::from_millis(500);

/// Bytes read from one side before they are written to the other.
const CHUNK: usize = 16 * 1024;

/// Serves one accepted TCP connection on the HTTPS listener, in a task of
/// the edge's relay tracker; with `limits.tls_handshakes` handshakes under
/// way already, closes it at once (dropped here) and counts it.
pub fn spawn(edge: &Arc<TlsEdge>, stream: TcpStream, accepted: Accepted, context: AcceptContext) {
    let Ok(permit) = edge.handshakes.clone().try_acquire_owned() else {
        edge.refused_handshake();
        tracing::debug!(id = accepted.connection_id, peer = %accepted.peer, "HTTPS connection closed: too many handshakes under way");
        return;
    };
    let edge_for_task = edge.clone();
    edge.relays.spawn(async move {
        serve(&edge_for_task, stream, accepted, &context, permit).await;
    });
}

async fn serve(
    edge: &TlsEdge,
    stream: TcpStream,
    accepted: Accepted,
    context: &AcceptContext,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    // The device plane watches a forwarded response's progress by what it
    // writes into the pair, which drains only as fast as this relay writes
    // to the customer: wake it per window step (`timeouts.body_idle`).
    blipless_supervise::pace::wake_per_window_step(&stream);
    let handshake = tokio::time::timeout(edge.handshake_timeout, edge.acceptor.accept(stream));
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                edge.metrics.count_handshake(false);
                tracing::debug!(id = accepted.connection_id, peer = %accepted.peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                edge.metrics.count_handshake(false);
                tracing::debug!(id = accepted.connection_id, peer = %accepted.peer, "TLS handshake timed out");
                return;
            }
        },
        () = edge.stop.cancelled() => return,
    };
    edge.metrics.count_handshake(true);
    let (ours, theirs) = match pair() {
        Ok(pair) => pair,
        Err(error) => {
            // EMFILE and the like: this connection only.
            tracing::warn!(id = accepted.connection_id, %error, "cannot make the socket pair for an HTTPS connection");
            return;
        }
    };
    let handed = accept::hand_over(theirs.as_fd(), accepted, context, &edge.handing_over).await;
    // Held until here: a connection waiting for a plane holds descriptors as
    // one handshaking does, and the plain listeners stop accepting while
    // theirs wait, so `limits.tls_handshakes` bounds both.
    drop(permit);
    // The device plane holds its own copy now; ours would keep the pair open.
    drop(theirs);
    if !handed {
        return;
    }
    edge.metrics.add_relayed(1);
    let activity = Activity::new();
    tokio::select! {
        () = relay(tls, ours, accepted.connection_id, &activity) => {}
        () = activity.idle_for(edge.idle_timeout) => {
            tracing::debug!(id = accepted.connection_id, idle = ?edge.idle_timeout, "HTTPS relay ended: no byte either way");
        }
        () = edge.stop.cancelled() => {}
    }
    edge.metrics.add_relayed(-1);
}

/// Moves bytes both ways until both are done. The device plane's end of
/// stream is either a half-close (a tunnel's destination finished sending:
/// the customer's upload goes on, as on the plain listeners) or its whole
/// end closed (the connection is over on its side): then the customer gets
/// [`CLOSE_WAIT`] to close theirs, so that a client that never does cannot
/// hold the connection open. The plane often half-closes first and closes
/// a moment later (it shuts its sending side, then reads what is left for
/// up to 2 s before it closes): so after a half-close the relay keeps
/// looking, every [`PLANE_CLOSE_POLL`], while the upload runs. A customer that stops reading is the caller's
/// [`Activity::idle_for`]'s to end: the plane's close cannot be seen while a
/// write to the customer waits.
async fn relay(tls: TlsStream<TcpStream>, ours: UnixStream, id: u64, activity: &Activity) {
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let (ours_read, mut ours_write) = ours.into_split();
    let up = async {
        let copied = pump(&mut tls_read, &mut ours_write, activity).await;
        let _ = ours_write.shutdown().await;
        copied
    };
    // Owns its half, and gives it back to tell a half-close from a close.
    let down = async move {
        let mut ours_read = ours_read;
        let copied = pump(&mut ours_read, &mut tls_write, activity).await;
        // A close_notify and a FIN to the customer.
        let _ = tls_write.shutdown().await;
        (copied, ours_read)
    };
    tokio::pin!(up, down);
    tokio::select! {
        copied = &mut up => {
            if let Err(error) = copied {
                tracing::debug!(id, %error, "HTTPS relay: the customer side ended");
            }
            // The customer is done sending; the plane may still answer.
            let _ = down.await;
        }
        (copied, ours_read) = &mut down => {
            if let Err(error) = &copied {
                tracing::debug!(id, %error, "HTTPS relay: the device plane side ended");
            }
            if copied.is_err() {
                let _ = tokio::time::timeout(CLOSE_WAIT, up).await;
                return;
            }
            tokio::select! {
                _ = &mut up => {}
                () = plane_closes(&ours_read) => {
                    let _ = tokio::time::timeout(CLOSE_WAIT, up).await;
                }
            }
        }
    }
}

/// Whether the device plane closed its whole end of the pair, not only its
/// sending side: on a Unix stream socket the peer's close shuts both of our
/// directions (`EPOLLHUP`), its `shutdown(SHUT_WR)` only our reading. Not
/// known within a moment (our sending side is full): taken as open, the
/// upload then runs on, bounded by the idle timeout.
async fn plane_closed(ours: &tokio::net::unix::OwnedReadHalf) -> bool {
    let ready = tokio::time::timeout(
        Duration::from_millis(100),
        ours.as_ref().ready(tokio::io::Interest::WRITABLE),
    )
    .await;
    matches!(ready, Ok(Ok(ready)) if ready.is_write_closed())
}

/// Returns once the device plane has closed its whole end of the pair,
/// looking every [`PLANE_CLOSE_POLL`]. (Waiting for the hang-up itself
/// would mean clearing the pair's write readiness, which the upload's
/// writes share.)
async fn plane_closes(ours: &tokio::net::unix::OwnedReadHalf) {
    while !plane_closed(ours).await {
        tokio::time::sleep(PLANE_CLOSE_POLL).await;
    }
}

/// Copies `from` into `to` until `from` ends, flushing each chunk (rustls
/// keeps written bytes until a flush) and marking `activity` at each read
/// and each completed write.
async fn pump<R, W>(from: &mut R, to: &mut W, activity: &Activity) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let read = from.read(&mut chunk).await?;
        if read == 0 {
            return Ok(());
        }
        activity.mark();
        to.write_all(&chunk[..read]).await?;
        to.flush().await?;
        activity.mark();
    }
}

/// When a relay last moved a byte, either way.
struct Activity {
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last byte moved.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(now, Ordering::Relaxed);
    }

    /// Completes once no byte has moved for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = self.start + last + limit;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A connected Unix stream socket pair: the relay's end, and the device
/// plane's as an fd.
fn pair() -> std::io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    // What the plane writes ahead of the relay, bounded so that a slow
    // customer's reading reaches the plane soon (`timeouts.body_idle`).
    blipless_supervise::pace::bound_pair_buffer(&theirs);
    let theirs = OwnedFd::from(theirs.into_std()?);
    Ok((ours, theirs))
}
