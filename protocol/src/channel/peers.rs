//! [`PeerUpdate`]: the WireGuard peer set, from the active device plane to the ingress.
//!
//! The device plane owns the client list (it reads the store); the ingress owns
//! the sessions. After `Activate` the device plane sends its whole peer set, in as
//! many `Peers` messages as it takes (the first flagged [`PeerUpdate::full_start`],
//! the last [`PeerUpdate::full_end`]; one message may be both), then one message
//! per change as clients are added or removed. The ingress applies a full set only
//! when its last part has arrived, so a half-sent set never removes a peer.
//!
//! Layout: `flags u8, upserts u16, upserts × (key [32], address (family u8 +
//! 4 or 16 bytes), name length u8, name), removes u16, removes × key [32]`.

use std::net::IpAddr;

use super::cursor::{ip_addr_len, put_ip_addr, Reader};
use super::{truncated, DecodeError, MAX_PAYLOAD};

/// One WireGuard peer: a client with a key and a tunnel address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    /// The client's Curve25519 public key.
    pub public_key: [u8; 32],
    /// The client's tunnel address: the only inner source its packets may carry,
    /// and the inner destination that routes return packets to it.
    pub address: IpAddr,
    /// The client's name, for logs and metrics (at most 255 bytes).
    pub client: String,
}

/// Payload of `Peers` ([`super::ToIngress::Peers`], [`super::Handoff::Peers`]). Built with [`PeerUpdate::try_upsert`] and
/// [`PeerUpdate::try_remove`], which keep the encoded frame within [`MAX_PAYLOAD`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerUpdate {
    /// This message starts a full peer set: the ingress begins collecting a new
    /// set, which replaces the current one at [`PeerUpdate::full_end`].
    pub full_start: bool,
    /// This message ends a full peer set: apply the collected set now.
    pub full_end: bool,
    upserts: Vec<PeerEntry>,
    removes: Vec<[u8; 32]>,
    encoded_len: usize,
}

const FLAG_FULL_START: u8 = 1;
const FLAG_FULL_END: u8 = 2;
const FIXED: usize = 1 + 2 + 2;
/// The shortest encoded upsert: a key, an IPv4 address, an empty name.
pub(crate) const MIN_UPSERT_LEN: usize = 32 + 5 + 1;
/// An encoded removal: a key.
pub(crate) const REMOVE_LEN: usize = 32;

impl PeerUpdate {
    /// An empty change (neither flag).
    pub fn change() -> Self {
        Self {
            encoded_len: FIXED,
            ..Self::default()
        }
    }

    /// An empty part of a full set.
    pub fn full(full_start: bool, full_end: bool) -> Self {
        Self {
            full_start,
            full_end,
            ..Self::change()
        }
    }

    /// Adds a peer (new or changed) if it fits; false (and nothing added) when
    /// the message is full or the name is longer than 255 bytes.
    pub fn try_upsert(&mut self, peer: PeerEntry) -> bool {
        self.push_upsert(peer).is_ok()
    }

    /// Adds a removal if it fits; false when the message is full.
    pub fn try_remove(&mut self, public_key: [u8; 32]) -> bool {
        let grown = self.encoded_len + 32;
        if grown > MAX_PAYLOAD || self.removes.len() == usize::from(u16::MAX) {
            return false;
        }
        self.removes.push(public_key);
        self.encoded_len = grown;
        true
    }

    /// A whole peer set as the parts that carry it, each within a frame: the
    /// first flagged `full_start`, the last `full_end` (one part for an empty
    /// set). Entries that can never fit (a name over 255 bytes) are skipped.
    pub fn split_full(peers: impl IntoIterator<Item = PeerEntry>) -> Vec<PeerUpdate> {
        let mut parts = Vec::new();
        let mut part = PeerUpdate::full(true, false);
        for peer in peers {
            if let Err(peer) = part.push_upsert(peer) {
                parts.push(std::mem::replace(&mut part, PeerUpdate::full(false, false)));
                let _ = part.push_upsert(peer);
            }
        }
        part.full_end = true;
        parts.push(part);
        parts
    }

    /// A change (removals, then additions) as the messages that carry it, each
    /// within a frame; none for no change.
    pub fn split_change(
        removes: impl IntoIterator<Item = [u8; 32]>,
        upserts: impl IntoIterator<Item = PeerEntry>,
    ) -> Vec<PeerUpdate> {
        let mut parts = Vec::new();
        let mut part = PeerUpdate::change();
        for key in removes {
            if !part.try_remove(key) {
                parts.push(std::mem::replace(&mut part, PeerUpdate::change()));
                let _ = part.try_remove(key);
            }
        }
        for peer in upserts {
            if let Err(peer) = part.push_upsert(peer) {
                parts.push(std::mem::replace(&mut part, PeerUpdate::change()));
                let _ = part.push_upsert(peer);
            }
        }
        if !part.is_empty() {
            parts.push(part);
        }
        parts
    }

    /// [`PeerUpdate::try_upsert`] that gives the entry back when it does not fit.
    fn push_upsert(&mut self, peer: PeerEntry) -> Result<(), PeerEntry> {
        let grown = self.encoded_len + 32 + ip_addr_len(peer.address) + 1 + peer.client.len();
        if peer.client.len() > usize::from(u8::MAX)
            || grown > MAX_PAYLOAD
            || self.upserts.len() == usize::from(u16::MAX)
        {
            return Err(peer);
        }
        self.upserts.push(peer);
        self.encoded_len = grown;
        Ok(())
    }

    /// Peers added or changed.
    pub fn upserts(&self) -> &[PeerEntry] {
        &self.upserts
    }

    /// Keys of peers removed.
    pub fn removes(&self) -> &[[u8; 32]] {
        &self.removes
    }

    /// True when the message carries no peer and no removal.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removes.is_empty()
    }

    /// Room reserved for (upserts, removes), for the tests of the decoder's
    /// allocation bound.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> (usize, usize) {
        (self.upserts.capacity(), self.removes.capacity())
    }
}

pub(crate) fn encode(update: &PeerUpdate, out: &mut Vec<u8>) {
    let mut flags = 0;
    if update.full_start {
        flags |= FLAG_FULL_START;
    }
    if update.full_end {
        flags |= FLAG_FULL_END;
    }
    out.push(flags);
    // try_upsert / try_remove bound both counts by u16::MAX.
    out.extend_from_slice(&(update.upserts.len() as u16).to_be_bytes());
    for peer in &update.upserts {
        out.extend_from_slice(&peer.public_key);
        put_ip_addr(out, peer.address);
        out.push(peer.client.len() as u8);
        out.extend_from_slice(peer.client.as_bytes());
    }
    out.extend_from_slice(&(update.removes.len() as u16).to_be_bytes());
    for key in &update.removes {
        out.extend_from_slice(key);
    }
}

pub(crate) fn decode(payload: &[u8]) -> Result<PeerUpdate, DecodeError> {
    const NAME: &str = "Peers";
    let malformed = |reason: &str| DecodeError::Malformed {
        message: NAME,
        reason: reason.to_owned(),
    };
    let mut reader = Reader::new(payload);
    let flags = reader.u8().map_err(truncated(NAME))?;
    if flags & !(FLAG_FULL_START | FLAG_FULL_END) != 0 {
        return Err(malformed("unknown flag bits"));
    }
    let mut update = PeerUpdate::full(flags & FLAG_FULL_START != 0, flags & FLAG_FULL_END != 0);
    let upserts = reader.u16().map_err(truncated(NAME))?;
    // The counts are the peer's word: reserve no more entries than the
    // payload can hold, so a lying count costs nothing.
    update
        .upserts
        .reserve(usize::from(upserts).min(payload.len() / MIN_UPSERT_LEN));
    for _ in 0..upserts {
        let mut public_key = [0u8; 32];
        public_key.copy_from_slice(reader.take(32).map_err(truncated(NAME))?);
        let address = reader
            .ip_addr()
            .map_err(truncated(NAME))?
            .ok_or_else(|| malformed("unknown address family"))?;
        let name_len = usize::from(reader.u8().map_err(truncated(NAME))?);
        let name = reader.take(name_len).map_err(truncated(NAME))?;
        let client = std::str::from_utf8(name)
            .map_err(|_| malformed("client name is not UTF-8"))?
            .to_owned();
        update.encoded_len += 32 + ip_addr_len(address) + 1 + name_len;
        update.upserts.push(PeerEntry {
            public_key,
            address,
            client,
        });
    }
    let removes = reader.u16().map_err(truncated(NAME))?;
    update
        .removes
        .reserve(usize::from(removes).min(payload.len() / REMOVE_LEN));
    for _ in 0..removes {
        let mut key = [0u8; 32];
        key.copy_from_slice(reader.take(32).map_err(truncated(NAME))?);
        update.removes.push(key);
        update.encoded_len += 32;
    }
    if !reader.is_empty() {
        return Err(malformed("trailing bytes after the removals"));
    }
    Ok(update)
}
