//! The embedded store's activity sets (schema version 2) and egress
//! identities (per node since schema version 5).
//!
//! - `activity (host, block, client, at)`: one row per client a node saw, raised (never
//!   lowered) on each touch. Rows older than [`ACTIVITY_RETENTION_SECS`] are ignored on
//!   read and deleted, for every node, on each write; that also covers the Redis set's
//!   expiry 2 h after its last write, since by then all its entries are older than 1 h.
//! - `node_identities (host, block, client, json, expires_at)`: one JSON snapshot per
//!   (node, client) with its expiry in unix milliseconds; a row at or past its expiry
//!   is absent. Expired rows are deleted on each put.
//! - `identities (client, json, expires_at)`: the snapshots of schema 2 to 4, one per
//!   client. A SQLite file serves one node, so they were this node's: a take that
//!   finds no per-node row takes the client's old row instead (once), and a deploy
//!   that upgrades the schema keeps every client's identity.
//!
//! Each function runs on the store's connection (on the blocking pool) with the current
//! time passed in, so every write is one transaction or one statement.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::db;
use crate::{decode_identity, EgressIdentity, NodeId, StoreError, ACTIVITY_RETENTION_SECS};

/// Adds or raises each client's last activity on `node`, then trims every node's
/// entries older than the retention, in one write transaction.
pub(super) fn touch_activity(
    conn: &mut Connection,
    node: &NodeId,
    clients: &[(String, i64)],
    now: i64,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning touch_activity"))?;
    {
        let mut upsert = tx
            .prepare_cached(
                "INSERT INTO activity (host, block, client, at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (host, block, client) DO UPDATE SET at = MAX(at, excluded.at)",
            )
            .map_err(db("recording activity"))?;
        for (client, at) in clients {
            upsert
                .execute(params![node.host, node.block, client, at])
                .map_err(db("recording activity"))?;
        }
    }
    tx.execute(
        "DELETE FROM activity WHERE at < ?1",
        params![now.saturating_sub(ACTIVITY_RETENTION_SECS)],
    )
    .map_err(db("trimming activity"))?;
    tx.commit().map_err(db("committing touch_activity"))
}

/// Clients active on `node` at or after `since` (and within the retention), most recent
/// first; ties in reverse byte order of the name, as Redis orders them.
pub(super) fn active_clients(
    conn: &Connection,
    node: &NodeId,
    since: i64,
    now: i64,
) -> Result<Vec<String>, StoreError> {
    let since = since.max(now.saturating_sub(ACTIVITY_RETENTION_SECS));
    let mut stmt = conn
        .prepare_cached(
            "SELECT client FROM activity WHERE host = ?1 AND block = ?2 AND at >= ?3 \
             ORDER BY at DESC, client DESC",
        )
        .map_err(db("reading activity"))?;
    let rows = stmt
        .query_map(params![node.host, node.block, since], |row| row.get(0))
        .map_err(db("reading activity"))?
        .collect::<Result<Vec<String>, _>>()
        .map_err(db("reading activity"))?;
    Ok(rows)
}

/// Saves (overwriting) a client's identity on `node` until `expires_at` (unix ms),
/// and deletes every expired identity.
pub(super) fn put_identity(
    conn: &mut Connection,
    node: &NodeId,
    client: &str,
    json: &str,
    expires_at: i64,
    now_ms: i64,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning put_identity"))?;
    for table in ["node_identities", "identities"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE expires_at <= ?1"),
            params![now_ms],
        )
        .map_err(db("deleting expired identities"))?;
    }
    tx.execute(
        "INSERT INTO node_identities (host, block, client, json, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (host, block, client) DO UPDATE SET json = excluded.json, \
         expires_at = excluded.expires_at",
        params![node.host, node.block, client, json, expires_at],
    )
    .map_err(db("saving identity"))?;
    tx.commit().map_err(db("committing put_identity"))
}

/// Deletes a client's identity on `node` and returns it if it had not expired; one
/// statement per table, so two takers never both get it. Falls back to the client's
/// row from before schema 5 (module docs).
pub(super) fn take_identity(
    conn: &Connection,
    node: &NodeId,
    client: &str,
    now_ms: i64,
) -> Result<Option<EgressIdentity>, StoreError> {
    let row: Option<(String, i64)> = conn
        .query_row(
            "DELETE FROM node_identities WHERE host = ?1 AND block = ?2 AND client = ?3 \
             RETURNING json, expires_at",
            params![node.host, node.block, client],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(db("taking identity"))?;
    let row = match row {
        Some(row) => Some(row),
        None => conn
            .query_row(
                "DELETE FROM identities WHERE client = ?1 RETURNING json, expires_at",
                params![client],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(db("taking identity"))?,
    };
    match row {
        Some((json, expires_at)) if expires_at > now_ms => decode_identity(client, &json).map(Some),
        _ => Ok(None),
    }
}

/// Deletes a client's identity on `node` (and any from before schema 5), if any.
pub(super) fn drop_identity(
    conn: &Connection,
    node: &NodeId,
    client: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM node_identities WHERE host = ?1 AND block = ?2 AND client = ?3",
        params![node.host, node.block, client],
    )
    .map_err(db("dropping identity"))?;
    conn.execute("DELETE FROM identities WHERE client = ?1", params![client])
        .map_err(db("dropping identity"))?;
    Ok(())
}
