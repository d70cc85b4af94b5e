//! [`EndpointPart`]: WireGuard peers' endpoints, between the ingress and a device plane.
//!
//! The ingress sends the active device plane a snapshot of where its peers are
//! (endpoint and last authenticated packet) every few seconds, and the device
//! plane keeps the latest in the store (`{pwh_<host>_<block>}`). An ingress that
//! starts with no predecessor to hand off from (after a crash) asks for it in
//! Welcome and initiates handshakes to the recently active peers at once, so
//! they recover in a round trip instead of their own 15-30 s retry.
//!
//! A snapshot may be larger than a frame, so it travels in parts: the first
//! flagged [`EndpointPart::start`], the last [`EndpointPart::end`].
//! Layout: `flags u8, taken_at_ms u64, count u16, count × (key [32], endpoint
//! (family u8 + 4 or 16 bytes + port u16), last_received_ms u64)`.

use std::net::SocketAddr;

use super::cursor::{ip_addr_len, put_socket_addr, Reader};
use super::{truncated, DecodeError, MAX_PAYLOAD};

/// Where one peer was last heard from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointEntry {
    /// The peer's public key.
    pub public_key: [u8; 32],
    /// Its endpoint (UDP address).
    pub endpoint: SocketAddr,
    /// Milliseconds since the Unix epoch of its last authenticated packet.
    pub last_received_ms: u64,
}

/// Payload of `Endpoints` (either way, and on the handoff): one part of a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPart {
    /// The first part: a new snapshot starts.
    pub start: bool,
    /// The last part: the snapshot is whole.
    pub end: bool,
    /// When the snapshot was taken, in milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    entries: Vec<EndpointEntry>,
    encoded_len: usize,
}

const FLAG_START: u8 = 1;
const FLAG_END: u8 = 2;
const FIXED: usize = 1 + 8 + 2;
/// The shortest encoded entry: a key, an IPv4 endpoint, a time.
pub(crate) const MIN_ENTRY_LEN: usize = 32 + 5 + 2 + 8;

fn entry_len(entry: &EndpointEntry) -> usize {
    32 + ip_addr_len(entry.endpoint.ip()) + 2 + 8
}

impl EndpointPart {
    /// An empty part.
    pub fn new(start: bool, end: bool, taken_at_ms: u64) -> Self {
        Self {
            start,
            end,
            taken_at_ms,
            entries: Vec::new(),
            encoded_len: FIXED,
        }
    }

    /// Adds an entry if it fits; false (and nothing added) when the part is full.
    pub fn try_push(&mut self, entry: EndpointEntry) -> bool {
        let grown = self.encoded_len + entry_len(&entry);
        if grown > MAX_PAYLOAD || self.entries.len() == usize::from(u16::MAX) {
            return false;
        }
        self.entries.push(entry);
        self.encoded_len = grown;
        true
    }

    /// The entries of this part.
    pub fn entries(&self) -> &[EndpointEntry] {
        &self.entries
    }

    /// Room reserved for entries, for the tests of the decoder's allocation
    /// bound.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> usize {
        self.entries.capacity()
    }

    /// Splits a whole snapshot into parts that each fit a frame (at least one,
    /// even for no entries).
    pub fn split(taken_at_ms: u64, entries: &[EndpointEntry]) -> Vec<EndpointPart> {
        let mut parts = Vec::new();
        let mut part = EndpointPart::new(true, false, taken_at_ms);
        for entry in entries {
            if !part.try_push(*entry) {
                parts.push(std::mem::replace(
                    &mut part,
                    EndpointPart::new(false, false, taken_at_ms),
                ));
                // An entry always fits an empty part.
                let _ = part.try_push(*entry);
            }
        }
        part.end = true;
        parts.push(part);
        parts
    }
}

pub(crate) fn encode(part: &EndpointPart, out: &mut Vec<u8>) {
    let mut flags = 0;
    if part.start {
        flags |= FLAG_START;
    }
    if part.end {
        flags |= FLAG_END;
    }
    out.push(flags);
    out.extend_from_slice(&part.taken_at_ms.to_be_bytes());
    // try_push bounds the count by u16::MAX.
    out.extend_from_slice(&(part.entries.len() as u16).to_be_bytes());
    for entry in &part.entries {
        out.extend_from_slice(&entry.public_key);
        put_socket_addr(out, entry.endpoint);
        out.extend_from_slice(&entry.last_received_ms.to_be_bytes());
    }
}

pub(crate) fn decode(payload: &[u8]) -> Result<EndpointPart, DecodeError> {
    const NAME: &str = "Endpoints";
    let malformed = |reason: &str| DecodeError::Malformed {
        message: NAME,
        reason: reason.to_owned(),
    };
    let mut reader = Reader::new(payload);
    let flags = reader.u8().map_err(truncated(NAME))?;
    if flags & !(FLAG_START | FLAG_END) != 0 {
        return Err(malformed("unknown flag bits"));
    }
    let taken_at_ms = reader.u64().map_err(truncated(NAME))?;
    let mut part = EndpointPart::new(flags & FLAG_START != 0, flags & FLAG_END != 0, taken_at_ms);
    let count = reader.u16().map_err(truncated(NAME))?;
    // The count is the peer's word: reserve no more entries than the payload
    // can hold, so a lying count costs nothing.
    part.entries
        .reserve(usize::from(count).min(payload.len() / MIN_ENTRY_LEN));
    for _ in 0..count {
        let mut public_key = [0u8; 32];
        public_key.copy_from_slice(reader.take(32).map_err(truncated(NAME))?);
        let endpoint = reader
            .socket_addr()
            .map_err(truncated(NAME))?
            .ok_or_else(|| malformed("unknown address family"))?;
        let last_received_ms = reader.u64().map_err(truncated(NAME))?;
        let entry = EndpointEntry {
            public_key,
            endpoint,
            last_received_ms,
        };
        part.encoded_len += entry_len(&entry);
        part.entries.push(entry);
    }
    if !reader.is_empty() {
        return Err(malformed("trailing bytes after the entries"));
    }
    Ok(part)
}
