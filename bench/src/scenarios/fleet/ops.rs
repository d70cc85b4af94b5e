//! Store operations from one node, on one topology: what `blipless-ctl client
//! add` costs, what a device plane's usage flush costs (one add per active
//! client, one after the other, each confirmed by a replica on Sentinel and
//! Cluster), usage adds and client reads 32 at once, and the memory per client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_store::{ClientRecord, Store, Usage};

use super::topology::{Kind, Topology};
use super::Plan;
use crate::stats::Percentiles;

/// How many requests run at once in the concurrent measurements.
pub const CONCURRENCY: usize = 32;

/// What one topology measured.
#[derive(Debug, Default)]
pub struct Ops {
    /// Clients added, one at a time.
    pub clients: usize,
    /// Latency of one client add.
    pub add: Percentiles,
    /// Latency of one usage add (one flush's step).
    pub usage: Percentiles,
    /// One flush of every client's usage, one add after the other: the median round.
    pub flush_round: Duration,
    /// Usage adds per second, [`CONCURRENCY`] at once.
    pub usage_per_second: f64,
    /// Client reads per second, [`CONCURRENCY`] at once.
    pub reads_per_second: f64,
    /// Bytes the masters hold per client (record, usage, index and feed entry,
    /// one usage batch key).
    pub bytes_per_client: f64,
}

fn record(name: &str) -> ClientRecord {
    blipless_store::testing::client_record(name)
}

/// Runs `total` calls of `call(i)`, [`CONCURRENCY`] at once; calls per second.
async fn concurrently<F, Fut>(total: usize, call: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (call, next) = (call.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                call(i).await;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.expect("a worker");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Measures one topology, started for it and stopped after.
pub async fn measure(kind: Kind, plan: Plan) -> Ops {
    let topology = Topology::start(kind);
    let url = topology.url();
    let store: Arc<dyn Store> = match blipless_store::open(&url).await {
        Ok(store) => store,
        Err(error) => panic!("opening {url}: {error}"),
    };
    let before = topology.data_bytes();
    let names: Vec<String> = (0..plan.clients).map(|n| format!("bench{n}")).collect();
    let mut adds = Vec::with_capacity(names.len());
    for name in &names {
        let started = Instant::now();
        store.add_client(record(name)).await.expect("add_client");
        adds.push(started.elapsed());
    }
    let delta = Usage {
        bytes_up: 1500,
        bytes_down: 64_000,
        connections: 3,
    };
    let mut usage = Vec::new();
    let mut rounds = Vec::new();
    let mut batch = 0;
    for _ in 0..5 {
        let round = Instant::now();
        for name in &names {
            batch += 1;
            let started = Instant::now();
            store
                .add_usage(name, delta, batch)
                .await
                .expect("add_usage");
            usage.push(started.elapsed());
        }
        rounds.push(round.elapsed());
    }
    rounds.sort_unstable();
    let after = topology.data_bytes();
    let bytes_per_client = after.saturating_sub(before) as f64 / names.len().max(1) as f64;

    let names = Arc::new(names);
    let usage_per_second = {
        let (store, names) = (store.clone(), names.clone());
        concurrently(plan.concurrent_ops, move |i| {
            let (store, names) = (store.clone(), names.clone());
            async move {
                let name = &names[i % names.len()];
                let batch = 1_000_000 + i as u64;
                store
                    .add_usage(name, delta, batch)
                    .await
                    .expect("add_usage");
            }
        })
        .await
    };
    let reads_per_second = {
        let (store, names) = (store.clone(), names.clone());
        concurrently(plan.concurrent_ops, move |i| {
            let (store, names) = (store.clone(), names.clone());
            async move {
                let name = &names[i % names.len()];
                assert!(store.get_client(name).await.expect("get_client").is_some());
            }
        })
        .await
    };
    drop(topology);
    Ops {
        clients: plan.clients,
        add: Percentiles::of(adds),
        usage: Percentiles::of(usage),
        flush_round: rounds[rounds.len() / 2],
        usage_per_second,
        reads_per_second,
        bytes_per_client,
    }
}
