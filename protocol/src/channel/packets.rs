//! [`Packets`]: a batch of inner IP packets of one WireGuard peer, either
//! way on the device channel.
//!
//! Layout (big-endian): `peer u32, count u16, count × (len u16, bytes)`.
//! A received batch is a borrowed view over the frame: decoding checks every
//! length once and copies nothing, and [`Packets::iter`] walks the packets in
//! place. A batch being built owns one buffer that [`Packets::try_push`]
//! appends to, so neither side allocates per packet.

use std::borrow::Cow;

use super::cursor::Reader;
use super::{truncated, DecodeError, MAX_PAYLOAD};

/// Bytes before the first packet: peer and count.
const FIXED: usize = 4 + 2;

/// A batch of inner packets (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packets<'a> {
    peer: u32,
    count: u16,
    /// `count × (len u16, bytes)`, checked.
    body: Cow<'a, [u8]>,
}

impl Packets<'static> {
    /// An empty batch for one WireGuard peer, to fill with [`Packets::try_push`].
    pub fn new(peer: u32) -> Self {
        Self {
            peer,
            count: 0,
            body: Cow::Owned(Vec::new()),
        }
    }
}

impl<'a> Packets<'a> {
    /// Adds a packet if it fits; returns false (and adds nothing) when the
    /// batch is full or the packet is empty or longer than 65535 bytes.
    pub fn try_push(&mut self, packet: &[u8]) -> bool {
        let grown = self.encoded_len() + 2 + packet.len();
        if packet.is_empty()
            || packet.len() > usize::from(u16::MAX)
            || grown > MAX_PAYLOAD
            || self.count == u16::MAX
        {
            return false;
        }
        let body = self.body.to_mut();
        body.extend_from_slice(&(packet.len() as u16).to_be_bytes());
        body.extend_from_slice(packet);
        self.count += 1;
        true
    }

    /// The WireGuard peer these packets belong to.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// How many packets the batch holds.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// True when the batch holds no packet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The inner packets, in order.
    pub fn iter(&self) -> PacketIter<'_> {
        PacketIter {
            rest: &self.body,
            left: self.count,
        }
    }

    /// The payload's length once encoded.
    pub fn encoded_len(&self) -> usize {
        FIXED + self.body.len()
    }

    /// The same batch, owning its bytes (one copy of the whole batch).
    pub fn into_owned(self) -> Packets<'static> {
        Packets {
            peer: self.peer,
            count: self.count,
            body: Cow::Owned(self.body.into_owned()),
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.peer.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.body);
    }

    /// Checks a payload's layout and borrows it.
    pub(crate) fn decode(payload: &'a [u8]) -> Result<Self, DecodeError> {
        const NAME: &str = "Packets";
        let mut reader = Reader::new(payload);
        let peer = reader.u32().map_err(truncated(NAME))?;
        let count = reader.u16().map_err(truncated(NAME))?;
        let body = &payload[FIXED..];
        for _ in 0..count {
            let len = usize::from(reader.u16().map_err(truncated(NAME))?);
            if len == 0 {
                return Err(DecodeError::Malformed {
                    message: NAME,
                    reason: "empty packet".into(),
                });
            }
            reader.take(len).map_err(truncated(NAME))?;
        }
        if !reader.is_empty() {
            return Err(DecodeError::Malformed {
                message: NAME,
                reason: "trailing bytes after the last packet".into(),
            });
        }
        Ok(Self {
            peer,
            count,
            body: Cow::Borrowed(body),
        })
    }
}

/// The packets of a [`Packets`] batch, borrowed in place.
#[derive(Debug, Clone)]
pub struct PacketIter<'b> {
    rest: &'b [u8],
    left: u16,
}

impl<'b> Iterator for PacketIter<'b> {
    type Item = &'b [u8];

    fn next(&mut self) -> Option<&'b [u8]> {
        if self.left == 0 {
            return None;
        }
        // The layout was checked when the batch was decoded or built, so
        // these never fail; if they did, the iteration would just end.
        let (len, rest) = self.rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        let packet = rest.get(..len)?;
        self.rest = rest.get(len..)?;
        self.left -= 1;
        Some(packet)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left), Some(usize::from(self.left)))
    }
}

impl ExactSizeIterator for PacketIter<'_> {}
