//! The messages of the device channel and their payload layouts.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::cursor::{put_socket_addr, Reader};
use super::endpoints::{self, EndpointPart};
use super::migrate::{self, Migrate};
use super::peers::{self, PeerUpdate};
use super::{truncated, DecodeError, MAX_PAYLOAD};

/// One device-channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Device plane to ingress, first message after connecting.
    Hello(Hello),
    /// Ingress to device plane: the Hello was accepted; the plane is Standby.
    Welcome(Welcome),
    /// Ingress to device plane: the Hello was refused; the connection closes.
    Refused(Refused),
    /// Ingress to device plane: a customer connection, its fd beside the frame.
    Accepted(Accepted),
    /// Either way: a batch of inner IP packets. Ingress to device plane: all
    /// from one WireGuard peer (its index). Device plane to ingress: peer 0,
    /// each packet routed by its inner destination address.
    Packets(Packets),
    /// Device plane to ingress: the WireGuard peer set or a change to it.
    Peers(PeerUpdate),
    /// Either way: `.0` queues of the TUN device, their fds beside the frame.
    /// A plane handing over sends its queues to the ingress, which passes them
    /// to the active plane: the queues are never closed or detached, so the
    /// kernel drops none of the packets waiting in them.
    TunQueues(u8),
    /// Either way: part of a snapshot of WireGuard peers' endpoints. Ingress to
    /// the active device plane: keep it in the store. Device plane to an ingress
    /// that asked in Welcome: the last one kept.
    Endpoints(EndpointPart),
    /// Successor ingress to its predecessor, on handoff.sock: take me over.
    HandoffHello(Hello),
    /// Predecessor to successor: every listening socket, their fds beside the
    /// frame in the order listed; the peer set (`Peers`) and an endpoint
    /// snapshot (`Endpoints`) follow.
    HandoffOffer(HandoffOffer),
    /// Successor to predecessor: serving on the sockets now; stop accepting,
    /// send device planes Goaway, and exit once your sessions are idle.
    HandoffServing,
    /// Device plane to ingress: warm-up done, able to take traffic.
    Ready,
    /// Ingress to device plane: you are the active plane now.
    Activate,
    /// Ingress to device plane: you get no new work; hand what you hold to
    /// the successor (`handover`) or finish it within the grace. Nothing the
    /// ingress sent before it is left unread. Device plane to ingress (on
    /// SIGTERM): please drain me; the ingress answers with its own Drain.
    Drain(DrainOrder),
    /// Either way: one customer connection moving to another device plane,
    /// through the ingress, its fds beside the frame.
    Migrate(Migrate),
    /// The successor took over connection `.0`: successor to ingress, then
    /// ingress to the plane it came from (which only then lets the next one go).
    MigrateDone(u64),
    /// Device plane to ingress: the drain is over; the plane exits.
    Drained(Drained),
    /// Ingress to device plane: this ingress is handing off; reconnect.
    Goaway,
    /// Device plane to ingress: periodic figures for status and metrics.
    Report(DeviceReport),
}

/// Payload of [`Message::Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The device plane's process id.
    pub pid: u32,
    /// The device plane's software version (for status and logs).
    pub software: String,
}

/// Payload of [`Message::Welcome`].
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
}

/// One listening socket in a [`HandoffOffer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedSocket {
    /// What it is: `socks`, `http`, `status`, `device`, `control`, `handoff`,
    /// `wg0`, `wg1` (the two members of the WireGuard reuseport group).
    pub name: String,
    /// Its address (`ip:port`, or a Unix socket path), to compare with the
    /// successor's configuration.
    pub address: String,
}

/// Payload of [`Message::HandoffOffer`].
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
    /// Connections handed to device planes.
    pub handed: u64,
    /// Tunnels migrated between device planes.
    pub migrated: u64,
    /// Ingress handoffs before this one.
    pub handoffs: u64,
}

/// Payload of [`Message::Refused`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// Payload of [`Message::Drain`] (one byte).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainOrder {
    /// True: a successor is active; migrate every connection that can move.
    /// False: no successor; finish connections within the grace.
    pub handover: bool,
}

/// Payload of [`Message::Drained`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drained {
    /// Connections handed to a successor.
    pub migrated: u64,
    /// Connections that finished in this plane.
    pub finished: u64,
    /// Connections closed at the grace deadline.
    pub cut: u64,
}

/// Payload of [`Message::Report`].
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
}

/// Which customer-facing listener accepted a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// The SOCKS5 listener.
    Socks,
    /// The HTTP proxy listener.
    Http,
}

impl ListenerKind {
    fn to_byte(self) -> u8 {
        match self {
            ListenerKind::Socks => 1,
            ListenerKind::Http => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(ListenerKind::Socks),
            2 => Some(ListenerKind::Http),
            _ => None,
        }
    }
}

/// Payload of [`Message::Accepted`] (binary). One fd travels with it.
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

/// Payload of [`Message::Packets`] (binary): `peer u32, count u16,
/// count × (len u16, bytes)`. Built with [`Packets::try_push`], which keeps
/// the encoded frame within [`MAX_PAYLOAD`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packets {
    peer: u32,
    packets: Vec<Vec<u8>>,
    encoded_len: usize,
}

const PACKETS_FIXED: usize = 4 + 2;

impl Packets {
    /// An empty batch for one WireGuard peer.
    pub fn new(peer: u32) -> Self {
        Self {
            peer,
            packets: Vec::new(),
            encoded_len: PACKETS_FIXED,
        }
    }

    /// Adds a packet if it fits; returns false (and adds nothing) when the
    /// batch is full or the packet is empty or longer than 65535 bytes.
    pub fn try_push(&mut self, packet: &[u8]) -> bool {
        let grown = self.encoded_len + 2 + packet.len();
        if packet.is_empty()
            || packet.len() > usize::from(u16::MAX)
            || grown > MAX_PAYLOAD
            || self.packets.len() == usize::from(u16::MAX)
        {
            return false;
        }
        self.packets.push(packet.to_vec());
        self.encoded_len = grown;
        true
    }

    /// The WireGuard peer these packets belong to.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The inner packets, in order.
    pub fn packets(&self) -> &[Vec<u8>] {
        &self.packets
    }

    /// True when the batch holds no packet.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }
}

const T_HELLO: u8 = 1;
const T_WELCOME: u8 = 2;
const T_REFUSED: u8 = 3;
const T_ACCEPTED: u8 = 4;
const T_PACKETS: u8 = 5;
const T_READY: u8 = 6;
const T_ACTIVATE: u8 = 7;
const T_DRAIN: u8 = 8;
const T_DRAINED: u8 = 9;
const T_GOAWAY: u8 = 10;
const T_REPORT: u8 = 11;
pub(crate) const T_MIGRATE: u8 = 12;
const T_MIGRATE_DONE: u8 = 13;
const T_PEERS: u8 = 14;
const T_TUN_QUEUES: u8 = 15;
const T_ENDPOINTS: u8 = 16;
const T_HANDOFF_HELLO: u8 = 17;
const T_HANDOFF_OFFER: u8 = 18;
const T_HANDOFF_SERVING: u8 = 19;

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
        _ => return None,
    })
}

impl Message {
    pub(crate) fn type_byte(&self) -> u8 {
        match self {
            Message::Hello(_) => T_HELLO,
            Message::Welcome(_) => T_WELCOME,
            Message::Refused(_) => T_REFUSED,
            Message::Accepted(_) => T_ACCEPTED,
            Message::Packets(_) => T_PACKETS,
            Message::Ready => T_READY,
            Message::Activate => T_ACTIVATE,
            Message::Drain(_) => T_DRAIN,
            Message::Migrate(_) => T_MIGRATE,
            Message::MigrateDone(_) => T_MIGRATE_DONE,
            Message::Drained(_) => T_DRAINED,
            Message::Goaway => T_GOAWAY,
            Message::Report(_) => T_REPORT,
            Message::Peers(_) => T_PEERS,
            Message::TunQueues(_) => T_TUN_QUEUES,
            Message::Endpoints(_) => T_ENDPOINTS,
            Message::HandoffHello(_) => T_HANDOFF_HELLO,
            Message::HandoffOffer(_) => T_HANDOFF_OFFER,
            Message::HandoffServing => T_HANDOFF_SERVING,
        }
    }

    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        type_name(self.type_byte()).unwrap_or("?")
    }

    /// How many file descriptors must travel beside this message.
    pub fn fd_count(&self) -> usize {
        match self {
            Message::Accepted(_) => 1,
            Message::Migrate(migrate) => migrate.fd_count(),
            Message::TunQueues(count) => usize::from(*count),
            Message::HandoffOffer(offer) => offer.sockets.len(),
            _ => 0,
        }
    }
}

pub(crate) fn encode_payload(message: &Message, out: &mut Vec<u8>) {
    match message {
        Message::Hello(body) => put_json(out, body),
        Message::Welcome(body) => put_json(out, body),
        Message::Refused(body) => put_json(out, body),
        Message::Drained(body) => put_json(out, body),
        Message::Report(body) => put_json(out, body),
        Message::HandoffHello(body) => put_json(out, body),
        Message::HandoffOffer(body) => put_json(out, body),
        Message::Accepted(accepted) => {
            out.push(accepted.listener.to_byte());
            out.extend_from_slice(&accepted.connection_id.to_be_bytes());
            put_socket_addr(out, accepted.peer);
            put_socket_addr(out, accepted.local);
        }
        Message::Packets(batch) => {
            out.extend_from_slice(&batch.peer.to_be_bytes());
            out.extend_from_slice(&(batch.packets.len() as u16).to_be_bytes());
            for packet in &batch.packets {
                out.extend_from_slice(&(packet.len() as u16).to_be_bytes());
                out.extend_from_slice(packet);
            }
        }
        Message::Drain(order) => out.push(u8::from(order.handover)),
        Message::Migrate(body) => migrate::encode(body, out),
        Message::MigrateDone(id) => out.extend_from_slice(&id.to_be_bytes()),
        Message::Peers(update) => peers::encode(update, out),
        Message::TunQueues(count) => out.push(*count),
        Message::Endpoints(part) => endpoints::encode(part, out),
        Message::Ready | Message::Activate | Message::Goaway | Message::HandoffServing => {}
    }
}

fn put_json<T: Serialize>(out: &mut Vec<u8>, body: &T) {
    // Serializing these plain structs to a Vec cannot fail: no maps with
    // non-string keys, no I/O.
    if let Err(error) = serde_json::to_writer(&mut *out, body) {
        debug_assert!(false, "serializing a channel message failed: {error}");
    }
}

pub(crate) fn decode_payload(message_type: u8, payload: &[u8]) -> Result<Message, DecodeError> {
    let name = type_name(message_type).ok_or(DecodeError::UnknownType(message_type))?;
    let message = match message_type {
        T_HELLO => Message::Hello(json(name, payload)?),
        T_WELCOME => Message::Welcome(json(name, payload)?),
        T_REFUSED => Message::Refused(json(name, payload)?),
        T_DRAINED => Message::Drained(json(name, payload)?),
        T_REPORT => Message::Report(json(name, payload)?),
        T_HANDOFF_HELLO => Message::HandoffHello(json(name, payload)?),
        T_HANDOFF_OFFER => {
            let offer: HandoffOffer = json(name, payload)?;
            if offer.sockets.len() > super::MAX_FDS_PER_FRAME {
                return Err(malformed(name, "more sockets than a frame can carry"));
            }
            Message::HandoffOffer(offer)
        }
        T_ACCEPTED => Message::Accepted(accepted(payload)?),
        T_PACKETS => Message::Packets(packets(payload)?),
        T_MIGRATE => Message::Migrate(migrate::decode(payload)?),
        T_PEERS => Message::Peers(peers::decode(payload)?),
        T_ENDPOINTS => Message::Endpoints(endpoints::decode(payload)?),
        T_TUN_QUEUES => match payload {
            [count] if *count > 0 && usize::from(*count) <= super::MAX_FDS_PER_FRAME => {
                Message::TunQueues(*count)
            }
            _ => return Err(malformed(name, "expected one byte, 1 to 252")),
        },
        T_MIGRATE_DONE => {
            let mut reader = Reader::new(payload);
            let id = reader.u64().map_err(truncated(name))?;
            if !reader.is_empty() {
                return Err(malformed(name, "trailing bytes"));
            }
            Message::MigrateDone(id)
        }
        T_DRAIN => match payload {
            [0] => Message::Drain(DrainOrder { handover: false }),
            [1] => Message::Drain(DrainOrder { handover: true }),
            _ => return Err(malformed(name, "expected one byte, 0 or 1")),
        },
        T_READY | T_ACTIVATE | T_GOAWAY | T_HANDOFF_SERVING => {
            if !payload.is_empty() {
                return Err(malformed(name, "expected an empty payload"));
            }
            match message_type {
                T_READY => Message::Ready,
                T_ACTIVATE => Message::Activate,
                T_HANDOFF_SERVING => Message::HandoffServing,
                _ => Message::Goaway,
            }
        }
        _ => return Err(DecodeError::UnknownType(message_type)),
    };
    Ok(message)
}

fn malformed(message: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError::Malformed {
        message,
        reason: reason.into(),
    }
}

fn json<T: serde::de::DeserializeOwned>(
    name: &'static str,
    payload: &[u8],
) -> Result<T, DecodeError> {
    serde_json::from_slice(payload).map_err(|error| malformed(name, error.to_string()))
}

fn accepted(payload: &[u8]) -> Result<Accepted, DecodeError> {
    const NAME: &str = "Accepted";
    let mut reader = Reader::new(payload);
    let kind_byte = reader.u8().map_err(truncated(NAME))?;
    let listener = ListenerKind::from_byte(kind_byte)
        .ok_or_else(|| malformed(NAME, format!("unknown listener kind {kind_byte}")))?;
    let connection_id = reader.u64().map_err(truncated(NAME))?;
    let peer = reader
        .socket_addr()
        .map_err(truncated(NAME))?
        .ok_or_else(|| malformed(NAME, "unknown address family for peer"))?;
    let local = reader
        .socket_addr()
        .map_err(truncated(NAME))?
        .ok_or_else(|| malformed(NAME, "unknown address family for local"))?;
    if !reader.is_empty() {
        return Err(malformed(NAME, "trailing bytes after the addresses"));
    }
    Ok(Accepted {
        listener,
        connection_id,
        peer,
        local,
    })
}

fn packets(payload: &[u8]) -> Result<Packets, DecodeError> {
    const NAME: &str = "Packets";
    let mut reader = Reader::new(payload);
    let peer = reader.u32().map_err(truncated(NAME))?;
    let count = reader.u16().map_err(truncated(NAME))?;
    let mut batch = Packets::new(peer);
    // Each packet needs at least 3 bytes (length + one byte): bound the
    // allocation by what the payload can hold, not by what it claims.
    batch
        .packets
        .reserve(usize::from(count).min(payload.len() / 3));
    for _ in 0..count {
        let len = usize::from(reader.u16().map_err(truncated(NAME))?);
        if len == 0 {
            return Err(malformed(NAME, "empty packet"));
        }
        let packet = reader.take(len).map_err(truncated(NAME))?;
        batch.packets.push(packet.to_vec());
        batch.encoded_len += 2 + len;
    }
    if !reader.is_empty() {
        return Err(malformed(NAME, "trailing bytes after the last packet"));
    }
    Ok(batch)
}
