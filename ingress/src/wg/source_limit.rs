//! A per-source limit on handshake initiations while the node is under load,
//! as the Linux kernel's WireGuard does (`ratelimiter.c`): once initiations
//! arrive faster than `wireguard.handshake_limit` a second, each must carry a
//! valid cookie (mac2), which proves only that its sender can receive at its
//! address. A sender that can (any customer, any host on the internet) could
//! still ask for an X25519 operation per datagram at line rate; this token
//! bucket per source address (an IPv4 address, an IPv6 /64) lets each source
//! through at [`PER_SECOND`] with a burst of [`BURST`], and the rest are
//! dropped before any Diffie-Hellman work. Not under load, nothing is limited
//! here, so many peers behind one NAT handshake freely.
//!
//! Sans-IO: the caller passes the time. See docs/ARCHITECTURE.md, "WireGuard
//! in the ingress", and docs/DECISIONS.md, "Only initiations pass the
//! node-wide rate limiter".

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Initiations a second each source may send while the node is under load
/// (the kernel's `PACKETS_PER_SECOND`).
pub const PER_SECOND: u64 = 20;
/// How many it may send at once after being quiet (the kernel's
/// `PACKETS_BURST`).
pub const BURST: u64 = 5;
/// Sources tracked at once; a new source beyond this many is refused until
/// the next [`SourceLimiter::forget_idle`] (the kernel's largest table,
/// 8 × 8,192 entries). A full table takes about 5 MiB (a hash table's
/// slots, about 40 bytes each, at twice the entries), given back once its
/// sources go quiet ([`SourceLimiter::forget_idle`]).
pub const MAX_SOURCES: usize = 65_536;

/// What one initiation costs, in nanoseconds of tokens.
const COST_NS: u64 = 1_000_000_000 / PER_SECOND;
/// The most tokens a source holds.
const TOKENS_MAX_NS: u64 = COST_NS * BURST;
/// A source quiet this long holds a full bucket again and can be forgotten.
const IDLE: Duration = Duration::from_secs(1);

/// The key a source is counted under: an IPv4 address, or an IPv6 address's
/// first 64 bits (a single host usually holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SourceKey {
    V4(u32),
    V6(u64),
}

impl SourceKey {
    fn of(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(v4) => SourceKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(u32::from(v4)),
                None => SourceKey::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    last: Instant,
    tokens_ns: u64,
}

/// Token buckets of handshake initiations, one per source.
#[derive(Debug)]
pub struct SourceLimiter {
    buckets: HashMap<SourceKey, Bucket>,
    max_sources: usize,
}

impl Default for SourceLimiter {
    fn default() -> Self {
        Self::with_capacity(MAX_SOURCES)
    }
}

impl SourceLimiter {
    /// A limiter that tracks at most `max_sources` sources at once.
    pub fn with_capacity(max_sources: usize) -> Self {
        Self {
            buckets: HashMap::new(),
            max_sources,
        }
    }

    /// Whether an initiation from `source` at `now` may go on to the
    /// handshake; counts it if so.
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        let key = SourceKey::of(source);
        if let Some(bucket) = self.buckets.get_mut(&key) {
            let gained = now.saturating_duration_since(bucket.last).as_nanos();
            let gained = u64::try_from(gained).unwrap_or(u64::MAX);
            bucket.tokens_ns = bucket.tokens_ns.saturating_add(gained).min(TOKENS_MAX_NS);
            bucket.last = bucket.last.max(now);
            if bucket.tokens_ns < COST_NS {
                return false;
            }
            bucket.tokens_ns -= COST_NS;
            return true;
        }
        if self.buckets.len() >= self.max_sources {
            return false;
        }
        self.buckets.insert(
            key,
            Bucket {
                last: now,
                tokens_ns: TOKENS_MAX_NS - COST_NS,
            },
        );
        true
    }

    /// Forgets sources quiet for a second or more (their buckets are full
    /// again, so forgetting them changes no answer). Called once a second.
    pub fn forget_idle(&mut self, now: Instant) {
        self.buckets
            .retain(|_, bucket| now.saturating_duration_since(bucket.last) < IDLE);
        // After a flood from many sources, the memory goes back too.
        if self.buckets.capacity() > 1024 && self.buckets.capacity() > 4 * self.buckets.len() {
            self.buckets.shrink_to(2 * self.buckets.len());
        }
    }

    /// Sources tracked now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no source is tracked.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let mut limiter = SourceLimiter::default();
        let start = Instant::now();
        let source = ip("198.51.100.7");
        let admitted = (0..100).filter(|_| limiter.admit(source, start)).count();
        assert_eq!(admitted as u64, BURST);
        // A second later: one second's worth, capped at the burst.
        let later = start + Duration::from_secs(1);
        let admitted = (0..100).filter(|_| limiter.admit(source, later)).count();
        assert_eq!(admitted as u64, BURST);
        // Steady sending at twice the rate gets the rate.
        let mut now = later;
        let mut admitted = 0;
        for _ in 0..(PER_SECOND * 2 * 10) {
            now += Duration::from_nanos(COST_NS / 2);
            if limiter.admit(source, now) {
                admitted += 1;
            }
        }
        assert!(
            (PER_SECOND * 10 - 1..=PER_SECOND * 10 + 1).contains(&admitted),
            "{admitted} admitted in 10 s"
        );
    }

    #[test]
    fn one_source_exhausted_leaves_others_alone() {
        let mut limiter = SourceLimiter::default();
        let now = Instant::now();
        for _ in 0..100 {
            limiter.admit(ip("198.51.100.7"), now);
        }
        assert!(!limiter.admit(ip("198.51.100.7"), now));
        assert!(limiter.admit(ip("198.51.100.8"), now));
        assert!(limiter.admit(ip("2001:db8::1"), now));
    }

    #[test]
    fn an_ipv6_64_is_one_source_and_mapped_ipv4_is_its_ipv4() {
        let mut limiter = SourceLimiter::default();
        let now = Instant::now();
        let admitted = (0..100u16)
            .filter(|n| limiter.admit(ip(&format!("2001:db8:1:2::{n:x}")), now))
            .count();
        assert_eq!(admitted as u64, BURST, "one /64, one bucket");
        assert!(limiter.admit(ip("2001:db8:1:3::1"), now), "the next /64");
        for _ in 0..BURST {
            assert!(limiter.admit(ip("192.0.2.1"), now));
        }
        assert!(!limiter.admit(ip("::ffff:192.0.2.1"), now));
    }

    #[test]
    fn a_full_table_refuses_new_sources_until_idle_ones_are_forgotten() {
        let mut limiter = SourceLimiter::with_capacity(2);
        let now = Instant::now();
        assert!(limiter.admit(ip("192.0.2.1"), now));
        assert!(limiter.admit(ip("192.0.2.2"), now));
        assert!(!limiter.admit(ip("192.0.2.3"), now), "table full");
        assert!(limiter.admit(ip("192.0.2.1"), now), "known sources go on");
        limiter.forget_idle(now + Duration::from_millis(500));
        assert_eq!(limiter.len(), 2, "not idle yet");
        limiter.forget_idle(now + IDLE);
        assert!(limiter.is_empty());
        assert!(limiter.admit(ip("192.0.2.3"), now + IDLE));
    }

    #[test]
    fn a_table_emptied_after_a_flood_gives_its_memory_back() {
        let mut limiter = SourceLimiter::default();
        let now = Instant::now();
        for n in 0..20_000u32 {
            limiter.admit(IpAddr::from(std::net::Ipv4Addr::from(n)), now);
        }
        assert!(limiter.buckets.capacity() >= 20_000);
        limiter.forget_idle(now + IDLE);
        assert!(limiter.is_empty());
        assert!(
            limiter.buckets.capacity() < 1024,
            "{}",
            limiter.buckets.capacity()
        );
    }

    #[test]
    fn time_going_backwards_gains_nothing() {
        let mut limiter = SourceLimiter::default();
        let now = Instant::now() + Duration::from_secs(10);
        for _ in 0..BURST {
            assert!(limiter.admit(ip("192.0.2.1"), now));
        }
        assert!(!limiter.admit(ip("192.0.2.1"), now - Duration::from_secs(5)));
    }
}
