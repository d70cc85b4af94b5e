//! The payloads of the handoff conversation between two ingresses on
//! `handoff.sock` (docs/ARCHITECTURE.md, "Ingress restart-by-handoff"): the
//! names of the sockets that move, the offer, and the counters that carry on.

use serde::{Deserialize, Serialize};

/// One listening socket of an ingress, by the name it goes by in a
/// [`HandoffOffer`] and in the service manager's fd store (`FDNAME=`):
/// `socks`, `http`, `status`, `device`, `control`, `handoff`, `wg0`, `wg1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketName {
    /// The SOCKS5 listener (TCP).
    Socks,
    /// The HTTP proxy listener (TCP).
    Http,
    /// The HTTPS proxy listener (TCP; TLS terminated by the ingress), when
    /// `listen.https` is set.
    Https,
    /// The `/status` and `/metrics` listener (TCP).
    Status,
    /// `device.sock`, where device planes attach (SOCK_SEQPACKET).
    Device,
    /// `control.sock`, for `blipless-ctl` (stream).
    Control,
    /// `handoff.sock`, where a successor ingress connects (SOCK_SEQPACKET).
    Handoff,
    /// Member 0 of the WireGuard SO_REUSEPORT group: generation 0's (UDP).
    Wg0,
    /// Member 1 of the WireGuard SO_REUSEPORT group: generation 1's (UDP).
    Wg1,
}

impl SocketName {
    /// Every socket, in the order an ingress offers them.
    pub const ALL: [SocketName; 9] = [
        SocketName::Socks,
        SocketName::Http,
        SocketName::Https,
        SocketName::Status,
        SocketName::Device,
        SocketName::Control,
        SocketName::Handoff,
        SocketName::Wg0,
        SocketName::Wg1,
    ];

    /// The name on the wire and in the fd store.
    pub fn as_str(self) -> &'static str {
        match self {
            SocketName::Socks => "socks",
            SocketName::Http => "http",
            SocketName::Https => "https",
            SocketName::Status => "status",
            SocketName::Device => "device",
            SocketName::Control => "control",
            SocketName::Handoff => "handoff",
            SocketName::Wg0 => "wg0",
            SocketName::Wg1 => "wg1",
        }
    }

    /// The socket called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|socket| socket.as_str() == name)
    }

    /// The WireGuard group member of `generation` (`wg0` or `wg1` by its
    /// lowest bit).
    pub fn wg(generation: u32) -> Self {
        if generation & 1 == 0 {
            SocketName::Wg0
        } else {
            SocketName::Wg1
        }
    }
}

impl std::fmt::Display for SocketName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One listening socket in a [`HandoffOffer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedSocket {
    /// What it is.
    pub name: SocketName,
    /// Its address (`ip:port`, or a Unix socket path), to compare with the
    /// successor's configuration.
    pub address: String,
}

/// Payload of [`super::Handoff::Offer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffOffer {
    /// The sockets whose fds travel beside the frame, in order.
    pub sockets: Vec<OfferedSocket>,
    /// The predecessor's WireGuard generation (0 or 1, bit 23 of its peer
    /// indices); the successor takes the other one.
    pub wg_generation: u32,
    /// Counters, so the successor's metrics carry on.
    pub counters: HandoffCounters,
}

/// Counters a successor ingress carries on from (see [`HandoffOffer`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffCounters {
    /// Connections accepted on the SOCKS5 listener.
    pub accepted_socks: u64,
    /// Connections accepted on the HTTP listener.
    pub accepted_http: u64,
    /// Connections accepted on the HTTPS listener (absent from a
    /// predecessor that had none).
    #[serde(default)]
    pub accepted_https: u64,
    /// Connections handed to device planes.
    pub handed: u64,
    /// Tunnels migrated between device planes.
    pub migrated: u64,
    /// Ingress handoffs before this one.
    pub handoffs: u64,
}
