//! Tests of the Redis store beyond the backend contract (`contract`): its key
//! shapes (and expiries), half-done adds and removes, leftover WireGuard address claims, URLs in errors, and a Redis that dies, hangs or
//! comes back.

use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, AsyncCommands};

use super::*;
use crate::contract::redis_server::RedisServer;
use crate::contract::{address_of, client};
use crate::{ChangeKind, ClientRecord, EgressIdentity, EndpointSnapshot, Store, Usage};

/// A plain connection for looking at (or tampering with) the keys.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

fn node() -> NodeId {
    NodeId {
        host: "h1".into(),
        block: "b0".into(),
    }
}

#[test]
fn urls_are_shown_without_passwords() {
    for (url, shown) in [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:hunter2@r:6379/1", "redis://:***@r:6379/1"),
        ("rediss://me:hunter2@r/0?x=1", "rediss://me:***@r/0?x=1"),
        ("redis://hunter2@r", "redis://***@r"),
        ("redis://u:p@ss@r/0", "redis://u:***@r/0"),
    ] {
        assert_eq!(redact_url(url), shown);
    }
}

/// A live-tunnel entry of a plane that died without clearing it goes at
/// the client's next put once long expired (ten minutes: a node whose
/// clock runs ahead must not delete what the others still count), though
/// another plane keeps the hash alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_live_tunnel_entries_are_deleted_by_the_next_put() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let plane = |pid: u32| NodeId {
        host: "h".into(),
        block: format!("0.p{pid}"),
    };
    let long = Duration::from_secs(60);
    store
        .put_live_tunnels(&plane(1), "u", 1, long)
        .await
        .expect("put");
    let mut conn = raw(&server).await;
    let key = "{pc_u}:live";
    let now = crate::unix_now_ms();
    // A dead plane's entry, expired an hour ago; another's, a minute ago.
    let _: i64 = conn
        .hset(key, "h_0.p2", format!("3:{}", now - 3_600_000))
        .await
        .expect("plant");
    let _: i64 = conn
        .hset(key, "h_0.p4", format!("5:{}", now - 60_000))
        .await
        .expect("plant");
    store
        .put_live_tunnels(&plane(3), "u", 2, long)
        .await
        .expect("put");
    let mut fields: Vec<String> = conn.hkeys(key).await.expect("fields");
    fields.sort_unstable();
    assert_eq!(fields, ["h_0.p1", "h_0.p3", "h_0.p4"]);
    assert_eq!(store.live_tunnels("u", &plane(9)).await.expect("sum"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_shapes() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    store.add_client(client("alice")).await.expect("add");
    let delta = Usage {
        bytes_up: 5,
        bytes_down: 6,
        connections: 1,
    };
    store
        .add_usage("alice", delta, crate::contract::batch())
        .await
        .expect("usage");
    let now = crate::unix_now();
    store
        .touch_activity(&node(), &[("alice".into(), now)])
        .await
        .expect("touch");
    let id = EgressIdentity::default();
    store
        .put_identity(&node(), "alice", &id, Duration::from_secs(600))
        .await
        .expect("put");
    store
        .put_endpoints(&node(), &EndpointSnapshot::default())
        .await
        .expect("put endpoints");

    let mut conn = raw(&server).await;
    let mut keys: Vec<String> = conn.keys("*").await.expect("KEYS");
    keys.sort();
    let address_claim = format!("{{pwg_{}}}", address_of("alice"));
    let batch = format!("{{pc_alice}}:batch:{}", store.writer);
    // The add's claim call, the handle's first with a receipt.
    let claim_receipt = format!("{address_claim}:receipt:{}_0", store.writer);
    let mut expected = vec![
        "{blipless}:clients",
        "{blipless}:feed",
        "{blipless}:feed:seq",
        "{pc_alice}",
        "{pc_alice}:usage",
        "{pca_h1_b0}",
        "{pwi_alice}_h1_b0",
        "{pwh_h1_b0}",
        address_claim.as_str(),
        claim_receipt.as_str(),
        batch.as_str(),
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    let receipt_ttl: i64 = conn.ttl(&claim_receipt).await.expect("TTL");
    assert!((20..=30).contains(&receipt_ttl), "{receipt_ttl}");
    let batch_ttl: i64 = conn.ttl(&batch).await.expect("TTL");
    assert!((3590..=3600).contains(&batch_ttl), "{batch_ttl}");
    let holder: String = conn.get(&address_claim).await.expect("GET");
    assert_eq!(holder, "alice", "the address key names its client");
    let usage: Vec<(String, i64)> = conn.hgetall("{pc_alice}:usage").await.expect("HGETALL");
    assert_eq!(usage.len(), 3);
    assert!(usage.contains(&("down".into(), 6)), "{usage:?}");
    let activity_ttl: i64 = conn.ttl("{pca_h1_b0}").await.expect("TTL");
    assert!((7190..=7200).contains(&activity_ttl), "{activity_ttl}");
    let identity_ttl: i64 = conn.ttl("{pwi_alice}_h1_b0").await.expect("TTL");
    assert!((590..=600).contains(&identity_ttl), "{identity_ttl}");
    let endpoints_ttl: i64 = conn.ttl("{pwh_h1_b0}").await.expect("TTL");
    assert!(
        (86_390..=86_400).contains(&endpoints_ttl),
        "{endpoints_ttl}"
    );
    let endpoints: String = conn.get("{pwh_h1_b0}").await.expect("GET");
    assert_eq!(endpoints, r#"{"taken_at_ms":0,"peers":[]}"#, "plain JSON");
    let feed: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("{blipless}:feed")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    assert_eq!(feed.len(), 1);
    assert_eq!(feed[0].0, "1-0");
}

/// A take call sent twice (the Cluster client re-sends one whose node
/// connection broke or timed out, after it may have applied) gets the
/// identity both times; another call finds none, and the receipt expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_take_gets_its_identity_again() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let id = EgressIdentity {
        source: Some("127.0.0.9".parse().expect("ip")),
        ..EgressIdentity::default()
    };
    store
        .put_identity(&node(), "alice", &id, Duration::from_secs(600))
        .await
        .expect("put");
    let take = store.identity_take(&node(), "alice");
    let first: Option<String> = store.run("taking", &take).await.expect("the take");
    let again: Option<String> = store.run("taking again", &take).await.expect("the repeat");
    let first = first.expect("the first send takes the identity");
    assert_eq!(
        again.as_deref(),
        Some(first.as_str()),
        "the repeat gets it too"
    );
    assert_eq!(
        crate::decode_identity("alice", &first)
            .expect("decodes")
            .source,
        id.source
    );
    assert_eq!(
        store.take_identity(&node(), "alice").await.expect("take"),
        None,
        "only one call takes it"
    );
    let mut conn = raw(&server).await;
    let receipts: Vec<String> = conn
        .keys("{pwi_alice}_h1_b0:receipt:*")
        .await
        .expect("KEYS");
    assert_eq!(receipts.len(), 1, "{receipts:?}");
    let ttl: i64 = conn.pttl(&receipts[0]).await.expect("PTTL");
    assert!((20_000..=30_000).contains(&ttl), "{ttl}");
}

/// A quota add sent twice (as the Cluster client re-sends a call whose
/// node connection broke) counts its bytes once and answers the same count;
/// another call adds again. Before, the repeat counted them twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_quota_add_counts_once() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    store.add_client(client("alice")).await.expect("add");
    let add = store.quota_add("alice", "day:1", 1000);
    let first: i64 = store.run("adding", &add).await.expect("the add");
    let again: i64 = store.run("adding again", &add).await.expect("the repeat");
    assert_eq!((first, again), (1000, 1000));
    assert_eq!(
        store
            .add_quota_usage("alice", "day:1", 24)
            .await
            .expect("another add"),
        1024
    );
    // A look (0 bytes) leaves no receipt: repeating it is harmless.
    assert_eq!(
        store
            .add_quota_usage("alice", "day:1", 0)
            .await
            .expect("look"),
        1024
    );
    let mut conn = raw(&server).await;
    let receipts: Vec<String> = conn.keys("{pc_alice}:quota:receipt:*").await.expect("KEYS");
    assert_eq!(receipts.len(), 2, "{receipts:?}");
}

/// An address claim sent twice says both times that it claimed the address
/// now (before, the repeat called the claim an earlier one, and an add that
/// then lost its name to another left the address claimed); another claim
/// of the same name says it held it already, and another name's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_address_claim_says_claimed_again() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let address: std::net::IpAddr = "10.9.0.7".parse().expect("ip");
    let claim = store.address_claim(address, "alice");
    let first: i64 = store.run("claiming", &claim).await.expect("the claim");
    let again: i64 = store
        .run("claiming again", &claim)
        .await
        .expect("the repeat");
    assert_eq!((first, again), (1, 1));
    assert!(!store
        .claim_address(address, "alice")
        .await
        .expect("held already"));
    assert!(matches!(
        store.claim_address(address, "bob").await,
        Err(StoreError::AddressTaken(taken)) if taken == address
    ));
}

/// The half-done states the module doc describes, as a crash between the two slots of
/// an add or a remove would leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_done_adds_and_removes_are_repaired() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let mut conn = raw(&server).await;
    // An add that died after writing the record: not listed, not in the feed.
    let json = serde_json::to_string(&client("half")).expect("json");
    let _: () = conn.set("{pc_half}", json).await.expect("SET");
    assert!(store.list_clients().await.expect("list").is_empty());
    assert!(store.get_client("half").await.expect("get").is_some());
    // Removing it puts the Remove in the feed; adding it again works.
    assert!(store.remove_client("half").await.expect("remove"));
    store.add_client(client("half")).await.expect("re-add");
    let feed: Vec<_> = store.changes_since(0, 10).await.expect("feed");
    let kinds: Vec<_> = feed.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ChangeKind::Remove, ChangeKind::Upsert]);

    // A remove that died after deleting the record: a listed name without a record.
    let _: () = conn.sadd("{blipless}:clients", "gone").await.expect("SADD");
    assert_eq!(store.list_clients().await.expect("list"), [client("half")]);
    assert!(
        store.remove_client("gone").await.expect("remove"),
        "the retried remove still reaches the feed"
    );
    let last = store.changes_since(feed[1].seq, 10).await.expect("feed");
    assert_eq!(last.len(), 1);
    assert_eq!(
        (last[0].name.as_str(), last[0].kind),
        ("gone", ChangeKind::Remove)
    );
    assert!(!store.remove_client("gone").await.expect("remove again"));
}

/// Adds a nameless upsert to the feed with an ID of Redis's own making
/// (`XADD *`, unix milliseconds); returns the ID and its milliseconds.
async fn xadd_stamped(conn: &mut redis::aio::MultiplexedConnection) -> (String, u64) {
    let mut xadd = redis::cmd("XADD");
    xadd.arg(FEED_KEY).arg("*").arg("kind").arg("upsert");
    let stamped: String = xadd.query_async(conn).await.expect("XADD *");
    let stamp = stamped
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .expect("an ID");
    (stamped, stamp)
}

/// Asserts that the feed after `after` (up to 10 entries) reads as
/// `expected` (seq, name, kind).
async fn assert_feed(store: &RedisStore, after: u64, expected: &[(u64, &str, ChangeKind)]) {
    let feed = store
        .changes_since(after, 10)
        .await
        .expect("the feed reads");
    let read: Vec<(u64, &str, ChangeKind)> = feed
        .iter()
        .map(|c| (c.seq, c.name.as_str(), c.kind))
        .collect();
    assert_eq!(read, expected);
}

/// Entries another version (or a hand) put in the feed do not stop it: an
/// unknown kind reads as an upsert, a nameless entry keeps its position, an
/// entry with a foreign ID is skipped; the entries around them still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_feed_entries_are_read_leniently() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    store.add_client(client("alice")).await.expect("add");
    let mut conn = raw(&server).await;
    for (id, fields) in [
        ("100-0", vec![("kind", "rename"), ("name", "alice")]),
        ("101-0", vec![("kind", "upsert")]),
        ("101-1", vec![("kind", "upsert"), ("name", "alice")]),
        ("102-0", vec![("kind", "remove"), ("name", "bob")]),
    ] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(FEED_KEY).arg(id);
        for (field, value) in fields {
            xadd.arg(field).arg(value);
        }
        let _: String = xadd.query_async(&mut conn).await.expect("XADD");
    }
    assert_feed(
        &store,
        0,
        &[
            (1, "alice", ChangeKind::Upsert),
            (100, "alice", ChangeKind::Upsert),
            (101, "", ChangeKind::Upsert),
            (102, "bob", ChangeKind::Remove),
        ],
    )
    .await;
    // Changes go on above them (the counter was at 1): before, XADD refused
    // every later seq, after the index had already changed.
    store
        .add_client(client("carol"))
        .await
        .expect("add above them");
    // And above an entry with an ID of Redis's own making (unix ms).
    let (_, stamp) = xadd_stamped(&mut conn).await;
    assert!(store.remove_client("carol").await.expect("remove above it"));
    assert_feed(
        &store,
        102,
        &[
            (103, "carol", ChangeKind::Upsert),
            (stamp, "", ChangeKind::Upsert),
            (stamp + 1, "carol", ChangeKind::Remove),
        ],
    )
    .await;
    assert_eq!(store.list_clients().await.expect("list"), [client("alice")]);
    // An entry of Redis's making deleted before anyone wrote above it: the
    // feed's highest ID stays what it was (before, XADD refused the seq
    // that came after the entries left).
    let (stamped, stamp) = xadd_stamped(&mut conn).await;
    let mut xdel = redis::cmd("XDEL");
    xdel.arg(FEED_KEY).arg(&stamped);
    let _: i64 = xdel.query_async(&mut conn).await.expect("XDEL");
    store
        .add_client(client("dave"))
        .await
        .expect("add after the delete");
    assert_feed(&store, stamp, &[(stamp + 1, "dave", ChangeKind::Upsert)]).await;
}

/// An entry with a foreign ID past a follower's position is no change to
/// wait for: the wait runs its course (before, it returned at once, every
/// time, and the follower spun on the entry it then skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_entry_is_no_change_to_wait_for() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    store.add_client(client("alice")).await.expect("add");
    let head = store.feed_head().await.expect("head");
    let mut conn = raw(&server).await;
    for id in [format!("{head}-7"), format!("{}-5", head + 1)] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(FEED_KEY).arg(id).arg("kind").arg("upsert");
        let _: String = xadd.query_async(&mut conn).await.expect("XADD");
    }
    assert!(!store
        .wait_for_change(head, Duration::from_millis(300))
        .await
        .expect("the wait"));
    store.add_client(client("bob")).await.expect("add");
    assert!(store
        .wait_for_change(head, Duration::from_millis(300))
        .await
        .expect("the wait"));
}

/// Every client's record is read in `MGET`s of [`READ_CHUNK`] at most:
/// 2,500 clients (written by hand, as a fleet's store holds them) all read
/// back, with one `SMEMBERS` and three `MGET`s. Before, one `MGET` of every
/// record held Redis up for as long as it ran, and over enough clients
/// outlasted a call's 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_is_read_in_chunks() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let count = READ_CHUNK * 2 + READ_CHUNK / 2;
    let mut conn = raw(&server).await;
    let mut pipe = redis::pipe();
    for n in 0..count {
        let name = format!("c{n:05}");
        let json = serde_json::to_string(&client(&name)).expect("json");
        pipe.cmd("SET")
            .arg(client_key(&name))
            .arg(json)
            .ignore()
            .cmd("SADD")
            .arg(INDEX_KEY)
            .arg(&name)
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.expect("the clients");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");

    let list = store.read_clients().await.expect("the list reads");
    let names: Vec<String> = list.records.iter().map(|r| r.name.clone()).collect();
    let expected: Vec<String> = (0..count).map(|n| format!("c{n:05}")).collect();
    assert_eq!(names, expected);
    assert!(list.unreadable.is_empty());

    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a count"))
    };
    assert_eq!(calls("smembers"), 1, "{stats}");
    assert_eq!(calls("mget"), 3, "{stats}");
}

/// Records a hand (or damage, or another version) wrote under client keys
/// cost only their own clients: bytes that are not UTF-8, and a record that
/// names another client, are those clients' corrupt records; a key of
/// another type reads as no record. The list, the other clients, the feed
/// (an entry whose name is not UTF-8 included) and removing the damaged
/// clients all still work. Before, one bad byte failed every list (so no
/// plane could start) and every read of the feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_records_cost_only_their_own_clients() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    for name in ["alice", "bob", "carol", "dave"] {
        store.add_client(client(name)).await.expect("add");
    }
    let mut conn = raw(&server).await;
    let set = |key: &str, value: Vec<u8>| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        cmd
    };
    let _: () = set("{pc_alice}", b"\xff\xfe{".to_vec())
        .query_async(&mut conn)
        .await
        .expect("SET");
    let _: () = conn.del("{pc_bob}").await.expect("DEL");
    let _: () = conn.hset("{pc_bob}", "x", "y").await.expect("HSET");
    let mut carol_as_dave = serde_json::to_vec(&client("dave")).expect("json");
    carol_as_dave.push(b' ');
    let _: () = set("{pc_carol}", carol_as_dave)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let mut xadd = redis::cmd("XADD");
    xadd.arg(FEED_KEY)
        .arg("100-0")
        .arg("kind")
        .arg("upsert")
        .arg("name")
        .arg(&b"\xffbad"[..]);
    let _: String = xadd.query_async(&mut conn).await.expect("XADD");

    let list = store.read_clients().await.expect("the list reads");
    let served: Vec<&str> = list.records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(served, ["dave"]);
    let mut unreadable: Vec<String> = list
        .unreadable
        .iter()
        .map(|error| match error {
            StoreError::CorruptRecord { name, .. } => name.clone(),
            other => panic!("not a corrupt record: {other}"),
        })
        .collect();
    unreadable.sort();
    assert_eq!(unreadable, ["alice", "carol"]);
    assert!(matches!(
        store.get_client("alice").await,
        Err(StoreError::CorruptRecord { .. })
    ));
    assert!(store.get_client("bob").await.expect("bob reads").is_none());
    assert!(store.get_client("dave").await.expect("dave").is_some());
    let feed = store.changes_since(0, 100).await.expect("the feed reads");
    assert_eq!(
        feed.last().map(|c| (c.seq, c.name.as_str())),
        Some((100, ""))
    );
    for name in ["alice", "bob", "carol"] {
        assert!(store.remove_client(name).await.expect("remove"), "{name}");
    }
    assert_eq!(store.list_clients().await.expect("list"), [client("dave")]);
    // An index member that is no name is skipped, not a failed list.
    let mut sadd = redis::cmd("SADD");
    sadd.arg(INDEX_KEY).arg(&b"\xff"[..]);
    let _: i64 = sadd.query_async(&mut conn).await.expect("SADD");
    assert_eq!(store.list_clients().await.expect("list"), [client("dave")]);
    // Adding a name whose key is of another type is refused as taken, and
    // the address it claimed is free again (before: a WRONGTYPE error,
    // and the claim kept for good).
    let _: () = conn.hset("{pc_gina}", "x", "y").await.expect("HSET");
    assert!(matches!(
        store.add_client(client("gina")).await,
        Err(StoreError::AlreadyExists(name)) if name == "gina"
    ));
    let erin = ClientRecord {
        wg_address: Some(address_of("gina")),
        ..client("erin")
    };
    store
        .add_client(erin)
        .await
        .expect("gina's address is free");
}

/// The WireGuard address claims the module doc describes: a claim left without a
/// record (an add that died between its steps) keeps the address from other clients
/// and is taken over by an add of the same name; a remove deletes the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_address_claims() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    let mut conn = raw(&server).await;
    let address: std::net::IpAddr = "10.64.0.2".parse().expect("literal");
    let key = format!("{{pwg_{address}}}");
    let _: () = conn.set(&key, "ghost").await.expect("SET");
    let other = ClientRecord {
        wg_address: Some(address),
        ..client("other")
    };
    assert!(matches!(
        store.add_client(other).await,
        Err(StoreError::AddressTaken(a)) if a == address
    ));
    let ghost = ClientRecord {
        wg_address: Some(address),
        ..client("ghost")
    };
    store
        .add_client(ghost.clone())
        .await
        .expect("the claim's own name takes it over");
    assert_eq!(store.get_client("ghost").await.expect("get"), Some(ghost));
    assert!(store.remove_client("ghost").await.expect("remove"));
    let left: Option<String> = conn.get(&key).await.expect("GET");
    assert_eq!(left, None, "removing the client deletes its claim");
    // A claim of another client is never deleted by a remove.
    let _: () = conn.set(&key, "someone").await.expect("SET");
    store.add_client(client("plain")).await.expect("add");
    assert!(store.remove_client("plain").await.expect("remove"));
    let left: Option<String> = conn.get(&key).await.expect("GET");
    assert_eq!(left.as_deref(), Some("someone"));
}

#[tokio::test]
async fn unreachable_redis_fails_fast_without_its_password() {
    let started = Instant::now();
    let err = RedisStore::open("redis://me:hunter2@127.0.0.1:1/0")
        .await
        .expect_err("nothing listens on port 1");
    let message = err.to_string();
    assert!(matches!(err, StoreError::Unavailable(_)), "{message}");
    assert!(
        message.contains("redis://me:***@127.0.0.1:1/0"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn malformed_url_is_invalid() {
    let err = RedisStore::open("redis://:hunter2@host:notaport/0")
        .await
        .expect_err("bad port");
    assert!(matches!(err, StoreError::InvalidUrl(_)), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// Redis dies: calls fail quickly and clearly. It comes back on the same port: the same
/// store works again, without being reopened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_when_redis_is_back() {
    let mut server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    store.add_client(client("before")).await.expect("add");
    assert_eq!(store.list_clients().await.expect("list").len(), 1);

    server.kill();
    let started = Instant::now();
    let err = store.get_client("before").await.expect_err("Redis is down");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let message = err.to_string();
    assert!(matches!(err, StoreError::Unavailable(_)), "{message}");
    assert!(message.contains(&server.url()), "{message}");
    let err = store
        .add_usage("before", Usage::default(), crate::contract::batch())
        .await;
    assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");

    server.restart();
    // Nothing was persisted, so the restarted Redis is empty; the store just works.
    assert!(store
        .list_clients()
        .await
        .expect("list after restart")
        .is_empty());
    store
        .add_client(client("after"))
        .await
        .expect("add after restart");
    assert_eq!(
        store.get_client("after").await.expect("get"),
        Some(client("after"))
    );
    let feed = store.changes_since(0, 10).await.expect("feed");
    assert_eq!(feed.len(), 1);
}

/// A Redis that hangs (SIGSTOP) answers nothing: calls time out instead of waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_times_out() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url()).await.expect("open");
    // Several pooled connections, each of which must not cost its own timeout.
    let mut held = Vec::new();
    for _ in 0..4 {
        match store.pools.get(false).await {
            Ok(conn) => held.push(conn),
            Err(err) => panic!("a pooled connection: {err}"),
        }
    }
    drop(held);
    assert_eq!(store.pools.size(), 4);
    let pid = nix::unistd::Pid::from_raw(server.pid().expect("running"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let started = Instant::now();
    let result = store.usage("anyone").await;
    let elapsed = started.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "{result:?}"
    );
    // One attempt, cut at ATTEMPT_TIMEOUT: timeouts are not retried.
    assert!(
        elapsed < ATTEMPT_TIMEOUT + Duration::from_millis(500),
        "{elapsed:?}"
    );
    assert!(matches!(
        store.usage("anyone").await,
        Err(StoreError::NotFound(_))
    ));
}

/// `rediss://` speaks TLS: against a plain-text Redis the handshake fails, clearly and
/// quickly (this also checks that the TLS client can be built at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_url_uses_tls() {
    let server = RedisServer::start();
    let url = server.url().replacen("redis://", "rediss://", 1);
    let started = Instant::now();
    let err = RedisStore::open(&url).await.expect_err("no TLS there");
    assert!(
        started.elapsed() < ATTEMPT_TIMEOUT * 2,
        "{:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains(&url), "{err}");
}
