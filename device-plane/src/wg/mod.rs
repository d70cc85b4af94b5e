//! WireGuard in the device plane (the sessions themselves end in the ingress,
//! `ingress/src/wg/`):
//! - [`packets`]: inner packets to and from the TUN device (packet egress);
//! - [`tun`]: the TUN device's queues (the one `unsafe` module of this crate);
//! - [`writer`]: the task that writes inner packets to the TUN device;
//! - [`peers`]: the peer set the ingress needs, from the client directory;
//! - [`endpoints`]: the ingress's endpoint snapshots, kept in the store for an
//!   ingress that restarts after a crash;
//! - [`exit`] and [`exits`]: WireGuard exits the node egresses through, and
//!   steering WireGuard clients to them;
//! - [`dns`]: the DNS gateway answering clients' queries to the node's
//!   tunnel address.

pub mod accounting;
pub mod dns;
pub mod endpoints;
pub mod exit;
pub mod exits;
pub mod packets;
pub mod peers;
pub mod tun;
mod tun_reader;
pub mod writer;

pub use packets::PacketPath;
pub use peers::{send_peers, PeerSync};
pub use writer::TunWriter;
