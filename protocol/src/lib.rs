//! Wire formats shared by the two blipless planes, free of I/O.
//!
//! - [`channel`]: the device channel between the ingress and a device plane
//!   (one frame per SOCK_SEQPACKET message, file descriptors beside it).
//! - [`control`]: the JSON-lines messages of the ingress control socket.
//! - [`ip`]: the addresses in an inner IP packet's header.
//!
//! Every decoder here is a pure function over a byte slice that tells
//! "not enough bytes yet" apart from "these bytes are wrong", so the I/O
//! layers in the binaries decide what to read next and what to refuse.

pub mod channel;
pub mod control;
pub mod ip;
pub mod socks5;
