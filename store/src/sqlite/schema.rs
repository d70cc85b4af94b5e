//! The embedded store's SQLite settings and schema: opening a connection in WAL mode
//! with a busy timeout, and creating (idempotently) or checking the versioned schema.
//!
//! Versions: 1 has clients, the change feed and usage; 2 adds the activity sets and the
//! egress identities; 3 makes a client's WireGuard address unique (a `UNIQUE` index on
//! `clients.wg_address`; clients without one, `NULL`, do not collide); 4 adds the
//! WireGuard endpoint snapshot per node (`endpoints`); 5 keys egress identities by
//! node (`node_identities`) and adds each client's egress policy (`clients.egress`);
//! 6 adds each client's limits (`clients.limits`) and quota counts (`quota_usage`);
//! 7 adds the tunnels each node has open per client (`live_tunnels`).
//! Each version's statements are `IF NOT EXISTS` where SQLite allows it, and a store is brought from whatever version it has
//! to [`SCHEMA_VERSION`] by running the ones above it, under the write lock. Before
//! version 3, `blipless-ctl` never set `wg_address`, so older stores upgrade cleanly; one
//! where two clients share an address anyway is refused with their names, unchanged.
//!
//! The store's files are private ([`private_files`]): the database is created
//! with mode 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm`
//! files the database's mode), an existing one with looser modes is set to
//! 0600 at every open, database, `-wal` and `-shm` alike, and a directory the
//! store is the first to fill is set to 0700.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::db;
use crate::StoreError;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 7;

/// How long a write waits for another connection's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Version 1: clients, the change feed and usage counters.
pub(super) const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS clients (
    name          TEXT PRIMARY KEY NOT NULL,
    secret_hash   TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    wg_public_key TEXT,
    wg_address    TEXT
);
CREATE TABLE IF NOT EXISTS changes (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('upsert', 'remove'))
);
CREATE TABLE IF NOT EXISTS usage (
    name        TEXT PRIMARY KEY NOT NULL,
    bytes_up    INTEGER NOT NULL DEFAULT 0,
    bytes_down  INTEGER NOT NULL DEFAULT 0,
    connections INTEGER NOT NULL DEFAULT 0
);
";

/// Version 2: the activity set per node and the egress identity per client.
pub(super) const SCHEMA_V2: &str = "
CREATE TABLE IF NOT EXISTS activity (
    host   TEXT NOT NULL,
    block  TEXT NOT NULL,
    client TEXT NOT NULL,
    at     INTEGER NOT NULL,
    PRIMARY KEY (host, block, client)
);
CREATE INDEX IF NOT EXISTS activity_at ON activity (at);
CREATE TABLE IF NOT EXISTS identities (
    client     TEXT PRIMARY KEY NOT NULL,
    json       TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS identities_expires_at ON identities (expires_at);
";

/// Version 3: at most one client per WireGuard tunnel address.
pub(super) const SCHEMA_V3: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS clients_wg_address ON clients (wg_address);
";

/// Version 4: the WireGuard endpoint snapshot per node, as JSON; `updated_at` (unix
/// seconds) is when it was last written, for its expiry.
const SCHEMA_V4: &str = "
CREATE TABLE IF NOT EXISTS endpoints (
    host       TEXT NOT NULL,
    block      TEXT NOT NULL,
    snapshot   TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (host, block)
);
";

/// Version 5: egress identities per (node, client), and each client's egress
/// policy (its text form, NULL meaning `any`). The version-2 `identities` table
/// stays, read once per client as a fallback (`presence`).
const SCHEMA_V5: &str = "
CREATE TABLE IF NOT EXISTS node_identities (
    host       TEXT NOT NULL,
    block      TEXT NOT NULL,
    client     TEXT NOT NULL,
    json       TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (host, block, client)
);
CREATE INDEX IF NOT EXISTS node_identities_expires_at ON node_identities (expires_at);
ALTER TABLE clients ADD COLUMN egress TEXT;
";

/// Version 6: each client's limits (JSON, NULL meaning none) and its quota
/// count in the current window (`limits`).
const SCHEMA_V6: &str = "
ALTER TABLE clients ADD COLUMN limits TEXT;
CREATE TABLE IF NOT EXISTS quota_usage (
    name   TEXT PRIMARY KEY NOT NULL,
    window TEXT NOT NULL,
    bytes  INTEGER NOT NULL
);
";

/// Version 7: the tunnels each node has open per client, until `expires_at`
/// (unix ms), for fleet-wide connection caps (`limits`).
const SCHEMA_V7: &str = "
CREATE TABLE IF NOT EXISTS live_tunnels (
    client     TEXT NOT NULL,
    host       TEXT NOT NULL,
    block      TEXT NOT NULL,
    count      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (client, host, block)
);
";

/// Each version's schema statements, oldest first: index `i` brings version `i` to `i + 1`.
const MIGRATIONS: [&str; 7] = [
    SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7,
];
const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// The mode of the store's files: the database, its WAL and its shared-memory index.
pub const FILE_MODE: u32 = 0o600;

/// The mode of a directory the store creates, or is the first to fill.
pub const DIR_MODE: u32 = 0o700;

/// The database file and the two SQLite keeps beside it.
pub(super) fn store_files(path: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [path.to_owned(), with("-wal"), with("-shm")]
}

/// Before SQLite opens `path`: creates a missing directory with mode 0700,
/// sets a directory the new store is the first to fill (empty, ours) to 0700,
/// and creates a missing database file with mode 0600.
fn private_files(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let file_error = |what: &str, at: &Path, err: std::io::Error| {
        StoreError::Backend(format!("{what} {}: {err}", at.display()))
    };
    if let Some(dir) = dir {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|err| file_error("creating the store's directory", dir, err))?;
    }
    let created = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => true,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(err) => return Err(file_error("creating store file", path, err)),
    };
    if let (true, Some(dir)) = (created, dir) {
        // Only the new database in it: a directory made for this store (by
        // `open`, with the umask's mode), not a shared one.
        let only_ours = std::fs::read_dir(dir)
            .map(|entries| entries.flatten().all(|entry| entry.path() == path))
            .unwrap_or(false);
        // Ours: its owner is the new file's, that is this process's.
        let ours = std::fs::metadata(path).map(|m| m.uid()).ok();
        let loose =
            std::fs::metadata(dir).is_ok_and(|m| Some(m.uid()) == ours && m.mode() & 0o077 != 0);
        if only_ours && loose {
            tighten(dir, DIR_MODE);
        }
    }
    Ok(())
}

/// After SQLite opened the store (and made its `-wal` and `-shm`): each of
/// the three files that is readable or writable by others is set to 0600.
fn private_modes(path: &Path) {
    for file in store_files(path) {
        if let Ok(metadata) = std::fs::metadata(&file) {
            if metadata.mode() & 0o077 != 0 {
                tighten(&file, FILE_MODE);
            }
        }
    }
}

/// Sets `path`'s mode; a failure (a file of another user) is logged, since
/// the store still works.
fn tighten(path: &Path, mode: u32) {
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        Ok(()) => {
            tracing::debug!(path = %path.display(), mode = format!("{mode:04o}"), "store file made private")
        }
        Err(err) => {
            tracing::warn!(path = %path.display(), "cannot make the store's file private (mode {mode:04o}): {err}")
        }
    }
}

pub(super) fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    private_files(path)?;
    // No SQLITE_OPEN_URI: the path is a path, never a `file:` URI.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(|err| {
        StoreError::Backend(format!("opening store file {}: {err}", path.display()))
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(db("setting busy timeout"))?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(db("setting WAL journal mode"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "store file {}: WAL journal mode unavailable (got {mode:?})",
            path.display()
        )));
    }
    migrate(&mut conn)?;
    private_modes(path);
    Ok(conn)
}

/// Creates the schema if the store is new, upgrades an older one, and refuses a newer
/// one. Runs under the write lock, so processes opening a store at once migrate it
/// exactly once.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning schema transaction"))?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(db("reading schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::IncompatibleSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        let from = usize::try_from(version.max(0)).unwrap_or(0);
        if (1..3).contains(&from) {
            refuse_shared_wg_addresses(&tx)?;
        }
        for statements in MIGRATIONS.iter().skip(from) {
            tx.execute_batch(statements)
                .map_err(db("creating or upgrading schema"))?;
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(db("writing schema version"))?;
    }
    tx.commit().map_err(db("committing schema"))
}

/// Before version 3's unique index: a store where two clients share a WireGuard address
/// cannot get it, so say which clients, instead of SQLite's bare constraint error.
fn refuse_shared_wg_addresses(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    let shared: Option<(String, String)> = tx
        .query_row(
            "SELECT wg_address, group_concat(name, ', ') FROM clients \
             WHERE wg_address IS NOT NULL GROUP BY wg_address HAVING count(*) > 1 LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(db("checking WireGuard addresses before the upgrade"))?;
    match shared {
        None => Ok(()),
        Some((address, names)) => Err(StoreError::Backend(format!(
            "cannot upgrade the store to schema version 3: clients {names} share the \
             WireGuard address {address}; remove all but one of them (with the \
             blipless-ctl that wrote them) and try again"
        ))),
    }
}
