//! Tests of the embedded store that are not part of the backend contract
//! (`contract`): its SQLite settings, file modes and schema versioning.

use std::os::unix::fs::PermissionsExt as _;

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test]
async fn a_new_store_and_its_wal_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let path = state.join("state.db");
    // Through `open`, as the daemons and blipless-ctl do: it makes the
    // directory with the umask's mode first.
    let store = crate::open(&format!("sqlite://{}", path.display()))
        .await
        .expect("open");
    store
        .add_client(crate::contract::client("alice"))
        .await
        .expect("a write, into the WAL");
    let [db, wal, shm] = schema::store_files(&path);
    assert!(wal.exists() && shm.exists(), "WAL mode makes -wal and -shm");
    for file in [&db, &wal, &shm] {
        assert_eq!(
            format!("{:04o}", mode(file)),
            format!("{FILE_MODE:04o}"),
            "{}",
            file.display()
        );
    }
    assert_eq!(
        format!("{:04o}", mode(&state)),
        format!("{DIR_MODE:04o}"),
        "the state directory"
    );
}

#[tokio::test]
async fn an_existing_store_with_loose_modes_is_made_private_when_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .add_client(crate::contract::client("alice"))
        .await
        .expect("write");
    let files = schema::store_files(&path);
    for file in &files {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let again = SqliteStore::open(&path).await.expect("reopen");
    for file in &files {
        assert_eq!(
            format!("{:04o}", mode(file)),
            format!("{FILE_MODE:04o}"),
            "{}",
            file.display()
        );
    }
    drop((store, again));
}

#[tokio::test]
async fn a_shared_directory_keeps_its_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(dir.path().join("other-file"), b"x").expect("another file");
    let path = dir.path().join("state.db");
    let _store = SqliteStore::open(&path).await.expect("open");
    assert_eq!(
        format!("{:04o}", mode(dir.path())),
        "0755",
        "not a directory made for the store"
    );
    assert_eq!(format!("{:04o}", mode(&path)), format!("{FILE_MODE:04o}"));
}

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

#[tokio::test]
async fn version_1_store_is_upgraded_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        // A store as version 1 left it, with a client.
        let conn = Connection::open(&path).expect("create v1 file");
        conn.execute_batch(schema::SCHEMA_V1).expect("v1 schema");
        conn.execute(
            "INSERT INTO clients (name, secret_hash, created_at) VALUES ('old', 'h', 1)",
            [],
        )
        .expect("v1 client");
        conn.pragma_update(None, "user_version", 1)
            .expect("v1 version");
    }
    let store = SqliteStore::open(&path).await.expect("open upgrades");
    let version: i64 = store
        .with_conn(|conn| {
            conn.pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(db("version"))
        })
        .await
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(store.list_clients().await.expect("list").len(), 1);
    let node = NodeId {
        host: "h".into(),
        block: "0".into(),
    };
    let now = crate::unix_now();
    store
        .touch_activity(&node, &[("old".into(), now)])
        .await
        .expect("activity table exists");
    assert_eq!(
        store.active_clients(&node, 0).await.expect("active"),
        ["old"]
    );
    let identity = EgressIdentity::default();
    store
        .put_identity(&node, "old", &identity, Duration::from_secs(60))
        .await
        .expect("identity table exists");
    let snapshot = EndpointSnapshot {
        taken_at_ms: 5,
        peers: Vec::new(),
    };
    store
        .put_endpoints(&node, &snapshot)
        .await
        .expect("endpoints table exists");
    drop(store);
    // Opening again (already at the current version) changes nothing.
    let store = SqliteStore::open(&path).await.expect("reopen");
    assert_eq!(
        store.active_clients(&node, 0).await.expect("active"),
        ["old"]
    );
    assert_eq!(
        store.take_identity(&node, "old").await.expect("take"),
        Some(identity)
    );
    assert_eq!(
        store.get_endpoints(&node).await.expect("endpoints"),
        Some(snapshot)
    );
}

/// A store as version 2 left it (`wg_address` not yet unique), with `clients`.
fn version_2_store(path: &std::path::Path, clients: &[(&str, Option<&str>)]) {
    let conn = Connection::open(path).expect("create v2 file");
    conn.execute_batch(schema::SCHEMA_V1).expect("v1 schema");
    conn.execute_batch(schema::SCHEMA_V2).expect("v2 schema");
    for (name, address) in clients {
        conn.execute(
            "INSERT INTO clients (name, secret_hash, created_at, wg_address) \
             VALUES (?1, 'h', 1, ?2)",
            params![name, address],
        )
        .expect("v2 client");
    }
    conn.pragma_update(None, "user_version", 2)
        .expect("v2 version");
}

#[tokio::test]
async fn version_2_store_gets_unique_wg_addresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    version_2_store(
        &path,
        &[("old", None), ("older", None), ("wg", Some("10.64.0.2"))],
    );
    let store = SqliteStore::open(&path).await.expect("open upgrades");
    assert_eq!(store.list_clients().await.expect("list").len(), 3);
    let taken = ClientRecord {
        wg_address: Some("10.64.0.2".parse().expect("literal")),
        ..crate::contract::client("new")
    };
    assert!(matches!(
        store.add_client(taken).await,
        Err(StoreError::AddressTaken(_))
    ));
}

#[tokio::test]
async fn version_2_store_with_shared_wg_addresses_is_refused_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    version_2_store(
        &path,
        &[("one", Some("10.64.0.2")), ("two", Some("10.64.0.2"))],
    );
    let error = SqliteStore::open(&path).await.expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains("one, two") || message.contains("two, one"),
        "{message}"
    );
    assert!(message.contains("10.64.0.2"), "{message}");
    let conn = Connection::open(&path).expect("reopen raw");
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2, "left as it was");
}

#[tokio::test]
async fn version_3_store_gets_endpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    version_2_store(&path, &[("wg", Some("10.64.0.2"))]);
    {
        let conn = Connection::open(&path).expect("reopen raw");
        conn.execute_batch(schema::SCHEMA_V3).expect("v3 schema");
        conn.pragma_update(None, "user_version", 3)
            .expect("v3 version");
    }
    let store = SqliteStore::open(&path).await.expect("open upgrades");
    assert_eq!(store.list_clients().await.expect("list").len(), 1);
    let node = NodeId {
        host: "h".into(),
        block: "0".into(),
    };
    assert_eq!(store.get_endpoints(&node).await.expect("get"), None);
    let snapshot = EndpointSnapshot {
        taken_at_ms: 7,
        peers: Vec::new(),
    };
    store.put_endpoints(&node, &snapshot).await.expect("put");
    assert_eq!(
        store.get_endpoints(&node).await.expect("get"),
        Some(snapshot)
    );
}

/// A snapshot last written more than a day ago is gone, as its Redis key would be; the
/// next put (of any node) deletes it.
#[tokio::test]
async fn endpoint_snapshots_expire_after_a_day() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("state.db"))
        .await
        .expect("open");
    let (old, other) = (
        NodeId {
            host: "old".into(),
            block: "0".into(),
        },
        NodeId {
            host: "other".into(),
            block: "0".into(),
        },
    );
    let snapshot = EndpointSnapshot {
        taken_at_ms: 1,
        peers: Vec::new(),
    };
    store.put_endpoints(&old, &snapshot).await.expect("put");
    let age = |secs: i64| {
        move |conn: &mut Connection| {
            conn.execute(
                "UPDATE endpoints SET updated_at = updated_at - ?1 WHERE host = 'old'",
                params![secs],
            )
            .map_err(db("ageing"))
        }
    };
    store.with_conn(age(3600)).await.expect("an hour old");
    assert!(store.get_endpoints(&old).await.expect("get").is_some());
    store
        .with_conn(age(crate::ENDPOINTS_EXPIRY_SECS))
        .await
        .expect("a day older");
    assert_eq!(store.get_endpoints(&old).await.expect("get"), None);
    store.put_endpoints(&other, &snapshot).await.expect("put");
    let rows: i64 = store
        .with_conn(|conn| {
            conn.query_row("SELECT count(*) FROM endpoints", [], |row| row.get(0))
                .map_err(db("count"))
        })
        .await
        .expect("count");
    assert_eq!(rows, 1, "the expired row was deleted");
}

/// A live-tunnel entry of a plane that died without clearing it (each
/// process writes under a name of its own) goes at the client's next put
/// once expired for ten minutes; one expired a minute ago stays.
#[tokio::test]
async fn expired_live_tunnel_entries_are_deleted_by_the_next_put() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("state.db"))
        .await
        .expect("open");
    let plane = |pid: u32| NodeId {
        host: "h".into(),
        block: format!("0.p{pid}"),
    };
    let long = Duration::from_secs(60);
    for (pid, client) in [(1, "u"), (2, "u"), (4, "u"), (5, "v")] {
        store
            .put_live_tunnels(&plane(pid), client, 3, long)
            .await
            .expect("put");
    }
    // Planes 2 and 5 died an hour ago, plane 4 a minute ago.
    store
        .with_conn(|conn| {
            let now = crate::unix_now_ms();
            conn.execute(
                "UPDATE live_tunnels SET expires_at = CASE block \
                 WHEN '0.p4' THEN ?1 ELSE ?2 END WHERE block IN ('0.p2', '0.p4', '0.p5')",
                params![now - 60_000, now - 3_600_000],
            )
            .map_err(db("ageing"))
        })
        .await
        .expect("aged");
    store
        .put_live_tunnels(&plane(3), "u", 2, long)
        .await
        .expect("put");
    let rows: Vec<(String, String)> = store
        .with_conn(|conn| {
            let mut query = conn
                .prepare("SELECT client, block FROM live_tunnels ORDER BY client, block")
                .map_err(db("prepare"))?;
            let rows = query
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(db("query"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("rows"));
            rows
        })
        .await
        .expect("rows");
    // Another client's entry waits for that client's next put.
    let expected: Vec<(String, String)> =
        [("u", "0.p1"), ("u", "0.p3"), ("u", "0.p4"), ("v", "0.p5")]
            .into_iter()
            .map(|(client, block)| (client.to_owned(), block.to_owned()))
            .collect();
    assert_eq!(rows, expected);
}

/// A deploy that upgrades the schema keeps every client's identity: the
/// snapshot the old plane wrote (one per client, before schema 5) is taken
/// once by the new plane, for whichever node asks, since a SQLite file
/// serves one node.
#[tokio::test]
async fn an_identity_from_before_schema_5_is_taken_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = Connection::open(&path).expect("create v2 file");
        conn.execute_batch(schema::SCHEMA_V1).expect("v1 schema");
        conn.execute_batch(schema::SCHEMA_V2).expect("v2 schema");
        conn.execute(
            "INSERT INTO identities (client, json, expires_at) VALUES ('old', ?1, ?2)",
            params![r#"{"source":"192.0.2.5"}"#, crate::unix_now_ms() + 60_000],
        )
        .expect("v2 identity");
        conn.pragma_update(None, "user_version", 2)
            .expect("v2 version");
    }
    let store = SqliteStore::open(&path).await.expect("open upgrades");
    let node = NodeId {
        host: "h".into(),
        block: "0".into(),
    };
    let taken = store.take_identity(&node, "old").await.expect("take");
    assert_eq!(
        taken,
        Some(EgressIdentity {
            source: Some("192.0.2.5".parse().expect("literal")),
            ..EgressIdentity::default()
        }),
        "the old snapshot, with the fields it lacked defaulted"
    );
    assert_eq!(
        store.take_identity(&node, "old").await.expect("again"),
        None
    );
}

#[tokio::test]
async fn a_record_that_cannot_be_read_is_named_and_the_others_are_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = crate::open(&format!("sqlite://{}", path.display()))
        .await
        .expect("open");
    for name in ["a", "b", "c"] {
        store
            .add_client(crate::contract::client(name))
            .await
            .expect("add");
    }
    // An egress policy this build does not know (a newer blipless-ctl's).
    rusqlite::Connection::open(&path)
        .expect("open the file")
        .execute(
            "UPDATE clients SET egress = 'via:next-year' WHERE name = 'b'",
            [],
        )
        .expect("update");
    let unreadable = |error: &StoreError| {
        matches!(error, StoreError::CorruptRecord { name, detail }
            if name == "b" && detail.contains("via:next-year"))
    };
    let got = store.get_client("b").await;
    assert!(got.as_ref().is_err_and(unreadable), "{got:?}");
    let list = store.read_clients().await.expect("read");
    let names: Vec<&str> = list.records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "c"]);
    assert!(
        matches!(&list.unreadable[..], [StoreError::CorruptRecord { name, .. }] if name == "b"),
        "{:?}",
        list.unreadable
    );
    let listed = store.list_clients().await;
    assert!(listed.as_ref().is_err_and(unreadable), "{listed:?}");
}

/// A column of the wrong type (a hand edit) costs only its client: it reads
/// as that client's CorruptRecord, and a listing goes on without it. It used
/// to fail every listing, so no device plane could start.
#[tokio::test]
async fn a_column_of_the_wrong_type_costs_only_its_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = crate::open(&format!("sqlite://{}", path.display()))
        .await
        .expect("open");
    for name in ["a", "b"] {
        store
            .add_client(crate::contract::client(name))
            .await
            .expect("add");
    }
    rusqlite::Connection::open(&path)
        .expect("open the file")
        .execute(
            "UPDATE clients SET created_at = 'yesterday' WHERE name = 'b'",
            [],
        )
        .expect("update");
    let got = store.get_client("b").await;
    assert!(
        matches!(&got, Err(StoreError::CorruptRecord { name, .. }) if name == "b"),
        "{got:?}"
    );
    let list = store.read_clients().await.expect("a listing");
    let names: Vec<&str> = list.records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a"]);
    assert!(
        matches!(&list.unreadable[..], [StoreError::CorruptRecord { name, .. }] if name == "b"),
        "{:?}",
        list.unreadable
    );
}
