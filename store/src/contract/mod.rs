//! The contract every [`Store`] backend must meet, as a test suite shared by all of them.
//!
//! Each check is a generic async fn over `Arc<dyn Store>` (two handles on the same
//! backend for the multi-process checks): [`clients`] for clients and the change feed,
//! [`wg_addresses`] for the uniqueness of WireGuard addresses,
//! [`usage`] for counters, [`presence`] for activity sets and egress identities,
//! [`endpoints`] for WireGuard endpoint snapshots,
//! [`limits`] for client limits and quota counts,
//! [`handles`] for several processes on one backend.
//! `contract_tests!` turns a fixture (a store URL plus whatever keeps the backend alive)
//! into one `#[tokio::test]` per check; the embedded store runs it below on a temp
//! file, and the Redis store runs the very same suite, each test against its own
//! `redis-server` ([`redis_server`]), on a Redis Cluster of three masters with a
//! replica each, and on a Sentinel-managed master with a replica and three
//! sentinels ([`crate::testing`]).

mod clients;
mod endpoints;
mod handles;
mod limits;
mod presence;
pub(crate) mod redis_server;
mod usage;
mod wg_addresses;

use std::sync::Arc;

pub(crate) use self::clients::*;
pub(crate) use self::endpoints::*;
pub(crate) use self::handles::*;
pub(crate) use self::limits::*;
pub(crate) use self::presence::*;
pub(crate) use self::usage::*;
pub(crate) use self::wg_addresses::*;
use super::{ChangeKind, ClientRecord, Store};

/// A backend to test: its URL, and a guard that keeps it alive (a temp dir, a child
/// server) until the test ends.
pub(crate) struct Fixture {
    url: String,
    _guard: Box<dyn std::any::Any + Send + Sync>,
    /// Empties the backend, for a fixture that serves the checks in turn.
    reset: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Fixture {
    pub(crate) fn new(url: String, guard: impl std::any::Any + Send + Sync) -> Self {
        Self {
            url,
            _guard: Box::new(guard),
            reset: None,
        }
    }

    /// A fixture on a shared backend that `reset` empties before each check.
    pub(crate) fn shared<G: Send + Sync + 'static>(url: String, guard: G, reset: fn(&G)) -> Self {
        let guard = std::sync::Arc::new(guard);
        let kept = guard.clone();
        Self {
            url,
            _guard: Box::new(guard),
            reset: Some(Box::new(move || reset(&kept))),
        }
    }

    /// Empties the backend (a fixture made by [`Fixture::shared`]).
    pub(crate) fn reset(&self) {
        if let Some(reset) = &self.reset {
            reset();
        }
    }

    /// A new handle on the backend, as a separate process would open it.
    pub(crate) async fn handle(&self) -> Arc<dyn Store> {
        match super::open(&self.url).await {
            Ok(store) => store,
            Err(err) => panic!("opening {}: {err}", self.url),
        }
    }
}

/// Instantiates the whole suite for a fixture expression: one test per check, each
/// on a fixture of its own (evaluated once per test), or with `in_turn`, one test
/// that runs every check on one shared fixture, reset before each (for backends that
/// take seconds to start, like a Redis Cluster).
macro_rules! contract_tests {
    ($fixture:expr) => {
        contract_tests!(@checks [each] $fixture);
    };
    (in_turn $fixture:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_check_in_turn() {
            let fixture = $fixture;
            contract_tests!(@checks [in_turn fixture] ());
        }
    };
    (@checks [$($how:tt)*] $fixture:expr) => {
        contract_tests!(@one [$($how)*] $fixture; round_trip, duplicate_add_fails, invalid_names,
            remove_unknown, change_feed, usage_lifecycle, usage_saturates, concurrent_usage,
            activity_order_and_since, activity_trims_after_an_hour, activity_per_node,
            identity_taken_once, identity_expires, identity_per_node, wg_address_unique, endpoints_round_trip,
            endpoints_replaced, endpoints_per_node, limits_round_trip_and_reach_the_feed,
            quota_counts_add_roll_over_and_reset, live_tunnels_are_summed_per_node_and_expire);
        contract_tests!(@two [$($how)*] $fixture; handles_see_each_other, concurrent_handles,
            identity_race, wg_address_race, feed_wait_wakes_on_a_write,
            quota_counts_are_shared_by_handles, limit_changes_from_two_handles_both_stand);
    };
    (@one [each] $fixture:expr; $($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let fixture = $fixture;
            $crate::contract::$check(fixture.handle().await).await;
        }
    )*};
    (@two [each] $fixture:expr; $($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let fixture = $fixture;
            $crate::contract::$check(fixture.handle().await, fixture.handle().await)
                .await;
        }
    )*};
    (@one [in_turn $fixture:ident] $unused:expr; $($check:ident),* $(,)?) => {$(
        eprintln!("contract check {}", stringify!($check));
        $fixture.reset();
        $crate::contract::$check($fixture.handle().await).await;
    )*};
    (@two [in_turn $fixture:ident] $unused:expr; $($check:ident),* $(,)?) => {$(
        eprintln!("contract check {}", stringify!($check));
        $fixture.reset();
        $crate::contract::$check($fixture.handle().await, $fixture.handle().await).await;
    )*};
}

/// A client record for tests, with every field set. Its WireGuard address is derived
/// from the name (in `fd00:64::/64`), as addresses are unique: clients of different
/// names do not collide, the same name always gets the same one.
pub(crate) fn client(name: &str) -> ClientRecord {
    ClientRecord {
        name: name.to_owned(),
        secret_hash: crate::credentials::hash_secret(name),
        created_at: 1_700_000_000,
        wg_public_key: Some(format!("{name}-wg-key=")),
        wg_address: Some(address_of(name)),
        egress: crate::EgressPolicy::Tags(vec!["eu".into(), "residential".into()]),
        limits: blipless_config::client_limits::ClientLimits::default(),
    }
}

/// Another record under `name` (its own secret, `n` telling rivals apart): adding it
/// where `client(name)` is stored is a conflict, not a repeat.
pub(crate) fn rival(name: &str, n: usize) -> ClientRecord {
    ClientRecord {
        secret_hash: crate::credentials::hash_secret(&format!("rival {n}")),
        ..client(name)
    }
}

/// A WireGuard address for tests, unique per name: `fd00:64::` and 64 bits of the
/// name's SHA-256.
pub(crate) fn address_of(name: &str) -> std::net::IpAddr {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let mut octets = [0u8; 16];
    octets[..4].copy_from_slice(&[0xfd, 0x00, 0x00, 0x64]);
    octets[8..].copy_from_slice(&digest[..8]);
    std::net::IpAddr::from(octets)
}

/// A fresh usage batch number (each add in the suite is a new delta).
pub(crate) fn batch() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The whole change feed, as (name, kind) pairs.
pub(crate) async fn feed(store: &Arc<dyn Store>) -> Vec<(String, ChangeKind)> {
    let changes = store
        .changes_since(0, usize::MAX)
        .await
        .expect("changes_since");
    changes.into_iter().map(|c| (c.name, c.kind)).collect()
}

/// The embedded store, each test on a fresh file in its own temp dir.
fn sqlite_fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    Fixture::new(url, dir)
}

/// The Redis store, each test on its own fresh `redis-server`.
fn redis_fixture() -> Fixture {
    let server = redis_server::RedisServer::start();
    Fixture::new(server.url(), server)
}

/// A Redis Cluster of three masters, each with a replica, emptied before each check.
fn cluster_fixture() -> Fixture {
    let cluster = crate::testing::RedisCluster::start();
    Fixture::shared(
        cluster.url(),
        cluster,
        crate::testing::RedisCluster::flush_all,
    )
}

/// A master, a replica and three sentinels, emptied before each check.
fn sentinel_fixture() -> Fixture {
    let sentinel = crate::testing::RedisSentinel::start();
    Fixture::shared(
        sentinel.url(),
        sentinel,
        crate::testing::RedisSentinel::flush_all,
    )
}

mod sqlite {
    contract_tests!(super::sqlite_fixture());
}

mod redis {
    contract_tests!(super::redis_fixture());
}

mod redis_cluster {
    contract_tests!(in_turn super::cluster_fixture());
}

mod redis_sentinel {
    contract_tests!(in_turn super::sentinel_fixture());
}
