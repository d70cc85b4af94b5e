//! Contract checks for the activity sets per node and the egress identities per client.
//! Activity timestamps are relative to now, since entries older than 1 h are trimmed.

use std::sync::Arc;
use std::time::Duration;

use crate::{unix_now, EgressIdentity, NodeId, Store, StoreError};

fn node(host: &str, block: &str) -> NodeId {
    NodeId {
        host: host.to_owned(),
        block: block.to_owned(),
    }
}

fn entries(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter()
        .map(|&(name, at)| (name.to_owned(), at))
        .collect()
}

fn identity(source: &str) -> EgressIdentity {
    EgressIdentity {
        source: Some(source.parse().expect("address literal")),
        ..EgressIdentity::default()
    }
}

/// The node the identity checks write as, unless they say otherwise.
fn here() -> NodeId {
    node("host-a", "0")
}

const MINUTE: Duration = Duration::from_secs(60);

pub(crate) async fn activity_order_and_since(store: Arc<dyn Store>) {
    let n = node("host-a", "0");
    let now = unix_now();
    assert!(store.active_clients(&n, 0).await.expect("empty").is_empty());
    store.touch_activity(&n, &[]).await.expect("empty touch");
    let first = entries(&[("a", now - 100), ("b", now - 10), ("c", now - 50)]);
    store.touch_activity(&n, &first).await.expect("touch");
    let all = store.active_clients(&n, 0).await.expect("active");
    assert_eq!(all, ["b", "c", "a"], "most recent first");
    assert_eq!(
        store.active_clients(&n, now - 50).await.expect("since"),
        ["b", "c"],
        "`since` is inclusive"
    );
    assert!(store
        .active_clients(&n, now + 60)
        .await
        .expect("future")
        .is_empty());

    // Entries are raised, never lowered; a repeated name in one call keeps its latest.
    let second = entries(&[
        ("a", now - 5),
        ("b", now - 900),
        ("d", now - 30),
        ("d", now - 20),
    ]);
    store
        .touch_activity(&n, &second)
        .await
        .expect("touch again");
    assert_eq!(
        store.active_clients(&n, 0).await.expect("active"),
        ["a", "b", "d", "c"]
    );
}

pub(crate) async fn activity_trims_after_an_hour(store: Arc<dyn Store>) {
    let n = node("host-a", "0");
    let now = unix_now();
    let touched = entries(&[
        ("fresh", now - 60),
        ("edge", now - 3500),
        ("stale", now - 3700),
        ("ancient", now - 7300),
    ]);
    store.touch_activity(&n, &touched).await.expect("touch");
    assert_eq!(
        store.active_clients(&n, 0).await.expect("active"),
        ["fresh", "edge"],
        "entries older than 1 h are gone, whatever `since` asks"
    );
    // An old entry is not revived by a touch that does not raise it past the hour.
    let again = entries(&[("stale", now - 3650), ("new", now)]);
    store.touch_activity(&n, &again).await.expect("touch again");
    assert_eq!(
        store.active_clients(&n, i64::MIN).await.expect("active"),
        ["new", "fresh", "edge"]
    );
}

pub(crate) async fn activity_per_node(store: Arc<dyn Store>) {
    let now = unix_now();
    let nodes = [
        node("host-a", "0"),
        node("host-b", "0"),
        node("host-a", "1"),
    ];
    for (i, n) in nodes.iter().enumerate() {
        let client = format!("client-{i}");
        store
            .touch_activity(n, &[(client, now - 1)])
            .await
            .expect("touch");
    }
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            store.active_clients(n, 0).await.expect("active"),
            [format!("client-{i}")],
            "{n:?} sees only its own clients"
        );
    }
    assert!(store
        .active_clients(&node("host-c", "0"), 0)
        .await
        .expect("unknown node")
        .is_empty());
}

pub(crate) async fn identity_taken_once(store: Arc<dyn Store>) {
    assert_eq!(
        store
            .take_identity(&here(), "ghost")
            .await
            .expect("unknown"),
        None
    );
    store
        .drop_identity(&here(), "ghost")
        .await
        .expect("drop unknown");

    let first = identity("192.0.2.7");
    store
        .put_identity(&here(), "alice", &first, MINUTE)
        .await
        .expect("put");
    let unpinned = EgressIdentity {
        source: None,
        window: vec!["dc-1".into(), "direct".into()],
        session: Some("s3ss10n".into()),
    };
    store
        .put_identity(&here(), "bob", &unpinned, MINUTE)
        .await
        .expect("put bob");
    assert_eq!(
        store.take_identity(&here(), "alice").await.expect("take"),
        Some(first)
    );
    assert_eq!(
        store
            .take_identity(&here(), "alice")
            .await
            .expect("take again"),
        None,
        "consumed once"
    );
    assert_eq!(
        store.take_identity(&here(), "bob").await.expect("take bob"),
        Some(unpinned),
        "identities are per client"
    );

    // A put overwrites: the latest snapshot wins.
    store
        .put_identity(&here(), "alice", &identity("192.0.2.8"), MINUTE)
        .await
        .expect("put");
    let latest = identity("2001:db8::9");
    store
        .put_identity(&here(), "alice", &latest, MINUTE)
        .await
        .expect("overwrite");
    assert_eq!(
        store.take_identity(&here(), "alice").await.expect("take"),
        Some(latest)
    );

    // A drop (live eviction) removes it.
    store
        .put_identity(&here(), "alice", &identity("192.0.2.9"), MINUTE)
        .await
        .expect("put");
    store.drop_identity(&here(), "alice").await.expect("drop");
    assert_eq!(
        store.take_identity(&here(), "alice").await.expect("take"),
        None
    );

    // Invalid names cannot hold an identity.
    for bad in ["", "a b", "{x}"] {
        assert!(matches!(
            store
                .put_identity(&here(), bad, &identity("192.0.2.1"), MINUTE)
                .await,
            Err(StoreError::InvalidName(_))
        ));
        assert_eq!(store.take_identity(&here(), bad).await.expect("take"), None);
        store.drop_identity(&here(), bad).await.expect("drop");
    }
}

pub(crate) async fn identity_expires(store: Arc<dyn Store>) {
    let id = identity("198.51.100.4");
    store
        .put_identity(&here(), "short", &id, Duration::from_secs(1))
        .await
        .expect("put");
    store
        .put_identity(&here(), "long", &id, MINUTE)
        .await
        .expect("put");
    store
        .put_identity(&here(), "zero", &id, Duration::ZERO)
        .await
        .expect("put with no ttl");
    assert_eq!(
        store.take_identity(&here(), "zero").await.expect("take"),
        None,
        "a zero TTL is expired at once"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        store.take_identity(&here(), "short").await.expect("take"),
        None,
        "expired"
    );
    assert_eq!(
        store.take_identity(&here(), "long").await.expect("take"),
        Some(id)
    );
}

/// What one node chose for a client never changes another node's choice
/// (issue 11: node A adopted what node B wrote).
pub(crate) async fn identity_per_node(store: Arc<dyn Store>) {
    let (a, b) = (node("node-a", "0"), node("node-b", "0"));
    let on_a = identity("192.0.2.10");
    let on_b = EgressIdentity {
        session: Some("b-session".into()),
        ..EgressIdentity::default()
    };
    store
        .put_identity(&a, "carol", &on_a, MINUTE)
        .await
        .expect("put a");
    store
        .put_identity(&b, "carol", &on_b, MINUTE)
        .await
        .expect("put b");
    assert_eq!(
        store.take_identity(&a, "carol").await.expect("take a"),
        Some(on_a),
        "node B's write left node A's alone"
    );
    assert_eq!(
        store
            .take_identity(&a, "carol")
            .await
            .expect("take a again"),
        None,
        "consumed on A, and B's is not A's"
    );
    store.drop_identity(&a, "carol").await.expect("drop on a");
    assert_eq!(
        store.take_identity(&b, "carol").await.expect("take b"),
        Some(on_b),
        "an eviction on A leaves B's"
    );
    // Same host, another block: another node.
    let other_block = node("node-a", "1");
    store
        .put_identity(&a, "dave", &identity("192.0.2.11"), MINUTE)
        .await
        .expect("put");
    assert_eq!(
        store
            .take_identity(&other_block, "dave")
            .await
            .expect("take"),
        None
    );
}

/// Two handles racing to take the same identity: exactly one gets it, each time.
pub(crate) async fn identity_race(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    for round in 0..20 {
        let id = identity(&format!("203.0.113.{round}"));
        a.put_identity(&here(), "raced", &id, MINUTE)
            .await
            .expect("put");
        let node = here();
        let (from_a, from_b) = tokio::join!(
            a.take_identity(&node, "raced"),
            b.take_identity(&node, "raced")
        );
        let taken: Vec<_> = [from_a.expect("take a"), from_b.expect("take b")]
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(taken, [id], "round {round}");
    }
}
