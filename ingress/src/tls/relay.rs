//! One HTTPS proxy connection in the ingress: the TLS handshake (bounded by
//! `proxy.handshake_timeout`), a Unix stream socket pair whose one end goes
//! to the active device plane as an `Accepted` connection, and the relay
//! between the TLS stream and the other end until either side is done.
//!
//! Each side's end of stream is passed on as the other's: a device plane
//! that closes its end (the response is complete, or the plane refused the
//! request) becomes a TLS close_notify and a FIN to the customer; a customer
//! that closes becomes a FIN on the pair. A handshake that fails (not TLS,
//! a name the certificate does not cover, too slow) closes the connection
//! and touches nothing else.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use std::time::Duration;

use blipless_protocol::channel::Accepted;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;

use super::TlsEdge;
use crate::accept::{self, AcceptContext};

/// How long a customer may keep its side open once the device plane has
/// closed the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

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
    drop(permit);
    let (ours, theirs) = match pair() {
        Ok(pair) => pair,
        Err(error) => {
            // EMFILE and the like: this connection only.
            tracing::warn!(id = accepted.connection_id, %error, "cannot make the socket pair for an HTTPS connection");
            return;
        }
    };
    let handed = accept::hand_over(theirs.as_fd(), accepted, context, &edge.stop).await;
    // The device plane holds its own copy now; ours would keep the pair open.
    drop(theirs);
    if !handed {
        return;
    }
    edge.metrics.add_relayed(1);
    tokio::select! {
        () = relay(tls, ours, accepted.connection_id) => {}
        () = edge.stop.cancelled() => {}
    }
    edge.metrics.add_relayed(-1);
}

/// Moves bytes both ways until both are done. Once the device plane has
/// closed its end (the connection is over on its side), the customer gets
/// [`CLOSE_WAIT`] to close theirs: a client that never does cannot hold the
/// connection open. (While the plane's end is open, the plane's own idle
/// timeouts govern.)
async fn relay(tls: TlsStream<TcpStream>, ours: UnixStream, id: u64) {
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let (mut ours_read, mut ours_write) = ours.into_split();
    let up = async {
        let copied = tokio::io::copy(&mut tls_read, &mut ours_write).await;
        let _ = ours_write.shutdown().await;
        copied
    };
    let down = async {
        let copied = tokio::io::copy(&mut ours_read, &mut tls_write).await;
        // A close_notify and a FIN to the customer.
        let _ = tls_write.shutdown().await;
        copied
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
        copied = &mut down => {
            if let Err(error) = copied {
                tracing::debug!(id, %error, "HTTPS relay: the device plane side ended");
            }
            let _ = tokio::time::timeout(CLOSE_WAIT, up).await;
        }
    }
}

/// A connected Unix stream socket pair: the relay's end, and the device
/// plane's as an fd.
fn pair() -> std::io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs.into_std()?);
    Ok((ours, theirs))
}
