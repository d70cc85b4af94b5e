//! The embedded store's client limits and quota counts (schema version 6).
//!
//! `clients.limits` holds a client's [`ClientLimits`] as JSON (NULL: none).
//! `quota_usage (name, window, bytes)` holds one count per client: the bytes
//! counted in the quota window named `window`; an add for another window
//! replaces it (the period rolled over), so old windows leave nothing behind.
//! `live_tunnels (client, host, block, count, expires_at)` holds what each
//! node last said of a client's open tunnels (schema version 7).

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::db;
use super::rows::{append_change, from_sql_int, to_sql_int};
use crate::{ChangeKind, ClientLimits, NodeId, StoreError};

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
        Some(json) => serde_json::from_str(json).map_err(|err| StoreError::CorruptRecord {
            name: name.to_owned(),
            detail: format!("limits {json:?}: {err}"),
        }),
    }
}

/// Changes `name`'s limits with `change`, read and written in one
/// transaction (`BEGIN IMMEDIATE`: no other writer between the two), and
/// appends an Upsert change.
pub(super) fn update_limits(
    conn: &mut Connection,
    name: &str,
    change: &crate::LimitsFn,
) -> Result<ClientLimits, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning update_limits"))?;
    let stored: Option<Option<String>> = tx
        .query_row(
            "SELECT limits FROM clients WHERE name = ?1",
            params![name],
            |row| row.get(0),
        )
        .optional()
        .map_err(db("reading limits"))?;
    let Some(stored) = stored else {
        return Err(StoreError::NotFound(name.to_owned()));
    };
    let limits = change(decode(name, stored.as_deref())?);
    tx.execute(
        "UPDATE clients SET limits = ?2 WHERE name = ?1",
        params![name, encode(&limits)?],
    )
    .map_err(db("setting limits"))?;
    append_change(&tx, name, ChangeKind::Upsert)?;
    tx.commit().map_err(db("committing update_limits"))?;
    Ok(limits)
}

/// Adds `bytes` to `name`'s count in `window` and returns the count: the
/// count starts at zero unless the one kept is this window's or the next
/// one of the same period ([`crate::Store::add_quota_usage`]; the same
/// rule as the Redis store's script).
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
    let kept: Option<String> = tx
        .query_row(
            "SELECT window FROM quota_usage WHERE name = ?1",
            params![name],
            |row| row.get(0),
        )
        .optional()
        .map_err(db("reading the quota window"))?;
    // The next window kept (this node's clock lags) takes the bytes.
    let window = match kept {
        Some(kept) if crate::quota_window::is_next(&kept, window) => kept,
        _ => window.to_owned(),
    };
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

/// Records `client`'s tunnels on `node` until `expires_at` (unix ms); 0
/// deletes the entry. The client's entries that expired before `prune_before`
/// go too: a plane that died without clearing its own (each process writes
/// under a name of its own) left them for ever. (The caller keeps a margin,
/// as the Redis store must for clock skew between nodes.)
pub(super) fn put_live_tunnels(
    conn: &Connection,
    node: &NodeId,
    client: &str,
    count: u64,
    expires_at: i64,
    prune_before: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM live_tunnels WHERE client = ?1 AND expires_at < ?2",
        params![client, prune_before],
    )
    .map_err(db("forgetting expired live tunnels"))?;
    if count == 0 {
        conn.execute(
            "DELETE FROM live_tunnels WHERE client = ?1 AND host = ?2 AND block = ?3",
            params![client, node.host, node.block],
        )
        .map_err(db("forgetting live tunnels"))?;
        return Ok(());
    }
    conn.execute(
        "INSERT INTO live_tunnels (client, host, block, count, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (client, host, block) DO UPDATE SET \
         count = excluded.count, expires_at = excluded.expires_at",
        params![client, node.host, node.block, to_sql_int(count), expires_at],
    )
    .map_err(db("recording live tunnels"))?;
    Ok(())
}

/// `client`'s tunnels on every node but `except`, unexpired at `now` (unix ms).
pub(super) fn live_tunnels(
    conn: &Connection,
    client: &str,
    except: &NodeId,
    now: i64,
) -> Result<u64, StoreError> {
    let sum: Option<i64> = conn
        .query_row(
            "SELECT SUM(count) FROM live_tunnels WHERE client = ?1 AND expires_at > ?2 \
             AND NOT (host = ?3 AND (block = ?4 \
                 OR substr(block, 1, length(?4) + 2) = ?4 || '.p'))",
            params![client, now, except.host, except.block],
            |row| row.get(0),
        )
        .map_err(db("reading live tunnels"))?;
    from_sql_int(sum.unwrap_or(0), "live tunnels")
}
