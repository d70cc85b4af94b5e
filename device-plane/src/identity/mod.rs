//! Per-client identities: a client's egress state on this plane.
//!
//! An identity is opened the first time a client connects (or by pre-warm
//! before the plane says Ready): its egress identity is restored from the
//! store if a predecessor left one (consumed once), else allocated from the
//! source pool, and written back as this plane's snapshot (10-minute TTL,
//! refreshed while the client is active, kept at shutdown, deleted on a live
//! eviction). So a client keeps the address destinations see across deploys
//! and crashes.
//!
//! Activity is recorded per client and flushed to the node's activity set
//! every minute and once more at drain; a new plane pre-warms the clients
//! active within the window.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{OnceCell, Semaphore};

use blipless_store::{EgressIdentity, NodeId, Store, StoreError};

/// How long an identity snapshot lives in the store without a refresh.
pub const IDENTITY_TTL: Duration = Duration::from_secs(600);
/// How often activity is flushed (and identities refreshed).
pub const ACTIVITY_FLUSH: Duration = Duration::from_secs(60);

/// One client's egress state on this plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The client.
    pub client: String,
    /// What destinations see.
    pub identity: EgressIdentity,
}

/// What a pre-warm did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrewarmReport {
    /// Clients active within the window.
    pub candidates: usize,
    /// Identities opened.
    pub opened: usize,
    /// Identities that failed or timed out (skipped).
    pub skipped: usize,
}

type Slot = Arc<OnceCell<Arc<ClientIdentity>>>;

/// Every identity this plane has open, and the activity not yet flushed.
#[derive(Debug)]
pub struct Identities {
    store: Arc<dyn Store>,
    node: NodeId,
    sources: Vec<IpAddr>,
    open: Mutex<HashMap<String, Slot>>,
    /// Each open client's egress window as it is now (it changes when a
    /// route fails); saved with the identity.
    windows: Mutex<HashMap<String, Vec<String>>>,
    activity: Mutex<HashMap<String, i64>>,
    prewarmed: AtomicU64,
    /// The next source a rotating client's connection takes.
    next_rotation: std::sync::atomic::AtomicUsize,
    /// Pool addresses found not to be the host's any more, and since when:
    /// not allocated for [`UNUSABLE_FOR`].
    unusable: Mutex<HashMap<IpAddr, std::time::Instant>>,
    /// The sources of opens not finished yet, by client: counted by
    /// allocations as if open, so that a burst of first opens (a pre-warm,
    /// a herd of new clients) spreads over the pool instead of each taking
    /// the address that was least used before any of them finished.
    opening: Mutex<HashMap<String, IpAddr>>,
    /// When a call on a connection's path last found the store unavailable:
    /// for [`UNAVAILABLE_QUIET`] after it, saves on that path (an open's, a
    /// new window's) are left to the flush, so a connection does not wait
    /// for a hung store twice.
    store_unavailable: Mutex<Option<std::time::Instant>>,
}

/// How long after the store was found unavailable a connection's path does
/// not wait on it for a save.
const UNAVAILABLE_QUIET: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a pool address that could not be bound is passed over.
const UNUSABLE_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// A new sticky session for upstream usernames: 16 lowercase hex digits,
/// which every provider's username syntax accepts.
fn new_session() -> String {
    let random = blipless_store::credentials::try_new_secret().unwrap_or_else(|_| {
        // No randomness from the OS: the time still tells sessions apart.
        format!("{:?}", SystemTime::now())
    });
    blipless_store::credentials::hash_secret(&random)[..16].to_owned()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Unix seconds now.
pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Identities {
    /// No identity open yet.
    pub fn new(store: Arc<dyn Store>, node: NodeId, sources: Vec<IpAddr>) -> Self {
        Self {
            store,
            node,
            sources,
            open: Mutex::new(HashMap::new()),
            windows: Mutex::new(HashMap::new()),
            activity: Mutex::new(HashMap::new()),
            prewarmed: AtomicU64::new(0),
            next_rotation: std::sync::atomic::AtomicUsize::new(0),
            unusable: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            store_unavailable: Mutex::new(None),
        }
    }

    /// Notes what a call on a connection's path found of the store.
    fn note_store(&self, answered: bool) {
        *lock(&self.store_unavailable) = (!answered).then(std::time::Instant::now);
    }

    /// Whether a save on a connection's path is left to the flush: the
    /// store was found unavailable lately.
    fn store_lately_unavailable(&self) -> bool {
        lock(&self.store_unavailable).is_some_and(|at| at.elapsed() < UNAVAILABLE_QUIET)
    }

    /// The source for one connection of a rotating client (docs/LIMITS.md,
    /// "Source rotation"): each call the next address of `egress.sources`,
    /// in turn across the plane's rotating clients; None without sources.
    pub fn rotating_source(&self) -> Option<IpAddr> {
        if self.sources.is_empty() {
            return None;
        }
        let turn = self.next_rotation.fetch_add(1, Ordering::Relaxed);
        self.sources.get(turn % self.sources.len()).copied()
    }

    /// The node this plane serves.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// Identities open now.
    pub fn live(&self) -> u64 {
        lock(&self.open)
            .values()
            .filter(|slot| slot.initialized())
            .count() as u64
    }

    /// Identities opened by pre-warm.
    pub fn prewarmed(&self) -> u64 {
        self.prewarmed.load(Ordering::Relaxed)
    }

    /// Records that `client` carried traffic now.
    pub fn touch(&self, client: &str) {
        lock(&self.activity).insert(client.to_string(), now_unix());
    }

    /// The client's identity, opening it if needed. Never fails: if the store
    /// cannot be reached, the client gets a fresh identity (logged) and the
    /// snapshot is written at the next flush.
    pub async fn open(self: &Arc<Self>, client: &str) -> Arc<ClientIdentity> {
        let slot = lock(&self.open)
            .entry(client.to_string())
            .or_default()
            .clone();
        if let Some(identity) = slot.get() {
            return identity.clone();
        }
        // The opening runs on a task of its own, which fills the slot
        // whatever becomes of this caller: restoring takes the stored
        // identity out of the store, and a caller dropped between that and
        // the save (a connect cut short, a pre-warm past its budget) would
        // lose it, and the client its source address.
        let (identities, name) = (self.clone(), client.to_owned());
        let opening = tokio::spawn(async move {
            let identity = slot
                .get_or_init(|| identities.open_identity(&name))
                .await
                .clone();
            // Counted through the slot from now on.
            lock(&identities.opening).remove(&name);
            // Evicted while it opened (the client removed, its source gone)
            // and not opened again since: what the opening saved is
            // dropped again, or a client added later under the name would
            // inherit it (and its window would count in the exits' load).
            let evicted = !lock(&identities.open).contains_key(&name);
            if evicted {
                identities.forget(&name).await;
            }
            identity
        });
        match opening.await {
            Ok(identity) => identity,
            // The runtime is going down (or the opening panicked): a fresh
            // identity, which is all this connection needs.
            Err(error) => {
                lock(&self.opening).remove(client);
                tracing::warn!(client, %error, "opening the egress identity failed; allocating one");
                Arc::new(ClientIdentity {
                    client: client.to_owned(),
                    identity: EgressIdentity {
                        source: self.allocate_source(None),
                        session: Some(new_session()),
                        ..EgressIdentity::default()
                    },
                })
            }
        }
    }

    async fn open_identity(&self, client: &str) -> Arc<ClientIdentity> {
        // A store that did not answer the take would not answer the save
        // either: the connection waiting for this open does not wait for it
        // twice (up to 8 s on a hung Redis), nor for a new window's save
        // (`store_lately_unavailable`). The flush saves the identity while
        // the client has traffic, and the exit saves every one.
        let restored = match self.store.take_identity(&self.node, client).await {
            Ok(identity) => {
                self.note_store(true);
                identity
            }
            Err(error) => {
                tracing::warn!(client, %error, "restoring the egress identity failed; allocating one");
                self.note_store(!matches!(error, StoreError::Unavailable(_)));
                None
            }
        };
        let mut identity = match restored {
            Some(mut identity) => {
                tracing::debug!(client, ?identity, "egress identity restored");
                // A source the pool no longer has, or none where the pool
                // now has some (`egress.sources` changed): a new source;
                // the session and window stay.
                let stale = identity.source.map_or(!self.sources.is_empty(), |source| {
                    !self.sources.contains(&source)
                });
                if stale {
                    identity.source = self.allocate_source(Some(client));
                } else if let Some(source) = identity.source {
                    lock(&self.opening).insert(client.to_owned(), source);
                }
                identity
            }
            None => EgressIdentity {
                source: self.allocate_source(Some(client)),
                ..EgressIdentity::default()
            },
        };
        if identity.session.is_none() {
            identity.session = Some(new_session());
        }
        lock(&self.windows).insert(client.to_owned(), identity.window.clone());
        if self.store_lately_unavailable() {
            tracing::debug!(
                client,
                "egress identity not saved now (the store is unavailable); the next flush saves it"
            );
        } else if let Err(error) = self
            .store
            .put_identity(&self.node, client, &identity, IDENTITY_TTL)
            .await
        {
            tracing::warn!(client, %error, "saving the egress identity failed; retrying at the next flush");
            if matches!(error, StoreError::Unavailable(_)) {
                self.note_store(false);
            }
        }
        Arc::new(ClientIdentity {
            client: client.to_string(),
            identity,
        })
    }

    /// `client`'s source address `source` cannot be bound (it is no longer
    /// the host's): the identity is evicted, and the address passed over by
    /// allocations for a while, so that the next open does not get it back.
    pub async fn source_unusable(&self, client: &str, source: IpAddr) {
        lock(&self.unusable).insert(source, std::time::Instant::now());
        self.evict(client).await;
    }

    /// The pool address fewest open (or opening) identities use (first such
    /// in pool order), among those not found unusable lately (all of them if
    /// none is left: a connection from a dead address fails, where one from
    /// the host's own would leave from an address the operator did not
    /// give). With `opening`, the choice is recorded as that client's until
    /// its open finishes.
    fn allocate_source(&self, opening: Option<&str>) -> Option<IpAddr> {
        // Held from the count to the record, so two opens cannot both see
        // the same address as the least used.
        let mut reserved = lock(&self.opening);
        let in_use: Vec<IpAddr> = {
            let open = lock(&self.open);
            let finished = open
                .values()
                .filter_map(|slot| slot.get().and_then(|held| held.identity.source));
            // An open whose slot just filled is counted there only.
            let unfinished = reserved.iter().filter_map(|(client, source)| {
                let filled = open.get(client).is_some_and(|slot| slot.initialized());
                (!filled).then_some(*source)
            });
            finished.chain(unfinished).collect()
        };
        let usable: Vec<&IpAddr> = {
            let mut unusable = lock(&self.unusable);
            unusable.retain(|_, since| since.elapsed() < UNUSABLE_FOR);
            self.sources
                .iter()
                .filter(|source| !unusable.contains_key(source))
                .collect()
        };
        let candidates = if usable.is_empty() {
            self.sources.iter().collect()
        } else {
            usable
        };
        let chosen = candidates
            .into_iter()
            .min_by_key(|source| in_use.iter().filter(|used| used == source).count())
            .copied();
        if let (Some(client), Some(source)) = (opening, chosen) {
            reserved.insert(client.to_owned(), source);
        }
        chosen
    }

    /// The client's egress window now (best first; empty before the first
    /// connection chose one).
    pub fn window(&self, client: &str) -> Vec<String> {
        lock(&self.windows).get(client).cloned().unwrap_or_default()
    }

    /// Records the client's new window and saves its identity at once (a
    /// window changes rarely: on first use and when a route fails), so a
    /// SIGKILL right after keeps the choice.
    pub async fn set_window(&self, held: &ClientIdentity, window: Vec<String>) {
        // An identity evicted since it was handed out (its source found
        // unusable, its client removed) must not be saved over what
        // replaced it.
        let current = lock(&self.open)
            .get(&held.client)
            .and_then(|slot| slot.get().cloned())
            .is_some_and(|open| std::ptr::eq(&*open, held));
        if !current {
            return;
        }
        let previous = lock(&self.windows).insert(held.client.clone(), window.clone());
        if previous.as_ref() == Some(&window) {
            return;
        }
        tracing::debug!(client = %held.client, ?window, "egress window chosen");
        if self.store_lately_unavailable() {
            tracing::debug!(client = %held.client, "egress window not saved now (the store is unavailable); the next flush saves it");
        } else if let Err(error) = self
            .store
            .put_identity(&self.node, &held.client, &self.snapshot(held), IDENTITY_TTL)
            .await
        {
            tracing::warn!(client = %held.client, %error, "saving an egress window failed; retrying at the next flush");
            if matches!(error, StoreError::Unavailable(_)) {
                self.note_store(false);
            }
        }
    }

    /// How many open clients' windows hold each route.
    pub fn window_members(&self) -> HashMap<String, u64> {
        let mut members = HashMap::new();
        for window in lock(&self.windows).values() {
            for route in window {
                *members.entry(route.clone()).or_insert(0) += 1;
            }
        }
        members
    }

    /// What is saved for `held`: its identity with the window as it is now.
    fn snapshot(&self, held: &ClientIdentity) -> EgressIdentity {
        let mut identity = held.identity.clone();
        if let Some(window) = lock(&self.windows).get(&held.client) {
            identity.window = window.clone();
        }
        identity
    }

    /// Live eviction (the client was removed, or its route failed): the
    /// identity closes and it is deleted from the store.
    pub async fn evict(&self, client: &str) {
        lock(&self.open).remove(client);
        self.forget(client).await;
    }

    /// The rest of an eviction: the window and the stored snapshot.
    async fn forget(&self, client: &str) {
        lock(&self.windows).remove(client);
        if let Err(error) = self.store.drop_identity(&self.node, client).await {
            tracing::warn!(client, %error, "deleting an evicted identity failed; it expires with its TTL");
        }
    }

    /// [`Identities::open`] for a client that must still be in `directory`
    /// once its identity is open, with the client: one removed meanwhile
    /// (its removal's eviction may even have come before this open began)
    /// has the identity evicted again, and gets `None`, so that it does not
    /// outlive the client, nor pass to one added later under the name.
    pub async fn open_known(
        self: &Arc<Self>,
        directory: &crate::clients::Directory,
        client: &str,
    ) -> Option<(Arc<ClientIdentity>, Arc<crate::clients::Client>)> {
        let held = self.open(client).await;
        match directory.get(client) {
            Some(known) => Some((held, known)),
            None => {
                self.evict(client).await;
                None
            }
        }
    }

    fn open_identities(&self) -> Vec<Arc<ClientIdentity>> {
        lock(&self.open)
            .values()
            .filter_map(|slot| slot.get().cloned())
            .collect()
    }

    /// Flushes recorded activity to the node's activity set and refreshes
    /// the identity snapshots of the clients that were active. Activity that
    /// could not be written is kept for the next flush.
    pub async fn flush(&self) {
        let batch: Vec<(String, i64)> = lock(&self.activity).drain().collect();
        if batch.is_empty() {
            return;
        }
        if let Err(error) = self.store.touch_activity(&self.node, &batch).await {
            tracing::warn!(%error, "flushing activity failed; will retry");
            let mut activity = lock(&self.activity);
            for (client, at) in batch {
                let entry = activity.entry(client).or_insert(at);
                *entry = (*entry).max(at);
            }
            return;
        }
        let active: std::collections::HashSet<String> = batch.into_iter().map(|(c, _)| c).collect();
        for held in self
            .open_identities()
            .into_iter()
            .filter(|d| active.contains(&d.client))
        {
            if let Err(error) = self
                .store
                .put_identity(
                    &self.node,
                    &held.client,
                    &self.snapshot(&held),
                    IDENTITY_TTL,
                )
                .await
            {
                tracing::warn!(client = %held.client, %error, "refreshing an identity failed");
                if matches!(error, StoreError::Unavailable(_)) {
                    self.note_store(false);
                }
            }
        }
    }

    /// At shutdown: flush activity and keep every open identity
    /// for the successor (or a restart).
    pub async fn keep_all(&self) {
        self.flush().await;
        for held in self.open_identities() {
            if let Err(error) = self
                .store
                .put_identity(
                    &self.node,
                    &held.client,
                    &self.snapshot(&held),
                    IDENTITY_TTL,
                )
                .await
            {
                tracing::warn!(client = %held.client, %error, "keeping an identity failed");
            }
        }
    }

    /// Opens identities for the clients active on this node within `window`,
    /// `concurrency` at a time with a little jitter, each within
    /// `device_timeout`, all within `budget`. Failures are logged and skipped.
    pub async fn prewarm(
        self: &Arc<Self>,
        window: Duration,
        concurrency: usize,
        device_timeout: Duration,
        budget: Duration,
        is_client: impl Fn(&str) -> bool,
    ) -> PrewarmReport {
        let since = now_unix() - window.as_secs() as i64;
        let candidates = match self.store.active_clients(&self.node, since).await {
            // Only clients there still: a removed one's activity outlives
            // it, and opening it would save its identity again.
            Ok(clients) => clients
                .into_iter()
                .filter(|client| is_client(client))
                .collect::<Vec<_>>(),
            Err(error) => {
                tracing::warn!(%error, "reading the activity set failed; no pre-warm");
                return PrewarmReport::default();
            }
        };
        let mut report = PrewarmReport {
            candidates: candidates.len(),
            ..PrewarmReport::default()
        };
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for (index, client) in candidates.into_iter().enumerate() {
            let identities = self.clone();
            let permits = permits.clone();
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await.ok()?;
                tokio::time::sleep(jitter(&client, index)).await;
                match tokio::time::timeout(device_timeout, identities.open(&client)).await {
                    Ok(_) => {
                        identities.prewarmed.fetch_add(1, Ordering::Relaxed);
                        Some(true)
                    }
                    Err(_) => {
                        tracing::warn!(
                            client,
                            ?device_timeout,
                            "pre-warming an identity timed out; skipped"
                        );
                        Some(false)
                    }
                }
            });
        }
        let all = async {
            while let Some(done) = tasks.join_next().await {
                match done {
                    Ok(Some(true)) => report.opened += 1,
                    _ => report.skipped += 1,
                }
            }
        };
        if tokio::time::timeout(budget, all).await.is_err() {
            tracing::warn!(?budget, "pre-warm budget over; the rest opens on first use");
            report.skipped = report.candidates - report.opened;
        }
        report
    }
}

/// Up to 50 ms, spread by client and position, so a herd of opens does not
/// hit the store in lockstep.
fn jitter(client: &str, index: usize) -> Duration {
    let hash = client.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Duration::from_millis((hash ^ index as u64) % 50)
}

#[cfg(test)]
mod tests;
