//! The embedded [`Store`]: one SQLite file, safe for several processes on one node.
//!
//! - WAL journal mode, so readers (`blipless-device`) never block the writer
//!   (`blipless-ctl client add`) and the other way round; a busy timeout of 5 s makes a
//!   writer wait for another process's write instead of failing.
//! - Multi-statement writes run in `BEGIN IMMEDIATE` transactions: the write lock is
//!   taken up front, so two processes never deadlock upgrading a read to a write.
//!   Usage adds are a single `UPDATE ... SET n = n + ?`, atomic across processes.
//! - The schema is created idempotently; its version lives in `PRAGMA user_version`.
//! - The change feed is a table whose `AUTOINCREMENT` key is the seq: strictly
//!   increasing across processes (writes are serialized by SQLite) and never reused.
//! - Activity sets and egress identities (schema version 2) live in `presence`'s
//!   tables; row conversions are in `rows`.
//! - WireGuard endpoint snapshots (schema version 4), one per node, are rows of the
//!   `endpoints` table (module `endpoints`) that expire a day after their last write,
//!   as the Redis key does.
//! - Client limits and quota counts (schema version 6) are in `limits`.
//! - A client's WireGuard address is unique (schema version 3: a `UNIQUE` index on
//!   `clients.wg_address`), so of two adds racing for one address the second is refused
//!   ([`StoreError::AddressTaken`]); deleting the client's row frees the address.
//! - The files are private: the database, its `-wal` and `-shm` are mode 0600 (made
//!   so at every open), a directory the store creates or is the first to fill 0700
//!   (`schema`).
//! - Every call runs on tokio's blocking pool (`spawn_blocking`); the connection sits in
//!   an `Arc<Mutex<_>>`, and a poisoned mutex is an error, not a panic.

mod endpoints;
mod limits;
mod presence;
mod rows;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use self::rows::{
    append_change, client_from_raw, from_sql_int, raw_client, read_usage, to_sql_int,
    CLIENT_COLUMNS,
};
pub use self::schema::{BUSY_TIMEOUT, DIR_MODE, FILE_MODE, SCHEMA_VERSION};
use super::{
    validate_name, Change, ChangeKind, ClientLimits, ClientList, ClientRecord, EgressIdentity,
    EndpointSnapshot, NodeId, Store, StoreError, Usage,
};

/// The embedded store on a SQLite file. Open it with [`super::open`] or
/// [`SqliteStore::open`]; clone the `Arc<dyn Store>` to share it.
pub struct SqliteStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Maps a rusqlite error to `StoreError::Backend`, saying what was being done.
fn db(context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |err| StoreError::Backend(format!("{context}: {err}"))
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`: sets WAL mode and the busy
    /// timeout, and creates or checks the schema. A missing parent directory is
    /// created with mode [`DIR_MODE`]; the files get [`FILE_MODE`].
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let path = path.into();
        let for_open = path.clone();
        let conn = tokio::task::spawn_blocking(move || schema::open_connection(&for_open))
            .await
            .map_err(|err| StoreError::Backend(format!("opening store: worker failed: {err}")))??;
        tracing::debug!(path = %path.display(), "opened embedded store");
        Ok(Self {
            path,
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn with_conn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| {
                StoreError::Backend("store connection lock poisoned by an earlier panic".into())
            })?;
            f(&mut guard)
        })
        .await
        .map_err(|err| StoreError::Backend(format!("store worker failed: {err}")))?
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn add_client(&self, record: ClientRecord) -> Result<(), StoreError> {
        validate_name(&record.name)?;
        self.with_conn(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db("beginning add_client"))?;
            let inserted = tx
                .execute(
                    "INSERT OR IGNORE INTO clients (name, secret_hash, created_at, wg_public_key, \
                     wg_address, egress, limits) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        record.name,
                        record.secret_hash,
                        record.created_at,
                        record.wg_public_key,
                        record.wg_address.map(|a| a.to_string()),
                        (record.egress != crate::EgressPolicy::Any)
                            .then(|| record.egress.to_string()),
                        limits::encode(&record.limits)?,
                    ],
                )
                .map_err(db("inserting client"))?;
            if inserted == 0 {
                // Ignored for a taken name or a taken WireGuard address (the unique
                // index); the name is reported first. This very record is a repeat
                // of an add that landed (with its feed entry, in its transaction).
                let stored = tx
                    .query_row(
                        &format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE name = ?1"),
                        params![record.name],
                        raw_client,
                    )
                    .optional()
                    .map_err(db("checking client name"))?;
                let name_taken = match stored {
                    Some(raw) => {
                        if raw
                            .and_then(client_from_raw)
                            .is_ok_and(|stored| stored == record)
                        {
                            return Ok(());
                        }
                        true
                    }
                    None => false,
                };
                return Err(match record.wg_address {
                    Some(address) if !name_taken => StoreError::AddressTaken(address),
                    _ => StoreError::AlreadyExists(record.name),
                });
            }
            // A leftover row (there should be none) is reset: a new client starts at zero.
            tx.execute(
                "INSERT OR REPLACE INTO usage (name, bytes_up, bytes_down, connections) \
                 VALUES (?1, 0, 0, 0)",
                params![record.name],
            )
            .map_err(db("creating usage row"))?;
            append_change(&tx, &record.name, ChangeKind::Upsert)?;
            tx.commit().map_err(db("committing add_client"))
        })
        .await
    }

    async fn get_client(&self, name: &str) -> Result<Option<ClientRecord>, StoreError> {
        if !super::is_valid_name(name) {
            return Ok(None);
        }
        let name = name.to_owned();
        self.with_conn(move |conn| {
            let raw = conn
                .query_row(
                    &format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE name = ?1"),
                    params![name],
                    raw_client,
                )
                .optional()
                .map_err(db("reading client"))?;
            raw.map(|raw| raw.and_then(client_from_raw)).transpose()
        })
        .await
    }

    async fn read_clients(&self) -> Result<ClientList, StoreError> {
        self.with_conn(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {CLIENT_COLUMNS} FROM clients ORDER BY name"
                ))
                .map_err(db("listing clients"))?;
            let rows = stmt
                .query_map([], raw_client)
                .map_err(db("listing clients"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("listing clients"))?;
            Ok(ClientList::from_results(
                rows.into_iter().map(|raw| raw.and_then(client_from_raw)),
            ))
        })
        .await
    }

    async fn remove_client(&self, name: &str) -> Result<bool, StoreError> {
        if !super::is_valid_name(name) {
            return Ok(false);
        }
        let name = name.to_owned();
        self.with_conn(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db("beginning remove_client"))?;
            let removed = tx
                .execute("DELETE FROM clients WHERE name = ?1", params![name])
                .map_err(db("deleting client"))?;
            if removed == 0 {
                return Ok(false);
            }
            tx.execute("DELETE FROM usage WHERE name = ?1", params![name])
                .map_err(db("deleting usage"))?;
            limits::reset_quota_usage(&tx, &name)?;
            tx.execute("DELETE FROM live_tunnels WHERE client = ?1", params![name])
                .map_err(db("deleting live tunnels"))?;
            append_change(&tx, &name, ChangeKind::Remove)?;
            tx.commit().map_err(db("committing remove_client"))?;
            Ok(true)
        })
        .await
    }

    async fn feed_head(&self) -> Result<u64, StoreError> {
        self.with_conn(|conn| {
            let head: Option<i64> = conn
                .query_row("SELECT MAX(seq) FROM changes", [], |row| row.get(0))
                .map_err(db("reading the feed head"))?;
            Ok(head.map_or(0, |seq| seq.max(0) as u64))
        })
        .await
    }

    async fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        // Seqs are positive i64s: nothing lies beyond i64::MAX.
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT seq, name, kind FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )
                .map_err(db("reading changes"))?;
            let rows = stmt
                .query_map(params![after, limit], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                })
                .map_err(db("reading changes"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("reading changes"))?;
            rows.into_iter()
                .map(|(seq, name, kind)| {
                    // Another version's kind reads as an upsert: a reader
                    // reads the named record afresh either way, and one
                    // odd row must not stop the feed.
                    let kind = match kind.as_str() {
                        "remove" => ChangeKind::Remove,
                        _ => ChangeKind::Upsert,
                    };
                    Ok(Change {
                        seq: from_sql_int(seq, "seq")?,
                        name,
                        kind,
                    })
                })
                .collect()
        })
        .await
    }

    async fn add_usage(&self, name: &str, delta: Usage, _batch: u64) -> Result<(), StoreError> {
        if !super::is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let name = name.to_owned();
        self.with_conn(move |conn| {
            // One statement: atomic across connections and processes. SQLite turns an
            // overflowing integer sum into a float, so saturate at i64::MAX instead.
            let updated = conn
                .prepare_cached(
                    "UPDATE usage SET \
                     bytes_up = CASE WHEN bytes_up > 9223372036854775807 - ?2 \
                         THEN 9223372036854775807 ELSE bytes_up + ?2 END, \
                     bytes_down = CASE WHEN bytes_down > 9223372036854775807 - ?3 \
                         THEN 9223372036854775807 ELSE bytes_down + ?3 END, \
                     connections = CASE WHEN connections > 9223372036854775807 - ?4 \
                         THEN 9223372036854775807 ELSE connections + ?4 END \
                     WHERE name = ?1",
                )
                .map_err(db("adding usage"))?
                .execute(params![
                    name,
                    to_sql_int(delta.bytes_up),
                    to_sql_int(delta.bytes_down),
                    to_sql_int(delta.connections),
                ])
                .map_err(db("adding usage"))?;
            if updated == 0 {
                return Err(StoreError::NotFound(name));
            }
            Ok(())
        })
        .await
    }

    async fn usage(&self, name: &str) -> Result<Usage, StoreError> {
        if !super::is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let name = name.to_owned();
        self.with_conn(move |conn| read_usage(conn, &name)).await
    }

    async fn touch_activity(
        &self,
        node: &NodeId,
        clients: &[(String, i64)],
    ) -> Result<(), StoreError> {
        if clients.is_empty() {
            return Ok(());
        }
        let (node, clients) = (node.clone(), clients.to_vec());
        self.with_conn(move |conn| {
            presence::touch_activity(conn, &node, &clients, super::unix_now())
        })
        .await
    }

    async fn active_clients(&self, node: &NodeId, since: i64) -> Result<Vec<String>, StoreError> {
        let node = node.clone();
        self.with_conn(move |conn| presence::active_clients(conn, &node, since, super::unix_now()))
            .await
    }

    async fn put_identity(
        &self,
        node: &NodeId,
        client: &str,
        identity: &EgressIdentity,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        validate_name(client)?;
        let (node, client) = (node.clone(), client.to_owned());
        let json = super::encode_identity(identity)?;
        let now_ms = super::unix_now_ms();
        let expires_at = now_ms.saturating_add(super::ttl_millis(ttl));
        self.with_conn(move |conn| {
            presence::put_identity(conn, &node, &client, &json, expires_at, now_ms)
        })
        .await
    }

    async fn take_identity(
        &self,
        node: &NodeId,
        client: &str,
    ) -> Result<Option<EgressIdentity>, StoreError> {
        if !super::is_valid_name(client) {
            return Ok(None);
        }
        let (node, client) = (node.clone(), client.to_owned());
        self.with_conn(move |conn| {
            presence::take_identity(conn, &node, &client, super::unix_now_ms())
        })
        .await
    }

    async fn drop_identity(&self, node: &NodeId, client: &str) -> Result<(), StoreError> {
        if !super::is_valid_name(client) {
            return Ok(());
        }
        let (node, client) = (node.clone(), client.to_owned());
        self.with_conn(move |conn| presence::drop_identity(conn, &node, &client))
            .await
    }

    async fn put_endpoints(
        &self,
        node: &NodeId,
        snapshot: &EndpointSnapshot,
    ) -> Result<(), StoreError> {
        let (node, json) = (node.clone(), super::encode_endpoints(snapshot)?);
        self.with_conn(move |conn| endpoints::put_endpoints(conn, &node, &json, super::unix_now()))
            .await
    }

    async fn get_endpoints(&self, node: &NodeId) -> Result<Option<EndpointSnapshot>, StoreError> {
        let node = node.clone();
        self.with_conn(move |conn| endpoints::get_endpoints(conn, &node, super::unix_now()))
            .await
    }

    async fn update_limits(
        &self,
        name: &str,
        change: crate::LimitsChange,
    ) -> Result<ClientLimits, StoreError> {
        if !super::is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let name = name.to_owned();
        self.with_conn(move |conn| limits::update_limits(conn, &name, &*change))
            .await
    }

    async fn add_quota_usage(
        &self,
        name: &str,
        window: &str,
        bytes: u64,
    ) -> Result<u64, StoreError> {
        if !super::is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let (name, window) = (name.to_owned(), window.to_owned());
        self.with_conn(move |conn| limits::add_quota_usage(conn, &name, &window, bytes))
            .await
    }

    async fn reset_quota_usage(&self, name: &str) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.with_conn(move |conn| limits::reset_quota_usage(conn, &name))
            .await
    }

    async fn put_live_tunnels(
        &self,
        node: &NodeId,
        client: &str,
        count: u64,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (node, client) = (node.clone(), client.to_owned());
        let now = super::unix_now_ms();
        let expires_at = now.saturating_add(super::ttl_millis(ttl));
        self.with_conn(move |conn| {
            let prune_before = now.saturating_sub(crate::LIVE_TUNNELS_PRUNE_AFTER_MS);
            limits::put_live_tunnels(conn, &node, &client, count, expires_at, prune_before)
        })
        .await
    }

    async fn live_tunnels(&self, client: &str, except: &NodeId) -> Result<u64, StoreError> {
        let (client, except) = (client.to_owned(), except.clone());
        self.with_conn(move |conn| {
            limits::live_tunnels(conn, &client, &except, super::unix_now_ms())
        })
        .await
    }
}

#[cfg(test)]
mod tests;
