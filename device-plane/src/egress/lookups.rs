//! Name lookups for customers' destinations (a SOCKS5 CONNECT or UDP
//! datagram to a name, an HTTP request's host), with the host's resolver
//! (`getaddrinfo`, which honours `/etc/hosts` and `nsswitch.conf`).
//!
//! `getaddrinfo` blocks, so each lookup runs on one of the runtime's
//! blocking threads, and a caller's deadline cannot stop it: glibc's own
//! retries can outlast any deadline by many seconds. Left unbounded, names
//! that resolve slowly (a customer can choose them) would fill the blocking
//! pool, which the store and file work share. So at most [`AT_ONCE`] lookups
//! run at once per plane: a permit is taken before one starts and given
//! back only when `getaddrinfo` returns, deadline or not. A lookup that
//! finds no permit before its deadline fails as timed out, and never starts.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Lookups run at once per device plane.
pub const AT_ONCE: usize = 128;

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
}

impl Default for Lookups {
    fn default() -> Self {
        Self::new(AT_ONCE)
    }
}

impl Lookups {
    /// At most `at_once` lookups in flight.
    pub fn new(at_once: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(at_once)),
        }
    }

    /// `host`'s addresses with `port`, by `deadline`.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>, LookupError> {
        let host = host.to_owned();
        self.resolve_with(deadline, move || {
            (host.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect)
                .map_err(|_| LookupError::Failed)
        })
        .await
    }

    /// Runs `lookup` on a blocking thread under a permit held until it
    /// returns; its answer if that is by `deadline`.
    async fn resolve_with(
        &self,
        deadline: Instant,
        lookup: impl FnOnce() -> Result<Vec<SocketAddr>, LookupError> + Send + 'static,
    ) -> Result<Vec<SocketAddr>, LookupError> {
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| LookupError::TimedOut)?
            .map_err(|_| LookupError::Failed)?;
        let running = tokio::task::spawn_blocking(move || {
            let answer = lookup();
            drop(permit);
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

    #[tokio::test]
    async fn a_lookup_past_its_deadline_keeps_its_permit_until_it_returns() {
        let lookups = Lookups::new(1);
        let started = Arc::new(AtomicUsize::new(0));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let slow = {
            let started = started.clone();
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                // A resolver that answers only when told to.
                let _ = released.recv();
                Ok(vec![SocketAddr::from(([192, 0, 2, 1], 80))])
            }
        };
        let soon = || Instant::now() + Duration::from_millis(100);
        assert_eq!(
            lookups.resolve_with(soon(), slow).await,
            Err(LookupError::TimedOut)
        );
        // Its getaddrinfo still runs: the next lookup gets no permit, times
        // out, and never starts.
        let counted = {
            let started = started.clone();
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                Ok(Vec::new())
            }
        };
        assert_eq!(
            lookups.resolve_with(soon(), counted).await,
            Err(LookupError::TimedOut)
        );
        assert_eq!(started.load(Ordering::SeqCst), 1);
        // Once it returns, lookups run again.
        release.send(()).expect("the slow lookup waits");
        let answer = lookups
            .resolve_with(Instant::now() + Duration::from_secs(10), || {
                Ok(vec![SocketAddr::from(([192, 0, 2, 2], 80))])
            })
            .await;
        assert_eq!(answer, Ok(vec![SocketAddr::from(([192, 0, 2, 2], 80))]));
    }

    #[tokio::test]
    async fn localhost_resolves_and_a_bad_name_fails() {
        let lookups = Lookups::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = lookups
            .resolve("localhost", 8080, deadline)
            .await
            .expect("localhost resolves");
        assert!(found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8080));
        assert_eq!(
            // Refused before any resolver is asked (a NUL in a name).
            lookups.resolve("bad\0name", 80, deadline).await,
            Err(LookupError::Failed)
        );
    }
}
