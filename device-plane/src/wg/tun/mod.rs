//! Queues of the persistent multi-queue TUN device that carries WireGuard
//! clients' packets out of the node (packet egress, docs/ARCHITECTURE.md, "WireGuard").
//!
//! The device itself (`egress.tun.name`, default `blip0`) is created once,
//! persistent and multi-queue, by `blipless-ctl net setup` or by a device
//! plane started with `egress.tun.manage = true` (see [`blipless_ctl::net`]). The
//! first device plane attaches its queues ([`attach_queues`]); the kernel
//! spreads flows over all attached queues. During a deploy the queues
//! themselves move: the old plane stops reading and sends their fds to the
//! successor, which [`TunQueue::adopt`]s them and reads on. Detaching or
//! closing a queue makes the kernel purge what is queued on it, so a queue
//! that moves is never detached or closed on the way; NAT state lives in the
//! kernel's conntrack table, so no flow notices.
//!
//! The device has carrier only while at least one queue is attached, so
//! keep the old plane's queues attached until the successor's are: when the
//! first queue attaches to a device with none, the kernel drops outgoing
//! packets for a few milliseconds until it notices the carrier.
//!
//! A queue reads and writes whole IP packets (no packet-information header:
//! `IFF_NO_PI`). With `egress.tun.offload` the first queue of a device asks
//! for virtio-net headers (`IFF_VNET_HDR`) and TCP offload, so the kernel
//! hands over TCP super-packets and takes joined ones
//! ([`blipless_protocol::offload`]; docs/WIREGUARD.md, "TUN offload"). The
//! mode is the device's, set by its first queue: every queue, attached later
//! or handed over, reads it back ([`TunQueue::offload`]).
//!
//! Attaching never creates a device: a missing device is an error that says
//! to run `blipless-ctl net setup`.
//!
//! The ioctls and the reactor registration live in `sys`, the crate's one
//! audited `unsafe` module.

mod sys;

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};

use blipless_protocol::offload::{self, VnetHeader};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The TUN driver's control device.
const CLONE_DEVICE: &str = "/dev/net/tun";

/// One queue of a multi-queue TUN device: a non-blocking `/dev/net/tun`
/// descriptor registered with the Tokio reactor. Each read is one packet,
/// each write one packet. `recv` and `send` take `&self`, so one task may
/// read while another writes (share it in an `Arc`).
///
/// Dropping it closes the descriptor, which also detaches the queue.
#[derive(Debug)]
pub struct TunQueue {
    fd: AsyncFd<OwnedFd>,
    name: String,
    detached: AtomicBool,
    /// Every read and write starts with a virtio-net header.
    offload: bool,
}

impl TunQueue {
    /// Attaches a new queue to the existing persistent multi-queue TUN
    /// device `name` in the calling thread's network namespace.
    ///
    /// Must be called inside a Tokio runtime with IO enabled (an error is
    /// returned outside any runtime). Errors say what is wrong: no such
    /// device (run `blipless-ctl net setup`), not permitted (needs
    /// CAP_NET_ADMIN), or a device of that name that is not a persistent
    /// multi-queue TUN device. `offload` asks for virtio-net headers and
    /// TCP offload, which the kernel grants only to a device's first queue
    /// (see the module's documentation).
    pub fn attach(name: &str, offload: bool) -> io::Result<TunQueue> {
        sys::check_name(name)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "TunQueue::attach must be called inside a Tokio runtime",
            ));
        }
        if !sys::interface_exists(name)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no TUN device {name} on this host (in this network namespace): run `blipless-ctl net setup` first, or set egress.tun.manage = true"
                ),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(CLONE_DEVICE)
            .map_err(|error| match error.kind() {
                io::ErrorKind::NotFound => io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{CLONE_DEVICE} is missing: the tun driver is not available (modprobe tun)"),
                ),
                io::ErrorKind::PermissionDenied => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("opening {CLONE_DEVICE}: permission denied (packet egress needs CAP_NET_ADMIN)"),
                ),
                _ => io::Error::new(error.kind(), format!("opening {CLONE_DEVICE}: {error}")),
            })?;
        let fd = OwnedFd::from(file);
        sys::attach_queue(fd.as_fd(), name, offload)
            .map_err(|error| explain_attach(name, error))?;
        // The device existed a moment ago; if it vanished in between, the
        // kernel just created a fresh, non-persistent one for us. Refuse it:
        // attaching never creates a device.
        let flags = sys::device_flags(fd.as_fd())?;
        if flags & libc::IFF_PERSIST == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "TUN device {name} is not persistent (or was just deleted): create it with `blipless-ctl net setup`"
                ),
            ));
        }
        let vnet = flags & libc::IFF_VNET_HDR != 0;
        if vnet {
            // Without it the queue still works, one packet per read.
            if let Err(error) = sys::enable_tcp_offload(fd.as_fd()) {
                tracing::warn!(device = name, %error, "TUN TCP offload refused: one packet per read");
            }
        }
        let fd = sys::register(fd)?;
        Ok(TunQueue {
            fd,
            name: name.to_string(),
            detached: AtomicBool::new(false),
            offload: vnet,
        })
    }

    /// Takes over a queue another device plane attached and handed over (its
    /// fd arrived by SCM_RIGHTS). The queue was never detached, so packets the
    /// kernel queued on it are still there to read. Refused unless the fd is a
    /// queue of the multi-queue TUN device `name` (a deploy that renamed or
    /// renumbered devices hands over queues of others; closing a refused one
    /// detaches it).
    pub fn adopt(fd: OwnedFd, name: &str) -> io::Result<TunQueue> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "TunQueue::adopt must be called inside a Tokio runtime",
            ));
        }
        let (device, flags) = sys::device_of(fd.as_fd()).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("a handed-over fd is not a TUN queue: {error}"),
            )
        })?;
        if device != name {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a handed-over queue is of TUN device {device}, not {name}"),
            ));
        }
        if flags & libc::IFF_MULTI_QUEUE == 0 || flags & libc::IFF_TUN == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a handed-over fd is not a queue of a multi-queue TUN device",
            ));
        }
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        Ok(TunQueue {
            fd: sys::register(fd)?,
            name: name.to_string(),
            detached: AtomicBool::new(false),
            offload: flags & libc::IFF_VNET_HDR != 0,
        })
    }

    /// Whether every read and write on this queue starts with a virtio-net
    /// header ([`blipless_protocol::offload::VnetHeader`]).
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// The queue's descriptor, to hand it to a successor.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }

    /// Whether [`detach`](Self::detach) was called (and no
    /// [`reattach`](Self::reattach) since).
    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Relaxed)
    }

    /// Waits for the next packet the kernel steers to this queue and copies
    /// it into `buf`; returns its length. A packet longer than `buf` is
    /// truncated, so size `buf` for the device's MTU (65535 is always enough;
    /// an [`offload`](Self::offload) queue's read starts with a virtio-net
    /// header and needs [`blipless_protocol::offload::HEADER_LEN`] more).
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.fd
            .async_io(Interest::READABLE, |fd| {
                nix::unistd::read(fd, buf).map_err(io::Error::from)
            })
            .await
    }

    /// Writes one IP packet (IPv4 or IPv6, starting with its IP header) into
    /// the kernel, as if it arrived on the TUN device (behind an all-zero
    /// virtio-net header on an [`offload`](Self::offload) queue).
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        if self.offload {
            return self.send_with_header(&VnetHeader::default(), packet).await;
        }
        let written = self
            .fd
            .async_io(Interest::WRITABLE, |fd| {
                nix::unistd::write(fd, packet).map_err(io::Error::from)
            })
            .await?;
        check_written(written, packet.len())
    }

    /// Writes `header` and then `packet` in one `writev`: for an
    /// [`offload`](Self::offload) queue only.
    pub async fn send_with_header(&self, header: &VnetHeader, packet: &[u8]) -> io::Result<()> {
        let header = header.encode();
        let parts = [io::IoSlice::new(&header), io::IoSlice::new(packet)];
        let written = self
            .fd
            .async_io(Interest::WRITABLE, |fd| {
                nix::sys::uio::writev(fd, &parts).map_err(io::Error::from)
            })
            .await?;
        check_written(written, header.len() + packet.len())
    }

    /// Writes `header`, then `first` and each of `rest`, as one packet in
    /// one `writev` (a joined super-packet, its payloads where they lie):
    /// for an [`offload`](Self::offload) queue only. At most
    /// [`offload::MAX_SEGMENTS`] parts follow `first`.
    pub async fn send_gathered(
        &self,
        header: &VnetHeader,
        first: &[u8],
        rest: &[&[u8]],
    ) -> io::Result<()> {
        let header = header.encode();
        let mut parts = [io::IoSlice::new(&[]); offload::MAX_SEGMENTS + 2];
        let count = 2 + rest.len();
        if count > parts.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more parts than a joined packet has segments",
            ));
        }
        parts[0] = io::IoSlice::new(&header);
        parts[1] = io::IoSlice::new(first);
        for (part, bytes) in parts[2..count].iter_mut().zip(rest) {
            *part = io::IoSlice::new(bytes);
        }
        let total: usize = parts[..count].iter().map(|part| part.len()).sum();
        let written = self
            .fd
            .async_io(Interest::WRITABLE, |fd| {
                nix::sys::uio::writev(fd, &parts[..count]).map_err(io::Error::from)
            })
            .await?;
        check_written(written, total)
    }

    /// Reads a packet if one is waiting, without waiting: `Ok(None)` when
    /// there is none. For draining a queue without the reactor's help.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match nix::unistd::read(self.fd.get_ref(), buf) {
            Ok(length) => Ok(Some(length)),
            Err(nix::errno::Errno::EAGAIN) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Detaches this queue from the device: the kernel stops steering
    /// packets to it (the other queues, this plane's or a successor's, get
    /// them) and drops what it had queued for it. The descriptor stays open,
    /// so [`reattach`](Self::reattach) can undo it. Detaching twice is fine.
    pub fn detach(&self) -> io::Result<()> {
        if self.detached.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        sys::set_queue(self.fd.get_ref().as_fd(), &self.name, false).map_err(|error| {
            self.detached.store(false, Ordering::Release);
            io::Error::new(
                error.kind(),
                format!("detaching a queue of TUN device {}: {error}", self.name),
            )
        })
    }

    /// Attaches a detached queue again (a drain that was called off).
    /// Attaching an attached queue is fine.
    pub fn reattach(&self) -> io::Result<()> {
        if !self.detached.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        sys::set_queue(self.fd.get_ref().as_fd(), &self.name, true).map_err(|error| {
            self.detached.store(true, Ordering::Release);
            io::Error::new(
                error.kind(),
                format!("re-attaching a queue of TUN device {}: {error}", self.name),
            )
        })
    }
}

/// A short write into a TUN queue is an error.
fn check_written(written: usize, length: usize) -> io::Result<()> {
    if written != length {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("the TUN device took {written} of a {length}-byte write"),
        ));
    }
    Ok(())
}

/// Attaches `queues` queues to the TUN device `name` (see
/// [`TunQueue::attach`]). All or nothing: on an error the queues attached so
/// far are closed.
pub fn attach_queues(name: &str, queues: usize, offload: bool) -> io::Result<Vec<TunQueue>> {
    if queues == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "egress.tun.queues must be at least 1",
        ));
    }
    (0..queues)
        .map(|_| TunQueue::attach(name, offload))
        .collect()
}

/// Turns a `TUNSETIFF` failure into an error that says what to do.
fn explain_attach(name: &str, error: io::Error) -> io::Error {
    let (kind, why) = match error.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => (
            io::ErrorKind::PermissionDenied,
            "not permitted: attaching to a TUN device needs CAP_NET_ADMIN (run as root, or grant the capability)".to_string(),
        ),
        Some(libc::EINVAL) => (
            io::ErrorKind::InvalidInput,
            format!(
                "{name} exists but is not a multi-queue TUN device (a TAP, another kind of device, or a TUN created without multi_queue): delete it (`ip link del {name}`) and run `blipless-ctl net setup`"
            ),
        ),
        Some(libc::EBUSY) => (
            io::ErrorKind::AddrInUse,
            format!("{name} is busy: another process holds it as a single-queue device"),
        ),
        _ => (error.kind(), error.to_string()),
    };
    io::Error::new(
        kind,
        format!("attaching a queue to TUN device {name}: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_outside_a_runtime_is_an_error_not_a_panic() {
        let error = TunQueue::attach("blip0", false)
            .err()
            .map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("Tokio runtime")),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn bad_names_and_zero_queues_are_refused_before_any_system_call() {
        for name in ["", "this-name-is-far-too-long", "nul\0"] {
            let kind = TunQueue::attach(name, true).err().map(|e| e.kind());
            assert_eq!(kind, Some(io::ErrorKind::InvalidInput), "{name:?}");
        }
        let kind = attach_queues("blip0", 0, false).err().map(|e| e.kind());
        assert_eq!(kind, Some(io::ErrorKind::InvalidInput));
    }
}
