//! Converting between the embedded store's rows and the store's records: clients,
//! usage counters, changes, and integers that SQLite keeps as i64.

use std::net::IpAddr;

use rusqlite::{params, Connection, OptionalExtension};

use super::db;
use crate::{ChangeKind, ClientRecord, StoreError, Usage};

/// The `clients` columns, in the order [`raw_client`] reads them.
pub(super) const CLIENT_COLUMNS: &str =
    "name, secret_hash, created_at, wg_public_key, wg_address, egress, limits";

/// A u64 counter or delta as SQLite's i64, saturating.
pub(super) fn to_sql_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An i64 read back from SQLite as u64; a negative value means corrupt data.
pub(super) fn from_sql_int(n: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Backend(format!("corrupt store: negative {what} {n}")))
}

pub(super) fn kind_str(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Upsert => "upsert",
        ChangeKind::Remove => "remove",
    }
}

pub(super) fn append_change(
    conn: &Connection,
    name: &str,
    kind: ChangeKind,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO changes (name, kind) VALUES (?1, ?2)",
        params![name, kind_str(kind)],
    )
    .map_err(db("appending change"))?;
    Ok(())
}

/// A `clients` row as read (columns in `CLIENT_COLUMNS` order), before validation.
pub(super) type RawClient = (
    String,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A `clients` row: an error only when its name cannot be read; a column of
/// the wrong type (a hand edit) is that client's [`StoreError::CorruptRecord`],
/// which costs it alone (a listing goes on without it).
pub(super) fn raw_client(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<Result<RawClient, StoreError>> {
    let name: String = row.get(0)?;
    let rest = (|| -> rusqlite::Result<_> {
        Ok((
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
            row.get(5)?,
            row.get(6)?,
        ))
    })();
    Ok(match rest {
        Ok((secret_hash, created_at, wg_public_key, wg_address, egress, limits)) => Ok((
            name,
            secret_hash,
            created_at,
            wg_public_key,
            wg_address,
            egress,
            limits,
        )),
        Err(error) => Err(StoreError::CorruptRecord {
            detail: error.to_string(),
            name,
        }),
    })
}

pub(super) fn client_from_raw(raw: RawClient) -> Result<ClientRecord, StoreError> {
    let (name, secret_hash, created_at, wg_public_key, wg_address, egress, limits) = raw;
    let limits = super::limits::decode(&name, limits.as_deref())?;
    let wg_address = match wg_address {
        None => None,
        Some(text) => Some(
            text.parse::<IpAddr>()
                .map_err(|_| StoreError::CorruptRecord {
                    name: name.clone(),
                    detail: format!("wg_address {text:?}"),
                })?,
        ),
    };
    let egress = match egress {
        None => crate::EgressPolicy::Any,
        Some(text) => text.parse().map_err(|_| StoreError::CorruptRecord {
            name: name.clone(),
            detail: format!("egress {text:?}"),
        })?,
    };
    Ok(ClientRecord {
        name,
        secret_hash,
        created_at,
        wg_public_key,
        wg_address,
        egress,
        limits,
    })
}

pub(super) fn read_usage(conn: &Connection, name: &str) -> Result<Usage, StoreError> {
    let row = conn
        .query_row(
            "SELECT bytes_up, bytes_down, connections FROM usage WHERE name = ?1",
            params![name],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            },
        )
        .optional()
        .map_err(db("reading usage"))?;
    match row {
        Some((up, down, conns)) => Ok(Usage {
            bytes_up: from_sql_int(up, "bytes_up")?,
            bytes_down: from_sql_int(down, "bytes_down")?,
            connections: from_sql_int(conns, "connections")?,
        }),
        None => Err(StoreError::NotFound(name.to_owned())),
    }
}
