//! Contract checks for the WireGuard endpoint snapshot per node.

use std::sync::Arc;

use crate::{EndpointSnapshot, NodeId, Store, StoredEndpoint};

fn node(host: &str, block: &str) -> NodeId {
    NodeId {
        host: host.to_owned(),
        block: block.to_owned(),
    }
}

/// A snapshot of `peers` peers (v4 and v6 endpoints), taken at `taken_at_ms`.
fn snapshot(taken_at_ms: u64, peers: usize) -> EndpointSnapshot {
    EndpointSnapshot {
        taken_at_ms,
        peers: (0..peers)
            .map(|i| StoredEndpoint {
                public_key: format!("peer-{i}-{taken_at_ms}="),
                endpoint: if i % 2 == 0 {
                    format!("198.51.100.{}:{}", i % 250, 40_000 + i)
                } else {
                    format!("[2001:db8::{i:x}]:{}", 50_000 + i)
                }
                .parse()
                .expect("endpoint literal"),
                last_received_ms: taken_at_ms - i as u64,
            })
            .collect(),
    }
}

/// None before any put; a put reads back equal; an empty snapshot is a snapshot too.
pub(crate) async fn endpoints_round_trip(store: Arc<dyn Store>) {
    let n = node("host-a", "0");
    assert_eq!(store.get_endpoints(&n).await.expect("get"), None);
    let saved = snapshot(1_700_000_000_000, 3);
    store.put_endpoints(&n, &saved).await.expect("put");
    assert_eq!(store.get_endpoints(&n).await.expect("get"), Some(saved));
    let empty = EndpointSnapshot {
        taken_at_ms: 1_700_000_002_000,
        peers: Vec::new(),
    };
    store.put_endpoints(&n, &empty).await.expect("put empty");
    assert_eq!(store.get_endpoints(&n).await.expect("get"), Some(empty));
}

/// A put replaces the whole snapshot, however many peers either has.
pub(crate) async fn endpoints_replaced(store: Arc<dyn Store>) {
    let n = node("host-a", "0");
    store
        .put_endpoints(&n, &snapshot(1_000, 500))
        .await
        .expect("put");
    let newer = snapshot(3_000, 2);
    store.put_endpoints(&n, &newer).await.expect("put again");
    assert_eq!(store.get_endpoints(&n).await.expect("get"), Some(newer));
    // Not newer than the last one: replaced all the same (the store keeps what it is
    // given last).
    let older = snapshot(2_000, 1);
    store.put_endpoints(&n, &older).await.expect("put older");
    assert_eq!(store.get_endpoints(&n).await.expect("get"), Some(older));
}

/// Each node (host and block) has its own snapshot.
pub(crate) async fn endpoints_per_node(store: Arc<dyn Store>) {
    let a = node("host-a", "0");
    let b = node("host-b", "0");
    let a1 = node("host-a", "1");
    store
        .put_endpoints(&a, &snapshot(1_000, 2))
        .await
        .expect("put a");
    assert_eq!(store.get_endpoints(&b).await.expect("get b"), None);
    assert_eq!(store.get_endpoints(&a1).await.expect("get a1"), None);
    store
        .put_endpoints(&b, &snapshot(2_000, 3))
        .await
        .expect("put b");
    store
        .put_endpoints(&a1, &snapshot(3_000, 1))
        .await
        .expect("put a1");
    assert_eq!(
        store.get_endpoints(&a).await.expect("get a"),
        Some(snapshot(1_000, 2))
    );
    assert_eq!(
        store.get_endpoints(&b).await.expect("get b"),
        Some(snapshot(2_000, 3))
    );
    assert_eq!(
        store.get_endpoints(&a1).await.expect("get a1"),
        Some(snapshot(3_000, 1))
    );
}
