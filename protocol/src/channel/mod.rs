//! The device channel: what the ingress and a device plane say to each other.
//!
//! One frame per SOCK_SEQPACKET message. A frame is a fixed 8-byte header
//! followed by its payload:
//!
//! ```text
//! 0      2         3      4                8
//! +------+---------+------+----------------+------------------+
//! | "BL" | version | type | payload length | payload ...      |
//! +------+---------+------+----------------+------------------+
//!  magic    u8       u8     u32 big-endian   <= MAX_PAYLOAD bytes
//! ```
//!
//! The header layout is fixed for every protocol version, so a peer that
//! speaks another version is recognised and told so ([`DecodeError::VersionMismatch`])
//! instead of being misread. File descriptors travel beside the frame as
//! SCM_RIGHTS ancillary data; [`Conversation::fd_count`] says how many a
//! frame must carry. Low-rate control messages carry a JSON payload; the
//! per-connection and per-packet messages are binary.
//!
//! Three conversations share the framing, each with its own message type
//! ([`conversations`]): [`ToDevice`] (ingress to device plane), [`ToIngress`]
//! (device plane to ingress) and [`Handoff`] (ingress to ingress). What a
//! side may not send is not in its type; a frame of another conversation's
//! type is refused on receipt ([`DecodeError::NotInConversation`]).
//!
//! [`decode`] works over any byte slice: given fewer bytes than a whole
//! frame it answers [`DecodeError::Incomplete`] (read more), which is kept
//! apart from every error that means the bytes are wrong (close the peer).
//! A decoded [`Packets`] batch borrows the frame it came in.

pub mod conversations;
mod cursor;
mod endpoints;
mod exits;
mod handoff;
mod migrate;
mod packets;
mod packets_frame;
mod payloads;
mod peers;
mod progress;
mod sync;
#[cfg(test)]
mod tests;

pub use conversations::{encode_migrate, Conversation, Handoff, ToDevice, ToIngress};
pub use endpoints::{EndpointEntry, EndpointPart};
pub use exits::ExitQueues;
pub use handoff::{HandoffCounters, HandoffOffer, OfferedSocket, SocketName};
pub use migrate::{Direction, Migrate, MigrateKind, UdpAssociation};
pub use packets::{PacketIter, Packets};
pub use packets_frame::PacketsFrame;
pub use payloads::{
    Accepted, DeviceReport, DrainOrder, Drained, Hello, ListenerKind, Refused, Rejoin, RouteReport,
    UdpCounts, Welcome, WgPacketCounts, MAX_ACCEPTED_MANY,
};
pub use peers::{PeerEntry, PeerUpdate};
pub use progress::HandoffProgress;
pub use sync::{SyncClients, Synced};

use cursor::Truncated;

/// The protocol version this build speaks.
/// Version 2 added MigrateDone and piped pending bytes (Migrate flag bits 2
/// and 3); version 3 added Peers, TunQueues and Packets from the device
/// plane; version 4 added Endpoints and the handoff messages; version 5 typed
/// the channel per conversation and added SyncClients and Synced. An older peer
/// cannot read these, so mismatched versions are refused at Hello.
pub const PROTOCOL_VERSION: u8 = 5;
/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"BL";
/// Length of the fixed header.
pub const HEADER_LEN: usize = 8;
/// Largest payload a frame may carry: a migrating tunnel's pending bytes
/// (up to 64 KiB each way) plus its metadata. Channel sockets set SO_SNDBUF
/// to [`MAX_FRAME`] (the kernel doubles it), so one frame always fits one
/// SOCK_SEQPACKET message.
pub const MAX_PAYLOAD: usize = 160 * 1024 - HEADER_LEN;
/// Largest whole frame: what a receive buffer must hold.
pub const MAX_FRAME: usize = HEADER_LEN + MAX_PAYLOAD;
/// Most file descriptors one frame carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS_PER_FRAME: usize = 252;

/// Why a byte slice is not (yet) a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a whole frame: not an error on a stream, read at
    /// least `needed` more bytes and try again. On SOCK_SEQPACKET, where a
    /// message is always whole, it means the peer sent a truncated frame.
    #[error("incomplete frame: {needed} more bytes needed")]
    Incomplete {
        /// How many more bytes are needed at least.
        needed: usize,
    },
    /// The frame does not start with [`MAGIC`]: not a blipless peer.
    #[error("not a blipless frame (magic {0:02x?})")]
    BadMagic([u8; 2]),
    /// The peer speaks another protocol version: it must be upgraded or
    /// downgraded to match, since neither side can read the other.
    #[error("protocol version mismatch: this side speaks v{ours}, the peer speaks v{theirs}")]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`].
        ours: u8,
        /// The version in the peer's header.
        theirs: u8,
    },
    /// The header declares a payload larger than [`MAX_PAYLOAD`].
    #[error("frame payload of {len} bytes exceeds the {max}-byte cap")]
    Oversize {
        /// Declared payload length.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// The message type is not one this version knows.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A known message that this conversation does not carry (a device
    /// plane sending `Activate`, say): the peer is confused or hostile.
    #[error("{message} is not a message of the {conversation} conversation")]
    NotInConversation {
        /// The message type's name.
        message: &'static str,
        /// The conversation it arrived on ([`Conversation::NAME`]).
        conversation: &'static str,
    },
    /// The payload does not match its message type's layout.
    #[error("malformed {message} payload: {reason}")]
    Malformed {
        /// The message type being decoded.
        message: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl DecodeError {
    /// True when more bytes could still make a valid frame.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, DecodeError::Incomplete { .. })
    }
}

/// The name of the message a type byte stands for, if it is one this
/// version knows (for logs about a frame that is not decoded).
pub fn message_name(message_type: u8) -> Option<&'static str> {
    payloads::type_name(message_type)
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The message type byte.
    pub message_type: u8,
    /// Payload length in bytes.
    pub payload_len: usize,
}

/// Parses and checks the fixed header at the start of `buf`.
pub fn decode_header(buf: &[u8]) -> Result<Header, DecodeError> {
    if buf.len() < HEADER_LEN {
        // Check what is there already, so garbage is refused early.
        if buf.len() >= 2 && buf[..2] != MAGIC {
            return Err(DecodeError::BadMagic([buf[0], buf[1]]));
        }
        return Err(DecodeError::Incomplete {
            needed: HEADER_LEN - buf.len(),
        });
    }
    if buf[..2] != MAGIC {
        return Err(DecodeError::BadMagic([buf[0], buf[1]]));
    }
    if buf[2] != PROTOCOL_VERSION {
        return Err(DecodeError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: buf[2],
        });
    }
    let payload_len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if payload_len > MAX_PAYLOAD {
        return Err(DecodeError::Oversize {
            len: payload_len,
            max: MAX_PAYLOAD,
        });
    }
    Ok(Header {
        message_type: buf[3],
        payload_len,
    })
}

/// Decodes the frame at the start of `buf` as a message of conversation
/// `M`, returning it and how many bytes it used. Bytes after the frame are
/// left for the next call.
pub fn decode<'a, M: Conversation<'a>>(buf: &'a [u8]) -> Result<(M, usize), DecodeError> {
    let header = decode_header(buf)?;
    let total = HEADER_LEN + header.payload_len;
    if buf.len() < total {
        // Refuse an unknown type before waiting for its payload.
        payloads::type_name(header.message_type)
            .ok_or(DecodeError::UnknownType(header.message_type))?;
        return Err(DecodeError::Incomplete {
            needed: total - buf.len(),
        });
    }
    let payload = &buf[HEADER_LEN..total];
    let message = M::decode_payload(header.message_type, payload)?;
    Ok((message, total))
}

/// Encodes a message as one frame.
///
/// The result may exceed [`MAX_FRAME`] only for a JSON message built with
/// absurd strings; [`Packets`] cannot (it refuses packets past the cap), and
/// the sending side checks the length before it writes.
pub fn encode<'a, M: Conversation<'a>>(message: &M) -> Vec<u8> {
    frame(message.type_byte(), message.payload_len_hint(), |out| {
        message.encode_payload(out)
    })
}

/// A frame: the header, then what `payload` appends (about `hint` bytes:
/// room for them is taken at once, so a large payload is not copied as the
/// frame grows).
fn frame(message_type: u8, hint: usize, payload: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + hint.clamp(56, MAX_PAYLOAD));
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(message_type);
    out.extend_from_slice(&[0; 4]);
    payload(&mut out);
    let payload_len = (out.len() - HEADER_LEN) as u32;
    out[4..8].copy_from_slice(&payload_len.to_be_bytes());
    out
}

fn truncated(message: &'static str) -> impl Fn(Truncated) -> DecodeError {
    move |_| DecodeError::Malformed {
        message,
        reason: "payload ends inside a field".into(),
    }
}
