//! The channel's three conversations, one message type each, over one
//! framing: what the ingress says to a device plane ([`ToDevice`]), what a
//! device plane says to the ingress ([`ToIngress`]), and what two ingresses
//! say on `handoff.sock` ([`Handoff`]). A message a side may not send is not
//! a variant of its type; a frame of such a type is refused on receipt
//! ([`DecodeError::NotInConversation`]). The type bytes are shared, so the
//! same message has the same byte in every conversation that carries it.

use super::endpoints::{self, EndpointPart};
use super::exits::{self, ExitQueues};
use super::handoff::HandoffOffer;
use super::migrate::{self, Migrate};
use super::packets::Packets;
use super::payloads::{self as p, *};
use super::peers::{self, PeerUpdate};
use super::progress::{self, HandoffProgress};
use super::sync::{self, SyncClients, Synced};
use super::DecodeError;

/// One direction of the channel: the messages it carries, and their codec.
pub trait Conversation<'a>: Sized {
    /// The conversation's name, for errors ("ingress to device plane").
    const NAME: &'static str;
    /// The message's type byte.
    fn type_byte(&self) -> u8;
    /// How many file descriptors must travel beside this message.
    fn fd_count(&self) -> usize;
    /// Appends the message's payload to `out`.
    fn encode_payload(&self, out: &mut Vec<u8>);
    /// The payload's length when it is large and known in advance (a batch
    /// of packets), so the frame is allocated once; 0: small, or unknown.
    fn payload_len_hint(&self) -> usize {
        0
    }
    /// Decodes the payload of a `message_type` frame, borrowing from it
    /// where the message allows ([`Packets`]).
    fn decode_payload(message_type: u8, payload: &'a [u8]) -> Result<Self, DecodeError>;
    /// The message's name, for logs.
    fn name(&self) -> &'static str {
        type_name(self.type_byte()).unwrap_or("?")
    }
}

/// Ingress to device plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToDevice<'a> {
    /// The Hello was accepted; the plane is Standby.
    Welcome(Welcome),
    /// The Hello was refused; the channel closes.
    Refused(Refused),
    /// A customer connection, its fd beside the frame.
    Accepted(Accepted),
    /// Several customer connections accepted in one burst, their fds beside
    /// the frame in the same order; sent only to a plane that said
    /// `accepts_many` in its [`Hello`].
    AcceptedMany(Vec<Accepted>),
    /// Inner IP packets of one WireGuard peer (its index), borrowed from the frame.
    Packets(Packets<'a>),
    /// `.0` TUN queues from the plane that handed them over, fds beside the
    /// frame: read them from now on. They were never closed or detached, so
    /// the kernel dropped none of the packets waiting in them.
    TunQueues(u8),
    /// Part of an endpoint snapshot of WireGuard peers: keep it in the store.
    Endpoints(EndpointPart),
    /// You are the active plane now.
    Activate,
    /// You get no new work; hand what you hold to the successor (`handover`)
    /// or finish it within the grace. Nothing sent before it is left unread.
    Drain(DrainOrder),
    /// A customer connection from the draining plane, fds beside the frame.
    Migrate(Migrate),
    /// The successor took over connection `.0`: only now let the next go.
    MigrateDone(u64),
    /// The successor died without taking connection `.0` (it never
    /// confirmed it, and its process is gone): the plane that sent it still
    /// holds it and serves it on. Sent only to a plane that said
    /// `reads_not_taken` in its [`Hello`].
    MigrateNotTaken(u64),
    /// This ingress is handing off: attach to its successor.
    Goaway,
    /// Apply the client change feed through a position, then say [`Synced`].
    SyncClients(SyncClients),
    /// A WireGuard exit's UDP socket and TUN queues from the plane that
    /// handed them over, fds beside the frame: run the exit on them.
    ExitQueues(ExitQueues),
}

/// Device plane to ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToIngress<'a> {
    /// The first message after connecting.
    Hello(Hello),
    /// Inner IP packets back toward WireGuard peers (peer 0: each packet is
    /// routed by its inner destination), borrowed from the frame.
    Packets(Packets<'a>),
    /// The WireGuard peer set or a change to it.
    Peers(PeerUpdate),
    /// This (draining) plane's TUN queues, for the active plane.
    TunQueues(u8),
    /// Part of the last endpoint snapshot, for an ingress that asked in Welcome.
    Endpoints(EndpointPart),
    /// Warm-up done, able to take traffic.
    Ready,
    /// Please drain me (SIGTERM); the ingress answers with its own Drain.
    Drain(DrainOrder),
    /// A customer connection moving to the successor, fds beside the frame.
    Migrate(Migrate),
    /// This plane (the successor) took over connection `.0`.
    MigrateDone(u64),
    /// The drain is over; the plane exits.
    Drained(Drained),
    /// Periodic figures for status and metrics (boxed: the largest payload
    /// by far, and sent once a second, so the enum stays small for packets).
    Report(Box<DeviceReport>),
    /// The answer to [`ToDevice::SyncClients`].
    Synced(Synced),
    /// This (draining) plane's descriptors of one WireGuard exit, for the
    /// active plane; sent before its [`ToIngress::TunQueues`].
    ExitQueues(ExitQueues),
}

/// Between two ingresses on `handoff.sock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// Successor to predecessor: take me over.
    Hello(Hello),
    /// Predecessor to successor: no (another uid, already beside a predecessor).
    Refused(Refused),
    /// Predecessor to successor: every listening socket, fds beside the frame
    /// in the order listed; the peer set and an endpoint snapshot follow.
    Offer(HandoffOffer),
    /// Predecessor to successor: the WireGuard peer set.
    Peers(PeerUpdate),
    /// Predecessor to successor: the WireGuard endpoints.
    Endpoints(EndpointPart),
    /// Successor to predecessor: serving on the sockets now; stop accepting,
    /// send device planes Goaway, and exit once your sessions are idle.
    Serving,
    /// Successor to predecessor, while both serve: peers that moved and
    /// device planes that attached since the last one.
    Progress(HandoffProgress),
    /// Successor to predecessor, while both serve: a stop was asked of the
    /// successor (SIGTERM, `blipless-ctl drain`); it drains the node and
    /// removes the socket files, so the predecessor exits rather than serve
    /// again when the connection closes.
    Stopping,
}

impl<'a> Conversation<'a> for ToDevice<'a> {
    const NAME: &'static str = "ingress to device plane";

    fn type_byte(&self) -> u8 {
        match self {
            ToDevice::Welcome(_) => T_WELCOME,
            ToDevice::Refused(_) => T_REFUSED,
            ToDevice::Accepted(_) => T_ACCEPTED,
            ToDevice::AcceptedMany(_) => T_ACCEPTED_MANY,
            ToDevice::Packets(_) => T_PACKETS,
            ToDevice::TunQueues(_) => T_TUN_QUEUES,
            ToDevice::Endpoints(_) => T_ENDPOINTS,
            ToDevice::Activate => T_ACTIVATE,
            ToDevice::Drain(_) => T_DRAIN,
            ToDevice::Migrate(_) => T_MIGRATE,
            ToDevice::MigrateDone(_) => T_MIGRATE_DONE,
            ToDevice::MigrateNotTaken(_) => T_MIGRATE_NOT_TAKEN,
            ToDevice::Goaway => T_GOAWAY,
            ToDevice::SyncClients(_) => T_SYNC_CLIENTS,
            ToDevice::ExitQueues(_) => T_EXIT_QUEUES,
        }
    }

    fn fd_count(&self) -> usize {
        match self {
            ToDevice::Accepted(_) => 1,
            ToDevice::AcceptedMany(all) => all.len(),
            ToDevice::Migrate(migrate) => migrate.fd_count(),
            ToDevice::TunQueues(count) => usize::from(*count),
            ToDevice::ExitQueues(exit) => exit.fd_count(),
            _ => 0,
        }
    }

    fn payload_len_hint(&self) -> usize {
        match self {
            ToDevice::Packets(batch) => batch.encoded_len(),
            _ => 0,
        }
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            ToDevice::Welcome(body) => put_json(out, body),
            ToDevice::Refused(body) => put_json(out, body),
            ToDevice::Accepted(accepted) => encode_accepted(accepted, out),
            ToDevice::AcceptedMany(all) => encode_accepted_many(all, out),
            ToDevice::Packets(batch) => batch.encode(out),
            ToDevice::TunQueues(count) => out.push(*count),
            ToDevice::Endpoints(part) => endpoints::encode(part, out),
            ToDevice::Drain(order) => out.push(u8::from(order.handover)),
            ToDevice::Migrate(body) => migrate::encode(body, out),
            ToDevice::MigrateDone(id) | ToDevice::MigrateNotTaken(id) => {
                out.extend_from_slice(&id.to_be_bytes());
            }
            ToDevice::SyncClients(s) => sync::encode(s.token, s.through, out),
            ToDevice::ExitQueues(exit) => exits::encode(exit, out),
            ToDevice::Activate | ToDevice::Goaway => {}
        }
    }

    fn decode_payload(message_type: u8, payload: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match message_type {
            T_WELCOME => ToDevice::Welcome(json("Welcome", payload)?),
            T_REFUSED => ToDevice::Refused(json("Refused", payload)?),
            T_ACCEPTED => ToDevice::Accepted(p::accepted(payload)?),
            T_ACCEPTED_MANY => ToDevice::AcceptedMany(p::accepted_many(payload)?),
            T_PACKETS => ToDevice::Packets(Packets::decode(payload)?),
            T_TUN_QUEUES => ToDevice::TunQueues(tun_queues(payload)?),
            T_ENDPOINTS => ToDevice::Endpoints(endpoints::decode(payload)?),
            T_ACTIVATE => {
                empty(message_type, payload)?;
                ToDevice::Activate
            }
            T_DRAIN => ToDevice::Drain(drain(payload)?),
            T_MIGRATE => ToDevice::Migrate(migrate::decode(payload)?),
            T_MIGRATE_DONE => ToDevice::MigrateDone(migrate_done(payload)?),
            T_MIGRATE_NOT_TAKEN => {
                ToDevice::MigrateNotTaken(migrate_id("MigrateNotTaken", payload)?)
            }
            T_GOAWAY => {
                empty(message_type, payload)?;
                ToDevice::Goaway
            }
            T_SYNC_CLIENTS => {
                let (token, through) = sync::decode("SyncClients", payload)?;
                ToDevice::SyncClients(SyncClients { token, through })
            }
            T_EXIT_QUEUES => ToDevice::ExitQueues(exits::decode(payload)?),
            other => return Err(not_carried(other, Self::NAME)),
        })
    }
}

impl<'a> Conversation<'a> for ToIngress<'a> {
    const NAME: &'static str = "device plane to ingress";

    fn type_byte(&self) -> u8 {
        match self {
            ToIngress::Hello(_) => T_HELLO,
            ToIngress::Packets(_) => T_PACKETS,
            ToIngress::Peers(_) => T_PEERS,
            ToIngress::TunQueues(_) => T_TUN_QUEUES,
            ToIngress::Endpoints(_) => T_ENDPOINTS,
            ToIngress::Ready => T_READY,
            ToIngress::Drain(_) => T_DRAIN,
            ToIngress::Migrate(_) => T_MIGRATE,
            ToIngress::MigrateDone(_) => T_MIGRATE_DONE,
            ToIngress::Drained(_) => T_DRAINED,
            ToIngress::Report(_) => T_REPORT,
            ToIngress::Synced(_) => T_SYNCED,
            ToIngress::ExitQueues(_) => T_EXIT_QUEUES,
        }
    }

    fn fd_count(&self) -> usize {
        match self {
            ToIngress::Migrate(migrate) => migrate.fd_count(),
            ToIngress::TunQueues(count) => usize::from(*count),
            ToIngress::ExitQueues(exit) => exit.fd_count(),
            _ => 0,
        }
    }

    fn payload_len_hint(&self) -> usize {
        match self {
            ToIngress::Packets(batch) => batch.encoded_len(),
            _ => 0,
        }
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            ToIngress::Hello(body) => put_json(out, body),
            ToIngress::Drained(body) => put_json(out, body),
            ToIngress::Report(body) => put_json(out, body),
            ToIngress::Packets(batch) => batch.encode(out),
            ToIngress::Peers(update) => peers::encode(update, out),
            ToIngress::TunQueues(count) => out.push(*count),
            ToIngress::Endpoints(part) => endpoints::encode(part, out),
            ToIngress::Drain(order) => out.push(u8::from(order.handover)),
            ToIngress::Migrate(body) => migrate::encode(body, out),
            ToIngress::MigrateDone(id) => out.extend_from_slice(&id.to_be_bytes()),
            ToIngress::Synced(s) => sync::encode(s.token, s.applied, out),
            ToIngress::ExitQueues(exit) => exits::encode(exit, out),
            ToIngress::Ready => {}
        }
    }

    fn decode_payload(message_type: u8, payload: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match message_type {
            T_HELLO => ToIngress::Hello(json("Hello", payload)?),
            T_DRAINED => ToIngress::Drained(json("Drained", payload)?),
            T_REPORT => ToIngress::Report(Box::new(json("Report", payload)?)),
            T_PACKETS => ToIngress::Packets(Packets::decode(payload)?),
            T_PEERS => ToIngress::Peers(peers::decode(payload)?),
            T_TUN_QUEUES => ToIngress::TunQueues(tun_queues(payload)?),
            T_ENDPOINTS => ToIngress::Endpoints(endpoints::decode(payload)?),
            T_READY => {
                empty(message_type, payload)?;
                ToIngress::Ready
            }
            T_DRAIN => ToIngress::Drain(drain(payload)?),
            T_MIGRATE => ToIngress::Migrate(migrate::decode(payload)?),
            T_MIGRATE_DONE => ToIngress::MigrateDone(migrate_done(payload)?),
            T_SYNCED => {
                let (token, applied) = sync::decode("Synced", payload)?;
                ToIngress::Synced(Synced { token, applied })
            }
            T_EXIT_QUEUES => ToIngress::ExitQueues(exits::decode(payload)?),
            other => return Err(not_carried(other, Self::NAME)),
        })
    }
}

impl<'a> Conversation<'a> for Handoff {
    const NAME: &'static str = "handoff";

    fn type_byte(&self) -> u8 {
        match self {
            Handoff::Hello(_) => T_HANDOFF_HELLO,
            Handoff::Refused(_) => T_REFUSED,
            Handoff::Offer(_) => T_HANDOFF_OFFER,
            Handoff::Peers(_) => T_PEERS,
            Handoff::Endpoints(_) => T_ENDPOINTS,
            Handoff::Serving => T_HANDOFF_SERVING,
            Handoff::Progress(_) => T_HANDOFF_PROGRESS,
            Handoff::Stopping => T_HANDOFF_STOPPING,
        }
    }

    fn fd_count(&self) -> usize {
        match self {
            Handoff::Offer(offer) => offer.sockets.len(),
            _ => 0,
        }
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Handoff::Hello(body) => put_json(out, body),
            Handoff::Refused(body) => put_json(out, body),
            Handoff::Offer(body) => put_json(out, body),
            Handoff::Peers(update) => peers::encode(update, out),
            Handoff::Endpoints(part) => endpoints::encode(part, out),
            Handoff::Serving | Handoff::Stopping => {}
            Handoff::Progress(body) => progress::encode(body, out),
        }
    }

    fn decode_payload(message_type: u8, payload: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match message_type {
            T_HANDOFF_HELLO => Handoff::Hello(json("HandoffHello", payload)?),
            T_REFUSED => Handoff::Refused(json("Refused", payload)?),
            T_HANDOFF_OFFER => Handoff::Offer(handoff_offer(payload)?),
            T_PEERS => Handoff::Peers(peers::decode(payload)?),
            T_ENDPOINTS => Handoff::Endpoints(endpoints::decode(payload)?),
            T_HANDOFF_SERVING => {
                empty(message_type, payload)?;
                Handoff::Serving
            }
            T_HANDOFF_PROGRESS => Handoff::Progress(progress::decode(payload)?),
            T_HANDOFF_STOPPING => {
                empty(message_type, payload)?;
                Handoff::Stopping
            }
            other => return Err(not_carried(other, Self::NAME)),
        })
    }
}

impl ToDevice<'_> {
    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        Conversation::name(self)
    }
}

impl ToIngress<'_> {
    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        Conversation::name(self)
    }
}

impl Handoff {
    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        Conversation::name(self)
    }
}

/// A `Migrate` frame from a device plane, encoded without moving the
/// connection's state into a message, so the sender keeps it if the send fails.
pub fn encode_migrate(migrate: &Migrate) -> Vec<u8> {
    super::frame(T_MIGRATE, 0, |out| migrate::encode(migrate, out))
}
