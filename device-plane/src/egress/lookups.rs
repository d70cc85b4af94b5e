//! Name lookups for customers' destinations (a SOCKS5 CONNECT or UDP
//! datagram to a name, an HTTP request's host), with the host's resolver
//! (`getaddrinfo`, which honours `/etc/hosts` and `nsswitch.conf`).
//!
//! `getaddrinfo` blocks, so each lookup runs on one of the runtime's
//! blocking threads, and a caller's deadline cannot stop it: glibc's own
//! retries can outlast any deadline by many seconds. Left unbounded, names
//! that resolve slowly (a customer can choose them) would fill the blocking
//! pool, which the store and file work share. So at most [`AT_ONCE`] lookups
//! run at once per plane, and at most [`PER_CLIENT`] of one client's, so
//! that one client choosing slow names cannot take every other client's
//! lookups with it: a place is taken before a lookup starts and given back
//! only when `getaddrinfo` returns, deadline or not. A lookup that finds no
//! place before its deadline fails as timed out, and never starts. An
//! address written as a name (`"192.0.2.7"`) needs no lookup and takes no
//! place.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::keyed_places::KeyedPlaces;

/// Lookups run at once per device plane.
pub const AT_ONCE: usize = 128;
/// Lookups of one client run at once.
pub const PER_CLIENT: usize = 16;
/// How often a lookup waiting for one of its client's places looks again.
const PLACE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a lookup gave no addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The deadline passed: waiting for a permit, or for the answer.
    #[error("the lookup did not finish in time")]
    TimedOut,
    /// The resolver answered with an error (no such name, no address).
    #[error("the name does not resolve")]
    Failed,
}

/// The plane's bound on lookups in flight; clones share it.
#[derive(Debug, Clone)]
pub struct Lookups {
    permits: Arc<Semaphore>,
    /// Each client's lookups in flight.
    by_client: KeyedPlaces<String>,
}

impl Default for Lookups {
    fn default() -> Self {
        Self::new(AT_ONCE, PER_CLIENT)
    }
}

impl Lookups {
    /// At most `at_once` lookups in flight, `per_client` of one client's.
    pub fn new(at_once: usize, per_client: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(at_once)),
            by_client: KeyedPlaces::new(per_client),
        }
    }

    /// `host`'s addresses with `port`, by `deadline`, as one of `client`'s
    /// lookups.
    pub async fn resolve(
        &self,
        client: &str,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>, LookupError> {
        if let Ok(address) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(address, port)]);
        }
        let host = host.to_owned();
        self.resolve_with(client, deadline, move || {
            (host.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect)
                .map_err(|_| LookupError::Failed)
        })
        .await
    }

    /// Runs `lookup` on a blocking thread under one of `client`'s places
    /// and a plane-wide permit, both held until it returns; its answer if
    /// that is by `deadline`.
    async fn resolve_with(
        &self,
        client: &str,
        deadline: Instant,
        lookup: impl FnOnce() -> Result<Vec<SocketAddr>, LookupError> + Send + 'static,
    ) -> Result<Vec<SocketAddr>, LookupError> {
        let place = loop {
            // The plane-wide bound is the permits' (below).
            if let Some(place) = self.by_client.take(&client.to_owned(), usize::MAX) {
                break place;
            }
            // The client's own lookups are all running: wait for one.
            if Instant::now() >= deadline {
                return Err(LookupError::TimedOut);
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + PLACE_POLL)).await;
        };
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| LookupError::TimedOut)?
            .map_err(|_| LookupError::Failed)?;
        let running = tokio::task::spawn_blocking(move || {
            let answer = lookup();
            drop((permit, place));
            answer
        });
        match tokio::time::timeout_at(deadline, running).await {
            Ok(Ok(answer)) => answer,
            // The blocking task panicked or the runtime is shutting down.
            Ok(Err(_)) => Err(LookupError::Failed),
            Err(_) => Err(LookupError::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A lookup that says when it has started, then answers only when told.
    fn held_open(
        started: &Arc<AtomicUsize>,
    ) -> (
        impl FnOnce() -> Result<Vec<SocketAddr>, LookupError> + Send + 'static,
        std::sync::mpsc::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (began, beginning) = tokio::sync::oneshot::channel();
        let started = started.clone();
        let lookup = move || {
            started.fetch_add(1, Ordering::SeqCst);
            let _ = began.send(());
            let _ = released.recv();
            Ok(vec![SocketAddr::from(([192, 0, 2, 1], 80))])
        };
        (lookup, release, beginning)
    }

    fn counted(
        started: &Arc<AtomicUsize>,
    ) -> impl FnOnce() -> Result<Vec<SocketAddr>, LookupError> + Send + 'static {
        let started = started.clone();
        move || {
            started.fetch_add(1, Ordering::SeqCst);
            Ok(vec![SocketAddr::from(([192, 0, 2, 2], 80))])
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(100)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    #[tokio::test]
    async fn a_lookup_past_its_deadline_keeps_its_permit_until_it_returns() {
        let lookups = Lookups::new(1, 1);
        let started = Arc::new(AtomicUsize::new(0));
        let (slow, release, beginning) = held_open(&started);
        let first = tokio::spawn({
            let lookups = lookups.clone();
            async move { lookups.resolve_with("alice", later(), slow).await }
        });
        beginning.await.expect("the slow lookup started");
        // Its getaddrinfo runs: the next lookup, of another client, gets no
        // permit, times out, and never starts.
        assert_eq!(
            lookups.resolve_with("bob", soon(), counted(&started)).await,
            Err(LookupError::TimedOut)
        );
        assert_eq!(started.load(Ordering::SeqCst), 1);
        // Once it returns, lookups run again.
        release.send(()).expect("the slow lookup waits");
        assert!(first.await.expect("joined").is_ok());
        assert_eq!(
            lookups
                .resolve_with("bob", later(), counted(&started))
                .await,
            Ok(vec![SocketAddr::from(([192, 0, 2, 2], 80))])
        );
    }

    #[tokio::test]
    async fn one_client_cannot_take_every_place() {
        let lookups = Lookups::new(4, 2);
        let started = Arc::new(AtomicUsize::new(0));
        let mut releases = Vec::new();
        let mut running = Vec::new();
        for _ in 0..2 {
            let (slow, release, beginning) = held_open(&started);
            let lookups = lookups.clone();
            running.push(tokio::spawn(async move {
                lookups.resolve_with("mallory", later(), slow).await
            }));
            beginning.await.expect("started");
            releases.push(release);
        }
        // A third of mallory's waits for one of its own, and times out.
        assert_eq!(
            lookups
                .resolve_with("mallory", soon(), counted(&started))
                .await,
            Err(LookupError::TimedOut)
        );
        assert_eq!(started.load(Ordering::SeqCst), 2);
        // Another client's runs at once.
        assert!(lookups
            .resolve_with("alice", later(), counted(&started))
            .await
            .is_ok());
        for release in releases {
            release.send(()).expect("waiting");
        }
        for lookup in running {
            assert!(lookup.await.expect("joined").is_ok());
        }
        assert!(lookups.by_client.is_empty());
    }

    #[tokio::test]
    async fn localhost_resolves_addresses_need_no_lookup_and_a_bad_name_fails() {
        let lookups = Lookups::new(1, 1);
        let found = lookups
            .resolve("alice", "localhost", 8080, later())
            .await
            .expect("localhost resolves");
        assert!(found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8080));
        // Refused before any resolver is asked (a NUL in a name).
        assert_eq!(
            lookups.resolve("alice", "bad\0name", 80, later()).await,
            Err(LookupError::Failed)
        );
        // With every place taken, an address still answers at once.
        let _permit = lookups
            .permits
            .clone()
            .try_acquire_owned()
            .expect("the one permit");
        assert_eq!(
            lookups.resolve("alice", "2001:db8::7", 443, soon()).await,
            Ok(vec!["[2001:db8::7]:443".parse().expect("address")])
        );
    }
}
