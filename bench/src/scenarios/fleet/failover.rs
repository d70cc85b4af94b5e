//! Failover on Sentinel and Cluster: a master SIGKILLed while one store handle
//! adds usage every 10 ms to a key it serves (the time from the kill until such
//! an add succeeds again: writes resumed), then the end-to-end run with curl load
//! and clients added (`blipless_tests::fleet::failover_under_load`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blipless_store::{ClientRecord, EgressPolicy, Store, Usage};
use blipless_tests::fleet::failover_under_load;

use super::topology::{Kind, Topology};
use super::Plan;

/// How often the probe adds usage.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);

/// One store-level failover.
#[derive(Debug, Clone, Copy)]
pub struct Resume {
    /// From the kill until the topology had a new master.
    pub failover: Duration,
    /// From the kill until a usage add on the killed master's slot succeeded.
    pub writes_resumed: Duration,
    /// Usage adds that failed meanwhile (each repeated).
    pub failed_adds: usize,
    /// Whether the stored usage equals the sum of the adds that succeeded.
    pub exact: bool,
}

/// The end-to-end run.
#[derive(Debug, Clone)]
pub struct EndToEnd {
    /// From the kill until the new master.
    pub failover: Duration,
    /// Requests through SOCKS5 and through HTTP CONNECT.
    pub requests: (usize, usize),
    /// Requests that failed.
    pub failed: usize,
    /// Clients added during the run, and how many needed more than one try.
    pub added: (usize, usize),
    /// Whether alice's stored usage equals what curl moved.
    pub exact: bool,
}

/// Everything measured on one topology.
#[derive(Debug)]
pub struct Failovers {
    /// The store-level runs.
    pub resumes: Vec<Resume>,
    /// The end-to-end run.
    pub end_to_end: EndToEnd,
}

/// Kills the master serving `key` (Sentinel: the master), waits for its
/// replacement; how long that took.
fn kill_master(topology: &mut Topology, key: &str) -> Duration {
    match topology {
        Topology::Sentinel(sentinel) => {
            let old = sentinel.kill_master();
            sentinel.wait_for_new_master(old)
        }
        Topology::Cluster(cluster) => {
            let port = cluster.master_of_slot_for_key(key);
            cluster.kill(port);
            cluster.wait_for_failover(port)
        }
        Topology::One(_) => panic!("one Redis has no failover"),
    }
}

async fn resume_once(kind: Kind) -> Resume {
    let topology = Arc::new(Mutex::new(Topology::start(kind)));
    let url = topology.lock().expect("topology").url();
    let store: Arc<dyn Store> = blipless_store::open(&url).await.expect("open");
    let record = ClientRecord {
        name: "probe".into(),
        secret_hash: blipless_store::credentials::hash_secret("probe"),
        created_at: 1_700_000_000,
        wg_public_key: None,
        wg_address: None,
        egress: EgressPolicy::Any,
        limits: blipless_store::ClientLimits::default(),
    };
    store
        .add_client(record)
        .await
        .expect("add the probe client");
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at = Arc::new(Mutex::new(None::<Instant>));
    let probe = {
        let (store, stop, killed_at) = (store.clone(), stop.clone(), killed_at.clone());
        tokio::spawn(async move {
            let delta = Usage {
                bytes_up: 1,
                bytes_down: 1,
                connections: 1,
            };
            let (mut batch, mut sum, mut failed) = (0u64, 0u64, 0usize);
            let mut resumed = None;
            while !stop.load(Ordering::SeqCst) {
                batch += 1;
                while store.add_usage("probe", delta, batch).await.is_err() {
                    failed += 1;
                    tokio::time::sleep(PROBE_EVERY).await;
                }
                sum += 1;
                let killed = *killed_at.lock().expect("killed_at");
                if let (Some(at), None, true) = (killed, resumed, failed > 0) {
                    resumed = Some(at.elapsed());
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
            (sum, failed, resumed)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killer = topology.clone();
    *killed_at.lock().expect("killed_at") = Some(Instant::now());
    let failover = tokio::task::spawn_blocking(move || {
        kill_master(&mut killer.lock().expect("topology"), "{pc_probe}:usage")
    })
    .await
    .expect("the kill");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (sum, failed_adds, resumed) = probe.await.expect("the probe");
    let stored = blipless_store::open(&url)
        .await
        .expect("open again")
        .usage("probe")
        .await
        .expect("usage");
    Resume {
        failover,
        writes_resumed: resumed.unwrap_or_default(),
        failed_adds,
        exact: stored.connections == sum && stored.bytes_up == sum,
    }
}

/// Measures one replicated topology: `plan.failovers` store-level runs, then one
/// end to end, each on a topology of its own.
pub fn measure(runtime: &tokio::runtime::Runtime, kind: Kind, plan: Plan) -> Failovers {
    let resumes = (0..plan.failovers)
        .map(|_| runtime.block_on(resume_once(kind)))
        .collect();
    let mut topology = Topology::start(kind);
    let url = topology.url();
    let report = failover_under_load(&url, || kill_master(&mut topology, "{pc_alice}:usage"));
    let retried = report.added.iter().filter(|(_, tries)| *tries > 1).count();
    Failovers {
        resumes,
        end_to_end: EndToEnd {
            failover: report.failover,
            requests: (report.socks.requests, report.http.requests),
            failed: report.socks.failures.len() + report.http.failures.len(),
            added: (report.added.len(), retried),
            exact: report.stored_usage == Some(report.expected_usage),
        },
    }
}
