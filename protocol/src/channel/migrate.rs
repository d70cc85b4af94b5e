//! The payload of [`super::ToIngress::Migrate`]: one customer connection moving
//! from a draining device plane to its successor, byte-exact.
//!
//! Layout (big-endian):
//!
//! ```text
//! kind u8 | connection_id u64 | name_len u8 | name | flags u8 |
//! up_len u32 | up bytes | down_len u32 | down bytes | bytes_up u64 | bytes_down u64
//! [ UDP association only: has_customer u8 | customer socket address | announced_port u16 ]
//! ```
//!
//! `up` holds bytes read from the customer and not yet written to the
//! destination, `down` the reverse. Flag bit 0: the customer's side reached
//! EOF (after `up` is written, the destination's write side is shut);
//! bit 1: the destination's side reached EOF. Bit 2 (up) and bit 3 (down):
//! that direction's bytes are too many for a frame and wait in a pipe that
//! travels as an extra fd; its length field then counts the bytes in the
//! pipe and no bytes follow it in the frame.
//!
//! The fds travel beside the frame: customer then destination for a tunnel,
//! the customer alone for an idle HTTP connection, the control connection,
//! the customer-facing UDP socket and the egress UDP socket for a SOCKS5
//! UDP association; then the up pipe, then the down pipe, for each
//! direction that has one. A UDP association's datagrams wait in its
//! sockets' kernel queues, which travel with the fds: its `up` and `down`
//! are empty. A socket address is written as family (4 or 6), address, port.

use std::net::SocketAddr;

use super::cursor::{put_socket_addr, Reader};
use super::{truncated, DecodeError};

/// What kind of connection moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateKind {
    /// An established SOCKS5 CONNECT tunnel (two fds).
    SocksTunnel,
    /// An established HTTP CONNECT tunnel (two fds).
    HttpTunnel,
    /// A kept-alive HTTP proxy connection between requests (one fd).
    HttpIdle,
    /// A SOCKS5 UDP association (three fds: the control connection, the
    /// customer-facing and the egress UDP sockets), with [`UdpAssociation`].
    SocksUdp,
}

impl MigrateKind {
    fn to_byte(self) -> u8 {
        match self {
            MigrateKind::SocksTunnel => 1,
            MigrateKind::HttpTunnel => 2,
            MigrateKind::HttpIdle => 3,
            MigrateKind::SocksUdp => 4,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(MigrateKind::SocksTunnel),
            2 => Some(MigrateKind::HttpTunnel),
            3 => Some(MigrateKind::HttpIdle),
            4 => Some(MigrateKind::SocksUdp),
            _ => None,
        }
    }

    /// How many fds travel with this kind.
    pub fn fd_count(self) -> usize {
        match self {
            MigrateKind::SocksTunnel | MigrateKind::HttpTunnel => 2,
            MigrateKind::HttpIdle => 1,
            MigrateKind::SocksUdp => 3,
        }
    }
}

/// What a SOCKS5 UDP association knows beside its sockets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpAssociation {
    /// Where the customer's datagrams come from, once one has arrived:
    /// answers go there.
    pub customer: Option<SocketAddr>,
    /// The port the customer named in its UDP ASSOCIATE request, carried
    /// for the record: the relay does not judge senders by it (behind a NAT
    /// the customer's datagrams come from a port of their own).
    pub announced_port: u16,
}

/// One direction of a tunnel in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Direction {
    /// Bytes read from one side and not yet written to the other.
    pub pending: Vec<u8>,
    /// The reading side reached EOF.
    pub eof: bool,
}

/// Payload of [`super::ToIngress::Migrate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrate {
    /// What moves.
    pub kind: MigrateKind,
    /// The ingress's number for the connection (kept for logs).
    pub connection_id: u64,
    /// The authenticated client's name; empty for an HTTP connection that
    /// has not authenticated yet.
    pub client: String,
    /// Customer toward destination.
    pub up: Direction,
    /// Destination toward customer.
    pub down: Direction,
    /// When non-zero: the up bytes (this many) are in a pipe fd instead of `up.pending`.
    pub up_piped: u32,
    /// When non-zero: the down bytes (this many) are in a pipe fd instead of `down.pending`.
    pub down_piped: u32,
    /// Bytes relayed up so far (for logs).
    pub bytes_up: u64,
    /// Bytes relayed down so far (for logs).
    pub bytes_down: u64,
    /// A UDP association's state: present exactly when `kind` is
    /// [`MigrateKind::SocksUdp`] (the encoder writes the default if missing).
    pub udp: Option<UdpAssociation>,
}

const NAME: &str = "Migrate";

impl Migrate {
    /// How many fds travel with this message.
    pub fn fd_count(&self) -> usize {
        self.kind.fd_count() + usize::from(self.up_piped > 0) + usize::from(self.down_piped > 0)
    }
}

pub(crate) fn encode(migrate: &Migrate, out: &mut Vec<u8>) {
    out.push(migrate.kind.to_byte());
    out.extend_from_slice(&migrate.connection_id.to_be_bytes());
    // Client names are at most 64 bytes (the store enforces it); a longer
    // one is cut rather than corrupting the frame.
    let name = &migrate.client.as_bytes()[..migrate.client.len().min(255)];
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.push(
        u8::from(migrate.up.eof)
            | (u8::from(migrate.down.eof) << 1)
            | (u8::from(migrate.up_piped > 0) << 2)
            | (u8::from(migrate.down_piped > 0) << 3),
    );
    for (pending, piped) in [
        (&migrate.up.pending, migrate.up_piped),
        (&migrate.down.pending, migrate.down_piped),
    ] {
        if piped > 0 {
            out.extend_from_slice(&piped.to_be_bytes());
        } else {
            out.extend_from_slice(&(pending.len() as u32).to_be_bytes());
            out.extend_from_slice(pending);
        }
    }
    out.extend_from_slice(&migrate.bytes_up.to_be_bytes());
    out.extend_from_slice(&migrate.bytes_down.to_be_bytes());
    if migrate.kind == MigrateKind::SocksUdp {
        let udp = migrate.udp.unwrap_or_default();
        out.push(u8::from(udp.customer.is_some()));
        if let Some(customer) = udp.customer {
            put_socket_addr(out, customer);
        }
        out.extend_from_slice(&udp.announced_port.to_be_bytes());
    }
}

fn malformed(reason: &str) -> DecodeError {
    DecodeError::Malformed {
        message: NAME,
        reason: reason.into(),
    }
}

pub(crate) fn decode(payload: &[u8]) -> Result<Migrate, DecodeError> {
    let mut reader = Reader::new(payload);
    let kind_byte = reader.u8().map_err(truncated(NAME))?;
    let kind = MigrateKind::from_byte(kind_byte).ok_or_else(|| malformed("unknown kind"))?;
    let connection_id = reader.u64().map_err(truncated(NAME))?;
    let name_len = usize::from(reader.u8().map_err(truncated(NAME))?);
    let name = reader.take(name_len).map_err(truncated(NAME))?;
    let client = std::str::from_utf8(name)
        .map_err(|_| malformed("client name is not UTF-8"))?
        .to_string();
    let flags = reader.u8().map_err(truncated(NAME))?;
    if flags & !0b1111 != 0 {
        return Err(malformed("unknown flags"));
    }
    let mut pendings = [Vec::new(), Vec::new()];
    let mut piped = [0u32, 0u32];
    for (index, pending) in pendings.iter_mut().enumerate() {
        let len = reader.u32().map_err(truncated(NAME))?;
        if flags & (0b100 << index) != 0 {
            if len == 0 {
                return Err(malformed("a pipe that holds nothing"));
            }
            piped[index] = len;
        } else {
            *pending = reader.take(len as usize).map_err(truncated(NAME))?.to_vec();
        }
    }
    let bytes_up = reader.u64().map_err(truncated(NAME))?;
    let bytes_down = reader.u64().map_err(truncated(NAME))?;
    let udp = if kind == MigrateKind::SocksUdp {
        let customer = match reader.u8().map_err(truncated(NAME))? {
            0 => None,
            1 => Some(
                reader
                    .socket_addr()
                    .map_err(truncated(NAME))?
                    .ok_or_else(|| malformed("unknown address family"))?,
            ),
            _ => return Err(malformed("bad customer flag")),
        };
        let announced_port = reader.u16().map_err(truncated(NAME))?;
        Some(UdpAssociation {
            customer,
            announced_port,
        })
    } else {
        None
    };
    if !reader.is_empty() {
        return Err(malformed("trailing bytes"));
    }
    let [up, down] = pendings;
    Ok(Migrate {
        kind,
        connection_id,
        client,
        up: Direction {
            pending: up,
            eof: flags & 1 != 0,
        },
        down: Direction {
            pending: down,
            eof: flags & 2 != 0,
        },
        up_piped: piped[0],
        down_piped: piped[1],
        bytes_up,
        bytes_down,
        udp,
    })
}
