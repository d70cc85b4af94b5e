//! Contract checks for client limits and quota counts (docs/LIMITS.md).

use std::sync::Arc;

use blipless_config::client_limits::{ClientLimits, Quota};

use super::{client, feed};
use crate::{ChangeKind, Store, StoreError};

fn some_limits() -> ClientLimits {
    ClientLimits {
        rate_up: Some("2Mbit".parse().expect("rate")),
        rate_down: Some("10Mbit".parse().expect("rate")),
        quota: Some("50GB/month".parse::<Quota>().expect("quota")),
        max_connections: Some(5),
        source: Some(blipless_config::client_limits::SourcePolicy::Rotate),
    }
}

pub(crate) async fn limits_round_trip_and_reach_the_feed(store: Arc<dyn Store>) {
    assert!(matches!(
        store.set_limits("ghost", some_limits()).await,
        Err(StoreError::NotFound(_))
    ));
    let record = client("u");
    store.add_client(record.clone()).await.expect("add");
    assert!(store
        .get_client("u")
        .await
        .expect("get")
        .expect("u")
        .limits
        .is_empty());
    store.set_limits("u", some_limits()).await.expect("set");
    let stored = store.get_client("u").await.expect("get").expect("u");
    assert_eq!(stored.limits, some_limits());
    // Everything else is as it was.
    assert_eq!(
        crate::ClientRecord {
            limits: ClientLimits::default(),
            ..stored
        },
        record
    );
    assert_eq!(
        store.list_clients().await.expect("list")[0].limits,
        some_limits()
    );
    assert_eq!(
        feed(&store).await,
        vec![
            ("u".into(), ChangeKind::Upsert),
            ("u".into(), ChangeKind::Upsert)
        ]
    );
    // Cleared again.
    store
        .set_limits("u", ClientLimits::default())
        .await
        .expect("clear");
    assert!(store
        .get_client("u")
        .await
        .expect("get")
        .expect("u")
        .limits
        .is_empty());
    // A record added with limits keeps them.
    let with = crate::ClientRecord {
        limits: some_limits(),
        ..client("w")
    };
    store
        .add_client(with.clone())
        .await
        .expect("add with limits");
    assert_eq!(store.get_client("w").await.expect("get"), Some(with));
}

pub(crate) async fn quota_counts_add_roll_over_and_reset(store: Arc<dyn Store>) {
    assert!(matches!(
        store.add_quota_usage("ghost", "day:1", 5).await,
        Err(StoreError::NotFound(_))
    ));
    store.add_client(client("u")).await.expect("add");
    assert_eq!(
        store.add_quota_usage("u", "day:1", 0).await.expect("read"),
        0
    );
    assert_eq!(
        store
            .add_quota_usage("u", "day:1", 1000)
            .await
            .expect("add"),
        1000
    );
    assert_eq!(
        store.add_quota_usage("u", "day:1", 24).await.expect("add"),
        1024
    );
    // Another window: the count starts again.
    assert_eq!(
        store.add_quota_usage("u", "day:2", 7).await.expect("roll"),
        7
    );
    // An add for the window before (a node whose clock lags) neither
    // restarts the count nor is lost: it goes to the later window kept.
    assert_eq!(
        store
            .add_quota_usage("u", "day:1", 3)
            .await
            .expect("late add"),
        10
    );
    assert_eq!(
        store.add_quota_usage("u", "day:2", 0).await.expect("read"),
        10
    );
    // A window far ahead (a node whose clock was years ahead) does not pin
    // the count: the next add of the right window replaces it.
    assert_eq!(
        store
            .add_quota_usage("u", "day:900", 4)
            .await
            .expect("far ahead"),
        4
    );
    assert_eq!(
        store.add_quota_usage("u", "day:2", 10).await.expect("back"),
        10
    );
    // Another period altogether (the quota changed): replaced.
    assert_eq!(
        store
            .add_quota_usage("u", "week:1", 5)
            .await
            .expect("new period"),
        5
    );
    assert_eq!(
        store.add_quota_usage("u", "day:2", 2).await.expect("back"),
        2
    );
    assert_eq!(
        store
            .add_quota_usage("u", "day:2", u64::MAX)
            .await
            .expect("saturate"),
        i64::MAX as u64
    );
    store.reset_quota_usage("u").await.expect("reset");
    assert_eq!(
        store.add_quota_usage("u", "day:2", 0).await.expect("read"),
        0
    );
    store
        .reset_quota_usage("ghost")
        .await
        .expect("reset of nothing");
    // Removing the client removes its count: a new client of that name starts at zero.
    store.add_quota_usage("u", "day:2", 99).await.expect("add");
    assert!(store.remove_client("u").await.expect("remove"));
    store.add_client(client("u")).await.expect("add again");
    assert_eq!(
        store.add_quota_usage("u", "day:2", 0).await.expect("read"),
        0
    );
}

pub(crate) async fn quota_counts_are_shared_by_handles(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    a.add_client(client("u")).await.expect("add");
    let adds: Vec<_> = (0..50)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { store.add_quota_usage("u", "month:1", 100).await })
        })
        .collect();
    for add in adds {
        add.await.expect("task").expect("concurrent add");
    }
    assert_eq!(
        a.add_quota_usage("u", "month:1", 0).await.expect("read"),
        5000
    );
    // Limits set through one handle are read through the other.
    a.set_limits("u", some_limits()).await.expect("set");
    assert_eq!(
        b.get_client("u").await.expect("get").expect("u").limits,
        some_limits()
    );
}

pub(crate) async fn live_tunnels_are_summed_per_node_and_expire(store: Arc<dyn Store>) {
    let node = |host: &str| crate::NodeId {
        host: host.into(),
        block: "0".into(),
    };
    let long = std::time::Duration::from_secs(60);
    store.add_client(client("u")).await.expect("add");
    assert_eq!(
        store.live_tunnels("u", &node("a")).await.expect("none yet"),
        0
    );
    store
        .put_live_tunnels(&node("a"), "u", 3, long)
        .await
        .expect("a");
    store
        .put_live_tunnels(&node("b"), "u", 2, long)
        .await
        .expect("b");
    assert_eq!(store.live_tunnels("u", &node("a")).await.expect("but a"), 2);
    assert_eq!(store.live_tunnels("u", &node("c")).await.expect("all"), 5);
    // A node's processes (its planes of a deploy) are left out with it.
    let process = |host: &str, pid: u32| crate::NodeId {
        host: host.into(),
        block: format!("0.p{pid}"),
    };
    store
        .put_live_tunnels(&process("c", 7), "u", 10, long)
        .await
        .expect("c's plane");
    store
        .put_live_tunnels(&process("c", 8), "u", 20, long)
        .await
        .expect("c's next plane");
    assert_eq!(store.live_tunnels("u", &node("c")).await.expect("but c"), 5);
    assert_eq!(
        store.live_tunnels("u", &node("a")).await.expect("but a"),
        32
    );
    for pid in [7, 8] {
        store
            .put_live_tunnels(&process("c", pid), "u", 0, long)
            .await
            .expect("c's planes gone");
    }
    // Replaced, and forgotten at 0.
    store
        .put_live_tunnels(&node("a"), "u", 4, long)
        .await
        .expect("a again");
    store
        .put_live_tunnels(&node("b"), "u", 0, long)
        .await
        .expect("b gone");
    assert_eq!(store.live_tunnels("u", &node("c")).await.expect("all"), 4);
    // An entry not refreshed within its ttl does not count.
    store
        .put_live_tunnels(&node("d"), "u", 7, std::time::Duration::from_millis(50))
        .await
        .expect("d");
    assert_eq!(
        store.live_tunnels("u", &node("c")).await.expect("with d"),
        11
    );
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert_eq!(
        store
            .live_tunnels("u", &node("c"))
            .await
            .expect("d expired"),
        4
    );
    // Removing the client removes its entries.
    assert!(store.remove_client("u").await.expect("remove"));
    store.add_client(client("u")).await.expect("add again");
    assert_eq!(store.live_tunnels("u", &node("c")).await.expect("fresh"), 0);
}

/// Two handles (two `blipless-ctl client set` at once) change different
/// limits of one client over and over: every change stands, none is undone
/// by the other's write of the limits it read before.
pub(crate) async fn limit_changes_from_two_handles_both_stand(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) {
    a.add_client(client("u")).await.expect("add");
    const ROUNDS: u32 = 20;
    let rates = {
        let a = a.clone();
        tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let rate = format!("{}kbit", 100 + round).parse().expect("rate");
                let change = Arc::new(move |mut limits: ClientLimits| {
                    limits.rate_up = Some(rate);
                    limits
                });
                a.update_limits("u", change).await.expect("rate");
            }
        })
    };
    for round in 1..=ROUNDS {
        let change = Arc::new(move |mut limits: ClientLimits| {
            limits.max_connections = Some(round);
            limits
        });
        let after = b.update_limits("u", change).await.expect("connections");
        assert_eq!(after.max_connections, Some(round));
    }
    rates.await.expect("the rate task");
    let stored = a.get_client("u").await.expect("get").expect("u").limits;
    assert_eq!(stored.max_connections, Some(ROUNDS));
    assert_eq!(
        stored.rate_up,
        Some(format!("{}kbit", 100 + ROUNDS).parse().expect("rate"))
    );
}
