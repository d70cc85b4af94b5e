//! Contract checks for several handles on one backend, as `blipless-ctl` and
//! `blipless-device` hold in separate processes.

use std::collections::HashSet;
use std::sync::Arc;

use super::{client, hammer_usage};
use crate::{ChangeKind, Store, StoreError, Usage};

/// Two handles on one backend, as `blipless-ctl` and `blipless-device` hold.
pub(crate) async fn handles_see_each_other(ctl: Arc<dyn Store>, device: Arc<dyn Store>) {
    let seen = device.changes_since(0, 100).await.expect("initial sync");
    assert!(seen.is_empty());

    ctl.add_client(client("new")).await.expect("ctl adds");
    assert_eq!(
        device.get_client("new").await.expect("device reads"),
        Some(client("new"))
    );
    assert_eq!(
        device.list_clients().await.expect("device lists"),
        vec![client("new")]
    );
    let changes = device.changes_since(0, 100).await.expect("device follows");
    assert_eq!(changes.len(), 1);
    assert_eq!(
        (changes[0].name.as_str(), changes[0].kind),
        ("new", ChangeKind::Upsert)
    );

    let delta = Usage {
        bytes_up: 10,
        bytes_down: 20,
        connections: 1,
    };
    device
        .add_usage("new", delta, crate::contract::batch())
        .await
        .expect("device adds usage");
    assert_eq!(ctl.usage("new").await.expect("ctl reads usage"), delta);

    match device.add_client(crate::contract::rival("new", 0)).await {
        Err(StoreError::AlreadyExists(_)) => {}
        other => panic!("expected AlreadyExists across handles, got {other:?}"),
    }
    // The very record again is a repeat of the add: it succeeds, and resets nothing.
    device
        .add_client(client("new"))
        .await
        .expect("a repeated add");
    assert_eq!(ctl.usage("new").await.expect("ctl reads usage"), delta);
    assert!(ctl.remove_client("new").await.expect("ctl removes"));
    assert_eq!(device.get_client("new").await.expect("device reads"), None);
    let more = device
        .changes_since(changes[0].seq, 100)
        .await
        .expect("device follows");
    // The repeated add may have appended its Upsert again (Redis cannot tell
    // whether the first attempt got that far); the Remove comes last.
    let kinds: Vec<_> = more.iter().map(|c| (c.name.as_str(), c.kind)).collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [("new", ChangeKind::Remove)]
                | [("new", ChangeKind::Upsert), ("new", ChangeKind::Remove)]
        ),
        "{kinds:?}"
    );
    assert!(!device.remove_client("new").await.expect("already gone"));
}

/// Concurrent writers on two handles: usage sums exactly, a contested name is taken
/// exactly once, and the feed stays strictly ordered.
pub(crate) async fn concurrent_handles(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    a.add_client(client("shared")).await.expect("add");
    let (from_a, from_b) = tokio::join!(
        hammer_usage(&a, "shared", 8, 25),
        hammer_usage(&b, "shared", 8, 25)
    );
    let expected = Usage {
        bytes_up: from_a.bytes_up + from_b.bytes_up,
        bytes_down: from_a.bytes_down + from_b.bytes_down,
        connections: from_a.connections + from_b.connections,
    };
    assert_eq!(b.usage("shared").await.expect("usage"), expected);

    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let store = Arc::clone(if i % 2 == 0 { &a } else { &b });
        set.spawn(async move {
            store
                .add_client(crate::contract::rival("contested", i))
                .await
        });
    }
    let (mut ok, mut taken) = (0, 0);
    while let Some(joined) = set.join_next().await {
        match joined.expect("add task") {
            Ok(()) => ok += 1,
            Err(StoreError::AlreadyExists(_)) => taken += 1,
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!((ok, taken), (1, 15));

    let all = a.changes_since(0, usize::MAX).await.expect("feed");
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    let seqs: HashSet<u64> = all.iter().map(|c| c.seq).collect();
    assert_eq!(seqs.len(), all.len());
    let names: Vec<_> = all.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["shared", "contested"]);
}

/// A handle waiting on the change feed wakes when another writes to it, and
/// only then; an empty wait ends at its time limit.
pub(crate) async fn feed_wait_wakes_on_a_write(ctl: Arc<dyn Store>, device: Arc<dyn Store>) {
    use std::time::Duration;
    let head = device.feed_head().await.expect("head");
    let started = tokio::time::Instant::now();
    let waited = device
        .wait_for_change(head, Duration::from_millis(300))
        .await
        .expect("waits");
    assert!(!waited, "nothing was written");
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited");

    let waiter = {
        let device = device.clone();
        tokio::spawn(async move {
            device
                .wait_for_change(head, Duration::from_secs(10))
                .await
                .expect("waits")
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let written = tokio::time::Instant::now();
    ctl.add_client(client("woken")).await.expect("ctl adds");
    assert!(waiter.await.expect("joins"), "the write woke the waiter");
    assert!(
        written.elapsed() < Duration::from_secs(5),
        "woken by the write, not by the time limit"
    );
    // Already past the head: no wait at all.
    assert!(device
        .wait_for_change(head, Duration::from_secs(10))
        .await
        .expect("waits"));
}
