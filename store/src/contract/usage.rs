//! Contract checks for usage counters: lifecycle, saturation, concurrent adds.

use std::sync::Arc;

use super::client;
use crate::{Store, StoreError, Usage};

pub(crate) async fn usage_lifecycle(store: Arc<dyn Store>) {
    assert!(matches!(
        store.usage("ghost").await,
        Err(StoreError::NotFound(_))
    ));
    let delta = Usage {
        bytes_up: 1,
        bytes_down: 2,
        connections: 3,
    };
    assert!(matches!(
        store
            .add_usage("ghost", delta, crate::contract::batch())
            .await,
        Err(StoreError::NotFound(_))
    ));

    store.add_client(client("u")).await.expect("add");
    assert_eq!(store.usage("u").await.expect("usage"), Usage::default());
    store
        .add_usage("u", delta, crate::contract::batch())
        .await
        .expect("add usage");
    store
        .add_usage("u", delta, crate::contract::batch())
        .await
        .expect("add usage");
    store
        .add_usage("u", Usage::default(), crate::contract::batch())
        .await
        .expect("zero delta");
    let expected = Usage {
        bytes_up: 2,
        bytes_down: 4,
        connections: 6,
    };
    assert_eq!(store.usage("u").await.expect("usage"), expected);

    // Removal takes the usage along; a new client of the same name starts at zero.
    assert!(store.remove_client("u").await.expect("remove"));
    assert!(matches!(
        store.usage("u").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.add_usage("u", delta, crate::contract::batch()).await,
        Err(StoreError::NotFound(_))
    ));
    store.add_client(client("u")).await.expect("re-add");
    assert_eq!(store.usage("u").await.expect("usage"), Usage::default());
}

/// Counters saturate at `i64::MAX` rather than overflow or wrap.
pub(crate) async fn usage_saturates(store: Arc<dyn Store>) {
    store.add_client(client("big")).await.expect("add");
    let max = u64::try_from(i64::MAX).expect("i64::MAX fits u64");
    let huge = Usage {
        bytes_up: u64::MAX,
        bytes_down: 1 << 61,
        connections: 1,
    };
    store
        .add_usage("big", huge, crate::contract::batch())
        .await
        .expect("first add");
    store
        .add_usage("big", huge, crate::contract::batch())
        .await
        .expect("second add");
    let expected = Usage {
        bytes_up: max,
        bytes_down: 1 << 62,
        connections: 2,
    };
    assert_eq!(store.usage("big").await.expect("usage"), expected);
    store
        .add_usage("big", huge, crate::contract::batch())
        .await
        .expect("third add");
    let expected = Usage {
        bytes_up: max,
        bytes_down: (1 << 62) + (1 << 61),
        connections: 3,
    };
    assert_eq!(store.usage("big").await.expect("usage"), expected);
    store
        .add_usage(
            "big",
            Usage {
                bytes_down: max,
                ..huge
            },
            crate::contract::batch(),
        )
        .await
        .expect("fourth add");
    let expected = Usage {
        bytes_up: max,
        bytes_down: max,
        connections: 4,
    };
    assert_eq!(store.usage("big").await.expect("usage"), expected);
}

/// Adds `rounds` deltas from each of `tasks` tasks on `store`; returns the total added.
pub(crate) async fn hammer_usage(
    store: &Arc<dyn Store>,
    name: &str,
    tasks: u64,
    rounds: u64,
) -> Usage {
    let mut set = tokio::task::JoinSet::new();
    for task in 1..=tasks {
        let store = Arc::clone(store);
        let name = name.to_owned();
        set.spawn(async move {
            for _ in 0..rounds {
                let delta = Usage {
                    bytes_up: task,
                    bytes_down: 1000 * task,
                    connections: 1,
                };
                store
                    .add_usage(&name, delta, crate::contract::batch())
                    .await
                    .expect("add_usage");
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("usage task");
    }
    let sum: u64 = (1..=tasks).sum();
    Usage {
        bytes_up: sum * rounds,
        bytes_down: 1000 * sum * rounds,
        connections: tasks * rounds,
    }
}

pub(crate) async fn concurrent_usage(store: Arc<dyn Store>) {
    store.add_client(client("busy")).await.expect("add");
    let expected = hammer_usage(&store, "busy", 32, 25).await;
    assert_eq!(store.usage("busy").await.expect("usage"), expected);
}
