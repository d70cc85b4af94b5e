//! WireGuard clients' packets against their limits (docs/LIMITS.md): each
//! packet is found its client by its tunnel address (the source of a packet
//! from the client, the destination of one to it), metered into the client's
//! usage, counted against its quota, and policed by its rate: a packet that
//! finds the client's bucket more than a read's worth in debt, or any
//! packet while the client is over its quota, is dropped. Policing, not queueing: one reader serves every
//! client, so a packet never waits for another client's tokens.

use std::sync::atomic::Ordering;

use crate::clients::Client;

/// Which way a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the client toward the internet.
    Up,
    /// From the internet to the client.
    Down,
}

/// Whether a packet of `bytes` to or from `client` may pass; meters it and
/// counts it against the quota when it does.
pub fn admit(client: &Client, way: Way, bytes: usize) -> bool {
    let limiter = &client.limiter;
    let bucket = match way {
        Way::Up => &limiter.up,
        Way::Down => &limiter.down,
    };
    if limiter.is_over_quota() || !bucket.admit_packet(bytes) {
        return false;
    }
    let meter = match way {
        Way::Up => &client.meter.up,
        Way::Down => &client.meter.down,
    };
    meter.fetch_add(bytes as u64, Ordering::Relaxed);
    limiter.charge_quota(bytes);
    true
}
