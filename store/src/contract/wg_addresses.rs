//! Contract checks for WireGuard addresses: at most one client holds each, a refused
//! add holds none, and removing a client frees its address.

use std::net::IpAddr;
use std::sync::Arc;

use super::{client, feed};
use crate::{ChangeKind, ClientRecord, Store, StoreError};

fn ip(text: &str) -> IpAddr {
    text.parse().expect("address literal")
}

/// `client(name)` with the given WireGuard address.
fn with_address(name: &str, address: Option<IpAddr>) -> ClientRecord {
    ClientRecord {
        wg_address: address,
        ..client(name)
    }
}

pub(crate) async fn wg_address_unique(store: Arc<dyn Store>) {
    let (x, y, z) = (ip("10.64.0.2"), ip("10.64.0.3"), ip("10.64.0.4"));
    store
        .add_client(with_address("a", Some(x)))
        .await
        .expect("add a");
    match store.add_client(with_address("b", Some(x))).await {
        Err(StoreError::AddressTaken(address)) => assert_eq!(address, x),
        other => panic!("expected AddressTaken, got {other:?}"),
    }
    assert_eq!(store.get_client("b").await.expect("get"), None);
    assert_eq!(
        feed(&store).await,
        vec![("a".to_owned(), ChangeKind::Upsert)],
        "a refused add leaves no change"
    );

    // A taken name is reported first, and the address it asked for stays free.
    for address in [Some(x), Some(z), None] {
        let rival = ClientRecord {
            wg_address: address,
            ..crate::contract::rival("a", 0)
        };
        match store.add_client(rival).await {
            Err(StoreError::AlreadyExists(name)) => assert_eq!(name, "a"),
            other => panic!("{address:?}: expected AlreadyExists, got {other:?}"),
        }
    }
    store
        .add_client(with_address("c", Some(z)))
        .await
        .expect("z was not kept by the refused add");

    // Clients without an address never collide.
    for name in ["plain1", "plain2"] {
        store
            .add_client(with_address(name, None))
            .await
            .expect("add without an address");
    }

    // Removing a client frees its address, for another name or its own.
    assert!(store.remove_client("a").await.expect("remove a"));
    store
        .add_client(with_address("b", Some(x)))
        .await
        .expect("x is free again");
    match store.add_client(with_address("a", Some(x))).await {
        Err(StoreError::AddressTaken(address)) => assert_eq!(address, x),
        other => panic!("expected AddressTaken, got {other:?}"),
    }
    store
        .add_client(with_address("a", Some(y)))
        .await
        .expect("a with another address");
    let held: Vec<_> = store
        .list_clients()
        .await
        .expect("list")
        .into_iter()
        .map(|c| (c.name, c.wg_address))
        .collect();
    assert_eq!(
        held,
        [
            ("a".to_owned(), Some(y)),
            ("b".to_owned(), Some(x)),
            ("c".to_owned(), Some(z)),
            ("plain1".to_owned(), None),
            ("plain2".to_owned(), None),
        ]
    );
}

/// Racing adds on two handles, as two `blipless-ctl client add --wg` at once: one
/// address goes to exactly one client; of adds racing for one name, the losers keep
/// none of the addresses they asked for.
pub(crate) async fn wg_address_race(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let contested = ip("10.64.0.9");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let store = Arc::clone(if i % 2 == 0 { &a } else { &b });
        let record = with_address(&format!("racer{i:02}"), Some(contested));
        set.spawn(async move { (record.name.clone(), store.add_client(record).await) });
    }
    let mut winners = Vec::new();
    let mut refused = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined.expect("add task") {
            (name, Ok(())) => winners.push(name),
            (name, Err(StoreError::AddressTaken(address))) => {
                assert_eq!(address, contested);
                refused.push(name);
            }
            (name, Err(other)) => panic!("{name}: unexpected error: {other}"),
        }
    }
    assert_eq!((winners.len(), refused.len()), (1, 15), "{winners:?}");
    let holders: Vec<_> = b
        .list_clients()
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(holders, winners);

    // The winner leaves: a loser can have the address now.
    assert!(a.remove_client(&winners[0]).await.expect("remove"));
    b.add_client(with_address(&refused[0], Some(contested)))
        .await
        .expect("the freed address");

    // One name, each racer with its own address: one wins, and every other address
    // is free afterwards.
    let own: Vec<IpAddr> = (20..28u8)
        .map(|last| IpAddr::from([10, 64, 0, last]))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for (i, address) in own.iter().copied().enumerate() {
        let store = Arc::clone(if i % 2 == 0 { &a } else { &b });
        set.spawn(async move {
            let added = store
                .add_client(with_address("samename", Some(address)))
                .await;
            (address, added)
        });
    }
    let mut won = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined.expect("add task") {
            (address, Ok(())) => won.push(address),
            (_, Err(StoreError::AlreadyExists(_))) => {}
            (address, Err(other)) => panic!("{address}: unexpected error: {other}"),
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    let stored = a
        .get_client("samename")
        .await
        .expect("get")
        .and_then(|c| c.wg_address);
    assert_eq!(stored, Some(won[0]));
    for (i, address) in own.into_iter().filter(|x| *x != won[0]).enumerate() {
        a.add_client(with_address(&format!("after{i}"), Some(address)))
            .await
            .unwrap_or_else(|error| panic!("{address} kept by a losing add: {error}"));
    }
}
