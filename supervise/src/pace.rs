//! How often a daemon is woken to write to a customer who reads slowly:
//! both daemons watch a forwarded response's progress by what they manage
//! to write (`timeouts.body_idle`, docs/CONFIG.md), so the kernel must wake
//! the writer each time the customer's window opens, not once megabytes of
//! an autotuned send buffer have drained (docs/DECISIONS.md, "A response
//! body's progress is the client's reading").

use std::os::fd::AsFd;

#[derive(Debug, Clone, Copy)]
struct NotSentLowat;
nix::setsockopt_impl!(
    NotSentLowat,
    libc::IPPROTO_TCP,
    libc::TCP_NOTSENT_LOWAT,
    usize,
    nix::sys::socket::sockopt::SetUsize
);

/// The most a customer's TCP socket holds unsent ([`wake_per_window_step`]).
pub const NOT_SENT_LOWAT: usize = 128 * 1024;

/// Keeps at most [`NOT_SENT_LOWAT`] bytes unsent in a TCP socket
/// (`TCP_NOTSENT_LOWAT`): a write waiting on it is woken each time the
/// peer's window opens. Best effort: on a socket that is not TCP (an HTTPS
/// connection's Unix pair end in the device plane) it does nothing.
pub fn wake_per_window_step(socket: &impl AsFd) {
    let _ = nix::sys::socket::setsockopt(socket, NotSentLowat, &NOT_SENT_LOWAT);
}

/// What the ingress asks for the device plane's end of an HTTPS
/// connection's Unix socket pair to hold unsent (`SO_SNDBUF`; the kernel
/// doubles it for its own overhead).
pub const PAIR_SEND_BUFFER: usize = 64 * 1024;

/// Bounds what the device plane may write into an HTTPS connection's socket
/// pair ahead of the ingress's relay to [`PAIR_SEND_BUFFER`]: a Unix
/// socket wakes its writer only once three quarters of its buffer drained,
/// which at the default (about 200 KiB) hid a slow customer's reading from
/// the plane for that much more. Best effort, as
/// [`wake_per_window_step`].
pub fn bound_pair_buffer(socket: &impl AsFd) {
    let _ =
        nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::SndBuf, &PAIR_SEND_BUFFER);
}
