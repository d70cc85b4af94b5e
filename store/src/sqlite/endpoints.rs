//! The embedded store's WireGuard endpoint snapshots (schema version 4).
//!
//! `endpoints (host, block, snapshot, updated_at)`: one JSON snapshot per node and when
//! it was last written (unix seconds). A row older than [`ENDPOINTS_EXPIRY_SECS`] is
//! absent, as the Redis key would have expired; expired rows (of every node) are
//! deleted on each put.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::db;
use crate::{decode_endpoints, EndpointSnapshot, NodeId, StoreError, ENDPOINTS_EXPIRY_SECS};

/// Saves (replacing) `node`'s snapshot as written at `now`, and deletes expired ones.
pub(super) fn put_endpoints(
    conn: &mut Connection,
    node: &NodeId,
    json: &str,
    now: i64,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("beginning put_endpoints"))?;
    tx.execute(
        "DELETE FROM endpoints WHERE updated_at <= ?1",
        params![now.saturating_sub(ENDPOINTS_EXPIRY_SECS)],
    )
    .map_err(db("deleting expired endpoint snapshots"))?;
    tx.execute(
        "INSERT INTO endpoints (host, block, snapshot, updated_at) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (host, block) DO UPDATE SET snapshot = excluded.snapshot, \
         updated_at = excluded.updated_at",
        params![node.host, node.block, json, now],
    )
    .map_err(db("saving endpoint snapshot"))?;
    tx.commit().map_err(db("committing put_endpoints"))
}

/// `node`'s snapshot, unless it is missing or expired at `now`.
pub(super) fn get_endpoints(
    conn: &Connection,
    node: &NodeId,
    now: i64,
) -> Result<Option<EndpointSnapshot>, StoreError> {
    let json: Option<String> = conn
        .query_row(
            "SELECT snapshot FROM endpoints WHERE host = ?1 AND block = ?2 AND updated_at > ?3",
            params![
                node.host,
                node.block,
                now.saturating_sub(ENDPOINTS_EXPIRY_SECS)
            ],
            |row| row.get(0),
        )
        .optional()
        .map_err(db("reading endpoint snapshot"))?;
    json.map(|json| decode_endpoints(node, &json)).transpose()
}
