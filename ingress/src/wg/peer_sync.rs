//! Applying the WireGuard peer set the active device plane sends: a full set
//! (possibly in parts) replaces the table once its last part arrives, keeping
//! the sessions of peers that did not change; a change removes, then upserts.
//! Only the active plane's messages count.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use blipless_protocol::channel::{PeerEntry, PeerUpdate};

use super::Wireguard;
use crate::planes::PlaneLink;

/// A full peer set being received from one plane.
#[derive(Debug)]
pub(super) struct Staging {
    generation: u64,
    peers: HashMap<[u8; 32], PeerEntry>,
}

impl Wireguard {
    /// Replaces the peer table with a whole set (keeping the sessions of the
    /// peers that did not change); from then on `/status` may say ok. Returns
    /// how many entries were refused (an address claimed by two keys).
    pub(super) fn apply_full_set(&self, entries: &[PeerEntry]) -> usize {
        let refused = self.write_peers().replace(entries);
        if refused > 0 {
            tracing::warn!(refused, "peers refused: an address claimed by two keys");
        }
        self.synced.store(true, Ordering::SeqCst);
        self.metrics.set_peers(self.peer_count());
        refused
    }

    /// Applies a peer-set message from the plane of `generation`. Only the active
    /// plane's messages count; a full set replaces the table when its last part
    /// arrives.
    pub fn on_peers(&self, from: &PlaneLink, update: PeerUpdate) {
        let active = self.planes.active().map(|plane| plane.generation);
        if active != Some(from.generation) {
            tracing::debug!(
                generation = from.generation,
                "peer update from a plane that is not active: ignored"
            );
            return;
        }
        let mut staging = self
            .staging
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if update.full_start {
            *staging = Some(Staging {
                generation: from.generation,
                peers: HashMap::new(),
            });
        }
        match staging.as_mut() {
            Some(set) if set.generation == from.generation => {
                for peer in update.upserts() {
                    set.peers.insert(peer.public_key, peer.clone());
                }
                for key in update.removes() {
                    set.peers.remove(key);
                }
                if update.full_end {
                    let Some(set) = staging.take() else { return };
                    let entries: Vec<PeerEntry> = set.peers.into_values().collect();
                    let first = !self.synced();
                    let refused = self.apply_full_set(&entries);
                    tracing::info!(
                        peers = entries.len() - refused,
                        generation = from.generation,
                        first,
                        "WireGuard peer set applied"
                    );
                }
            }
            _ => {
                // A change (or a stale partial set from another plane, dropped).
                *staging = None;
                let (removed, refused) = self
                    .write_peers()
                    .apply_change(update.removes(), update.upserts());
                if removed > 0 {
                    tracing::info!(removed, "WireGuard peers removed; their sessions end");
                }
                for peer in refused {
                    tracing::warn!(client = %peer.client, address = %peer.address, "peer refused: its address belongs to another key");
                }
            }
        }
        self.metrics.set_peers(self.peer_count());
    }
}
