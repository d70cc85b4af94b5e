//! An upstream's own addresses: its `host:port` from the configuration,
//! resolved and kept (docs/EGRESS.md, "Streams through an upstream").
//!
//! Providers rotate their gateways' addresses, so a name is looked up again
//! once what it gave is [`FRESH`] seconds old; but not by every connect: one
//! connect (or probe) at a time refreshes it, and the others meanwhile take
//! the addresses already known. A lookup that fails or does not finish in
//! time falls back to them too while they are less than [`STALE`] old, so
//! a slow resolver does not mark a working upstream down. Lookups run in
//! their own bounded pool ([`UPSTREAM_AT_ONCE`] at once, [`PER_UPSTREAM`]
//! of one upstream's), apart from customers' names, which cannot hold them
//! up. An address written as such is never looked up.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::lookups::{LookupError, Lookups};

/// How long a lookup's answer is used before the name is looked up again.
pub const FRESH: Duration = Duration::from_secs(10);
/// How long a lookup's answer is still used when a new lookup fails.
pub const STALE: Duration = Duration::from_secs(600);
/// Lookups of upstreams' names running at once per plane.
pub const UPSTREAM_AT_ONCE: usize = 16;
/// Lookups of one upstream's name running at once.
pub const PER_UPSTREAM: usize = 2;

/// The plane's pool for upstreams' own lookups.
pub fn lookups() -> Lookups {
    Lookups::new(UPSTREAM_AT_ONCE, PER_UPSTREAM)
}

/// One upstream's resolved addresses.
#[derive(Debug, Default)]
pub struct UpstreamAddresses {
    /// The last answer, and when it came.
    last: Mutex<Option<(Instant, Arc<[SocketAddr]>)>>,
    /// Whether a connect is looking the name up again now.
    refreshing: AtomicBool,
}

/// Why an upstream's address is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// The configured address is not `host:port`.
    #[error("the upstream's address is not host:port")]
    NotHostPort,
    /// The name does not resolve (and no earlier answer is recent enough).
    #[error("the upstream's host name does not resolve")]
    Unresolvable,
    /// The lookup did not finish by the deadline (and no earlier answer is
    /// recent enough).
    #[error("the upstream's host name did not resolve in time")]
    TimedOut,
}

impl UpstreamAddresses {
    /// The addresses of `address` (`host:port`, `[v6]:port`), the
    /// upstream `upstream`'s, by `deadline`.
    pub async fn resolve(
        &self,
        lookups: &Lookups,
        upstream: &str,
        address: &str,
        deadline: Instant,
    ) -> Result<Arc<[SocketAddr]>, AddressError> {
        let (host, port) = split_host_port(address).ok_or(AddressError::NotHostPort)?;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Arc::from([SocketAddr::new(ip, port)]));
        }
        let known = self.known();
        if let Some((at, addresses)) = &known {
            // Fresh, or another connect is refreshing them: as they are.
            if at.elapsed() < FRESH || self.refreshing.swap(true, Ordering::AcqRel) {
                return Ok(addresses.clone());
            }
        }
        // This connect refreshes them (holding `refreshing` until it is done
        // or dropped), or finds them first. A client name has no space:
        // this key is no client's.
        let _refreshing = known.is_some().then_some(Refreshing(&self.refreshing));
        let looked_up = lookups
            .resolve(&format!("upstream {upstream}"), host, port, deadline)
            .await;
        match looked_up {
            Ok(found) if !found.is_empty() => {
                let found: Arc<[SocketAddr]> = Arc::from(found);
                *lock(&self.last) = Some((Instant::now(), found.clone()));
                Ok(found)
            }
            failed => match known {
                Some((at, addresses)) if at.elapsed() < STALE => {
                    tracing::debug!(
                        upstream,
                        "an upstream's name did not resolve; using its last addresses"
                    );
                    Ok(addresses)
                }
                _ => Err(match failed {
                    Err(LookupError::TimedOut) => AddressError::TimedOut,
                    _ => AddressError::Unresolvable,
                }),
            },
        }
    }

    fn known(&self) -> Option<(Instant, Arc<[SocketAddr]>)> {
        lock(&self.last).clone()
    }
}

/// Clears the refreshing flag when the refresh ends, however it ends (a
/// connect given up mid-lookup included).
struct Refreshing<'a>(&'a AtomicBool);

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `host` and `port` of a configured upstream address (`host:port` or
/// `[v6]:port`, checked when the configuration was loaded).
fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn configured_addresses_split_into_host_and_port() {
        assert_eq!(
            split_host_port("proxy.example.net:1080"),
            Some(("proxy.example.net", 1080))
        );
        assert_eq!(split_host_port("192.0.2.7:1"), Some(("192.0.2.7", 1)));
        assert_eq!(
            split_host_port("[2001:db8::1]:443"),
            Some(("2001:db8::1", 443))
        );
        assert_eq!(split_host_port("no-port"), None);
        assert_eq!(split_host_port("host:http"), None);
    }

    #[tokio::test]
    async fn an_address_needs_no_lookup_and_a_name_is_kept() {
        let cache = UpstreamAddresses::default();
        // No places at all: only an address, or what is known, can answer.
        let no_places = Lookups::new(0, 1);
        let literal = cache
            .resolve(&no_places, "up", "127.0.0.1:1080", soon())
            .await
            .expect("an address");
        assert_eq!(&*literal, [SocketAddr::from(([127, 0, 0, 1], 1080))]);
        let short = Instant::now() + Duration::from_millis(200);
        assert_eq!(
            cache
                .resolve(&no_places, "up", "localhost:1080", short)
                .await
                .err(),
            Some(AddressError::TimedOut)
        );
        let found = cache
            .resolve(&Lookups::default(), "up", "localhost:1080", soon())
            .await
            .expect("localhost resolves");
        assert!(found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 1080));
        // Kept: answered without a place.
        let again = cache
            .resolve(&no_places, "up", "localhost:1080", soon())
            .await
            .expect("kept");
        assert_eq!(again, found);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_answer_is_refreshed_and_used_when_the_refresh_fails() {
        let cache = UpstreamAddresses::default();
        let found = cache
            .resolve(&Lookups::default(), "up", "localhost:1080", soon())
            .await
            .expect("localhost resolves");
        tokio::time::advance(FRESH + Duration::from_secs(1)).await;
        // The refresh cannot run (no places) and times out: the last
        // answer serves.
        let no_places = Lookups::new(0, 1);
        let deadline = Instant::now() + Duration::from_millis(200);
        let stale = cache
            .resolve(&no_places, "up", "localhost:1080", deadline)
            .await
            .expect("the last answer");
        assert_eq!(stale, found);
        tokio::time::advance(STALE).await;
        let deadline = Instant::now() + Duration::from_millis(200);
        assert_eq!(
            cache
                .resolve(&no_places, "up", "localhost:1080", deadline)
                .await
                .err(),
            Some(AddressError::TimedOut),
            "too old to stand in"
        );
    }
}
