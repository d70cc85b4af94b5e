//! The payloads of a client sync (read-your-writes): `blipless-ctl` changed a
//! client in the store and asks, through the ingress, that every ready
//! device plane apply the change feed at least through `through` before it
//! returns (docs/ARCHITECTURE.md, "Client changes, read-your-writes").
//!
//! Layout (binary, big-endian): `token u64, through u64` each way.

use super::cursor::Reader;
use super::payloads::malformed;
use super::{truncated, DecodeError};

/// Ingress to device plane: apply the change feed through `through`, then
/// answer [`Synced`] with the same token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncClients {
    /// The ingress's number for this request, echoed in the answer.
    pub token: u64,
    /// The feed position the plane must have applied.
    pub through: u64,
}

/// Device plane to ingress: the feed is applied through `applied` (at least
/// the request's `through`), and the peer-set changes it caused were sent
/// before this message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// The request's token.
    pub token: u64,
    /// The feed position the plane has applied.
    pub applied: u64,
}

pub(crate) fn encode(token: u64, position: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&token.to_be_bytes());
    out.extend_from_slice(&position.to_be_bytes());
}

pub(crate) fn decode(name: &'static str, payload: &[u8]) -> Result<(u64, u64), DecodeError> {
    let mut reader = Reader::new(payload);
    let token = reader.u64().map_err(truncated(name))?;
    let position = reader.u64().map_err(truncated(name))?;
    if !reader.is_empty() {
        return Err(malformed(name, "trailing bytes"));
    }
    Ok((token, position))
}
