//! The device channel's socket layer, shared by both planes.
//!
//! The frame format lives in `blipless_protocol::channel` (sans-IO); this
//! crate moves frames over a connected SOCK_SEQPACKET socket: one frame per
//! message, file descriptors beside it as SCM_RIGHTS. It checks what the
//! codec cannot see: a message cut short by the receive buffer, fds that did
//! not fit, and that a frame carries exactly the fds its type calls for.
//! Every fd received is owned (`OwnedFd`), so anything refused is closed.

use std::os::fd::{BorrowedFd, OwnedFd};

use blipless_protocol::channel::{self, Conversation, DecodeError, MAX_FDS_PER_FRAME, MAX_FRAME};
use tokio_seqpacket::ancillary::{AncillaryMessageWriter, OwnedAncillaryMessage};
use tokio_seqpacket::UnixSeqpacket;

/// Room for the ancillary data of one frame: one SCM_RIGHTS message with
/// up to [`MAX_FDS_PER_FRAME`] fds, as `CMSG_SPACE` counts it on Linux (a
/// 16-byte header, then the fds rounded up to 8 bytes). A `TunQueues`
/// carries one fd per queue, up to that many; 256 bytes (60 fds) lost a
/// node's queues at a deploy when `egress.tun.queues` was above 59.
const ANCILLARY_BUFFER: usize = 16 + (4 * MAX_FDS_PER_FRAME).next_multiple_of(8);

/// The ancillary data's room, aligned as a `cmsghdr` is: the writer skips
/// to that alignment first, and a byte array on an async task's state may
/// start anywhere, which would leave fewer bytes than 252 fds need.
#[repr(C, align(8))]
struct AncillaryBuffer([u8; ANCILLARY_BUFFER]);

const _: () = assert!(
    std::mem::align_of::<AncillaryBuffer>() >= AncillaryMessageWriter::BUFFER_ALIGN,
    "the ancillary buffer is aligned for a cmsghdr"
);

/// Why a frame could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The socket failed.
    #[error("device channel I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The frame to send is larger than [`MAX_FRAME`].
    #[error("{message} frame of {len} bytes exceeds the {MAX_FRAME}-byte cap")]
    TooLarge {
        /// The message type.
        message: &'static str,
        /// Its encoded length.
        len: usize,
    },
    /// The peer sent a message larger than [`MAX_FRAME`].
    #[error("the peer sent a message over {MAX_FRAME} bytes")]
    Oversize,
    /// The frame does not decode (another version, garbage, truncated).
    #[error("the peer sent a bad frame: {0}")]
    Decode(#[from] DecodeError),
    /// Bytes follow the frame inside the same message.
    #[error("the peer sent bytes after its frame")]
    TrailingBytes,
    /// A frame to send was given the wrong number of fds for its type, or
    /// more than a frame carries ([`MAX_FDS_PER_FRAME`]): nothing is sent
    /// (the peer would refuse it, or lose some of them).
    #[error("refusing to send {message} with {got} fds (its type carries {expected}, a frame at most {MAX_FDS_PER_FRAME})")]
    FdsToSend {
        /// The message type.
        message: &'static str,
        /// Fds given.
        got: usize,
        /// Fds its type carries.
        expected: usize,
    },
    /// The frame carries the wrong number of fds for its type.
    #[error("the peer sent {message} with {got} fds (expected {expected})")]
    FdCount {
        /// The message type.
        message: &'static str,
        /// Fds that came with it.
        got: usize,
        /// Fds its type carries.
        expected: usize,
    },
}

/// Sends one frame of conversation `M` with `fds` beside it.
pub async fn send<'m, M: Conversation<'m>>(
    socket: &UnixSeqpacket,
    message: &M,
    fds: &[BorrowedFd<'_>],
) -> Result<(), LinkError> {
    if fds.len() != message.fd_count() || fds.len() > MAX_FDS_PER_FRAME {
        return Err(LinkError::FdsToSend {
            message: message.name(),
            got: fds.len(),
            expected: message.fd_count(),
        });
    }
    send_encoded(socket, &channel::encode(message), message.name(), fds).await
}

/// Sends a frame already encoded (`name` is its message type, for errors).
pub async fn send_encoded(
    socket: &UnixSeqpacket,
    frame: &[u8],
    name: &'static str,
    fds: &[BorrowedFd<'_>],
) -> Result<(), LinkError> {
    if frame.len() > MAX_FRAME {
        return Err(LinkError::TooLarge {
            message: name,
            len: frame.len(),
        });
    }
    let mut ancillary_buffer = AncillaryBuffer([0u8; ANCILLARY_BUFFER]);
    let mut ancillary = AncillaryMessageWriter::new(&mut ancillary_buffer.0);
    if !fds.is_empty() {
        ancillary
            .add_fds(fds.iter().copied())
            .map_err(std::io::Error::from)?;
    }
    let sent = socket.send_with_ancillary(frame, &mut ancillary).await?;
    if sent != frame.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short SOCK_SEQPACKET write",
        )
        .into());
    }
    Ok(())
}

/// Receives one frame of conversation `M` and its fds; `Ok(None)` when the
/// peer closed the channel. `buffer` must hold [`MAX_FRAME`] bytes; the
/// message may borrow from it (a batch of packets does).
///
/// A frame whose fds the kernel dropped (this process at its open-file
/// limit) costs only that frame: it is counted ([`fds_dropped`]), logged at
/// most once a second, and skipped; the channel stays up.
pub async fn receive<'b, M: Conversation<'b>>(
    socket: &UnixSeqpacket,
    buffer: &'b mut [u8],
) -> Result<Option<(M, Vec<OwnedFd>)>, LinkError> {
    let (len, fds) = loop {
        match receive_raw(socket, buffer).await? {
            Raw::Closed => return Ok(None),
            Raw::Frame { len, fds } => break (len, fds),
            Raw::FdsDropped { len } => {
                let name = channel::decode_header(&buffer[..len])
                    .ok()
                    .and_then(|header| channel::message_name(header.message_type))
                    .unwrap_or("?");
                dropped::count(name);
            }
        }
    };
    let frame: &'b [u8] = &buffer[..len];
    let (message, used) = channel::decode::<M>(frame)?;
    if used != frame.len() {
        return Err(LinkError::TrailingBytes);
    }
    if fds.len() != message.fd_count() {
        return Err(LinkError::FdCount {
            message: message.name(),
            got: fds.len(),
            expected: message.fd_count(),
        });
    }
    Ok(Some((message, fds)))
}

/// One message off the socket, not yet decoded.
enum Raw {
    Closed,
    Frame { len: usize, fds: Vec<OwnedFd> },
    FdsDropped { len: usize },
}

async fn receive_raw(socket: &UnixSeqpacket, buffer: &mut [u8]) -> Result<Raw, LinkError> {
    let mut ancillary_buffer = AncillaryBuffer([0u8; ANCILLARY_BUFFER]);
    // A peer that closes with frames of ours still unread makes the kernel
    // report ECONNRESET once, ahead of the frames it had sent us before
    // closing (sock_error comes first in the datagram receive path, and is
    // cleared by being reported). Those frames are the peer's last words
    // (a draining plane's TUN queues, say): read on, and the queue ends in
    // an orderly end of file.
    let mut resets = 0;
    let (info, ancillary) = loop {
        match socket
            .recv_with_ancillary(buffer, &mut ancillary_buffer.0)
            .await
        {
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset && resets == 0 => {
                resets += 1;
            }
            received => break received?,
        }
    };
    let fds_truncated = ancillary.is_truncated();
    let mut fds = Vec::new();
    for item in ancillary.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(received) = item {
            fds.extend(received);
        }
    }
    if info.truncated() {
        return Err(LinkError::Oversize);
    }
    if fds_truncated {
        // Whatever fds did arrive close with `fds` here.
        return Ok(Raw::FdsDropped {
            len: info.bytes_read(),
        });
    }
    if info.bytes_read() == 0 && fds.is_empty() {
        return Ok(Raw::Closed);
    }
    Ok(Raw::Frame {
        len: info.bytes_read(),
        fds,
    })
}

/// How many frames this process has lost the fds of (open-file limit).
pub fn fds_dropped() -> u64 {
    dropped::total()
}

mod dropped {
    //! The count of frames whose fds were dropped, and its log line, at most
    //! one a second with how many since the last.

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    static TOTAL: AtomicU64 = AtomicU64::new(0);
    static LOGGED: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

    pub(super) fn total() -> u64 {
        TOTAL.load(Ordering::Relaxed)
    }

    pub(super) fn count(message: &'static str) {
        let total = TOTAL.fetch_add(1, Ordering::Relaxed) + 1;
        let mut logged = LOGGED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = logged.is_none_or(|(at, _)| at.elapsed() >= Duration::from_secs(1));
        if due {
            let since = total - logged.map_or(0, |(_, seen)| seen);
            tracing::warn!(
                message,
                dropped = since,
                total,
                "the kernel dropped the file descriptors of channel frames: this process is at its open-file limit (the frame is skipped; the channel stays up)"
            );
            *logged = Some((Instant::now(), total));
        }
    }
}

/// Sizes the socket's send buffer so one [`MAX_FRAME`] frame always fits one
/// message (the kernel doubles the value, up to its own maximum).
pub fn size_buffers(socket: &UnixSeqpacket) -> Result<(), LinkError> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(socket, sockopt::SndBuf, &MAX_FRAME).map_err(|errno| LinkError::Io(errno.into()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    use blipless_protocol::channel::{
        Accepted, ListenerKind, Migrate, MigrateKind, ToDevice, ToIngress,
    };

    use super::*;

    fn pair() -> (UnixSeqpacket, UnixSeqpacket) {
        let (a, b) = UnixSeqpacket::pair().expect("socketpair");
        size_buffers(&a).expect("size");
        size_buffers(&b).expect("size");
        (a, b)
    }

    #[tokio::test]
    async fn frames_sent_before_the_peer_closed_with_unread_input_still_arrive() {
        // The plane's last frames (its TUN queues) and then its exit, with
        // the ingress's Goaway still unread in its queue: the kernel reports
        // ECONNRESET ahead of the queued frames, which must not be lost.
        let (plane, ingress) = pair();
        let (_near, far) = std::os::unix::net::UnixStream::pair().expect("pair");
        send(&ingress, &ToDevice::Goaway, &[])
            .await
            .expect("goaway");
        send(&plane, &ToIngress::TunQueues(1), &[far.as_fd()])
            .await
            .expect("the last frame");
        drop(far);
        drop(plane);
        let mut buffer = vec![0u8; MAX_FRAME];
        let got = receive::<ToIngress>(&ingress, &mut buffer)
            .await
            .expect("the queued frame, not ECONNRESET");
        let (message, fds) = got.expect("a frame before the close");
        assert_eq!(message, ToIngress::TunQueues(1));
        assert_eq!(fds.len(), 1, "with its descriptor");
        let mut buffer = vec![0u8; MAX_FRAME];
        assert!(matches!(
            receive::<ToIngress>(&ingress, &mut buffer).await,
            Ok(None)
        ));
    }

    #[tokio::test]
    async fn a_frame_with_the_most_fds_crosses_whole() {
        // As many TUN queues as a frame may carry (the protocol's cap), and
        // a burst of accepted connections, each fd still the one sent.
        let (a, b) = pair();
        let (mut near, far) = std::os::unix::net::UnixStream::pair().expect("pair");
        let copies: Vec<OwnedFd> = (0..MAX_FDS_PER_FRAME)
            .map(|_| far.as_fd().try_clone_to_owned().expect("dup"))
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = copies.iter().map(|fd| fd.as_fd()).collect();
        let queues = ToDevice::TunQueues(MAX_FDS_PER_FRAME as u8);
        send(&a, &queues, &borrowed).await.expect("send");
        let mut buffer = vec![0u8; MAX_FRAME];
        let (message, fds) = receive::<ToDevice>(&b, &mut buffer)
            .await
            .expect("receive")
            .expect("a frame");
        assert_eq!(message, queues);
        assert_eq!(fds.len(), MAX_FDS_PER_FRAME);

        let burst: Vec<Accepted> = (0..blipless_protocol::channel::MAX_ACCEPTED_MANY as u64)
            .map(|id| Accepted {
                listener: ListenerKind::Socks,
                connection_id: id,
                peer: "127.0.0.1:4000".parse().expect("addr"),
                local: "127.0.0.1:1080".parse().expect("addr"),
            })
            .collect();
        let many = ToDevice::AcceptedMany(burst);
        send(&a, &many, &borrowed[..many.fd_count()])
            .await
            .expect("send");
        let (message, fds) = receive::<ToDevice>(&b, &mut buffer)
            .await
            .expect("receive")
            .expect("a frame");
        assert_eq!(message, many);
        let last = fds.into_iter().last().expect("fds");
        let mut passed = std::os::unix::net::UnixStream::from(last);
        passed.write_all(b"the last one").expect("write");
        let mut got = [0u8; 12];
        near.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"the last one");
    }

    #[tokio::test]
    async fn a_frame_and_its_fd_cross_and_the_fd_works() {
        let (a, b) = pair();
        let (mut near, far) = std::os::unix::net::UnixStream::pair().expect("pair");
        let accepted = ToDevice::Accepted(Accepted {
            listener: ListenerKind::Http,
            connection_id: 9,
            peer: "127.0.0.1:1".parse().expect("addr"),
            local: "127.0.0.1:2".parse().expect("addr"),
        });
        send(&a, &accepted, &[far.as_fd()]).await.expect("send");
        drop(far);
        let mut buffer = vec![0u8; MAX_FRAME];
        let (message, fds) = receive::<ToDevice>(&b, &mut buffer)
            .await
            .expect("receive")
            .expect("frame");
        assert_eq!(message, accepted);
        let mut passed = std::os::unix::net::UnixStream::from(fds.into_iter().next().expect("fd"));
        passed.write_all(b"through the fd").expect("write");
        let mut got = [0u8; 14];
        near.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"through the fd");
    }

    #[tokio::test]
    async fn the_largest_frame_fits_one_message() {
        let (a, b) = pair();
        let (one, two) = std::os::unix::net::UnixStream::pair().expect("pair");
        let migrate = ToIngress::Migrate(Migrate {
            kind: MigrateKind::SocksTunnel,
            connection_id: 1,
            client: "c".into(),
            up: blipless_protocol::channel::Direction {
                pending: vec![1; 64 * 1024],
                eof: false,
            },
            down: blipless_protocol::channel::Direction {
                pending: vec![2; 64 * 1024],
                eof: true,
            },
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        });
        send(&a, &migrate, &[one.as_fd(), two.as_fd()])
            .await
            .expect("send");
        let mut buffer = vec![0u8; MAX_FRAME];
        let (message, fds) = receive::<ToIngress>(&b, &mut buffer)
            .await
            .expect("receive")
            .expect("frame");
        assert_eq!(message, migrate);
        assert_eq!(fds.len(), 2);
    }

    #[tokio::test]
    async fn a_missing_fd_garbage_and_a_close_are_told_apart() {
        let (a, b) = pair();
        let mut buffer = vec![0u8; MAX_FRAME];
        // Accepted without its fd.
        let accepted = ToDevice::Accepted(Accepted {
            listener: ListenerKind::Socks,
            connection_id: 1,
            peer: "127.0.0.1:1".parse().expect("addr"),
            local: "127.0.0.1:2".parse().expect("addr"),
        });
        // Our own send refuses it; another peer's might not.
        assert!(matches!(
            send(&a, &accepted, &[]).await,
            Err(LinkError::FdsToSend {
                got: 0,
                expected: 1,
                ..
            })
        ));
        send_encoded(&a, &channel::encode(&accepted), "Accepted", &[])
            .await
            .expect("send");
        assert!(matches!(
            receive::<ToDevice>(&b, &mut buffer).await,
            Err(LinkError::FdCount {
                got: 0,
                expected: 1,
                ..
            })
        ));
        // Garbage.
        a.send(b"not a frame").await.expect("send");
        assert!(matches!(
            receive::<ToDevice>(&b, &mut buffer).await,
            Err(LinkError::Decode(DecodeError::BadMagic(_)))
        ));
        // A truncated frame (seqpacket keeps message boundaries: a short message is a short frame).
        let frame = channel::encode(&ToIngress::Ready);
        a.send(&frame[..5]).await.expect("send");
        assert!(matches!(
            receive::<ToDevice>(&b, &mut buffer).await,
            Err(LinkError::Decode(DecodeError::Incomplete { .. }))
        ));
        // A message of the other direction.
        send(&a, &ToIngress::Ready, &[]).await.expect("send");
        assert!(matches!(
            receive::<ToDevice>(&b, &mut buffer).await,
            Err(LinkError::Decode(DecodeError::NotInConversation { .. }))
        ));
        // A close.
        drop(a);
        assert!(matches!(
            receive::<ToDevice>(&b, &mut buffer).await,
            Ok(None)
        ));
    }
}
