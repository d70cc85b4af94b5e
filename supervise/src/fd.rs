//! Taking ownership of file descriptors that arrive as bare numbers: the
//! ones systemd passes at exec (`LISTEN_FDS`, from fd 3 up) and the ones a
//! notification carries as SCM_RIGHTS.
//!
//! The workspace denies `unsafe_code`; turning a raw descriptor number into
//! an [`OwnedFd`] is inherently unsafe (the type promises sole ownership),
//! so this is the one module of the crate that allows it. Each block states
//! why the ownership claim holds.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Adopts a descriptor inherited through `LISTEN_FDS`: checks that it is
/// open and marks it close-on-exec (systemd passes it without), so it does
/// not leak into programs this process runs.
///
/// The caller ([`crate::listen_fds::take`]) guarantees that `raw` lies in
/// the `LISTEN_FDS` range that `LISTEN_PID` addressed to this process, and
/// that it adopts that range once per process.
pub(crate) fn adopt_listen_fd(raw: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) on any integer is defined behaviour: it only
    // reads the descriptor's flags, or fails with EBADF when it is not open.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFD changes only this descriptor's own flags.
    if unsafe { libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is open (checked above). It was inherited at exec, and
    // the service manager addressed it to this process (LISTEN_PID), so no
    // other object in this process owns it; `take` hands each number out at
    // most once per process, so it is never adopted twice.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Adopts the descriptors one `recvmsg` just returned in an SCM_RIGHTS
/// control message.
///
/// Callers pass the list straight from `ControlMessageOwned::ScmRights` and
/// nothing else.
pub(crate) fn adopt_received(raw: Vec<RawFd>) -> Vec<OwnedFd> {
    raw.into_iter()
        // SAFETY: the kernel installed each of these descriptors in this
        // process's table during the recvmsg call that returned them; only
        // that call's caller knows the numbers, and it hands them here at
        // once, so each OwnedFd is the sole owner and closes it exactly once.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}
