//! Contract checks for clients and the change feed.

use std::sync::Arc;

use super::{client, feed};
use crate::{ChangeKind, Store, StoreError, Usage};

pub(crate) async fn round_trip(store: Arc<dyn Store>) {
    assert!(store.list_clients().await.expect("list").is_empty());
    let bob = client("bob");
    let mut alice = client("alice");
    alice.wg_public_key = None;
    alice.wg_address = Some("fd00::42".parse().expect("v6 literal"));
    alice.egress = crate::EgressPolicy::Upstream("dc-1".into());
    let mut carol = client("carol");
    carol.wg_address = None;
    carol.egress = crate::EgressPolicy::Any;
    for record in [bob.clone(), carol.clone(), alice.clone()] {
        store.add_client(record).await.expect("add");
    }
    assert_eq!(
        store.get_client("alice").await.expect("get"),
        Some(alice.clone())
    );
    assert_eq!(
        store.get_client("bob").await.expect("get"),
        Some(bob.clone())
    );
    assert_eq!(store.get_client("nobody").await.expect("get"), None);
    assert_eq!(
        store.get_client("Alice").await.expect("get"),
        None,
        "names are case-sensitive"
    );
    let listed = store.list_clients().await.expect("list");
    assert_eq!(
        listed,
        vec![alice.clone(), bob.clone(), carol.clone()],
        "ordered by name"
    );

    assert!(store.remove_client("bob").await.expect("remove"));
    assert_eq!(store.get_client("bob").await.expect("get"), None);
    assert_eq!(
        store.list_clients().await.expect("list"),
        vec![alice, carol]
    );
    // The name is free again.
    store.add_client(bob.clone()).await.expect("re-add");
    assert_eq!(store.get_client("bob").await.expect("get"), Some(bob));
}

pub(crate) async fn duplicate_add_fails(store: Arc<dyn Store>) {
    let first = client("dup");
    store.add_client(first.clone()).await.expect("add");
    let mut second = client("dup");
    second.secret_hash = crate::credentials::hash_secret("other");
    match store.add_client(second).await {
        Err(StoreError::AlreadyExists(name)) => assert_eq!(name, "dup"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(
        store.get_client("dup").await.expect("get"),
        Some(first),
        "unchanged"
    );
    assert_eq!(
        feed(&store).await,
        vec![("dup".to_owned(), ChangeKind::Upsert)]
    );
}

pub(crate) async fn invalid_names(store: Arc<dyn Store>) {
    let long = "x".repeat(65);
    for bad in [
        "",
        "has space",
        "a:b",
        "a/b",
        "{tag}",
        "ünï",
        "line\n",
        long.as_str(),
    ] {
        match store.add_client(client(bad)).await {
            Err(StoreError::InvalidName(name)) => assert_eq!(name, bad),
            other => panic!("{bad:?}: expected InvalidName, got {other:?}"),
        }
        assert_eq!(store.get_client(bad).await.expect("get"), None);
        assert!(!store.remove_client(bad).await.expect("remove"));
        assert!(matches!(
            store.usage(bad).await,
            Err(StoreError::NotFound(_))
        ));
        let delta = Usage {
            bytes_up: 1,
            ..Usage::default()
        };
        assert!(matches!(
            store.add_usage(bad, delta, crate::contract::batch()).await,
            Err(StoreError::NotFound(_))
        ));
    }
    let longest = "y".repeat(64);
    store
        .add_client(client(&longest))
        .await
        .expect("64 characters are fine");
    store
        .add_client(client("A.z_0-9"))
        .await
        .expect("all allowed characters");
    assert_eq!(store.list_clients().await.expect("list").len(), 2);
    assert_eq!(feed(&store).await.len(), 2, "rejected adds leave no change");
}

pub(crate) async fn remove_unknown(store: Arc<dyn Store>) {
    assert!(!store.remove_client("ghost").await.expect("remove unknown"));
    store.add_client(client("once")).await.expect("add");
    assert!(store.remove_client("once").await.expect("remove"));
    assert!(!store.remove_client("once").await.expect("remove again"));
    let expected = vec![
        ("once".to_owned(), ChangeKind::Upsert),
        ("once".to_owned(), ChangeKind::Remove),
    ];
    assert_eq!(
        feed(&store).await,
        expected,
        "only real removals are in the feed"
    );
}

pub(crate) async fn change_feed(store: Arc<dyn Store>) {
    assert!(store
        .changes_since(0, 10)
        .await
        .expect("empty feed")
        .is_empty());
    assert_eq!(
        store.feed_head().await.expect("head"),
        0,
        "an empty feed's head"
    );
    for name in ["a", "b", "c"] {
        store.add_client(client(name)).await.expect("add");
    }
    assert!(store.remove_client("b").await.expect("remove"));
    store.add_client(client("b")).await.expect("re-add");

    let all = store.changes_since(0, 100).await.expect("all");
    let got: Vec<_> = all.iter().map(|c| (c.name.as_str(), c.kind)).collect();
    use ChangeKind::{Remove, Upsert};
    assert_eq!(
        got,
        [
            ("a", Upsert),
            ("b", Upsert),
            ("c", Upsert),
            ("b", Remove),
            ("b", Upsert)
        ]
    );
    assert!(all[0].seq > 0, "seq 0 means 'from the start'");
    let head = store.feed_head().await.expect("head");
    assert_eq!(
        head,
        all[all.len() - 1].seq,
        "the head is the newest change"
    );
    assert!(store
        .changes_since(head, 10)
        .await
        .expect("after head")
        .is_empty());
    assert!(
        all.windows(2).all(|w| w[0].seq < w[1].seq),
        "seq strictly increasing: {all:?}"
    );

    // `limit` caps from the oldest; `after` is exclusive.
    assert_eq!(store.changes_since(0, 2).await.expect("limit"), all[..2]);
    assert_eq!(
        store.changes_since(all[1].seq, 2).await.expect("page"),
        all[2..4]
    );
    assert_eq!(
        store.changes_since(all[3].seq, 100).await.expect("tail"),
        all[4..]
    );
    let last = all[4].seq;
    assert!(store
        .changes_since(last, 100)
        .await
        .expect("caught up")
        .is_empty());
    assert!(store.changes_since(0, 0).await.expect("limit 0").is_empty());
    assert!(store
        .changes_since(u64::MAX, 10)
        .await
        .expect("far future")
        .is_empty());

    // Following the feed one page at a time yields exactly the same sequence.
    let mut followed = Vec::new();
    let mut cursor = 0;
    while let Some(change) = store.changes_since(cursor, 1).await.expect("follow").pop() {
        cursor = change.seq;
        followed.push(change);
    }
    assert_eq!(followed, all);

    // New changes come after everything seen so far.
    store.add_client(client("d")).await.expect("add d");
    let new = store.changes_since(last, 100).await.expect("new");
    assert_eq!(new.len(), 1);
    assert_eq!((new[0].name.as_str(), new[0].kind), ("d", Upsert));
    assert!(new[0].seq > last);
}
