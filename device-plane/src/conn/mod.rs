//! Customer connections in the device plane: each fd the ingress hands over
//! (`Accepted`, or several in an `AcceptedMany`) is served here as SOCKS5 ([`socks`]) or HTTP proxy ([`http`];
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
pub mod linger;
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

/// Serves a connection the ingress accepted and handed over (`Accepted`).
pub fn take_connection(context: &Arc<Context>, accepted: Accepted, fds: Vec<OwnedFd>) {
    if let Some(fd) = fds.into_iter().next() {
        serve_handed(context, accepted, fd);
    }
}

/// Serves a burst of connections the ingress accepted and handed over in
/// one frame (`AcceptedMany`): the fds are in the order of `all`, and as
/// many (the link checked).
pub fn take_connections(context: &Arc<Context>, all: Vec<Accepted>, fds: Vec<OwnedFd>) {
    for (accepted, fd) in all.into_iter().zip(fds) {
        serve_handed(context, accepted, fd);
    }
}

fn serve_handed(context: &Arc<Context>, accepted: Accepted, fd: OwnedFd) {
    let socket = socket_from_accepted_fd(fd);
    if !context
        .fds
        .admits_connection(context.connections.len() as u64)
    {
        // Dropping the socket closes it: the customer's client sees the
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
        let Some(stream) = register(socket, accepted.connection_id) else {
            return;
        };
        // Answered by a small task outside the tracker: it never holds a
        // drain. Its descriptor counts in the budget until it ends, so a
        // flood of refusals ends in refusals without an answer (above),
        // never in the reserve.
        let held = context.fds.hold();
        match accepted.listener {
            ListenerKind::Socks => tokio::spawn(async move {
                caps::refuse_socks(stream).await;
                drop(held);
            }),
            ListenerKind::Http | ListenerKind::Https => tokio::spawn(async move {
                caps::refuse_http(stream).await;
                drop(held);
            }),
        };
        return;
    }
    if !context.accepted_nodelay.load(Ordering::Relaxed) {
        let _ = socket.set_nodelay(true);
    }
    context.taken.fetch_add(1, Ordering::Relaxed);
    let id = accepted.connection_id;
    let source = accepted.peer.ip();
    let serving = context.clone();
    match accepted.listener {
        ListenerKind::Socks => {
            context.connections.spawn(async move {
                let first = first_bytes(&socket);
                if let Some(stream) = register(socket, id) {
                    socks::serve(stream, first, serving, id, source).await;
                }
            });
        }
        ListenerKind::Http | ListenerKind::Https => {
            context.connections.spawn(async move {
                let mut adopted = http::Adopted::fresh(source);
                adopted.prefix = first_bytes(&socket);
                adopted.unbilled_up = adopted.prefix.len() as u64;
                if let Some(stream) = register(socket, id) {
                    http::serve(stream, adopted, serving, id).await;
                }
            });
        }
    }
}

/// How much of a handed connection [`first_bytes`] reads: more than a
/// SOCKS5 greeting or a typical proxy request head.
const FIRST_READ: usize = 1024;

/// Reads what the customer has sent already, before the socket is
/// registered with the runtime. Most clients send their first message
/// (a SOCKS5 greeting, an HTTP request head) right after connecting, well
/// before the ingress's `Accepted` reaches us; a socket registered first
/// would have no readiness cached until the runtime's next poll, so its
/// first read would cost a wake-up for bytes that were already there.
/// Nothing read (not sent yet, or the customer already gone): empty, and
/// the serving code's own first read finds out which.
fn first_bytes(socket: &std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut chunk = [0u8; FIRST_READ];
    match (&*socket).read(&mut chunk) {
        Ok(n) => chunk[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

/// Writes what fits now with one `send`, whatever readiness tokio has
/// cached for `stream`: `Some(n)` bytes written, `None` when nothing fits
/// (then go tokio's way, which waits for room). A socket registered a
/// moment ago has no readiness cached until the runtime's next poll (see
/// [`first_bytes`]), so its first answer would otherwise wait for that poll
/// although its send buffer is empty.
pub(crate) fn send_now(stream: &TcpStream, bytes: &[u8]) -> std::io::Result<Option<usize>> {
    use nix::errno::Errno;
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;
    match send(stream.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
        Ok(sent) => Ok(Some(sent)),
        Err(Errno::EAGAIN | Errno::EINTR) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

/// Registers a handed connection with the runtime; on failure (the
/// runtime's registration table is full) the connection is closed.
fn register(socket: std::net::TcpStream, id: u64) -> Option<TcpStream> {
    match TcpStream::from_std(socket) {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, id, "cannot use a handed connection");
            None
        }
    }
}

/// Takes the fd of a connection the ingress accepted as a socket.
/// Its open file description is non-blocking already (the ingress accepts
/// with `accept4` and `SOCK_NONBLOCK`; an HTTPS connection's end is a
/// tokio socket pair's), and SCM_RIGHTS passes the description, flags
/// and all: no `ioctl` to set it again.
fn socket_from_accepted_fd(fd: OwnedFd) -> std::net::TcpStream {
    // The tests run debug builds: a blocking fd would be caught there.
    debug_assert!(
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).is_ok_and(|flags| {
            nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
        }),
        "the ingress handed over a blocking connection"
    );
    std::net::TcpStream::from(fd)
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
