//! The WireGuard peer set this plane gives the ingress: every client with a
//! WireGuard key, as a full set after each `Activate`, then the differences
//! as clients come and go.

use std::collections::HashMap;

use blipless_protocol::channel::{PeerEntry, PeerUpdate, ToIngress};
use tokio_seqpacket::UnixSeqpacket;

use crate::clients::Directory;

/// What the ingress has been told about the peer set, to send it differences.
#[derive(Debug, Default)]
pub struct PeerSync {
    sent: Option<HashMap<[u8; 32], PeerEntry>>,
}

impl PeerSync {
    /// Nothing sent yet (a new attachment).
    pub fn new() -> Self {
        Self::default()
    }

    /// The messages carrying the whole peer set; from now on changes are
    /// differences from it.
    pub fn full(&mut self, directory: &Directory) -> Vec<ToIngress<'static>> {
        let peers = directory.wireguard_peers();
        let messages = PeerUpdate::split_full(peers.values().cloned())
            .into_iter()
            .map(ToIngress::Peers)
            .collect();
        self.sent = Some(peers);
        messages
    }

    /// The messages carrying what changed since the last full set or change;
    /// nothing before a full set was sent.
    pub fn changes(&mut self, directory: &Directory) -> Vec<ToIngress<'static>> {
        let Some(sent) = self.sent.as_mut() else {
            return Vec::new();
        };
        let now = directory.wireguard_peers();
        let removes: Vec<[u8; 32]> = sent
            .keys()
            .filter(|key| !now.contains_key(*key))
            .copied()
            .collect();
        let upserts: Vec<PeerEntry> = now
            .iter()
            .filter(|(key, peer)| sent.get(*key) != Some(*peer))
            .map(|(_, peer)| peer.clone())
            .collect();
        *sent = now;
        PeerUpdate::split_change(removes, upserts)
            .into_iter()
            .map(ToIngress::Peers)
            .collect()
    }
}

/// Sends peer-set messages in order.
pub async fn send_peers(
    socket: &UnixSeqpacket,
    messages: Vec<ToIngress<'static>>,
) -> Result<(), blipless_link::LinkError> {
    for message in messages {
        blipless_link::send(socket, &message, &[]).await?;
    }
    Ok(())
}
