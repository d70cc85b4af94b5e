//! A customer TCP listener that tokio watches for readiness but whose
//! accepted sockets it never registers with epoll: the ingress only passes
//! them to a device plane (SCM_RIGHTS) and closes its copy, so registering
//! each one (`epoll_ctl` ADD, then DEL at close) was two system calls per
//! connection for nothing. Accepting goes through mio (`accept4` with
//! `SOCK_NONBLOCK | SOCK_CLOEXEC`), so the socket a device plane gets is
//! non-blocking, as before.
//!
//! Audited `unsafe`: one call, [`AsyncFd::register_with_interest`], whose
//! contract (the fd stays open, and the same, while the `AsyncFd` lives) the
//! listener it owns upholds; see the SAFETY comment.

#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A listening TCP socket, accepting without registering what it accepts.
#[derive(Debug)]
pub struct WatchedListener {
    listener: AsyncFd<mio::net::TcpListener>,
    /// The address it listens on, when that is one address (not a
    /// wildcard): then every accepted socket's local address is this one,
    /// and no `getsockname` per connection is needed to know it.
    bound: Option<SocketAddr>,
}

impl WatchedListener {
    /// Takes over a tokio listener (must run inside the runtime).
    pub fn new(listener: tokio::net::TcpListener) -> io::Result<Self> {
        let listener = mio::net::TcpListener::from_std(listener.into_std()?);
        let bound = Some(listener.local_addr()?).filter(|address| !address.ip().is_unspecified());
        // SAFETY: `register_with_interest` requires the fd `as_raw_fd`
        // returns to stay open and refer to the same open file description
        // for as long as the `AsyncFd` lives. The mio listener owns that fd:
        // it is closed only when the listener is dropped, which happens when
        // the `AsyncFd` holding it is dropped (it is never taken out), and
        // `as_raw_fd` on it always returns the one fd it owns.
        let listener = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
            .map_err(|error| error.into_parts().1)?;
        Ok(Self { listener, bound })
    }

    /// The local address of a socket this listener accepted: the listener's
    /// own, or (on a wildcard address) the socket's, asked of the kernel.
    pub fn local_addr_of(&self, accepted: &mio::net::TcpStream) -> io::Result<SocketAddr> {
        match self.bound {
            Some(bound) => Ok(bound),
            None => accepted.local_addr(),
        }
    }

    /// Accepts the connections waiting, at least one and at most `max`,
    /// into `into` (which must be empty): non-blocking sockets that no
    /// reactor watches, and the customers' addresses. Waits only while
    /// none is waiting. Cancel-safe: nothing is accepted while waiting, and
    /// once the first is accepted the rest are taken without waiting. An
    /// error after some were accepted ends the burst; the next call meets it
    /// again if it lasts.
    pub async fn accept_burst(
        &self,
        max: usize,
        into: &mut Vec<(mio::net::TcpStream, SocketAddr)>,
    ) -> io::Result<()> {
        debug_assert!(into.is_empty() && max > 0);
        loop {
            let mut ready = self.listener.readable().await?;
            loop {
                match ready.try_io(|listener| listener.get_ref().accept()) {
                    Ok(Ok(pair)) => {
                        into.push(pair);
                        if into.len() >= max {
                            return Ok(());
                        }
                    }
                    Ok(Err(error)) if into.is_empty() => return Err(error),
                    Ok(Err(_)) => return Ok(()),
                    // Nothing left to accept: readiness is cleared.
                    Err(_would_block) if into.is_empty() => break,
                    Err(_would_block) => return Ok(()),
                }
            }
        }
    }
}
