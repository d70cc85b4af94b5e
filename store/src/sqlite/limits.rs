//! The embedded store's client limits and quota counts (schema version 6).
//!
//! `clients.limits` holds a client's [`ClientLimits`] as JSON (NULL: none).
//! `quota_usage (name, window, bytes)` holds one count per client: the bytes
//! counted in the quota window named `window`; an add for another window
//! replaces it (the period rolled over), so old windows leave nothing behind.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::db;
use super::rows::{append_change, from_sql_int, to_sql_int};
use crate::{ChangeKind, ClientLimits, StoreError};

/// Encodes limits for `clients.limits`: NULL when there are none.
pub(super) fn encode(limits: &ClientLimits) -> Result<Option<String>, StoreError> {
    if limits.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(limits)
        .map(Some)
        .map_err(|err| StoreError::Backend(format!("encoding limits: {err}")))
}

/// Decodes `clients.limits` of client `name`.
pub(super) fn decode(name: &str, json: Option<&str>) -> Result<ClientLimits, StoreError> {
    match json {
        None => Ok(ClientLimits::default()),
        Some(json) => serde_json::from_str(json).map_err(|err| {
            StoreError::Backend(format!(
                "corrupt store: client {name:?} limits {json:?}: {err}"
            ))
        }),
    }
}

/// Replaces `name`'s limits and appends an Upsert change.
pub(super) fn set_limits(
    conn: &mut Connection,
    name: &str,
    limits: &ClientLimits,
) -> Result<(), StoreError> {
    let json = encode(limits)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning set_limits"))?;
    let updated = tx
        .execute(
            "UPDATE clients SET limits = ?2 WHERE name = ?1",
            params![name, json],
        )
        .map_err(db("setting limits"))?;
    if updated == 0 {
        return Err(StoreError::NotFound(name.to_owned()));
    }
    append_change(&tx, name, ChangeKind::Upsert)?;
    tx.commit().map_err(db("committing set_limits"))
}

/// Adds `bytes` to `name`'s count in `window` (starting it at zero if the
/// count kept is another window's) and returns the count.
pub(super) fn add_quota_usage(
    conn: &mut Connection,
    name: &str,
    window: &str,
    bytes: u64,
) -> Result<u64, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning add_quota_usage"))?;
    let exists: Option<i64> = tx
        .query_row(
            "SELECT 1 FROM clients WHERE name = ?1",
            params![name],
            |row| row.get(0),
        )
        .optional()
        .map_err(db("checking client"))?;
    if exists.is_none() {
        return Err(StoreError::NotFound(name.to_owned()));
    }
    let count: i64 = tx
        .query_row(
            "INSERT INTO quota_usage (name, window, bytes) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET \
             bytes = CASE WHEN window = excluded.window \
                     THEN min(bytes + excluded.bytes, 9223372036854775807) \
                     ELSE excluded.bytes END, \
             window = excluded.window \
             RETURNING bytes",
            params![name, window, to_sql_int(bytes)],
            |row| row.get(0),
        )
        .map_err(db("adding quota usage"))?;
    tx.commit().map_err(db("committing add_quota_usage"))?;
    from_sql_int(count, "quota bytes")
}

/// Forgets `name`'s count.
pub(super) fn reset_quota_usage(conn: &Connection, name: &str) -> Result<(), StoreError> {
    conn.execute("DELETE FROM quota_usage WHERE name = ?1", params![name])
        .map_err(db("resetting quota usage"))?;
    Ok(())
}
