//! The clients this device plane serves, kept in memory and kept current
//! from the store's change feed.
//!
//! Authentication is a lookup here, never a store round trip. The initial
//! load lists the clients after noting the change feed's head; the
//! background loop then follows the feed from that head. A removed client's
//! `revoked` token is cancelled, which closes its open connections.
//!
//! Each client has a [`limiter::Limiter`] (docs/LIMITS.md) enforcing its
//! limits, or the node's `[limits]` defaults where it sets none. A change of
//! limits alone keeps the client's connections and applies to them at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio_util::sync::CancellationToken;

use blipless_store::credentials;
use blipless_store::{Change, ChangeKind, ClientLimits, ClientRecord, Store, StoreError, Usage};

pub mod limiter;
mod usage;

pub use usage::tunnel_instance;

use self::limiter::Limiter;

/// Bytes and connections a client has used since the last flush.
#[derive(Debug, Default)]
pub struct Meter {
    /// Bytes from the customer toward the destination.
    pub up: AtomicU64,
    /// Bytes from the destination to the customer.
    pub down: AtomicU64,
    /// Connections opened.
    pub connections: AtomicU64,
    /// Tunnels open now on this plane (not flushed: a live count, for
    /// `limits.tunnels_per_client`).
    pub live_tunnels: AtomicU64,
    /// SOCKS5 UDP associations open now on this plane (a live count, for
    /// `limits.udp_associations_per_client`).
    pub live_udp_associations: AtomicU64,
    /// A delta taken for the store whose add failed, with its batch number: it is
    /// sent again, alone and unchanged, until the store takes it (a repeat of an
    /// add that did land counts nothing, see `Store::add_usage`).
    unflushed: std::sync::Mutex<Option<(u64, Usage)>>,
    /// Held by the flush of this client's usage: two flushes at once (the
    /// last one at exit beside a periodic one a slow store held up) would
    /// defeat the batch numbers' repeat check (the store remembers one
    /// batch per writer and client: a newer batch landing between a held
    /// batch's two sends made its repeat count again) or put a batch back
    /// after the other flush passed the client (lost at exit).
    flushing: tokio::sync::Mutex<()>,
}

impl Meter {
    /// Bytes (both ways) counted since the last take.
    pub fn pending_bytes(&self) -> u64 {
        self.up
            .load(Ordering::Relaxed)
            .saturating_add(self.down.load(Ordering::Relaxed))
    }

    /// Bytes (both ways) of a taken delta whose add failed and is held for
    /// the next flush: counted nowhere in the store yet.
    pub fn held_bytes(&self) -> u64 {
        self.unflushed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, |(_, usage)| {
                usage.bytes_up.saturating_add(usage.bytes_down)
            })
    }

    /// Takes the counts accumulated since the last take.
    pub fn take(&self) -> Usage {
        Usage {
            bytes_up: self.up.swap(0, Ordering::Relaxed),
            bytes_down: self.down.swap(0, Ordering::Relaxed),
            connections: self.connections.swap(0, Ordering::Relaxed),
        }
    }
}

/// One known client.
#[derive(Debug)]
pub struct Client {
    /// As stored.
    pub record: ClientRecord,
    /// Usage not yet flushed to the store.
    pub meter: Arc<Meter>,
    /// Cancelled when the client is removed or replaced.
    pub revoked: CancellationToken,
    /// Its limits as enforced here, shared by all its connections.
    pub limiter: Arc<Limiter>,
}

impl Client {
    fn new(record: ClientRecord, defaults: &ClientLimits) -> Self {
        let limiter = Arc::new(Limiter::new(&record.limits.or(defaults)));
        Client {
            record,
            meter: Arc::default(),
            revoked: CancellationToken::new(),
            limiter,
        }
    }
}

/// Whether two records differ only in their limits (a change that keeps the
/// client's connections).
fn only_limits_differ(old: &ClientRecord, new: &ClientRecord) -> bool {
    ClientRecord {
        limits: new.limits,
        ..old.clone()
    } == *new
}

/// Every client this plane knows, by name.
#[derive(Debug)]
pub struct Directory {
    store: Arc<dyn Store>,
    clients: RwLock<HashMap<String, Arc<Client>>>,
    /// WireGuard clients by tunnel address, for their packets' accounting.
    by_address: RwLock<HashMap<std::net::IpAddr, Arc<Client>>>,
    feed_position: AtomicU64,
    catching_up: tokio::sync::Mutex<()>,
    /// The next usage batch number (see [`Directory::flush_usage`]).
    next_batch: AtomicU64,
    /// The last change applied from the feed, or the one at the head it was
    /// loaded at (checked by [`Directory::catch_up`]).
    last_change: std::sync::Mutex<Option<Change>>,
    removed: std::sync::Mutex<Vec<String>>,
    /// Bumped on every applied change, for those who follow the client list.
    version: tokio::sync::watch::Sender<u64>,
    /// `[limits]`: what a client's record leaves unset.
    defaults: ClientLimits,
    /// `wireguard.pool` and `wireguard.pool6`: an IPv6 tunnel address is
    /// the twin of its client's IPv4 one ([`Directory::set_pools6`]).
    pools6: std::sync::OnceLock<blipless_config::pool6::TunnelPools>,
}

const FEED_PAGE: usize = 1000;
/// How many clients' usage a flush adds to the store at once.
pub const FLUSH_CONCURRENCY: usize = 32;
/// How long [`Directory::sync_through`] waits for the store to show a
/// position it was told exists.
const SYNC_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

impl Directory {
    /// Loads every client: the feed's head first, then the client list,
    /// then whatever changed after that head (so nothing between the two
    /// reads is missed; changes already in the list re-apply harmlessly).
    pub async fn load(store: Arc<dyn Store>) -> Result<Arc<Self>, StoreError> {
        Self::load_with_defaults(store, ClientLimits::default()).await
    }

    /// [`Directory::load`], with the node's default limits.
    pub async fn load_with_defaults(
        store: Arc<dyn Store>,
        defaults: ClientLimits,
    ) -> Result<Arc<Self>, StoreError> {
        let head = store.feed_head().await?;
        let at_head = change_at(store.as_ref(), head).await?;
        let records = readable_clients(store.as_ref()).await?;
        let clients = records
            .into_iter()
            .map(|record| {
                let client = Client::new(record, &defaults);
                (client.record.name.clone(), Arc::new(client))
            })
            .collect();
        let by_address = address_index(&clients);
        let directory = Arc::new(Self {
            store,
            clients: RwLock::new(clients),
            by_address: RwLock::new(by_address),
            feed_position: AtomicU64::new(head),
            catching_up: tokio::sync::Mutex::new(()),
            next_batch: AtomicU64::new(1),
            last_change: std::sync::Mutex::new(at_head),
            removed: std::sync::Mutex::new(Vec::new()),
            version: tokio::sync::watch::channel(0).0,
            defaults,
            pools6: std::sync::OnceLock::new(),
        });
        directory.catch_up().await?;
        Ok(directory)
    }

    /// How many clients are known.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when no client is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Client>>> {
        self.clients
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Client>>> {
        self.clients
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The client whose name and secret these are, if any.
    pub fn authenticate(&self, name: &[u8], secret: &[u8]) -> Option<Arc<Client>> {
        let name = std::str::from_utf8(name).ok()?;
        let secret = std::str::from_utf8(secret).ok()?;
        let client = self.read().get(name).cloned()?;
        credentials::verify(secret, &client.record.secret_hash).then_some(client)
    }

    /// One client by name.
    pub fn get(&self, name: &str) -> Option<Arc<Client>> {
        self.read().get(name).cloned()
    }

    /// How many clients are over their quota now.
    pub fn over_quota(&self) -> u64 {
        self.read()
            .values()
            .filter(|client| client.limiter.is_over_quota())
            .count() as u64
    }

    /// Every client now.
    pub fn all(&self) -> Vec<Arc<Client>> {
        self.read().values().cloned().collect()
    }

    /// Applies every change after the last one seen; returns how many.
    ///
    /// Each read starts one entry early, at the last change applied, to check
    /// that it is still there: after a Redis failover that promoted a replica
    /// which had not yet received the last entries this plane read, their seqs
    /// are handed out again for other changes, and following on from the
    /// position would miss those. Then every client is read afresh, as at load.
    pub async fn catch_up(&self) -> Result<usize, StoreError> {
        // One reader at a time, so changes apply in feed order.
        let _turn = self.catching_up.lock().await;
        let mut applied = 0;
        loop {
            let after = self.feed_position.load(Ordering::SeqCst);
            let last_seen = self
                .last_change
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let from = match &last_seen {
                Some(seen) if seen.seq == after => after.saturating_sub(1),
                _ => after,
            };
            let mut changes = self.store.changes_since(from, FEED_PAGE + 1).await?;
            if from < after {
                if changes.first() != last_seen.as_ref() {
                    return Ok(applied + self.reload().await?);
                }
                changes.remove(0);
            }
            let Some(last) = changes.last().cloned() else {
                return Ok(applied);
            };
            // Fetch each touched client once: its current record is the truth.
            // One removed on the way (and added again, if it has a record) is
            // a new client of the same name: not the old one's usage, limits'
            // state or egress identity.
            let removed_on_the_way: BTreeSet<String> = changes
                .iter()
                .filter(|c| c.kind == ChangeKind::Remove)
                .map(|c| c.name.clone())
                .collect();
            let names: BTreeSet<String> = changes
                .into_iter()
                .map(|c| c.name)
                .filter(|name| !name.is_empty())
                .collect();
            for name in names {
                let record = match self.store.get_client(&name).await {
                    Ok(record) => record,
                    Err(error @ StoreError::CorruptRecord { .. }) => {
                        // Not to be retried: it reads the same next time, and
                        // every later change would wait behind it. The client
                        // is served as absent until its record is written again.
                        tracing::warn!(%error, "a client's record cannot be read: it is not served");
                        None
                    }
                    Err(error) => return Err(error),
                };
                if record.is_some() && removed_on_the_way.contains(&name) {
                    self.apply(&name, None);
                }
                self.apply(&name, record);
                applied += 1;
            }
            self.feed_position.store(last.seq, Ordering::SeqCst);
            *self
                .last_change
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(last);
        }
    }

    /// Reads every client afresh, as at load, after the feed lost entries this
    /// plane had applied: the position moves to the head. Returns how many
    /// clients were applied.
    async fn reload(&self) -> Result<usize, StoreError> {
        let after = self.feed_position.load(Ordering::SeqCst);
        let head = self.store.feed_head().await?;
        let at_head = change_at(self.store.as_ref(), head).await?;
        tracing::warn!(
            position = after,
            head,
            "the change feed lost entries this plane had applied (a store failover); reloading every client"
        );
        let records = readable_clients(self.store.as_ref()).await?;
        let listed: BTreeSet<String> = records.iter().map(|r| r.name.clone()).collect();
        let gone: Vec<String> = self
            .read()
            .keys()
            .filter(|name| !listed.contains(*name))
            .cloned()
            .collect();
        let applied = records.len() + gone.len();
        for record in records {
            let name = record.name.clone();
            self.apply(&name, Some(record));
        }
        for name in gone {
            self.apply(&name, None);
        }
        self.feed_position.store(head, Ordering::SeqCst);
        *self
            .last_change
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at_head;
        Ok(applied)
    }

    /// The change feed's position this plane has applied.
    pub fn position(&self) -> u64 {
        self.feed_position.load(Ordering::SeqCst)
    }

    /// Waits up to `wait` for a change after the applied position (Redis:
    /// a blocking read, so another node's change arrives at once).
    pub async fn wait_for_change(&self, wait: std::time::Duration) -> Result<bool, StoreError> {
        self.store.wait_for_change(self.position(), wait).await
    }

    /// Applies the change feed at least through `through` (read-your-writes
    /// for `blipless-ctl`): catches up, retrying briefly if the store has not
    /// shown that far yet (a replica behind its master). Returns the
    /// position applied, which may still be short of `through`.
    pub async fn sync_through(&self, through: u64) -> Result<u64, StoreError> {
        let deadline = tokio::time::Instant::now() + SYNC_PATIENCE;
        loop {
            self.catch_up().await?;
            let applied = self.position();
            if applied >= through || tokio::time::Instant::now() >= deadline {
                return Ok(applied);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Notified (the value bumped) whenever a client is added, changed or removed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The WireGuard peers: every client with a valid public key and a tunnel
    /// address, by key. A key that is not base64 of 32 bytes is skipped (logged).
    pub fn wireguard_peers(&self) -> HashMap<[u8; 32], blipless_protocol::channel::PeerEntry> {
        let mut peers = HashMap::new();
        for client in self.read().values() {
            let record = &client.record;
            let (Some(key), Some(address)) = (&record.wg_public_key, record.wg_address) else {
                continue;
            };
            let Some(public_key) = blipless_config::wireguard_key::decode(key) else {
                tracing::warn!(client = %record.name, "WireGuard public key is not base64 of 32 bytes; not a peer");
                continue;
            };
            peers.insert(
                public_key,
                blipless_protocol::channel::PeerEntry {
                    public_key,
                    address,
                    client: record.name.clone(),
                },
            );
        }
        peers
    }

    fn apply(&self, name: &str, record: Option<ClientRecord>) {
        let old_address = self.get(name).and_then(|c| c.record.wg_address);
        self.apply_record(name, record);
        let now = self.get(name);
        let mut index = self
            .by_address
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(address) = old_address {
            if index.get(&address).is_some_and(|c| c.record.name == name) {
                index.remove(&address);
            }
        }
        if let Some(client) = now {
            if let Some(address) = client.record.wg_address {
                index.insert(address, client);
            }
        }
        drop(index);
        self.version.send_modify(|version| *version += 1);
    }

    /// Sets the pools IPv6 tunnel addresses are mapped by (once, at start).
    pub fn set_pools6(&self, pools: blipless_config::pool6::TunnelPools) {
        let _ = self.pools6.set(pools);
    }

    /// The client whose WireGuard tunnel address (or its IPv6 twin) is `address`.
    pub fn by_address(&self, address: std::net::IpAddr) -> Option<Arc<Client>> {
        // An IPv6 tunnel address stands for its IPv4 twin.
        let address = match (address, self.pools6.get()) {
            (std::net::IpAddr::V6(v6), Some(pools)) => {
                pools.v4_of(v6).map_or(address, std::net::IpAddr::V4)
            }
            _ => address,
        };
        self.by_address
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&address)
            .cloned()
    }

    fn apply_record(&self, name: &str, record: Option<ClientRecord>) {
        let mut clients = self.write();
        match record {
            Some(record) => {
                let unchanged = clients.get(name).is_some_and(|c| c.record == record);
                if unchanged {
                    return;
                }
                if let Some(old) = clients.get(name) {
                    if only_limits_differ(&old.record, &record) {
                        // Same credentials: its connections stay, under the new limits.
                        old.limiter.set(&record.limits.or(&self.defaults));
                        let client = Client {
                            record,
                            meter: old.meter.clone(),
                            revoked: old.revoked.clone(),
                            limiter: old.limiter.clone(),
                        };
                        clients.insert(name.to_string(), Arc::new(client));
                        tracing::info!(client = name, "client's limits changed");
                        return;
                    }
                }
                let old = clients.get(name).cloned();
                let mut client = Client::new(record, &self.defaults);
                if let Some(old) = old {
                    // New credentials, same client: its usage, buckets, quota
                    // state and fleet tunnel counts go on.
                    old.limiter.set(&client.record.limits.or(&self.defaults));
                    client.meter = old.meter.clone();
                    client.limiter = old.limiter.clone();
                }
                let replaced = clients.insert(name.to_string(), Arc::new(client));
                if let Some(old) = replaced {
                    // New credentials: connections made with the old ones close.
                    old.revoked.cancel();
                }
                tracing::info!(client = name, "client loaded");
            }
            None => {
                if let Some(old) = clients.remove(name) {
                    old.revoked.cancel();
                    self.removed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(name.to_string());
                    tracing::info!(client = name, "client removed; closing its connections");
                }
            }
        }
    }

    /// Names removed since the last call (their egress identities must be evicted).
    pub fn take_removed(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .removed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The clients with a WireGuard address, by that address.
fn address_index(clients: &HashMap<String, Arc<Client>>) -> HashMap<std::net::IpAddr, Arc<Client>> {
    clients
        .values()
        .filter_map(|client| Some((client.record.wg_address?, client.clone())))
        .collect()
}

/// Unix seconds now.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The feed's entry at `head` (none for an empty feed): what a directory
/// loaded at `head` has seen last, so that [`Directory::catch_up`] can tell
/// when a store failover handed that seq out again, as it does after an
/// entry it applied itself. Without it a plane that had applied no change
/// since its load followed on from `head` and missed every change made at
/// a reused seq: a client removed then kept working there.
async fn change_at(store: &dyn Store, head: u64) -> Result<Option<Change>, StoreError> {
    if head == 0 {
        return Ok(None);
    }
    let first = store.changes_since(head - 1, 1).await?.into_iter().next();
    Ok(first.filter(|change| change.seq == head))
}

/// Every client whose record can be read; each that cannot is logged and
/// left out (served as absent), so one bad record costs only its client.
async fn readable_clients(store: &dyn Store) -> Result<Vec<ClientRecord>, StoreError> {
    let list = store.read_clients().await?;
    for error in &list.unreadable {
        tracing::warn!(%error, "a client's record cannot be read: it is not served");
    }
    Ok(list.records)
}

#[cfg(test)]
mod tests;
