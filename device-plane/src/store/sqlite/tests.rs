//! Tests of the embedded store that are not part of the backend contract
//! (`store::contract`): its SQLite settings and schema versioning.

use super::*;

#[tokio::test]
async fn wal_mode_and_schema_version_are_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let (mode, version) = store
        .with_conn(|conn| {
            let mode: String = conn
                .pragma_query_value(None, "journal_mode", |r| r.get(0))
                .map_err(db("mode"))?;
            let version: i64 = conn
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(db("version"))?;
            Ok((mode, version))
        })
        .await
        .expect("pragmas");
    assert_eq!(mode, "wal");
    assert_eq!(version, SCHEMA_VERSION);
    // Reopening an existing store is idempotent.
    drop(store);
    SqliteStore::open(&path).await.expect("reopen");
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .with_conn(|conn| {
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .map_err(db("bump"))
        })
        .await
        .expect("bump version");
    drop(store);
    assert!(matches!(
        SqliteStore::open(&path).await,
        Err(StoreError::IncompatibleSchema { .. })
    ));
}
