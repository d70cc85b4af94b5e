//! The TUN driver's ioctls and the reactor registration of a queue: the one
//! audited module of this crate that uses `unsafe`.
//!
//! Attaching a file descriptor to a multi-queue TUN device and detaching it
//! again are `ioctl(2)` calls on `/dev/net/tun` that take a `struct ifreq`
//! pointer; neither `nix` nor `std` wraps them, so they are made here through
//! `libc`, and nowhere else. Registering the descriptor with Tokio's reactor
//! (`AsyncFd::register_with_interest`) is `unsafe` too, and lives here for
//! the same reason.
//!
//! Audited: every `unsafe` block below is one foreign call, one union read
//! or the zeroing of a plain C struct, with a `SAFETY:` comment stating why
//! it is sound. No pointer outlives the call it is passed to, no memory is
//! shared with the kernel beyond it, and every file descriptor is borrowed
//! from an owner that keeps it open. Everything else (opening the device,
//! reading and writing packets) is safe code in the parent module.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The longest interface name the kernel accepts, in bytes (`IFNAMSIZ`
/// counts the terminating NUL).
pub(super) const NAME_MAX: usize = libc::IFNAMSIZ - 1;

/// Checks `name` fits an `ifreq` (1 to [`NAME_MAX`] bytes, no NUL).
pub(super) fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() > NAME_MAX || name.as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a valid interface name (1 to {NAME_MAX} bytes, no NUL): check egress.tun.name"
            ),
        ));
    }
    Ok(())
}

/// An all-zero `ifreq`.
fn zeroed_request() -> libc::ifreq {
    // SAFETY: `ifreq` is a plain C struct of integers, byte arrays, a
    // `sockaddr` and a raw pointer inside a union; all-zero bytes are a valid
    // value for every one of them (the pointer is null and never read).
    unsafe { std::mem::zeroed() }
}

/// An `ifreq` naming `name`, with `flags` in `ifr_flags`, zero elsewhere.
fn request(name: &str, flags: libc::c_int) -> io::Result<libc::ifreq> {
    check_name(name)?;
    let mut request = zeroed_request();
    // `check_name` leaves room for the NUL, which `zeroed` already wrote.
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    // The kernel reads TUN flags as a C short; every TUN flag fits in 16 bits.
    request.ifr_ifru.ifru_flags = flags as libc::c_short;
    Ok(request)
}

/// Whether a network device named `name` exists in the calling thread's
/// network namespace.
pub(super) fn interface_exists(name: &str) -> io::Result<bool> {
    check_name(name)?;
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a valid NUL-terminated C string that lives until the
    // call returns; `if_nametoindex` only reads it.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index != 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) => Ok(false),
        _ => Err(error),
    }
}

/// `TUNSETIFF`: makes `fd` (a fresh `/dev/net/tun` descriptor) one more
/// queue of the multi-queue TUN device `name`, asking for virtio-net headers
/// (`IFF_VNET_HDR`) when `offload`. The kernel heeds that only for the first
/// queue of a device with none attached; later queues get the device's mode
/// (read it back with [`device_flags`]). Returns the raw OS error so the
/// caller can explain it.
pub(super) fn attach_queue(fd: BorrowedFd<'_>, name: &str, offload: bool) -> io::Result<()> {
    let vnet = if offload { libc::IFF_VNET_HDR } else { 0 };
    let mut request = request(
        name,
        libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE | vnet,
    )?;
    // SAFETY: `fd` is an open descriptor borrowed for the whole call;
    // `request` is a properly initialised `ifreq` on this stack frame, valid
    // for reads and writes for the whole call, which is all `TUNSETIFF`
    // touches (it writes the final name back into it).
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `TUNGETIFF`: the TUN flags of the device `fd` is a queue of (they include
/// `IFF_PERSIST` for a persistent device).
pub(super) fn device_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    device_of(fd).map(|(_, flags)| flags)
}

/// `TUNGETIFF`: the name and the TUN flags of the device `fd` is a queue of.
pub(super) fn device_of(fd: BorrowedFd<'_>) -> io::Result<(String, libc::c_int)> {
    let mut request = zeroed_request();
    // SAFETY: as in `attach_queue`: an open borrowed descriptor and a valid
    // `ifreq` on this stack frame that `TUNGETIFF` overwrites with the
    // device's name and flags.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: reading a union field: `TUNGETIFF` stored the flags in
    // `ifru_flags`, and any bit pattern is a valid `c_short` anyway.
    let flags = unsafe { request.ifr_ifru.ifru_flags };
    // The name the kernel wrote, up to its NUL (it always writes one within
    // IFNAMSIZ; without one, the whole array).
    let name: Vec<u8> = request
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    // Reinterpret the 16 bits as flags (IFF_TUN_EXCL is the sign bit).
    Ok((
        String::from_utf8_lossy(&name).into_owned(),
        libc::c_int::from(flags as u16),
    ))
}

/// `TUNSETOFFLOAD`: lets the kernel hand TCP super-packets with partial
/// checksums to the device's queues (`TUN_F_CSUM | TUN_F_TSO4 |
/// TUN_F_TSO6`). Only for a device whose queues carry virtio-net headers.
pub(super) fn enable_tcp_offload(fd: BorrowedFd<'_>) -> io::Result<()> {
    let features = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
    // SAFETY: an open borrowed descriptor; `TUNSETOFFLOAD` takes its
    // argument by value (an unsigned int of feature bits), no pointer.
    let result = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(features),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `TUNSETQUEUE`: detaches the queue `fd` from its device (the kernel stops
/// steering packets to it and drops what it had queued for it), or attaches
/// it again.
pub(super) fn set_queue(fd: BorrowedFd<'_>, name: &str, attach: bool) -> io::Result<()> {
    let flags = if attach {
        libc::IFF_ATTACH_QUEUE
    } else {
        libc::IFF_DETACH_QUEUE
    };
    let mut request = request(name, flags)?;
    // SAFETY: as in `attach_queue`: an open borrowed descriptor and a valid
    // `ifreq` on this stack frame; `TUNSETQUEUE` only reads its flags.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETQUEUE, &mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Registers a queue's descriptor with the current Tokio reactor, for
/// reading and writing. Call it inside a Tokio runtime with IO enabled.
///
/// Tokio's registration is `unsafe` because a registered descriptor must
/// stay open, and the same one, until the `AsyncFd` is gone; the parent
/// module never calls `AsyncFd::get_mut` or `into_inner` on the result.
pub(super) fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor that only its own drop
    // closes, so it stays open while the `AsyncFd` owns it; its `as_raw_fd`
    // returns that one descriptor every time; and the caller never swaps it
    // out through `get_mut`.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
        .map_err(|error| error.into_parts().1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_without_panicking() {
        assert!(check_name("blip0").is_ok());
        assert!(check_name(&"a".repeat(NAME_MAX)).is_ok());
        for bad in ["", "a\0b", &"a".repeat(NAME_MAX + 1)] {
            let error = check_name(bad).err().map(|e| e.kind());
            assert_eq!(error, Some(io::ErrorKind::InvalidInput), "{bad:?}");
        }
    }

    #[test]
    fn request_carries_name_and_flags() -> io::Result<()> {
        let request = request("blip0", libc::IFF_TUN | libc::IFF_MULTI_QUEUE)?;
        let name: Vec<u8> = request.ifr_name.iter().map(|c| *c as u8).collect();
        assert_eq!(&name[..6], b"blip0\0");
        // SAFETY: reading the union field `request` just wrote.
        let flags = unsafe { request.ifr_ifru.ifru_flags };
        assert_eq!(
            libc::c_int::from(flags),
            libc::IFF_TUN | libc::IFF_MULTI_QUEUE
        );
        Ok(())
    }
}
