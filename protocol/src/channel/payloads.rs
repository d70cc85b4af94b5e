//! The payloads of the device channel's messages, their type bytes and
//! names, and the codecs that the three conversations ([`super::ToDevice`],
//! [`super::ToIngress`], [`super::Handoff`]) share.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::cursor::{put_socket_addr, Reader};
use super::handoff::HandoffOffer;
use super::{truncated, DecodeError};

/// What a device plane was at an ingress that handed off, as it attaches to
/// the successor (docs/ARCHITECTURE.md, "Device planes follow").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rejoin {
    /// A first attachment, or a plane no ingress had activated yet (it may
    /// have said Ready: a deploy the ingress handed off in the middle of).
    #[default]
    No,
    /// It was serving: it says Ready, and is activated only if no plane is
    /// active here yet; a plane already active here (a newer one) takes over
    /// from it, as in a deploy.
    Serving,
    /// It was draining: attached as Draining, says no Ready, and carries on
    /// handing over.
    Draining,
}

/// Payload of `Hello` (and of `HandoffHello`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The device plane's process id.
    pub pid: u32,
    /// The device plane's software version (for status and logs).
    pub software: String,
    /// A device plane attaching to the successor of an ingress that handed
    /// off (Goaway) says what it was there. Always `No` between ingresses.
    #[serde(default)]
    pub rejoin: Rejoin,
    /// The plane reads `AcceptedMany`: the ingress may hand it a burst of
    /// connections in one frame. Absent (an older plane): false, and each
    /// connection travels in an `Accepted` of its own. Always false between
    /// ingresses.
    #[serde(default)]
    pub accepts_many: bool,
    /// The plane reads `MigrateNotTaken`: when the successor it handed
    /// connections to died before taking some, it serves those on. Absent
    /// (an older plane): false, and the ingress answers `MigrateDone` for
    /// them, as before. Always false between ingresses.
    #[serde(default)]
    pub reads_not_taken: bool,
    /// The plane reads a `Migrate` of kind `SocksUdp` (a SOCKS5 UDP
    /// association). Absent (a plane built before UDP ASSOCIATE, which a
    /// rollback may bring back): false, and the ingress passes it none: a
    /// draining plane's association comes back to it, which serves it on.
    /// Always false between ingresses.
    #[serde(default)]
    pub reads_udp_migrate: bool,
}

/// Payload of [`Welcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The number the ingress gave this device plane (1, 2, ...).
    pub generation: u64,
    /// The ingress's process id.
    pub ingress_pid: u32,
    /// Another plane is active: this one is its successor and inherits its
    /// TUN queues at handover instead of attaching its own.
    #[serde(default)]
    pub successor: bool,
    /// This ingress started with no predecessor to hand off from: send it the
    /// last endpoint snapshot from the store after the peer set.
    #[serde(default)]
    pub wants_endpoints: bool,
    /// This ingress passes SOCKS5 UDP associations on at a deploy (Migrate
    /// of kind `SocksUdp`). An older ingress does not know the kind and
    /// would drop the plane that sent it: a plane attached to one closes its
    /// associations at a deploy instead of handing them over.
    #[serde(default)]
    pub udp_associations: bool,
    /// The customer listeners have TCP_NODELAY set, which the connections
    /// they accept inherit: the device plane need not set it on each one.
    /// An older ingress does not say so, and the plane sets it itself.
    #[serde(default)]
    pub accepted_nodelay: bool,
}

/// Payload of [`Refused`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Why, in words an operator can act on.
    pub reason: String,
    /// The refusal is for now only: the ingress is busy with another
    /// handoff (it is still beside its own predecessor, or another successor
    /// is taking over). A successor asks again; one that reads `false` (or
    /// an older ingress, which never sends it) gives up.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

/// Payload of [`Drain`] (one byte).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainOrder {
    /// True: a successor is active; migrate every connection that can move.
    /// False: no successor; finish connections within the grace.
    pub handover: bool,
}

/// Payload of [`Drained`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drained {
    /// Connections handed to a successor.
    pub migrated: u64,
    /// Connections that finished in this plane.
    pub finished: u64,
    /// Connections closed at the grace deadline.
    pub cut: u64,
}

/// Payload of [`Report`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// Customer connections this plane holds now.
    pub connections: u64,
    /// Connections this plane has taken since it started.
    pub connections_total: u64,
    /// Clients known to this plane.
    pub clients: u64,
    /// Connections this plane has handed to a successor.
    #[serde(default)]
    pub migrated: u64,
    /// Client devices open on this plane.
    #[serde(default)]
    pub devices: u64,
    /// Devices this plane opened by pre-warm before it said Ready.
    #[serde(default)]
    pub prewarmed: u64,
    /// Failed SOCKS5 authentications (RFC 1929), counted on this attachment:
    /// since the last report an earlier attachment of this plane sent, so a
    /// plane that reattaches never reports one twice. This and the three
    /// below only grow within an attachment; the ingress adds each increase
    /// to its own counters, so they never go backwards when a plane leaves.
    #[serde(default)]
    pub auth_failures_socks5: u64,
    /// SOCKS5 logins refused unchecked while throttled (their username at their source, or their whole source).
    #[serde(default)]
    pub auth_throttled_socks5: u64,
    /// HTTP proxy 407s (`Proxy-Authorization` missing, malformed or wrong).
    #[serde(default)]
    pub auth_failures_http: u64,
    /// HTTP proxy requests refused unchecked (429) while throttled (their username at their source, or their whole source).
    #[serde(default)]
    pub auth_throttled_http: u64,
    /// Connections refused at once because the plane was near its open-file
    /// limit (counted on this attachment, like the auth counts).
    #[serde(default)]
    pub refused_fd_limit: u64,
    /// Connections refused at `limits.connections`, on this attachment.
    #[serde(default)]
    pub refused_connection_cap: u64,
    /// Tunnels refused at `limits.tunnels_per_client` or a client's own
    /// `max_connections`, on this attachment.
    #[serde(default)]
    pub refused_tunnel_cap: u64,
    /// Tunnels and requests refused because their client was over its
    /// quota, on this attachment.
    #[serde(default)]
    pub refused_over_quota: u64,
    /// Clients over their quota now.
    #[serde(default)]
    pub clients_over_quota: u64,
    /// HTTP request heads over `limits.header_bytes` (431), on this attachment.
    #[serde(default)]
    pub http_head_too_large: u64,
    /// Forwarded HTTP requests answered 504 (`timeouts.response`).
    #[serde(default)]
    pub http_response_timeouts: u64,
    /// HTTP exchanges ended for a stalled body (`timeouts.body_idle`).
    #[serde(default)]
    pub http_body_stalls: u64,
    /// HTTP request targets refused (400) for carrying userinfo.
    #[serde(default)]
    pub http_userinfo_refused: u64,
    /// SOCKS5 UDP associations opened, and datagrams their relays dropped
    /// by reason, on this attachment (like the refusal counts).
    #[serde(default)]
    pub udp: UdpCounts,
    /// WireGuard inner packets the plane dropped, by reason, on this
    /// attachment (like the refusal counts).
    #[serde(default)]
    pub wg_packets: WgPacketCounts,
    /// Channel frames whose fds the kernel dropped on receipt (the plane at
    /// its open-file limit), on this attachment.
    #[serde(default)]
    pub channel_fds_dropped: u64,
    /// WireGuard clients' DNS queries the plane's gateway answered, on this
    /// attachment.
    #[serde(default)]
    pub dns_answered: u64,
    /// DNS queries the gateway dropped (unreadable, a response, too many in
    /// flight) and DNS-over-TCP connections it closed unserved (over a cap,
    /// no descriptor room), on this attachment.
    #[serde(default)]
    pub dns_dropped: u64,
    /// The plane's egress routes and their health (docs/EGRESS.md).
    #[serde(default)]
    pub routes: Vec<RouteReport>,
    /// The plane process's open file descriptors now (0: not read).
    #[serde(default)]
    pub open_fds: u64,
    /// The plane process's soft open-file limit (0: not read).
    #[serde(default)]
    pub max_fds: u64,
    /// The plane process's resident memory in bytes now (0: not read).
    #[serde(default)]
    pub resident_bytes: u64,
    /// CPU time (user and system) the plane process used, in microseconds,
    /// on this attachment (like the refusal counts: only grows within one).
    #[serde(default)]
    pub cpu_micros: u64,
}

/// What a device plane's SOCKS5 UDP relays counted (see [`DeviceReport::udp`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpCounts {
    /// Associations opened (adopted ones not counted).
    pub opened: u64,
    /// Datagrams dropped for a fragment number other than 0.
    pub fragment: u64,
    /// Datagrams dropped for a header that does not parse.
    pub bad_header: u64,
    /// Datagrams to (or from) an address the egress policy refuses, or to
    /// a name with no permitted address.
    pub denied: u64,
    /// Datagrams sent to a relay from an address not the customer's.
    pub foreign: u64,
    /// Datagrams over their client's rate limit.
    pub rate_limited: u64,
    /// Datagrams the kernel refused to send, either way (a destination
    /// port 0, an unreachable network, a firewall's reject). Absent (an
    /// older plane): 0.
    #[serde(default)]
    pub send_failed: u64,
    /// UDP ASSOCIATE requests refused at `limits.udp_associations_per_client`.
    /// Absent (an older plane): 0.
    #[serde(default)]
    pub refused_at_cap: u64,
}

impl UdpCounts {
    /// What was counted since `before`.
    pub fn since(self, before: UdpCounts) -> UdpCounts {
        UdpCounts {
            opened: self.opened.saturating_sub(before.opened),
            fragment: self.fragment.saturating_sub(before.fragment),
            bad_header: self.bad_header.saturating_sub(before.bad_header),
            denied: self.denied.saturating_sub(before.denied),
            foreign: self.foreign.saturating_sub(before.foreign),
            rate_limited: self.rate_limited.saturating_sub(before.rate_limited),
            send_failed: self.send_failed.saturating_sub(before.send_failed),
            refused_at_cap: self.refused_at_cap.saturating_sub(before.refused_at_cap),
        }
    }
}

/// WireGuard inner packets a device plane dropped (see
/// [`DeviceReport::wg_packets`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WgPacketCounts {
    /// Refused by the egress policy, or held back from leaving directly
    /// while the steering map does not yet send their client to an exit.
    pub denied: u64,
    /// Over their client's rate limit or quota.
    pub limited: u64,
    /// Lost on the way to or from the TUN device or an exit: no queue, a
    /// full writer queue, a write error.
    pub lost: u64,
}

impl WgPacketCounts {
    /// What was counted since `before`.
    pub fn since(self, before: WgPacketCounts) -> WgPacketCounts {
        WgPacketCounts {
            denied: self.denied.saturating_sub(before.denied),
            limited: self.limited.saturating_sub(before.limited),
            lost: self.lost.saturating_sub(before.lost),
        }
    }
}

/// One egress route as a device plane sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteReport {
    /// `direct` or the upstream's name.
    pub name: String,
    /// `direct` or `socks5`.
    pub kind: String,
    /// Whether it is up.
    pub up: bool,
    /// Smoothed latency of its probes and connects, in microseconds.
    pub latency_us: Option<u64>,
    /// Why it is down, while it is.
    pub error: Option<String>,
    /// Clients whose window holds it, first or not.
    pub clients: u64,
    /// Tunnels opened through it since the plane started.
    pub opened: u64,
    /// Times it went down since the plane started.
    pub downs: u64,
}

/// Which customer-facing listener accepted a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// The SOCKS5 listener.
    Socks,
    /// The HTTP proxy listener.
    Http,
    /// The HTTPS proxy listener: the ingress terminated TLS and hands over
    /// one end of a Unix stream socket pair carrying the plaintext
    /// (docs/ARCHITECTURE.md, "HTTPS proxy"). Served as [`ListenerKind::Http`].
    Https,
}

impl ListenerKind {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            ListenerKind::Socks => 1,
            ListenerKind::Http => 2,
            ListenerKind::Https => 3,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(ListenerKind::Socks),
            2 => Some(ListenerKind::Http),
            3 => Some(ListenerKind::Https),
            _ => None,
        }
    }
}

/// Payload of [`Accepted`] (binary). One fd travels with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The listener that accepted the connection.
    pub listener: ListenerKind,
    /// The ingress's number for this connection, for logs on both sides.
    pub connection_id: u64,
    /// The customer's address.
    pub peer: SocketAddr,
    /// The local address the customer connected to.
    pub local: SocketAddr,
}

pub(crate) const T_HELLO: u8 = 1;
pub(crate) const T_WELCOME: u8 = 2;
pub(crate) const T_REFUSED: u8 = 3;
pub(crate) const T_ACCEPTED: u8 = 4;
pub(crate) const T_PACKETS: u8 = 5;
pub(crate) const T_READY: u8 = 6;
pub(crate) const T_ACTIVATE: u8 = 7;
pub(crate) const T_DRAIN: u8 = 8;
pub(crate) const T_DRAINED: u8 = 9;
pub(crate) const T_GOAWAY: u8 = 10;
pub(crate) const T_REPORT: u8 = 11;
pub(crate) const T_MIGRATE: u8 = 12;
pub(crate) const T_MIGRATE_DONE: u8 = 13;
pub(crate) const T_PEERS: u8 = 14;
pub(crate) const T_TUN_QUEUES: u8 = 15;
pub(crate) const T_ENDPOINTS: u8 = 16;
pub(crate) const T_HANDOFF_HELLO: u8 = 17;
pub(crate) const T_HANDOFF_OFFER: u8 = 18;
pub(crate) const T_HANDOFF_SERVING: u8 = 19;
pub(crate) const T_SYNC_CLIENTS: u8 = 20;
pub(crate) const T_SYNCED: u8 = 21;
pub(crate) const T_EXIT_QUEUES: u8 = 22;
pub(crate) const T_HANDOFF_PROGRESS: u8 = 23;
pub(crate) const T_ACCEPTED_MANY: u8 = 24;
pub(crate) const T_HANDOFF_STOPPING: u8 = 25;
pub(crate) const T_MIGRATE_NOT_TAKEN: u8 = 26;

/// Most connections one [`AcceptedMany`](super::ToDevice::AcceptedMany)
/// carries: their fds fit the channel's ancillary buffer with room to spare,
/// and the first of a burst never waits long behind the rest.
pub const MAX_ACCEPTED_MANY: usize = 32;

/// The name of a known message type, or None.
pub(crate) fn type_name(byte: u8) -> Option<&'static str> {
    Some(match byte {
        T_HELLO => "Hello",
        T_WELCOME => "Welcome",
        T_REFUSED => "Refused",
        T_ACCEPTED => "Accepted",
        T_PACKETS => "Packets",
        T_READY => "Ready",
        T_ACTIVATE => "Activate",
        T_DRAIN => "Drain",
        T_DRAINED => "Drained",
        T_GOAWAY => "Goaway",
        T_REPORT => "Report",
        T_MIGRATE => "Migrate",
        T_MIGRATE_DONE => "MigrateDone",
        T_PEERS => "Peers",
        T_TUN_QUEUES => "TunQueues",
        T_ENDPOINTS => "Endpoints",
        T_HANDOFF_HELLO => "HandoffHello",
        T_HANDOFF_OFFER => "HandoffOffer",
        T_HANDOFF_SERVING => "HandoffServing",
        T_SYNC_CLIENTS => "SyncClients",
        T_SYNCED => "Synced",
        T_EXIT_QUEUES => "ExitQueues",
        T_HANDOFF_PROGRESS => "HandoffProgress",
        T_ACCEPTED_MANY => "AcceptedMany",
        T_HANDOFF_STOPPING => "HandoffStopping",
        T_MIGRATE_NOT_TAKEN => "MigrateNotTaken",
        _ => return None,
    })
}

pub(crate) fn put_json<T: Serialize>(out: &mut Vec<u8>, body: &T) {
    // Serializing these plain structs to a Vec cannot fail: no maps with
    // non-string keys, no I/O.
    if let Err(error) = serde_json::to_writer(&mut *out, body) {
        debug_assert!(false, "serializing a channel message failed: {error}");
    }
}

pub(crate) fn malformed(message: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError::Malformed {
        message,
        reason: reason.into(),
    }
}

/// Longest reason a malformed JSON payload's error carries.
const MAX_REASON: usize = 200;

pub(crate) fn json<T: serde::de::DeserializeOwned>(
    name: &'static str,
    payload: &[u8],
) -> Result<T, DecodeError> {
    serde_json::from_slice(payload).map_err(|error| {
        // serde quotes the peer's bytes in its message: bound what reaches logs.
        let mut reason = error.to_string();
        if reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
            reason.push_str("...");
        }
        malformed(name, reason)
    })
}

pub(crate) fn accepted(payload: &[u8]) -> Result<Accepted, DecodeError> {
    const NAME: &str = "Accepted";
    let mut reader = Reader::new(payload);
    let accepted = read_accepted(NAME, &mut reader)?;
    if !reader.is_empty() {
        return Err(malformed(NAME, "trailing bytes after the addresses"));
    }
    Ok(accepted)
}

/// The shortest `Accepted` payload: kind, id and two IPv4 socket addresses.
const ACCEPTED_MIN_LEN: usize = 1 + 8 + 7 + 7;

/// An `AcceptedMany` payload: a count (1 to [`MAX_ACCEPTED_MANY`]), then
/// that many `Accepted` payloads back to back (each ends where its second
/// address does).
pub(crate) fn accepted_many(payload: &[u8]) -> Result<Vec<Accepted>, DecodeError> {
    const NAME: &str = "AcceptedMany";
    let mut reader = Reader::new(payload);
    let count = usize::from(reader.u8().map_err(truncated(NAME))?);
    if count == 0 || count > MAX_ACCEPTED_MANY {
        return Err(malformed(
            NAME,
            format!("{count} connections (1 to {MAX_ACCEPTED_MANY})"),
        ));
    }
    // Room for what the payload can hold, not what the count claims.
    let mut all = Vec::with_capacity(count.min(payload.len() / ACCEPTED_MIN_LEN));
    for _ in 0..count {
        all.push(read_accepted(NAME, &mut reader)?);
    }
    if !reader.is_empty() {
        return Err(malformed(NAME, "trailing bytes after the last connection"));
    }
    Ok(all)
}

fn read_accepted(name: &'static str, reader: &mut Reader<'_>) -> Result<Accepted, DecodeError> {
    let kind_byte = reader.u8().map_err(truncated(name))?;
    let listener = ListenerKind::from_byte(kind_byte)
        .ok_or_else(|| malformed(name, format!("unknown listener kind {kind_byte}")))?;
    let connection_id = reader.u64().map_err(truncated(name))?;
    let peer = reader
        .socket_addr()
        .map_err(truncated(name))?
        .ok_or_else(|| malformed(name, "unknown address family for peer"))?;
    let local = reader
        .socket_addr()
        .map_err(truncated(name))?
        .ok_or_else(|| malformed(name, "unknown address family for local"))?;
    Ok(Accepted {
        listener,
        connection_id,
        peer,
        local,
    })
}

/// Encodes an `AcceptedMany` payload; `all` holds 1 to
/// [`MAX_ACCEPTED_MANY`] connections (the sender's contract: more would be
/// refused by the receiver).
pub(crate) fn encode_accepted_many(all: &[Accepted], out: &mut Vec<u8>) {
    debug_assert!((1..=MAX_ACCEPTED_MANY).contains(&all.len()));
    out.push(all.len() as u8);
    for accepted in all {
        encode_accepted(accepted, out);
    }
}

pub(crate) fn encode_accepted(accepted: &Accepted, out: &mut Vec<u8>) {
    out.push(accepted.listener.to_byte());
    out.extend_from_slice(&accepted.connection_id.to_be_bytes());
    put_socket_addr(out, accepted.peer);
    put_socket_addr(out, accepted.local);
}

pub(crate) fn drain(payload: &[u8]) -> Result<DrainOrder, DecodeError> {
    match payload {
        [0] => Ok(DrainOrder { handover: false }),
        [1] => Ok(DrainOrder { handover: true }),
        _ => Err(malformed("Drain", "expected one byte, 0 or 1")),
    }
}

pub(crate) fn migrate_done(payload: &[u8]) -> Result<u64, DecodeError> {
    migrate_id("MigrateDone", payload)
}

/// The payload of a message that is one connection id.
pub(crate) fn migrate_id(name: &'static str, payload: &[u8]) -> Result<u64, DecodeError> {
    let mut reader = Reader::new(payload);
    let id = reader.u64().map_err(truncated(name))?;
    if !reader.is_empty() {
        return Err(malformed(name, "trailing bytes"));
    }
    Ok(id)
}

pub(crate) fn tun_queues(payload: &[u8]) -> Result<u8, DecodeError> {
    match payload {
        [count] if *count > 0 && usize::from(*count) <= super::MAX_FDS_PER_FRAME => Ok(*count),
        _ => Err(malformed("TunQueues", "expected one byte, 1 to 252")),
    }
}

/// Checks that a message without a payload has none.
pub(crate) fn empty(message_type: u8, payload: &[u8]) -> Result<(), DecodeError> {
    if payload.is_empty() {
        Ok(())
    } else {
        Err(malformed(
            type_name(message_type).unwrap_or("?"),
            "expected an empty payload",
        ))
    }
}

pub(crate) fn handoff_offer(payload: &[u8]) -> Result<HandoffOffer, DecodeError> {
    const NAME: &str = "HandoffOffer";
    let offer: HandoffOffer = json(NAME, payload)?;
    if offer.sockets.len() > super::MAX_FDS_PER_FRAME {
        return Err(malformed(NAME, "more sockets than a frame can carry"));
    }
    Ok(offer)
}

/// The error for a type byte that `conversation` does not carry: unknown
/// altogether, or known but sent the wrong way.
pub(crate) fn not_carried(message_type: u8, conversation: &'static str) -> DecodeError {
    match type_name(message_type) {
        Some(message) => DecodeError::NotInConversation {
            message,
            conversation,
        },
        None => DecodeError::UnknownType(message_type),
    }
}
