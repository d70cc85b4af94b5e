//! Pre-warm scheduling and identity handling, over the real embedded store
//! wrapped to slow one client down and to count opens in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use blipless_store::{self as store, Change, ClientRecord, StoreError, Usage};

/// The embedded store, with identity restores that take `delay` (or
/// `slow_delay` for `slow_client`), counting how many run at once.
#[derive(Debug)]
struct Instrumented {
    inner: Arc<dyn Store>,
    delay: Duration,
    slow_client: &'static str,
    slow_delay: Duration,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Milliseconds each identity save waits before it is made.
    put_delay_ms: std::sync::atomic::AtomicU64,
    /// Identity takes fail as a hung store's do.
    takes_unavailable: std::sync::atomic::AtomicBool,
    /// Identity saves made.
    puts: AtomicUsize,
    restored: std::sync::Mutex<Vec<String>>,
}

#[async_trait]
impl Store for Instrumented {
    async fn add_client(&self, record: ClientRecord) -> Result<(), StoreError> {
        self.inner.add_client(record).await
    }
    async fn get_client(&self, name: &str) -> Result<Option<ClientRecord>, StoreError> {
        self.inner.get_client(name).await
    }
    async fn read_clients(&self) -> Result<blipless_store::ClientList, StoreError> {
        self.inner.read_clients().await
    }
    async fn remove_client(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.remove_client(name).await
    }
    async fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        self.inner.changes_since(after, limit).await
    }
    async fn feed_head(&self) -> Result<u64, StoreError> {
        self.inner.feed_head().await
    }
    async fn add_usage(&self, name: &str, delta: Usage, batch: u64) -> Result<(), StoreError> {
        self.inner.add_usage(name, delta, batch).await
    }
    async fn usage(&self, name: &str) -> Result<Usage, StoreError> {
        self.inner.usage(name).await
    }
    async fn touch_activity(
        &self,
        node: &NodeId,
        clients: &[(String, i64)],
    ) -> Result<(), StoreError> {
        self.inner.touch_activity(node, clients).await
    }
    async fn active_clients(&self, node: &NodeId, since: i64) -> Result<Vec<String>, StoreError> {
        self.inner.active_clients(node, since).await
    }
    async fn put_identity(
        &self,
        node: &NodeId,
        client: &str,
        identity: &EgressIdentity,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let delay = self.put_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put_identity(node, client, identity, ttl).await
    }
    async fn take_identity(
        &self,
        node: &NodeId,
        client: &str,
    ) -> Result<Option<EgressIdentity>, StoreError> {
        if self.takes_unavailable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("no answer within 4 s".into()));
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = if client == self.slow_client {
            self.slow_delay
        } else {
            self.delay
        };
        tokio::time::sleep(delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.restored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(client.to_string());
        self.inner.take_identity(node, client).await
    }
    async fn drop_identity(&self, node: &NodeId, client: &str) -> Result<(), StoreError> {
        self.inner.drop_identity(node, client).await
    }
    async fn put_endpoints(
        &self,
        node: &NodeId,
        snapshot: &store::EndpointSnapshot,
    ) -> Result<(), StoreError> {
        self.inner.put_endpoints(node, snapshot).await
    }
    async fn get_endpoints(
        &self,
        node: &NodeId,
    ) -> Result<Option<store::EndpointSnapshot>, StoreError> {
        self.inner.get_endpoints(node).await
    }
    async fn update_limits(
        &self,
        name: &str,
        change: store::LimitsChange,
    ) -> Result<store::ClientLimits, StoreError> {
        self.inner.update_limits(name, change).await
    }
    async fn add_quota_usage(
        &self,
        name: &str,
        window: &str,
        bytes: u64,
    ) -> Result<u64, StoreError> {
        self.inner.add_quota_usage(name, window, bytes).await
    }
    async fn reset_quota_usage(&self, name: &str) -> Result<(), StoreError> {
        self.inner.reset_quota_usage(name).await
    }
    async fn put_live_tunnels(
        &self,
        node: &NodeId,
        client: &str,
        count: u64,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.inner.put_live_tunnels(node, client, count, ttl).await
    }
    async fn live_tunnels(&self, client: &str, except: &NodeId) -> Result<u64, StoreError> {
        self.inner.live_tunnels(client, except).await
    }
}

fn node() -> NodeId {
    NodeId {
        host: "test".into(),
        block: "0".into(),
    }
}

async fn fixture(slow_delay: Duration) -> (tempfile::TempDir, Arc<Instrumented>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let inner = store::open(&url).await.expect("store");
    let store = Arc::new(Instrumented {
        inner,
        delay: Duration::from_millis(50),
        slow_client: "slow",
        slow_delay,
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
        put_delay_ms: std::sync::atomic::AtomicU64::new(0),
        takes_unavailable: std::sync::atomic::AtomicBool::new(false),
        puts: AtomicUsize::new(0),
        restored: std::sync::Mutex::new(Vec::new()),
    });
    (dir, store)
}

/// A store that did not answer the take is not asked to save on the
/// opening connection's path (a hung Redis made that connection wait for
/// both, up to 8 s); the flush saves the identity once the client has
/// traffic. A take that answers is followed by the save at once.
#[tokio::test]
async fn an_unavailable_store_is_not_waited_on_twice_by_an_open() {
    let (_dir, store) = fixture(Duration::from_millis(0)).await;
    let sources: Vec<std::net::IpAddr> = vec!["127.0.0.2".parse().expect("ip")];
    let identities = Arc::new(Identities::new(store.clone(), node(), sources));
    store.takes_unavailable.store(true, Ordering::SeqCst);
    let opened = identities.open("a").await;
    assert!(opened.identity.source.is_some(), "allocated all the same");
    assert_eq!(store.puts.load(Ordering::SeqCst), 0, "no save on the path");
    identities.touch("a");
    identities.flush().await;
    assert_eq!(store.puts.load(Ordering::SeqCst), 1, "the flush saves it");
    // Nor is its first window saved on the path (a connection through an
    // upstream waits for that).
    identities
        .set_window(&opened, vec!["direct".to_owned()])
        .await;
    assert_eq!(store.puts.load(Ordering::SeqCst), 1, "no save on the path");
    store.takes_unavailable.store(false, Ordering::SeqCst);
    identities.open("b").await;
    assert_eq!(store.puts.load(Ordering::SeqCst), 2, "saved at once");
}

#[tokio::test]
async fn pre_warm_opens_only_recent_clients_with_bounded_concurrency() {
    let (_dir, store) = fixture(Duration::from_millis(50)).await;
    let now = now_unix();
    let mut activity: Vec<(String, i64)> =
        (0..20).map(|i| (format!("recent{i}"), now - 30)).collect();
    activity.push(("stale".into(), now - 1200));
    store
        .touch_activity(&node(), &activity)
        .await
        .expect("touch");
    let identities = Arc::new(Identities::new(store.clone(), node(), Vec::new()));
    let report = identities
        .prewarm(
            Duration::from_secs(600),
            4,
            Duration::from_secs(5),
            Duration::from_secs(30),
            |client| client != "recent0",
        )
        .await;
    assert_eq!(report.candidates, 19, "recent0 is no client any more");
    assert_eq!(report.opened, 19);
    assert_eq!(identities.prewarmed(), 19);
    assert_eq!(identities.live(), 19);
    let restored = store.restored.lock().expect("lock").clone();
    assert!(!restored.contains(&"recent0".to_string()));
    assert!(
        !restored.contains(&"stale".to_string()),
        "a client idle past the window is not pre-warmed"
    );
    let most = store.most_in_flight.load(Ordering::SeqCst);
    assert!(most <= 4, "at most 4 opens at once, saw {most}");
    assert!(most >= 2, "opens overlapped (saw {most})");
}

#[tokio::test]
async fn a_slow_client_is_skipped_and_cannot_hold_the_budget() {
    let (_dir, store) = fixture(Duration::from_secs(3600)).await;
    let now = now_unix();
    let activity = vec![
        ("slow".to_string(), now - 10),
        ("quick".to_string(), now - 10),
    ];
    store
        .touch_activity(&node(), &activity)
        .await
        .expect("touch");
    let identities = Arc::new(Identities::new(store.clone(), node(), Vec::new()));
    let started = std::time::Instant::now();
    let report = identities
        .prewarm(
            Duration::from_secs(600),
            8,
            Duration::from_millis(300),
            Duration::from_secs(30),
            |_| true,
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!((report.opened, report.skipped), (1, 1));

    // With a per-device timeout longer than the budget, the budget still holds.
    let identities = Arc::new(Identities::new(store, node(), Vec::new()));
    let started = std::time::Instant::now();
    let report = identities
        .prewarm(
            Duration::from_secs(600),
            8,
            Duration::from_secs(3600),
            Duration::from_millis(500),
            |_| true,
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(report.opened, 1);
    assert_eq!(report.skipped, 1);
}

#[tokio::test]
async fn identities_are_restored_kept_and_evicted() {
    let (_dir, store) = fixture(Duration::from_millis(1)).await;
    let pool: Vec<std::net::IpAddr> = vec![
        "127.0.0.2".parse().expect("ip"),
        "127.0.0.3".parse().expect("ip"),
    ];
    let first = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let a = first.open("a").await;
    let b = first.open("b").await;
    assert_ne!(
        a.identity.source, b.identity.source,
        "the pool is shared out"
    );
    first.keep_all().await;

    // A successor restores both.
    let second = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    assert_eq!(second.open("a").await.identity, a.identity);
    assert_eq!(second.open("b").await.identity, b.identity);

    // A live eviction deletes the snapshot: a third plane allocates afresh.
    second.evict("a").await;
    assert_eq!(
        store.inner.take_identity(&node(), "a").await.expect("take"),
        None
    );

    // An identity outside the current pool is not restored.
    let narrower = Arc::new(Identities::new(
        store.clone(),
        node(),
        vec![a.identity.source.expect("source")],
    ));
    let b_again = narrower.open("b").await;
    assert_eq!(b_again.identity.source, a.identity.source);
    assert_eq!(
        b_again.identity.session, b.identity.session,
        "a new source, the same session"
    );

    // One kept without a source (no pool then) gets one when a pool is set.
    let without = Arc::new(Identities::new(store.clone(), node(), Vec::new()));
    let c = without.open("c").await;
    assert_eq!(c.identity.source, None);
    without.keep_all().await;
    let with_pool = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let c_again = with_pool.open("c").await;
    assert!(c_again.identity.source.is_some_and(|s| pool.contains(&s)));
    assert_eq!(c_again.identity.session, c.identity.session);
}

/// An open given up while it restores (a connect cut short, a pre-warm past
/// its budget) still saves what it took out of the store: the next plane
/// restores the same identity instead of allocating a new source.
#[tokio::test]
async fn an_open_given_up_midway_keeps_the_stored_identity() {
    let (_dir, store) = fixture(Duration::from_millis(1)).await;
    let pool: Vec<std::net::IpAddr> = vec![
        "127.0.0.2".parse().expect("ip"),
        "127.0.0.3".parse().expect("ip"),
    ];
    let first = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let kept = first.open("a").await;
    first.keep_all().await;

    // The take takes 50 ms and the save after it 100 ms: the caller gives
    // up between the two, when the identity is out of the store.
    store.put_delay_ms.store(100, Ordering::SeqCst);
    let second = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let given_up = tokio::time::timeout(Duration::from_millis(90), second.open("a")).await;
    assert!(given_up.is_err(), "the open was to take longer");
    tokio::time::sleep(Duration::from_millis(400)).await;
    store.put_delay_ms.store(0, Ordering::SeqCst);

    let third = Arc::new(Identities::new(store.clone(), node(), pool));
    assert_eq!(third.open("a").await.identity, kept.identity);
}

/// A client removed while its identity opens: the eviction runs while the
/// open saves, and what the open saved is dropped again (a client added
/// later under the name would otherwise inherit it).
#[tokio::test]
async fn an_identity_evicted_while_it_opens_is_not_saved_back() {
    let (_dir, store) = fixture(Duration::from_millis(1)).await;
    let pool: Vec<std::net::IpAddr> = vec!["127.0.0.2".parse().expect("ip")];
    let identities = Arc::new(Identities::new(store.clone(), node(), pool));
    // The take takes 50 ms and the save after it 200 ms: the eviction comes
    // between the two.
    store.put_delay_ms.store(200, Ordering::SeqCst);
    let opening = tokio::spawn({
        let identities = identities.clone();
        async move { identities.open("a").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    identities.evict("a").await;
    opening.await.expect("the open");
    store.put_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(
        store.inner.take_identity(&node(), "a").await.expect("take"),
        None,
        "the evicted identity was saved back"
    );
}

/// A source found unusable (no longer the host's) is not handed straight
/// back to the client it was taken from: the next open gets another.
#[tokio::test]
async fn an_unusable_source_is_passed_over() {
    let (_dir, store) = fixture(Duration::from_millis(1)).await;
    let pool: Vec<std::net::IpAddr> = vec![
        "127.0.0.2".parse().expect("ip"),
        "127.0.0.3".parse().expect("ip"),
    ];
    let identities = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let first = identities.open("a").await;
    let dead = first.identity.source.expect("a source");
    identities.source_unusable("a", dead).await;
    let again = identities.open("a").await;
    assert!(
        again
            .identity
            .source
            .is_some_and(|s| s != dead && pool.contains(&s)),
        "{:?} after {dead} was found unusable",
        again.identity.source
    );
}

/// A burst of first opens (a pre-warm, a herd of new clients) spreads over
/// the pool: each open counts the sources of the opens not finished yet.
#[tokio::test]
async fn a_burst_of_first_opens_spreads_over_the_pool() {
    let (_dir, store) = fixture(Duration::from_millis(1)).await;
    // Every save takes a while, so that the opens overlap.
    store.put_delay_ms.store(50, Ordering::SeqCst);
    let pool: Vec<std::net::IpAddr> = vec![
        "127.0.0.2".parse().expect("ip"),
        "127.0.0.3".parse().expect("ip"),
    ];
    let identities = Arc::new(Identities::new(store.clone(), node(), pool.clone()));
    let opens = (0..8).map(|n| {
        let identities = identities.clone();
        async move { identities.open(&format!("client-{n}")).await }
    });
    let opened = futures_util::future::join_all(opens).await;
    for source in &pool {
        let users = opened
            .iter()
            .filter(|held| held.identity.source == Some(*source))
            .count();
        assert_eq!(users, 4, "{source} serves {users} of 8 clients");
    }
}
