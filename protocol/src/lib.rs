//! Wire formats shared by the two blipless planes, free of I/O.
//!
//! - [`channel`]: the device channel between the ingress and a device plane
//!   (one frame per SOCK_SEQPACKET message, file descriptors beside it).
//! - [`control`]: the JSON-lines messages of the ingress control socket.
//! - [`ip`]: the addresses in an inner IP packet's header.
//! - [`numeric_host`]: host names that are addresses (`127.1`), as a
//!   resolver reads them.
//! - [`offload`]: the virtio-net header of an offload TUN queue, TCP
//!   segmentation of what it reads and joining of what it writes.
//! - [`udp`]: a UDP datagram in an inner IPv4 packet, read and built (the
//!   device plane's DNS gateway).
//! - [`wg_uapi`]: the read-only half of WireGuard's userspace API (`wg show`).
//!
//! Every decoder here is a pure function over a byte slice that tells
//! "not enough bytes yet" apart from "these bytes are wrong", so the I/O
//! layers in the binaries decide what to read next and what to refuse.
//!
//! # One convention for "incomplete"
//!
//! Every decoder of a message from received bytes ([`channel::decode`],
//! [`socks5::parse_greeting`], [`socks5::parse_user_pass`],
//! [`socks5::parse_request`], [`wg_uapi::parse_request`]) returns `Result<(value, consumed), Error>`,
//! in the manner of mini-redis's `frame.rs`:
//!
//! - `Ok((value, consumed))`: a whole message; it took exactly `consumed`
//!   bytes, and whatever follows belongs to the next message and is kept;
//! - `Err(Error::Incomplete { needed })` ([`channel::DecodeError::Incomplete`],
//!   [`socks5::Socks5Error::Incomplete`]): not a whole message yet; read at
//!   least `needed` (never 0) more bytes and decode the longer buffer again.
//!   Nothing is consumed, and it is never answered. `Error::is_incomplete()`
//!   tells it apart;
//! - every other error: the bytes can never become a valid message; refuse
//!   and close the peer.
//!
//! [`ip`] reads headers of packets that always arrive whole, and [`control`]
//! is JSON lines read by line, so neither has an "incomplete" answer.

pub mod channel;
pub mod control;
pub mod http_target;
pub mod ip;
pub mod numeric_host;
pub mod offload;
pub mod proxy_auth;
pub mod socks5;
pub mod udp;
pub mod wg_uapi;
