//! The Redis store on Sentinel and on Cluster, beyond the contract suite (which
//! runs on both in `contract`): a repeated usage batch counts once, and a master
//! killed (SIGKILL) while usage is added and clients are added costs no count,
//! no client and no feed entry, and activity and identity writes go on after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::contract::client;
use crate::testing::{RedisCluster, RedisSentinel};
use crate::{Store, StoreError, Usage};

use super::RedisStore;

async fn open(url: &str) -> Arc<dyn Store> {
    match RedisStore::open(url).await {
        Ok(store) => Arc::new(store),
        Err(err) => panic!("opening {url}: {err}"),
    }
}

/// The same batch twice adds once; a new batch adds again.
async fn a_repeated_batch_counts_once(url: &str) {
    let store = open(url).await;
    store.add_client(client("u")).await.expect("add");
    let delta = Usage {
        bytes_up: 3,
        bytes_down: 4,
        connections: 1,
    };
    store.add_usage("u", delta, 7).await.expect("first");
    store.add_usage("u", delta, 7).await.expect("repeat");
    assert_eq!(store.usage("u").await.expect("usage"), delta);
    store.add_usage("u", delta, 8).await.expect("next");
    let twice = Usage {
        bytes_up: 6,
        bytes_down: 8,
        connections: 2,
    };
    assert_eq!(store.usage("u").await.expect("usage"), twice);
    // Another handle (another process) has batches of its own.
    let other = open(url).await;
    other.add_usage("u", delta, 7).await.expect("other handle");
    assert_eq!(store.usage("u").await.expect("usage").connections, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_batch_on_one_redis() {
    let server = crate::contract::redis_server::RedisServer::start();
    a_repeated_batch_counts_once(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_batch_on_sentinel() {
    let sentinel = RedisSentinel::start();
    a_repeated_batch_counts_once(&sentinel.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_batch_on_cluster() {
    let cluster = RedisCluster::start();
    a_repeated_batch_counts_once(&cluster.url()).await;
}

/// A master whose replica is gone has nothing to wait for: usage adds succeed,
/// and only the first waits out `WAIT` (after it, the store knows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_replicas_is_not_waited_on() {
    let mut sentinel = RedisSentinel::start();
    let store = open(&sentinel.url()).await;
    store.add_client(client("u")).await.expect("add");
    let replica = sentinel.replica_port();
    sentinel.kill_node(replica);
    let master = sentinel.master_port();
    while crate::testing::cli(master, &["INFO", "replication"]).contains("connected_slaves:1") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delta = Usage {
        bytes_up: 1,
        bytes_down: 1,
        connections: 1,
    };
    let started = Instant::now();
    for batch in 1..=20 {
        store.add_usage("u", delta, batch).await.expect("usage add");
    }
    let took = started.elapsed();
    // Twenty waits of 250 ms would be 5 s.
    assert!(took < Duration::from_secs(2), "20 usage adds took {took:?}");
    assert_eq!(store.usage("u").await.expect("usage").connections, 20);
}

/// A replica that is connected but does not answer (stopped) confirms nothing:
/// the add is `Unconfirmed`; repeated with its batch once the replica is back, it
/// is confirmed and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_add_repeated_counts_once() {
    let sentinel = RedisSentinel::start();
    let store = open(&sentinel.url()).await;
    store.add_client(client("u")).await.expect("add");
    let delta = Usage {
        bytes_up: 5,
        bytes_down: 5,
        connections: 1,
    };
    store
        .add_usage("u", delta, 1)
        .await
        .expect("a confirmed add");
    let replica = nix::unistd::Pid::from_raw(
        sentinel
            .pid_of(sentinel.replica_port())
            .expect("the replica runs"),
    );
    nix::sys::signal::kill(replica, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let unconfirmed = store.add_usage("u", delta, 2).await;
    nix::sys::signal::kill(replica, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert!(
        matches!(unconfirmed, Err(StoreError::Unconfirmed(_))),
        "{unconfirmed:?}"
    );
    store
        .add_usage("u", delta, 2)
        .await
        .expect("the repeat, confirmed");
    let usage = store.usage("u").await.expect("usage");
    assert_eq!(usage.connections, 2, "{usage:?}");
    assert_eq!(usage.bytes_up, 10, "{usage:?}");
}

/// A Cluster master that hangs (SIGSTOP) pauses the keys in its slots, not
/// the others: calls on another master's slots go on. Before, the pool
/// checked each connection it handed out with a PING, which a cluster
/// connection sends to every master: it waited on the hung one, and every
/// call on every slot failed until the master was failed over. Once it is
/// failed over, still hung, calls on its slots work again. (Full coverage
/// is off, so that slots served stay served meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_master_pauses_only_its_own_slots() {
    let cluster = RedisCluster::start();
    for port in cluster.ports() {
        crate::testing::cli(
            port,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        );
    }
    let feed_master = cluster.master_of_slot_for_key("{blipless}:feed");
    let name = (0..1000)
        .map(|n| format!("c{n}"))
        .find(|name| cluster.master_of_slot_for_key(&format!("{{pc_{name}}}")) != feed_master)
        .expect("a name on another master than the feed's");
    let client_master = cluster.master_of_slot_for_key(&format!("{{pc_{name}}}"));
    let hung = cluster
        .master_ports()
        .into_iter()
        .find(|port| ![feed_master, client_master].contains(port))
        .expect("a third master");
    let on_the_hung = (0..1000)
        .map(|n| format!("h{n}"))
        .find(|name| cluster.master_of_slot_for_key(&format!("{{pc_{name}}}")) == hung)
        .expect("a name on the master to hang");
    let store = open(&cluster.url()).await;
    store.add_client(client(&name)).await.expect("add");
    for _ in 0..8 {
        store.get_client(&name).await.expect("read");
    }
    let hung_pid = nix::unistd::Pid::from_raw(cluster.pid_of(hung).expect("it runs"));
    nix::sys::signal::kill(hung_pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    // Calls on the hung master's slots meanwhile: they wait and fail, and
    // must cost the others nothing.
    let stop = Arc::new(AtomicBool::new(false));
    let hung_calls: Vec<_> = (0..4)
        .map(|_| {
            let (store, stop, on_the_hung) = (store.clone(), stop.clone(), on_the_hung.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let _ = store.get_client(&on_the_hung).await;
                }
            })
        })
        .collect();
    // Let them begin first. With a pool of cluster connections, they held
    // every idle one and the next call had to make one, which (connecting
    // to every node, the hung one too, 2 s each) took longer than a call
    // may wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delta = Usage {
        bytes_up: 1,
        bytes_down: 1,
        connections: 1,
    };
    let mut failures = Vec::new();
    for batch in 1..=10 {
        if let Err(error) = store.get_client(&name).await {
            failures.push(format!("read: {error}"));
        }
        if let Err(error) = store.add_usage(&name, delta, batch).await {
            failures.push(format!("usage: {error}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for calls in hung_calls {
        let _ = calls.await;
    }
    // The hung master is failed over (its node timeout is 1 s) while it is
    // still stopped: calls on its slots work again, on connections that
    // read the slot map afresh (a connection kept retried the hung node).
    let hung_key = format!("{{pc_{on_the_hung}}}");
    let failed_over = async {
        while cluster.master_of_slot_for_key_asking(feed_master, &hung_key) == hung {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), failed_over)
        .await
        .expect("the hung master is failed over");
    let answered = async {
        while store.get_client(&on_the_hung).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let recovered = tokio::time::timeout(Duration::from_secs(60), answered).await;
    nix::sys::signal::kill(hung_pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        recovered.is_ok(),
        "calls on the failed-over master's slots work again while it is still hung"
    );
}

/// What the writers saw while a master was killed.
#[derive(Debug, Default)]
struct Tally {
    /// The sum of the usage adds that returned Ok.
    usage: Usage,
    /// Clients whose add returned Ok (or Unconfirmed: stored all the same).
    added: Vec<String>,
    /// Calls that failed (and were repeated).
    failures: usize,
    /// The first write that succeeded after the kill, from the kill.
    resumed_after: Option<Duration>,
}

/// Usage adds every 20 ms and a client add every 100 ms, each repeated until it
/// lands, while `kill` (on a blocking thread) kills a master and waits for the
/// failover; then checks that every count landed exactly once, every client added
/// is there, and the feed is whole; prints the failover's and the writes' pauses.
async fn failover_under_load(url: String, kill: impl FnOnce() -> Duration + Send + 'static) {
    let store = open(&url).await;
    store
        .add_client(client("steady"))
        .await
        .expect("add steady");
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let killed_at = Arc::new(Mutex::new(None::<Instant>));

    let writer = {
        let (store, stop, tally, killed_at) = (
            store.clone(),
            stop.clone(),
            tally.clone(),
            killed_at.clone(),
        );
        tokio::spawn(async move {
            let mut batch = 0u64;
            while !stop.load(Ordering::SeqCst) {
                batch += 1;
                let delta = Usage {
                    bytes_up: batch,
                    bytes_down: 1,
                    connections: 1,
                };
                loop {
                    match store.add_usage("steady", delta, batch).await {
                        Ok(()) => break,
                        Err(StoreError::NotFound(name)) => panic!("{name} vanished"),
                        Err(_) => {
                            tally.lock().expect("tally").failures += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                {
                    let killed = *killed_at.lock().expect("killed_at");
                    let mut tally = tally.lock().expect("tally");
                    tally.usage.bytes_up += delta.bytes_up;
                    tally.usage.bytes_down += 1;
                    tally.usage.connections += 1;
                    if let (Some(at), None) = (killed, tally.resumed_after) {
                        if tally.failures > 0 {
                            tally.resumed_after = Some(at.elapsed());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let adder = {
        let (store, stop, tally) = (store.clone(), stop.clone(), tally.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("new{n}");
                n += 1;
                // The same record each time: a repeat finishes an earlier attempt.
                loop {
                    match store.add_client(client(&name)).await {
                        Ok(()) | Err(StoreError::Unconfirmed(_)) => break,
                        Err(
                            error @ (StoreError::AlreadyExists(_) | StoreError::AddressTaken(_)),
                        ) => {
                            panic!("{name}: {error}")
                        }
                        Err(_) => {
                            tally.lock().expect("tally").failures += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                tally.lock().expect("tally").added.push(name);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    *killed_at.lock().expect("killed_at") = Some(Instant::now());
    let failover = tokio::task::spawn_blocking(kill).await.expect("kill");
    // Long enough after the new master for every pending call to land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    writer.await.expect("usage writer");
    adder.await.expect("client adder");

    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    assert!(
        tally.failures > 0,
        "the kill interrupted no write: nothing was tested"
    );
    // A fresh handle: nothing cached from before the failover.
    // The handle that lived through the failover writes the rest of the state too:
    // activity and egress identities (on the keys' own slots).
    let node = crate::NodeId {
        host: "h1".into(),
        block: "b0".into(),
    };
    let now = crate::unix_now();
    store
        .touch_activity(&node, &[("steady".into(), now)])
        .await
        .expect("activity written after the failover");
    let identity = crate::EgressIdentity {
        window: vec!["direct".into()],
        ..crate::EgressIdentity::default()
    };
    store
        .put_identity(&node, "steady", &identity, Duration::from_secs(600))
        .await
        .expect("identity written after the failover");

    let after = open(&url).await;
    assert_eq!(
        after
            .active_clients(&node, now - 1)
            .await
            .expect("activity"),
        ["steady"]
    );
    assert_eq!(
        after
            .take_identity(&node, "steady")
            .await
            .expect("identity"),
        Some(identity)
    );
    assert_eq!(
        after.usage("steady").await.expect("usage"),
        tally.usage,
        "usage lost or counted twice across the failover"
    );
    let feed = after.changes_since(0, usize::MAX).await.expect("feed");
    let seqs: Vec<u64> = feed.iter().map(|change| change.seq).collect();
    let whole: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, whole, "the feed has gaps");
    for name in &tally.added {
        assert!(
            after.get_client(name).await.expect("get").is_some(),
            "{name} was added but is gone"
        );
        assert!(
            feed.iter().any(|change| &change.name == name),
            "{name} was added but is not in the feed"
        );
    }
    eprintln!(
        "failover: new master after {} ms; writes resumed {} ms after the kill; \
         {} calls repeated; {} clients added, {} usage adds",
        failover.as_millis(),
        tally.resumed_after.unwrap_or_default().as_millis(),
        tally.failures,
        tally.added.len(),
        tally.usage.connections,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_loses_and_doubles_nothing() {
    let sentinel = Arc::new(Mutex::new(RedisSentinel::start()));
    let url = sentinel.lock().expect("sentinel").url();
    let killer = sentinel.clone();
    failover_under_load(url, move || {
        let mut sentinel = killer.lock().expect("sentinel");
        let old = sentinel.kill_master();
        sentinel.wait_for_new_master(old)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_loses_and_doubles_nothing() {
    let cluster = Arc::new(Mutex::new(RedisCluster::start()));
    let url = cluster.lock().expect("cluster").url();
    let killer = cluster.clone();
    failover_under_load(url, move || {
        let mut cluster = killer.lock().expect("cluster");
        // The master of the usage counters the writer adds to.
        let port = cluster.master_of_slot_for_key("{pc_steady}:usage");
        cluster.kill(port);
        cluster.wait_for_failover(port)
    })
    .await;
}
