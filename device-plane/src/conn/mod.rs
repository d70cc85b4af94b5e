//! Customer connections in the device plane: each fd the ingress hands over
//! (`Accepted`) is served here as SOCKS5 ([`socks`]) or HTTP proxy ([`http`];
//! an HTTPS listener's connection arrives as the plaintext end of a Unix
//! socket pair the ingress relays TLS for, and is served as HTTP);
//! an established tunnel ([`tunnel`]) moves bytes with [`relay`] until it ends
//! or is handed to a successor plane ([`handover`], with long pending runs in
//! a pipe: [`piped`]). A SOCKS5 UDP ASSOCIATE is relayed, and handed over,
//! by [`udp_associate`]. [`context::Context`] is what they all share.

pub mod auth_guard;
pub mod caps;
pub mod context;
pub mod fd_budget;
pub mod handover;
pub mod http;
pub mod piped;
pub mod relay;
pub mod socks;
pub mod splice;
pub mod tunnel;
pub mod udp_associate;

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use blipless_protocol::channel::{Accepted, ListenerKind};
use tokio::net::TcpStream;

pub use context::{Context, Mode};

/// Serves a connection the ingress accepted and handed over.
pub fn take_connection(context: &Arc<Context>, accepted: Accepted, fds: Vec<OwnedFd>) {
    let Some(fd) = fds.into_iter().next() else {
        return;
    };
    let stream = match stream_from_accepted_fd(fd) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, id = accepted.connection_id, "cannot use a handed connection");
            return;
        }
    };
    if !context.fds.admits(context.connections.len() as u64) {
        // Dropping the stream closes it: the customer's client sees the
        // connection end at once, and nothing else is touched.
        context.fds.refuse(accepted.connection_id);
        return;
    }
    if !context
        .caps
        .admits_connection(context.connections.len() as u64)
    {
        tracing::debug!(
            id = accepted.connection_id,
            cap = context.caps.connections,
            "connection cap reached: refused"
        );
        // Answered by a small task outside the tracker: it never holds a drain.
        match accepted.listener {
            ListenerKind::Socks => tokio::spawn(caps::refuse_socks(stream)),
            ListenerKind::Http | ListenerKind::Https => tokio::spawn(caps::refuse_http(stream)),
        };
        return;
    }
    if !context.accepted_nodelay.load(Ordering::Relaxed) {
        let _ = stream.set_nodelay(true);
    }
    context.taken.fetch_add(1, Ordering::Relaxed);
    let id = accepted.connection_id;
    match accepted.listener {
        ListenerKind::Socks => {
            context.connections.spawn(socks::serve(
                stream,
                context.clone(),
                id,
                accepted.peer.ip(),
            ));
        }
        ListenerKind::Http | ListenerKind::Https => {
            context.connections.spawn(http::serve(
                stream,
                http::Adopted::fresh(accepted.peer.ip()),
                context.clone(),
                id,
            ));
        }
    }
}

/// Turns the fd of a connection the ingress accepted into a tokio socket.
/// Its open file description is non-blocking already (the ingress accepts
/// with tokio, `accept4` with `SOCK_NONBLOCK`; an HTTPS connection's end is
/// a tokio socket pair's), and SCM_RIGHTS passes the description, flags
/// and all: no `ioctl` to set it again.
fn stream_from_accepted_fd(fd: OwnedFd) -> std::io::Result<TcpStream> {
    // The tests run debug builds: a blocking fd would be caught there.
    debug_assert!(
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).is_ok_and(|flags| {
            nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
        }),
        "the ingress handed over a blocking connection"
    );
    TcpStream::from_std(std::net::TcpStream::from(fd))
}

/// Turns a received fd into a tokio socket. The fd may be a Unix stream
/// socket (an HTTPS connection's plaintext end): only stream operations
/// (read, write, shutdown, readiness) are used on a customer socket, and
/// the TCP-only ones (`set_nodelay`, `peer_addr`) are allowed to fail.
pub fn stream_from_fd(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let stream = std::net::TcpStream::from(fd);
    stream.set_nonblocking(true)?;
    TcpStream::from_std(stream)
}
