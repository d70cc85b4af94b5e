//! The WireGuard peer table: each peer's session state, found by public key
//! (handshake initiations), by peer index (every other message) and by tunnel
//! address (return packets from the device plane).
//!
//! ## Peer index layout
//!
//! boringtun builds a session's receiver index as `peer_index << 8 | n` and
//! keeps 24 bits of the peer index, so the index a peer answers to is:
//!
//! ```text
//!  31        24 23 22                          0
//! +------------+--+-----------------------------+
//! | (shifted   |G |  slot: 1 .. 2^23 - 1        |
//! |  out)      |  |                             |
//! +------------+--+-----------------------------+
//! ```
//!
//! Bit 23 (`G`) is the ingress generation (docs/ARCHITECTURE.md, "Two generations on one UDP port"): an ingress and its
//! successor use different values, so a classic BPF program on the shared
//! SO_REUSEPORT group can steer every non-initiation message to the ingress that
//! owns the session. Slots are allocated round-robin and never 0, so a receiver
//! index of 0 never names a peer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use blipless_protocol::channel::PeerEntry;
use boringtun::noise::Tunn;

/// Bit of the peer index that carries the ingress generation.
pub const GENERATION_BIT: u32 = 1 << 23;
/// Slots per generation: indices `1 ..= SLOT_MASK`.
const SLOT_MASK: u32 = GENERATION_BIT - 1;

/// One WireGuard peer and its session state.
pub struct Peer {
    /// The index boringtun builds session indices from (see the module docs).
    pub index: u32,
    /// The peer's public key.
    pub public_key: [u8; 32],
    /// The peer's tunnel address: the only inner source it may send from.
    pub address: IpAddr,
    /// The client's name, for logs.
    pub client: String,
    /// boringtun's session state, made when the peer is first used on this
    /// ingress (its handshake initiation, a packet for it from the device
    /// plane, a call-back; never another message from the network): a peer that never
    /// connects costs no `Tunn` (11 KiB, and an X25519 computation to make;
    /// boxed, so that an empty slot is one pointer, not the 11 KiB inline).
    tunnel: Mutex<Option<Box<Tunn>>>,
    endpoint: Mutex<Option<SocketAddr>>,
    /// Milliseconds since the Unix epoch of the last authenticated packet, 0 if none.
    last_received_ms: AtomicU64,
    /// Milliseconds since the Unix epoch of the last session made, 0 if none.
    session_ms: AtomicU64,
    /// Milliseconds since the Unix epoch of the last authenticated data
    /// message (type 4, keepalives included), 0 if none.
    data_ms: AtomicU64,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("index", &self.index)
            .field("client", &self.client)
            .field("address", &self.address)
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

impl Peer {
    /// The session state, locked; made with `make` if this ingress has none
    /// for the peer yet.
    pub fn tunnel(&self, make: TunnelFactory<'_>) -> TunnelGuard<'_> {
        let mut slot = self.slot();
        let fresh = slot.is_none();
        if fresh {
            *slot = Some(Box::new(make(&self.public_key, self.index)));
        }
        TunnelGuard { slot, fresh }
    }

    /// The session state, locked, only if it has been made (timers and
    /// statistics never make one).
    pub fn made_tunnel(&self) -> Option<TunnelGuard<'_>> {
        let slot = self.slot();
        slot.is_some().then_some(TunnelGuard { slot, fresh: false })
    }

    fn slot(&self) -> MutexGuard<'_, Option<Box<Tunn>>> {
        self.tunnel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where the peer was last heard from, if ever.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        *self
            .endpoint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records an authenticated packet from `from`: the peer roams there.
    pub fn heard_from(&self, from: SocketAddr, now_ms: u64) {
        let mut endpoint = self
            .endpoint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *endpoint != Some(from) {
            if endpoint.is_some() {
                tracing::debug!(client = %self.client, %from, "peer roamed");
            }
            *endpoint = Some(from);
        }
        self.last_received_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Sets the endpoint and last-heard time from a snapshot, unless the peer
    /// has been heard from directly since.
    pub fn seed_endpoint(&self, endpoint: SocketAddr, last_received_ms: u64) {
        let mut current = self
            .endpoint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.is_none() {
            *current = Some(endpoint);
            self.last_received_ms
                .fetch_max(last_received_ms, Ordering::Relaxed);
        }
    }

    /// Records a session made now (a handshake completed either way).
    pub fn session_made(&self, now_ms: u64) {
        self.session_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Milliseconds since the epoch of the last session made (0: never).
    pub fn session_made_ms(&self) -> u64 {
        self.session_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the epoch of the last authenticated packet (0: never).
    pub fn last_received_ms(&self) -> u64 {
        self.last_received_ms.load(Ordering::Relaxed)
    }

    /// Records an authenticated data message (a keepalive counts): the peer
    /// sends on a session of this ingress.
    pub fn sent_data(&self, now_ms: u64) {
        self.data_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Milliseconds since the epoch of the last authenticated data message
    /// (0: never).
    pub fn data_ms(&self) -> u64 {
        self.data_ms.load(Ordering::Relaxed)
    }
}

/// Builds the session state of a peer from its public key and index.
pub type TunnelFactory<'a> = &'a dyn Fn(&[u8; 32], u32) -> Tunn;

/// A peer's session state, locked ([`Peer::tunnel`], [`Peer::made_tunnel`]):
/// the slot always holds one while the guard exists.
pub struct TunnelGuard<'a> {
    slot: MutexGuard<'a, Option<Box<Tunn>>>,
    /// Made by this very [`Peer::tunnel`] call.
    fresh: bool,
}

impl TunnelGuard<'_> {
    /// Unmakes the session state if it was made for this use: an
    /// initiation that then failed its checks (a stranger who knows a
    /// peer's public key can name it) must not leave the state behind,
    /// about 11 KiB for every peer named that way.
    pub fn unmake_if_fresh(mut self) {
        if self.fresh {
            *self.slot = None;
        }
    }
}

impl std::fmt::Debug for TunnelGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelGuard")
    }
}

impl std::ops::Deref for TunnelGuard<'_> {
    type Target = Tunn;
    fn deref(&self) -> &Tunn {
        self.slot
            .as_ref()
            .expect("a guard is only made over a made tunnel")
    }
}

impl std::ops::DerefMut for TunnelGuard<'_> {
    fn deref_mut(&mut self) -> &mut Tunn {
        self.slot
            .as_mut()
            .expect("a guard is only made over a made tunnel")
    }
}

/// Every peer, by key, index and address.
#[derive(Debug, Default)]
pub struct PeerTable {
    by_key: HashMap<[u8; 32], Arc<Peer>>,
    by_index: HashMap<u32, Arc<Peer>>,
    by_address: HashMap<IpAddr, Arc<Peer>>,
    generation: u32,
    next_slot: u32,
}

impl PeerTable {
    /// An empty table whose indices carry `generation` (0 or 1) in bit 23.
    pub fn new(generation: u32) -> Self {
        Self {
            generation: (generation & 1) * GENERATION_BIT,
            next_slot: 1,
            ..Self::default()
        }
    }

    /// How many peers there are.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The peer with this public key.
    pub fn by_key(&self, key: &[u8; 32]) -> Option<&Arc<Peer>> {
        self.by_key.get(key)
    }

    /// The peer a receiver index (`peer_index << 8 | n`) belongs to.
    pub fn by_receiver_index(&self, receiver_index: u32) -> Option<&Arc<Peer>> {
        self.by_index.get(&(receiver_index >> 8))
    }

    /// The peer whose tunnel address is `address`.
    pub fn by_address(&self, address: IpAddr) -> Option<&Arc<Peer>> {
        self.by_address.get(&address)
    }

    /// Every peer.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Peer>> {
        self.by_key.values()
    }

    /// Adds or changes a peer. A peer whose key and address are unchanged keeps
    /// its sessions; a changed address keeps them too (only routing changes).
    /// Returns false when the address belongs to another peer (the entry is
    /// refused: two peers cannot own one address) or no slot is free.
    pub fn upsert(&mut self, entry: &PeerEntry) -> bool {
        if let Some(owner) = self.by_address.get(&entry.address) {
            if owner.public_key != entry.public_key {
                return false;
            }
        }
        if let Some(existing) = self.by_key.get(&entry.public_key).cloned() {
            if existing.address == entry.address && existing.client == entry.client {
                return true;
            }
            // Same key, new address or name: a new record sharing nothing but
            // the index would lose the sessions, so move the tunnel over.
            self.remove(&entry.public_key);
            let moved = Arc::new(Peer {
                index: existing.index,
                public_key: entry.public_key,
                address: entry.address,
                client: entry.client.clone(),
                // The old record may still be referenced by a task
                // mid-packet: it is left without one (made afresh if used).
                tunnel: Mutex::new(existing.slot().take()),
                endpoint: Mutex::new(existing.endpoint()),
                last_received_ms: AtomicU64::new(existing.last_received_ms()),
                session_ms: AtomicU64::new(existing.session_made_ms()),
                data_ms: AtomicU64::new(existing.data_ms()),
            });
            self.insert(moved);
            return true;
        }
        let Some(index) = self.free_index() else {
            return false;
        };
        let peer = Arc::new(Peer {
            index,
            public_key: entry.public_key,
            address: entry.address,
            client: entry.client.clone(),
            tunnel: Mutex::new(None),
            endpoint: Mutex::new(None),
            last_received_ms: AtomicU64::new(0),
            session_ms: AtomicU64::new(0),
            data_ms: AtomicU64::new(0),
        });
        self.insert(peer);
        true
    }

    /// Removes a peer; its sessions end with it. Returns whether it was there.
    pub fn remove(&mut self, key: &[u8; 32]) -> bool {
        let Some(peer) = self.by_key.remove(key) else {
            return false;
        };
        self.by_index.remove(&peer.index);
        if self
            .by_address
            .get(&peer.address)
            .is_some_and(|owner| Arc::ptr_eq(owner, &peer))
        {
            self.by_address.remove(&peer.address);
        }
        true
    }

    /// Applies a change as the device plane sends it: the removals first,
    /// then the additions, so an address freed by a removal can go to a
    /// peer added in the same change (a client removed and another added
    /// within one poll of the store's feed get the same address). Returns
    /// how many peers were removed and the entries refused.
    pub fn apply_change<'e>(
        &mut self,
        removes: &[[u8; 32]],
        upserts: &'e [PeerEntry],
    ) -> (usize, Vec<&'e PeerEntry>) {
        let removed = removes.iter().filter(|key| self.remove(key)).count();
        let moving = self.detach_moving(upserts);
        let refused = upserts.iter().filter(|entry| !self.upsert(entry)).collect();
        self.reattach(&moving);
        (removed, refused)
    }

    /// Replaces the whole set: peers not in `entries` are removed, the others
    /// upserted (keeping their sessions). Returns how many entries were refused.
    pub fn replace(&mut self, entries: &[PeerEntry]) -> usize {
        let keep: std::collections::HashSet<[u8; 32]> =
            entries.iter().map(|entry| entry.public_key).collect();
        let gone: Vec<[u8; 32]> = self
            .by_key
            .keys()
            .filter(|key| !keep.contains(*key))
            .copied()
            .collect();
        for key in gone {
            self.remove(&key);
        }
        let moving = self.detach_moving(entries);
        let refused = entries.iter().filter(|entry| !self.upsert(entry)).count();
        self.reattach(&moving);
        refused
    }

    /// Frees the addresses of the peers that `entries` move to another
    /// address, before any entry is applied: within one batch addresses
    /// may pass between peers (two clients removed and added again, each
    /// given the other's address), which applied one by one, in whatever
    /// order, would find each new address still held and refuse both. Only
    /// moves that can succeed are freed: one whose new address is held by a
    /// peer that does not move too is refused as before, keeping its
    /// address. Returns the keys detached.
    fn detach_moving(&mut self, entries: &[PeerEntry]) -> Vec<[u8; 32]> {
        let mut moving: Vec<(&[u8; 32], IpAddr)> = entries
            .iter()
            .filter(|entry| {
                self.by_key
                    .get(&entry.public_key)
                    .is_some_and(|peer| peer.address != entry.address)
            })
            .map(|entry| (&entry.public_key, entry.address))
            .collect();
        // Until nothing changes: a move whose new address is held by a
        // peer staying put cannot happen, nor then one into its address.
        loop {
            let keys: std::collections::HashSet<[u8; 32]> =
                moving.iter().map(|(key, _)| **key).collect();
            let before = moving.len();
            moving.retain(|(key, to)| match self.by_address.get(to) {
                None => true,
                Some(owner) => owner.public_key != **key && keys.contains(&owner.public_key),
            });
            if moving.len() == before {
                break;
            }
        }
        let mut detached = Vec::new();
        for (key, _) in moving {
            let Some(peer) = self.by_key.get(key) else {
                continue;
            };
            if self
                .by_address
                .get(&peer.address)
                .is_some_and(|owner| Arc::ptr_eq(owner, peer))
            {
                self.by_address.remove(&peer.address);
                detached.push(*key);
            }
        }
        detached
    }

    /// Settles the peers [`Self::detach_moving`] detached whose move was
    /// refused all the same (a batch that names one address twice): each
    /// gets its old address back, or, if another peer took it meanwhile,
    /// leaves the table. A peer without its address would still pass the
    /// source check while its return traffic went to the other peer.
    fn reattach(&mut self, detached: &[[u8; 32]]) {
        for key in detached {
            let Some(peer) = self.by_key.get(key).cloned() else {
                continue;
            };
            match self.by_address.get(&peer.address) {
                None => {
                    self.by_address.insert(peer.address, peer);
                }
                Some(owner) if Arc::ptr_eq(owner, &peer) => {}
                Some(_) => {
                    tracing::warn!(client = %peer.client, "a WireGuard peer's address went to another peer in the same batch: it is removed until the next full set");
                    self.by_key.remove(key);
                    self.by_index.remove(&peer.index);
                }
            }
        }
    }

    fn insert(&mut self, peer: Arc<Peer>) {
        self.by_index.insert(peer.index, peer.clone());
        self.by_address.insert(peer.address, peer.clone());
        self.by_key.insert(peer.public_key, peer);
    }

    fn free_index(&mut self) -> Option<u32> {
        for _ in 0..SLOT_MASK {
            let slot = self.next_slot;
            self.next_slot = if slot >= SLOT_MASK { 1 } else { slot + 1 };
            let index = self.generation | slot;
            if !self.by_index.contains_key(&index) {
                return Some(index);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boringtun::x25519::{PublicKey, StaticSecret};

    fn factory() -> impl Fn(&[u8; 32], u32) -> Tunn {
        let ours = StaticSecret::from([7u8; 32]);
        move |key, index| Tunn::new(ours.clone(), PublicKey::from(*key), None, None, index, None)
    }

    fn entry(key: u8, address: &str) -> PeerEntry {
        PeerEntry {
            public_key: PublicKey::from(&StaticSecret::from([key; 32])).to_bytes(),
            address: address.parse().expect("ip"),
            client: format!("client-{key}"),
        }
    }

    #[test]
    fn a_peer_never_used_is_small() {
        // The session state is boxed: a peer without one holds a pointer.
        assert!(
            std::mem::size_of::<Peer>() < 512,
            "{}",
            std::mem::size_of::<Peer>()
        );
    }

    #[test]
    fn peers_are_found_by_key_index_and_address() {
        let mut table = PeerTable::new(1);
        assert!(table.upsert(&entry(1, "10.64.0.2")));
        assert!(table.upsert(&entry(2, "10.64.0.3")));
        let peer = table
            .by_address("10.64.0.3".parse().expect("ip"))
            .expect("by address")
            .clone();
        assert_eq!(
            peer.index & GENERATION_BIT,
            GENERATION_BIT,
            "generation bit set"
        );
        assert!(peer.index < 1 << 24, "fits boringtun's 24 bits");
        let receiver = peer.index << 8 | 5;
        assert_eq!(
            table.by_receiver_index(receiver).map(|p| p.index),
            Some(peer.index)
        );
        assert_eq!(
            table.by_key(&peer.public_key).map(|p| p.index),
            Some(peer.index)
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn an_address_has_one_owner() {
        let mut table = PeerTable::new(0);
        assert!(table.upsert(&entry(1, "10.64.0.2")));
        assert!(!table.upsert(&entry(2, "10.64.0.2")));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn replace_keeps_unchanged_peers_and_removes_the_rest() {
        let mut table = PeerTable::new(0);
        table.upsert(&entry(1, "10.64.0.2"));
        table.upsert(&entry(2, "10.64.0.3"));
        let kept = table
            .by_key(&entry(1, "10.64.0.2").public_key)
            .cloned()
            .expect("kept");
        let refused = table.replace(&[entry(1, "10.64.0.2"), entry(3, "10.64.0.4")]);
        assert_eq!(refused, 0);
        assert_eq!(table.len(), 2);
        let after = table.by_key(&kept.public_key).expect("still there");
        assert!(Arc::ptr_eq(after, &kept), "the same session state");
        assert!(table.by_address("10.64.0.3".parse().expect("ip")).is_none());
        assert!(table.remove(&entry(3, "10.64.0.4").public_key));
        assert!(!table.remove(&entry(3, "10.64.0.4").public_key));
    }

    /// Two clients removed and added again with the same keys and each
    /// other's address, within one feed poll: both moves apply, in a full
    /// set and in a change alike. Before, each found its new address still
    /// held by the other and both were refused.
    #[test]
    fn addresses_can_pass_between_peers_within_one_batch() {
        let address = |table: &PeerTable, key: u8| {
            table
                .by_key(&entry(key, "10.64.0.9").public_key)
                .map(|peer| peer.address.to_string())
        };
        let owner = |table: &PeerTable, ip: &str| {
            table
                .by_address(ip.parse().expect("ip"))
                .map(|peer| peer.client.clone())
        };
        let owner = |table: &PeerTable, ip: &str| {
            owner(table, ip).and_then(|client| client.strip_prefix("client-")?.parse::<u8>().ok())
        };
        let mut table = PeerTable::new(0);
        table.upsert(&entry(1, "10.64.0.2"));
        table.upsert(&entry(2, "10.64.0.3"));
        assert_eq!(
            table.replace(&[entry(1, "10.64.0.3"), entry(2, "10.64.0.2")]),
            0
        );
        assert_eq!(address(&table, 1).as_deref(), Some("10.64.0.3"));
        assert_eq!(owner(&table, "10.64.0.2"), Some(2));
        assert_eq!(owner(&table, "10.64.0.3"), Some(1));
        let swap = [entry(2, "10.64.0.3"), entry(1, "10.64.0.2")];
        let (_, refused) = table.apply_change(&[], &swap);
        assert!(refused.is_empty());
        assert_eq!(owner(&table, "10.64.0.2"), Some(1));
        assert_eq!(owner(&table, "10.64.0.3"), Some(2));
        // A move that is refused (its new address belongs to a peer that
        // stays) keeps the old address, and a new peer in the same batch
        // does not get it.
        table.upsert(&entry(3, "10.64.0.4"));
        let taken = [entry(1, "10.64.0.4"), entry(4, "10.64.0.2")];
        let (_, refused) = table.apply_change(&[], &taken);
        assert_eq!(refused.len(), 2);
        assert_eq!(owner(&table, "10.64.0.2"), Some(1));
        assert_eq!(owner(&table, "10.64.0.4"), Some(3));
        // A batch that names one address twice: the move that loses keeps
        // no address another peer holds.
        let twice = [
            entry(7, "10.64.0.5"),
            entry(1, "10.64.0.5"),
            entry(8, "10.64.0.2"),
        ];
        let (_, refused) = table.apply_change(&[], &twice);
        assert_eq!(refused.len(), 1);
        assert_eq!(owner(&table, "10.64.0.2"), Some(8));
        for peer in table.iter() {
            if let Some(owner) = table.by_address(peer.address) {
                assert!(Arc::ptr_eq(owner, peer), "{} owns its address", peer.client);
            }
        }
    }

    #[test]
    fn a_change_frees_addresses_before_it_gives_them_out() {
        let (alice, bob, carol) = (
            entry(1, "10.64.0.2"),
            entry(2, "10.64.0.2"),
            entry(3, "10.64.0.2"),
        );
        let mut table = PeerTable::new(0);
        table.upsert(&alice);
        let added = [bob.clone()];
        let (removed, refused) = table.apply_change(&[alice.public_key], &added);
        assert_eq!((removed, refused.len()), (1, 0));
        assert_eq!(
            table
                .by_address("10.64.0.2".parse().expect("ip"))
                .map(|p| p.public_key),
            Some(bob.public_key),
            "the new client has the freed address"
        );
        // A client removed and added again in one change is there after it.
        let (removed, refused) = table.apply_change(&[bob.public_key], &added);
        assert_eq!((removed, refused.len()), (1, 0));
        assert_eq!(table.len(), 1);
        // An address still owned is refused.
        let refused_entries = [carol];
        let (_, refused) = table.apply_change(&[], &refused_entries);
        assert_eq!(refused.len(), 1);
    }

    #[test]
    fn a_moved_address_keeps_the_index() {
        let mut table = PeerTable::new(0);
        table.upsert(&entry(1, "10.64.0.2"));
        let index = table
            .by_key(&entry(1, "10.64.0.2").public_key)
            .map(|p| p.index);
        assert!(table.upsert(&entry(1, "10.64.0.9")));
        assert!(table.by_address("10.64.0.2".parse().expect("ip")).is_none());
        assert_eq!(
            table
                .by_address("10.64.0.9".parse().expect("ip"))
                .map(|p| p.index),
            index
        );
    }

    /// A table with one peer (10.64.0.2), and that peer.
    fn one_peer() -> (PeerTable, Arc<Peer>) {
        let mut table = PeerTable::new(0);
        table.upsert(&entry(1, "10.64.0.2"));
        let peer = table
            .by_address("10.64.0.2".parse().expect("ip"))
            .cloned()
            .expect("peer");
        (table, peer)
    }

    /// A state made for an initiation that then fails is unmade; one that
    /// was there before is kept.
    #[test]
    fn only_a_state_made_for_this_use_is_unmade() {
        let make = factory();
        let (_table, peer) = one_peer();
        peer.tunnel(&make).unmake_if_fresh();
        assert!(peer.made_tunnel().is_none(), "made and unmade");
        drop(peer.tunnel(&make));
        assert!(peer.made_tunnel().is_some(), "made and kept");
        peer.tunnel(&make).unmake_if_fresh();
        assert!(peer.made_tunnel().is_some(), "made before: kept");
    }

    #[test]
    fn a_peer_gets_its_session_state_only_when_used_and_keeps_it_when_moved() {
        let make = factory();
        let (mut table, peer) = one_peer();
        assert!(peer.made_tunnel().is_none(), "nothing made at upsert");
        let (_, tx, rx, _, _) = peer.tunnel(&make).stats();
        assert_eq!((tx, rx), (0, 0));
        assert!(peer.made_tunnel().is_some(), "made on first use");
        // A new address moves the made state to the new record.
        assert!(table.upsert(&entry(1, "10.64.0.9")));
        let moved = table
            .by_address("10.64.0.9".parse().expect("ip"))
            .cloned()
            .expect("moved");
        assert!(moved.made_tunnel().is_some());
        assert!(peer.made_tunnel().is_none(), "the old record gave it up");
    }

    #[test]
    fn slots_wrap_and_skip_used_ones() {
        let mut table = PeerTable::new(0);
        table.next_slot = SLOT_MASK;
        table.upsert(&entry(1, "10.64.0.2"));
        table.upsert(&entry(2, "10.64.0.3"));
        let indices: Vec<u32> = [1u8, 2]
            .iter()
            .filter_map(|k| {
                table
                    .by_key(&entry(*k, "10.64.0.2").public_key)
                    .map(|p| p.index)
            })
            .collect();
        assert_eq!(indices, vec![SLOT_MASK, 1]);
    }
}
