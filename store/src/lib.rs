//! The device plane's state: proxy clients, their change feed and usage counters, the
//! activity set per node, the egress identities per client and the WireGuard endpoint
//! snapshot per node (docs/ARCHITECTURE.md, "State and the store").
//!
//! One object-safe [`Store`] trait, used as `Arc<dyn Store>`, with one implementation per
//! backend and one contract test suite (`contract`, test builds only) that every backend must pass:
//! - **embedded** (`sqlite://<path>`, the default): a SQLite file in WAL mode, safe for
//!   several processes on one node (`blipless-ctl` adding a client while
//!   `blipless-device` serves); see [`sqlite`].
//! - **redis** (`redis://...`, `redis+sentinel://...`, `redis+cluster://...`, each
//!   with a `rediss` twin for TLS): one Redis, a Sentinel-managed master or a Redis
//!   Cluster shared by a fleet of nodes; see [`redis`] for its key shapes, what is
//!   atomic and what survives a failover.
//!
//! Pick a backend with [`open`]. Client names are checked by [`validate_name`]: they are
//! proxy usernames and (with Redis) parts of keys.

use std::path::PathBuf;
use std::sync::Arc;

use blipless_config::store_url::{self, StoreUrl};

pub mod credentials;
pub mod policy;
mod quota_window;
pub mod redis;
pub mod sqlite;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

#[cfg(test)]
mod contract;

pub use self::policy::{EgressPolicy, PolicyError};
pub use self::redis::RedisStore;
pub use self::sqlite::SqliteStore;
pub use blipless_config::client_limits::{ClientLimits, SourcePolicy};

/// A change to a client's limits, given the limits it finds
/// ([`Store::update_limits`]).
pub type LimitsChange = Arc<LimitsFn>;
/// What a [`LimitsChange`] holds.
pub type LimitsFn = dyn Fn(ClientLimits) -> ClientLimits + Send + Sync;

/// How often [`Store::wait_for_change`] looks at a store that cannot block
/// on its feed (the embedded one).
pub const FEED_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// Longest client name accepted, in bytes (names are ASCII).
pub const MAX_NAME_LEN: usize = 64;

/// A proxy client, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientRecord {
    /// Unique; also the proxy username. See [`validate_name`].
    pub name: String,
    /// Hex SHA-256 of the secret ([`crate::credentials::hash_secret`]); the secret
    /// itself is never stored.
    pub secret_hash: String,
    /// When the client was created, in unix seconds.
    pub created_at: i64,
    /// WireGuard public key, stored and returned as given.
    pub wg_public_key: Option<String>,
    /// WireGuard tunnel address, stored and returned as given. At most one client
    /// holds each address: [`Store::add_client`] refuses a taken one
    /// ([`StoreError::AddressTaken`]); removing the client frees it.
    pub wg_address: Option<std::net::IpAddr>,
    /// Which routes the client's egress window may use ([`EgressPolicy::Any`]
    /// when absent, as for clients stored before policies existed).
    #[serde(default)]
    pub egress: EgressPolicy,
    /// The client's own limits (docs/LIMITS.md); a field it leaves unset
    /// takes the node's `[limits]` default. Empty for clients stored before
    /// limits existed.
    #[serde(default, skip_serializing_if = "ClientLimits::is_empty")]
    pub limits: ClientLimits,
}

/// What happened to a client in the change feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// The client was added (or, later, updated): read it with [`Store::get_client`].
    Upsert,
    /// The client was removed.
    Remove,
}

/// One entry of the change feed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Change {
    /// Position in the feed: positive, strictly increasing, never reused.
    pub seq: u64,
    /// The client's name; empty for a feed entry that names none (not one
    /// of ours): it only moves a reader's position.
    pub name: String,
    /// What happened to it.
    pub kind: ChangeKind,
}

/// A client's traffic counters, or a delta added to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Bytes from the client to the destinations.
    pub bytes_up: u64,
    /// Bytes from the destinations to the client.
    pub bytes_down: u64,
    /// Connections (or tunnels) opened.
    pub connections: u64,
}

/// A node's name in keys: node.host and node.block from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId {
    /// `node.host`: unique per node.
    pub host: String,
    /// `node.block`: the group of nodes it belongs to.
    pub block: String,
}

/// What a client's egress looks like from outside on one node; kept across
/// deploys. Fields added later default when absent, so a snapshot written by
/// an older plane still restores.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EgressIdentity {
    /// The source address the client's direct traffic leaves from, if pinned.
    pub source: Option<std::net::IpAddr>,
    /// The client's egress window: route names, best first (`direct` or an
    /// upstream's name).
    #[serde(default)]
    pub window: Vec<String>,
    /// The value of `{session}` in upstream SOCKS5 usernames (providers'
    /// sticky sessions).
    #[serde(default)]
    pub session: Option<String>,
}

/// One WireGuard peer in an [`EndpointSnapshot`]: where the ingress last heard from it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredEndpoint {
    /// The peer's public key, standard base64 (as `wg` writes it).
    pub public_key: String,
    /// Its endpoint: the UDP address its last authenticated packet came from.
    pub endpoint: std::net::SocketAddr,
    /// When that packet came, in milliseconds since the Unix epoch.
    pub last_received_ms: u64,
}

/// A node's WireGuard peer endpoints, as the ingress last reported them (it sends the
/// active device plane one every few seconds). An ingress that starts with no
/// predecessor to hand off from (after a crash) gets it back and initiates handshakes
/// to the recently active peers at once. Stored as JSON, one per node.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EndpointSnapshot {
    /// When the ingress took it, in milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    /// Every peer the ingress had an endpoint for.
    pub peers: Vec<StoredEndpoint>,
}

/// How long a node's endpoint snapshot lives after its last write: a node that has been
/// gone for a day has no peers worth calling back (their NAT mappings are long gone,
/// and a peer that still wants the tunnel handshakes again by itself).
pub const ENDPOINTS_EXPIRY_SECS: i64 = 24 * 3600;

/// How long an activity entry counts: older ones are trimmed on write and ignored on read.
pub const ACTIVITY_RETENTION_SECS: i64 = 3600;

/// How long a node's whole activity set lives after its last write.
pub const ACTIVITY_EXPIRY_SECS: i64 = 7200;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL could not be parsed or names an unknown scheme.
    #[error(
        "invalid store URL {0}: expected sqlite://<path>, \
         redis[s]://[[user]:password@]<host>[:port][/db], \
         redis[s]+sentinel://[[user]:password@]<host>[:port],.../<service>[/<db>] or \
         redis[s]+cluster://[[user]:password@]<host>[:port],..."
    )]
    InvalidUrl(String),
    /// A write was applied on the Redis master, but no replica confirmed it in
    /// time ([`redis::CONFIRM_WAIT`]): it stands, unless the master fails before
    /// it reaches a replica and a failover promotes one without it.
    #[error("store write not confirmed: {0}")]
    Unconfirmed(String),
    /// The backend cannot be reached (a Redis that is down, slow or unreachable), or the
    /// connection broke during the call; the message names the store (without its
    /// password) and what was being done. Worth retrying later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A client name is not 1..=64 characters of `[A-Za-z0-9._-]`.
    #[error("invalid client name {0:?}: use 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    InvalidName(String),
    /// A client of that name already exists.
    #[error("client {0:?} already exists")]
    AlreadyExists(String),
    /// Another client holds that WireGuard tunnel address (`wg_address`). Worth
    /// retrying with another address: two `blipless-ctl client add --wg` running at
    /// once may pick the same one, and the store lets only one of them have it.
    #[error("WireGuard address {0} is taken by another client")]
    AddressTaken(std::net::IpAddr),
    /// No client of that name exists (usage of an unknown client).
    #[error("no client named {0:?}")]
    NotFound(String),
    /// The store was written by a newer version whose schema this one does not know.
    #[error("store schema version {found} is newer than the {supported} this build supports")]
    IncompatibleSchema {
        /// The version found in the store.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// One client's stored record cannot be decoded (written by a newer version,
    /// or damaged). Only that client is affected: [`Store::read_clients`] reads
    /// the others.
    #[error("client {name:?}'s stored record cannot be read: {detail}")]
    CorruptRecord {
        /// The client whose record it is.
        name: String,
        /// What is wrong with it (never a secret).
        detail: String,
    },
    /// The backend failed (a database error, a lost worker thread, a poisoned lock or
    /// corrupt data); the message says what was being done.
    #[error("store backend: {0}")]
    Backend(String),
    /// A filesystem operation failed (creating the store's directory).
    #[error("store I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// What [`Store::read_clients`] found.
#[derive(Debug, Default)]
pub struct ClientList {
    /// The clients whose records could be read, ordered by name.
    pub records: Vec<ClientRecord>,
    /// One [`StoreError::CorruptRecord`] for each record that could not.
    pub unreadable: Vec<StoreError>,
}

impl ClientList {
    /// Sorts what was read into records and errors, in the order given.
    pub fn from_results(
        results: impl IntoIterator<Item = Result<ClientRecord, StoreError>>,
    ) -> Self {
        let mut list = Self::default();
        for result in results {
            match result {
                Ok(record) => list.records.push(record),
                Err(error) => list.unreadable.push(error),
            }
        }
        list
    }
}

/// The device plane's state. Object safe: use it as `Arc<dyn Store>`.
///
/// Methods that take a name treat an invalid name (see [`validate_name`]) as a name
/// that cannot exist: `get_client` answers `None`, `remove_client` `false`, the usage
/// methods [`StoreError::NotFound`]. Only `add_client` answers
/// [`StoreError::InvalidName`]. So untrusted input (a proxy username) can be looked up
/// as it is. Identities follow the same rule: `put_identity` answers
/// [`StoreError::InvalidName`], `take_identity` `None`, `drop_identity` `Ok`.
///
/// Activity is kept relative to the store's wall clock: entries older than
/// [`ACTIVITY_RETENTION_SECS`] are trimmed on write and never returned, whatever `since`
/// asks. Touching no clients writes nothing.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Adds a client; `StoreError::AlreadyExists` if the name is taken,
    /// `StoreError::InvalidName` if the name is invalid, `StoreError::AddressTaken` if
    /// its `wg_address` is another client's (a taken name is reported first). Appends
    /// an Upsert change. Of several adds of different records racing for one name or
    /// one address, exactly one succeeds.
    ///
    /// Adding the very record that is stored succeeds: it is the repeat of an add
    /// whose outcome the caller did not learn (the store failed over mid-call), and
    /// it finishes what that add left undone (on Redis, the feed entry). Records made
    /// by `blipless-ctl` are never equal by chance (each has a fresh secret).
    async fn add_client(&self, record: ClientRecord) -> Result<(), StoreError>;
    /// The client of that name, if any.
    async fn get_client(&self, name: &str) -> Result<Option<ClientRecord>, StoreError>;
    /// Every client whose record can be read, ordered by name, and a
    /// [`StoreError::CorruptRecord`] for each that cannot: one bad record costs
    /// only its own client (a device plane loads and follows the rest).
    async fn read_clients(&self) -> Result<ClientList, StoreError>;
    /// All clients, ordered by name; a record that cannot be read fails it
    /// ([`StoreError::CorruptRecord`], naming the client), so an operator's
    /// listing never leaves one out without saying so.
    async fn list_clients(&self) -> Result<Vec<ClientRecord>, StoreError> {
        let list = self.read_clients().await?;
        match list.unreadable.into_iter().next() {
            Some(error) => Err(error),
            None => Ok(list.records),
        }
    }
    /// Removes a client (and its usage) and frees its `wg_address`; Ok(false) if there
    /// was none. Appends a Remove change (only when a client was removed).
    async fn remove_client(&self, name: &str) -> Result<bool, StoreError>;
    /// Changes with seq > `after`, oldest first, at most `limit`. `after = 0` reads the
    /// feed from the start; follow it by passing the last seq seen.
    async fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError>;
    /// The newest change's seq (0 for an empty feed): read it before
    /// listing the clients, then follow the feed after it.
    async fn feed_head(&self) -> Result<u64, StoreError>;
    /// Waits up to about `wait` for a change with seq > `after`; true when
    /// there is one (read it with [`Store::changes_since`]). The default
    /// looks every [`FEED_LOOK_EVERY`] (the embedded store: one cheap query
    /// on a local file); Redis blocks on the stream (`XREAD BLOCK`), so a
    /// fleet's nodes see a change as soon as it is written.
    async fn wait_for_change(
        &self,
        after: u64,
        wait: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.feed_head().await? > after {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(FEED_LOOK_EVERY.min(deadline - now)).await;
        }
    }
    /// Adds a usage delta to a client's counters (atomically; several processes may add
    /// concurrently). Counters saturate at `i64::MAX` (2^63 - 1). `StoreError::NotFound` if the
    /// client does not exist (for example, it was removed meanwhile).
    ///
    /// `batch` names this delta among this handle's adds for this client: a caller
    /// whose add failed keeps the delta and its batch number and repeats both, and a
    /// repeat of an add that was applied after all adds nothing. Each new delta takes
    /// a new number. The Redis store, where a broken connection or a failover can
    /// leave it unknown whether an add was applied, remembers the last batch of each
    /// handle and client for an hour ([`redis::USAGE_BATCH_MEMORY`]), and on Sentinel
    /// and Cluster fails an add that no replica confirmed (to be repeated); the
    /// embedded store applies an add or fails it whole, and ignores `batch`.
    async fn add_usage(&self, name: &str, delta: Usage, batch: u64) -> Result<(), StoreError>;
    /// A client's counters (zero for a new client); `StoreError::NotFound` if the
    /// client does not exist.
    async fn usage(&self, name: &str) -> Result<Usage, StoreError>;

    /// Records that `clients` (name, unix seconds of last activity) carried traffic on `node`:
    /// adds or raises each entry, trims entries older than 1 h, and lets the whole set expire 2 h after the last write.
    async fn touch_activity(
        &self,
        node: &NodeId,
        clients: &[(String, i64)],
    ) -> Result<(), StoreError>;
    /// Clients active on `node` at or after `since` (unix seconds), most recent first.
    async fn active_clients(&self, node: &NodeId, since: i64) -> Result<Vec<String>, StoreError>;
    /// Saves a client's egress identity on `node`, a full snapshot, for `ttl`
    /// (overwrites). Identities are per (client, node): what one node chose
    /// never changes another's.
    async fn put_identity(
        &self,
        node: &NodeId,
        client: &str,
        identity: &EgressIdentity,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError>;
    /// Takes a client's identity on `node`: returns it and deletes it (consumed
    /// once per restore). None if absent or expired.
    async fn take_identity(
        &self,
        node: &NodeId,
        client: &str,
    ) -> Result<Option<EgressIdentity>, StoreError>;
    /// Deletes a client's identity on `node` (live eviction).
    async fn drop_identity(&self, node: &NodeId, client: &str) -> Result<(), StoreError>;

    /// Saves `node`'s WireGuard endpoint snapshot, replacing the one it had. It expires
    /// [`ENDPOINTS_EXPIRY_SECS`] after this write unless replaced again.
    async fn put_endpoints(
        &self,
        node: &NodeId,
        snapshot: &EndpointSnapshot,
    ) -> Result<(), StoreError>;
    /// `node`'s last WireGuard endpoint snapshot; None if it has none (never saved, or
    /// expired).
    async fn get_endpoints(&self, node: &NodeId) -> Result<Option<EndpointSnapshot>, StoreError>;

    /// Replaces a client's limits (docs/LIMITS.md) and appends an Upsert
    /// change, so every node's device plane applies them.
    /// `StoreError::NotFound` if there is no such client.
    async fn set_limits(&self, name: &str, limits: ClientLimits) -> Result<(), StoreError> {
        self.update_limits(name, Arc::new(move |_| limits))
            .await
            .map(|_| ())
    }
    /// Changes a client's limits with `change`, applied to the limits as
    /// they are at that moment in one atomic step (a transaction, or a
    /// compare and set repeated on a conflict), so that two changes to
    /// different limits made at once both stand; appends an Upsert change
    /// and returns the new limits. `StoreError::NotFound` if there is no
    /// such client.
    async fn update_limits(
        &self,
        name: &str,
        change: LimitsChange,
    ) -> Result<ClientLimits, StoreError>;
    /// Adds `bytes` to the client's quota count for `window` (a quota
    /// period's key, [`blipless_config::client_limits::Window::key`]) and
    /// returns the count. A count kept for an earlier window of the same
    /// period (`day:N` before `day:N+1`) is replaced: the period rolled
    /// over. A count kept for the next one is kept, and the bytes are added
    /// to it: the adding node's clock lags (skew between nodes, a clock
    /// stepped back), and its add must neither restart the fleet's count
    /// nor be lost. A count kept for a window further ahead is replaced (a
    /// node whose clock was years ahead must not pin the count), as is one
    /// of another period (the quota changed). Every node adds to the one count, so a quota is
    /// fleet-wide. `StoreError::NotFound` if there is no such client.
    ///
    /// Not deduplicated across calls like [`Store::add_usage`]: a caller
    /// repeating an add whose reply it lost may count those bytes twice
    /// (docs/LIMITS.md, "Overshoot"). Within one call, the Redis store's own
    /// repeats (its retries, the Cluster client's re-sends) count once.
    async fn add_quota_usage(
        &self,
        name: &str,
        window: &str,
        bytes: u64,
    ) -> Result<u64, StoreError>;
    /// Forgets the client's quota count (`blipless-ctl client set --quota-reset`):
    /// it starts again from zero.
    async fn reset_quota_usage(&self, name: &str) -> Result<(), StoreError>;

    /// Records that `client` has `count` tunnels open on `node` now, for
    /// `ttl` (0 forgets the entry): how a fleet shares a client's
    /// connection cap (docs/LIMITS.md, "Connection caps").
    async fn put_live_tunnels(
        &self,
        node: &NodeId,
        client: &str,
        count: u64,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError>;
    /// The tunnels `client` has open on every node but `except`, as each
    /// last recorded them; entries whose `ttl` ran out (a node that died)
    /// do not count. `except`'s processes (recorded as block
    /// `<block>.p<pid>`) are left out with it: a plane counts its node's
    /// tunnels itself, and its predecessor's entry still lists the tunnels
    /// it adopted at the deploy.
    async fn live_tunnels(&self, client: &str, except: &NodeId) -> Result<u64, StoreError>;
}

/// Longest identity TTL kept: 100 years (a longer one is cut to this), so an expiry in
/// milliseconds never overflows.
pub(crate) const MAX_IDENTITY_TTL_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// A TTL in whole milliseconds, rounded up (1 ns is 1 ms; zero stays zero) and capped
/// at [`MAX_IDENTITY_TTL_MS`].
pub(crate) fn ttl_millis(ttl: std::time::Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).map_or(MAX_IDENTITY_TTL_MS, |ms| ms.min(MAX_IDENTITY_TTL_MS))
}

/// An identity as stored: JSON.
pub(crate) fn encode_identity(identity: &EgressIdentity) -> Result<String, StoreError> {
    serde_json::to_string(identity)
        .map_err(|err| StoreError::Backend(format!("encoding identity: {err}")))
}

/// An identity read back; anything but its JSON is corrupt data.
pub(crate) fn decode_identity(client: &str, json: &str) -> Result<EgressIdentity, StoreError> {
    serde_json::from_str(json).map_err(|err| {
        StoreError::Backend(format!(
            "corrupt store: identity of client {client:?}: {err}"
        ))
    })
}

/// An endpoint snapshot as stored: JSON.
pub(crate) fn encode_endpoints(snapshot: &EndpointSnapshot) -> Result<String, StoreError> {
    serde_json::to_string(snapshot)
        .map_err(|err| StoreError::Backend(format!("encoding endpoint snapshot: {err}")))
}

/// An endpoint snapshot read back; anything but its JSON is corrupt data.
pub(crate) fn decode_endpoints(node: &NodeId, json: &str) -> Result<EndpointSnapshot, StoreError> {
    serde_json::from_str(json).map_err(|err| {
        StoreError::Backend(format!(
            "corrupt store: endpoint snapshot of node {}/{}: {err}",
            node.host, node.block
        ))
    })
}

/// The current time in unix seconds (0 if the clock is before 1970).
pub(crate) fn unix_now() -> i64 {
    unix_now_ms() / 1000
}

/// The current time in unix milliseconds (0 if the clock is before 1970).
/// How long past its expiry a live-tunnel entry is kept before a write of
/// the same client's deletes it (both backends): far beyond any clock skew
/// between a fleet's nodes that would matter elsewhere, so that a node whose
/// clock runs ahead does not delete entries the others still count.
pub(crate) const LIVE_TUNNELS_PRUNE_AFTER_MS: i64 = 10 * 60 * 1000;

pub(crate) fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Whether `name` is a valid client name: 1..=64 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Checks a client name: `StoreError::InvalidName` unless [`is_valid_name`].
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(StoreError::InvalidName(name.to_owned()))
    }
}

/// A store URL fit for logs and messages: any password replaced by `***`.
pub fn display_url(url: &str) -> String {
    redis::redact_url(url)
}

/// Opens the store a URL names:
/// - `sqlite://<path>`: the embedded store; `<path>` is absolute
///   (`sqlite:///var/lib/blipless/state.db`) or relative to the working directory
///   (`sqlite://state.db`). Missing parent directories are created, and so is the file
///   and its schema.
/// - `redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS, and the
///   Sentinel and Cluster forms (`redis+sentinel://`, `redis+cluster://`): the Redis
///   store ([`RedisStore::open`]); it checks that Redis answers, and fails with
///   `StoreError::Unavailable` if it does not.
///
/// The grammar is [`blipless_config::store_url`]; anything else is
/// `StoreError::InvalidUrl`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let parsed = store_url::parse(url)
        .map_err(|error| StoreError::InvalidUrl(format!("{}: {error}", redis::redact_url(url))))?;
    match parsed {
        StoreUrl::Sqlite(path) => {
            let path = PathBuf::from(path);
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                // A state directory made here is the service's alone.
                let mut builder = tokio::fs::DirBuilder::new();
                builder.recursive(true).mode(0o700);
                builder.create(parent).await?;
            }
            let store = SqliteStore::open(path).await?;
            Ok(Arc::new(store))
        }
        StoreUrl::Redis(_) | StoreUrl::Sentinel(_) | StoreUrl::Cluster(_) => {
            Ok(Arc::new(RedisStore::open(url).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "alice", "A.b_c-9", &"x".repeat(64)] {
            assert!(is_valid_name(ok), "{ok}");
            assert!(validate_name(ok).is_ok());
        }
        for bad in ["", "a b", "a:b", "a/b", "{x}", "é", "a\n", &"x".repeat(65)] {
            assert!(!is_valid_name(bad), "{bad:?}");
            assert!(matches!(
                validate_name(bad),
                Err(StoreError::InvalidName(_))
            ));
        }
    }

    #[tokio::test]
    async fn open_dispatches_on_scheme() {
        // A Redis URL opens the Redis store: nothing listens on port 1, so it is
        // unavailable, and says where it looked.
        match open("redis://127.0.0.1:1/0").await.err() {
            Some(StoreError::Unavailable(msg)) => assert!(msg.contains("127.0.0.1:1"), "{msg}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        for bad in [
            "",
            "sqlite://",
            "sqlite:///tmp/",
            "state.db",
            "postgres://localhost/x",
        ] {
            assert!(
                matches!(open(bad).await.err(), Some(StoreError::InvalidUrl(_))),
                "{bad}"
            );
        }
        match open("redis+sentinel://:hunter2@s1:x/m").await.err() {
            Some(StoreError::InvalidUrl(msg)) => {
                assert!(
                    msg.contains("port \"x\"") && !msg.contains("hunter2"),
                    "{msg}"
                );
            }
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested/deeper/state.db");
        let store = open(&format!("sqlite://{}", path.display()))
            .await
            .expect("open sqlite");
        assert!(store.list_clients().await.expect("list").is_empty());
        assert!(path.exists());
    }
}
