//! The directory after a Redis failover that lost feed entries it had applied:
//! their seqs are handed out again, and the directory must notice and reload
//! rather than follow on from its position and miss those changes.

use std::sync::Arc;

use blipless_store::testing::{cli, Mode, Node};
use blipless_store::{ClientRecord, Store};

use super::Directory;

fn record(name: &str) -> ClientRecord {
    blipless_store::testing::client_record(name)
}

/// What a failover to a replica that never got feed entry 2 (client b's add)
/// leaves: the entry and its seq gone, and b's record with them, as they
/// travel in the same replication stream. A stream remembers its top ID after
/// XDEL, so it is rebuilt with entry 1 (a's add) only.
fn lose_entry_two_in_a_failover(redis: &Node) {
    cli(redis.port(), &["DEL", "{blipless}:feed"]);
    let first = [
        "XADD",
        "{blipless}:feed",
        "1-0",
        "name",
        "a",
        "kind",
        "upsert",
    ];
    cli(redis.port(), &first);
    cli(redis.port(), &["SET", "{blipless}:feed:seq", "1"]);
    cli(redis.port(), &["DEL", "{pc_b}", "{pc_b}:usage"]);
    cli(redis.port(), &["SREM", "{blipless}:clients", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_that_handed_a_seq_out_again_makes_the_directory_reload() {
    let redis = Node::start(Mode::Server, |_| String::new());
    let url = format!("redis://127.0.0.1:{}/0", redis.port());
    let store: Arc<dyn Store> = blipless_store::open(&url).await.expect("open");
    store.add_client(record("a")).await.expect("add a");
    let directory = Directory::load(store.clone()).await.expect("load");
    store.add_client(record("b")).await.expect("add b");
    directory.catch_up().await.expect("catch up");
    assert_eq!(directory.position(), 2);
    assert!(directory.get("b").is_some());

    lose_entry_two_in_a_failover(&redis);
    // ... and the next change takes seq 2 again.
    store.add_client(record("c")).await.expect("add c");

    directory.catch_up().await.expect("catch up");
    assert!(
        directory.get("c").is_some(),
        "c, at the reused seq 2, was missed"
    );
    assert!(
        directory.get("b").is_none(),
        "b, lost with the failover, is still served"
    );
    assert_eq!(directory.position(), 2);
    // And it follows on normally.
    store.add_client(record("d")).await.expect("add d");
    directory.catch_up().await.expect("catch up");
    assert!(directory.get("d").is_some());
    assert_eq!(directory.position(), 3);
}

/// The same failover met by a plane that has applied no change since its
/// load (a freshly deployed one, typically): it knows the entry at the head
/// it loaded at, and notices the seq handed out again as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_seq_is_noticed_by_a_directory_that_applied_nothing_since_its_load() {
    let redis = Node::start(Mode::Server, |_| String::new());
    let url = format!("redis://127.0.0.1:{}/0", redis.port());
    let store: Arc<dyn Store> = blipless_store::open(&url).await.expect("open");
    store.add_client(record("a")).await.expect("add a");
    store.add_client(record("b")).await.expect("add b");
    let directory = Directory::load(store.clone()).await.expect("load");
    assert_eq!(directory.position(), 2);
    assert!(directory.get("b").is_some());

    lose_entry_two_in_a_failover(&redis);
    // The next change takes seq 2 again.
    store.add_client(record("c")).await.expect("add c");

    directory.catch_up().await.expect("catch up");
    assert!(
        directory.get("c").is_some(),
        "c, at the reused seq 2, was missed"
    );
    assert!(
        directory.get("b").is_none(),
        "b, lost with the failover, is still served"
    );
    store.add_client(record("d")).await.expect("add d");
    directory.catch_up().await.expect("catch up");
    assert!(directory.get("d").is_some());
    assert_eq!(directory.position(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_cannot_be_read_costs_only_its_own_client() {
    // What a record written by a newer blipless-ctl, or damaged, looks like
    // to this plane: JSON it cannot decode under the client's key.
    let redis = Node::start(Mode::Server, |_| String::new());
    let url = format!("redis://127.0.0.1:{}/0", redis.port());
    let store: Arc<dyn Store> = blipless_store::open(&url).await.expect("open");
    store.add_client(record("a")).await.expect("add a");
    let directory = Directory::load(store.clone()).await.expect("load");
    store.add_client(record("b")).await.expect("add b");
    cli(
        redis.port(),
        &["SET", "{pc_b}", "{\"name\": \"b\", \"secret_hash\": 7}"],
    );
    store.add_client(record("c")).await.expect("add c");

    // Following the feed: b is skipped, and the changes after it apply.
    directory.catch_up().await.expect("catch up past b");
    assert!(directory.get("c").is_some(), "c, after b, was applied");
    assert!(
        directory.get("b").is_none(),
        "b's unreadable record is not served"
    );
    assert_eq!(directory.position(), 3);
    // Loading: every other client is there.
    let loaded = Directory::load(store.clone())
        .await
        .expect("load with b unreadable");
    assert!(loaded.get("a").is_some() && loaded.get("c").is_some());
    assert!(loaded.get("b").is_none());
    // The operator's listing names it rather than leave it out unsaid.
    let listed = store.list_clients().await;
    assert!(
        matches!(&listed, Err(blipless_store::StoreError::CorruptRecord { name, .. }) if name == "b"),
        "{listed:?}"
    );
    // Written again, it is served again.
    assert!(store.remove_client("b").await.expect("remove b"));
    store.add_client(record("b")).await.expect("add b again");
    directory.catch_up().await.expect("catch up");
    assert!(directory.get("b").is_some());
}

/// A client removed and added again between two polls is a new client of
/// the same name: its usage meter starts afresh and the old one's egress
/// identity is evicted, even when the new record reads the same.
#[tokio::test]
async fn a_client_removed_and_added_again_between_polls_is_a_new_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let store: Arc<dyn Store> = blipless_store::open(&url).await.expect("open");
    store.add_client(record("a")).await.expect("add a");
    let directory = Directory::load(store.clone()).await.expect("load");
    let before = directory.get("a").expect("a");
    assert!(store.remove_client("a").await.expect("remove a"));
    store.add_client(record("a")).await.expect("add a again");
    directory.catch_up().await.expect("catch up");
    let after = directory.get("a").expect("a, added again");
    assert!(
        !Arc::ptr_eq(&before.meter, &after.meter),
        "the old client's usage carried over"
    );
    assert!(
        before.revoked.is_cancelled(),
        "the old client's connections go on"
    );
    assert_eq!(directory.take_removed(), ["a"]);
}
