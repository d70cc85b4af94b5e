//! One client's limits as this device plane enforces them (docs/LIMITS.md):
//! a token bucket each way, shared by all the client's tunnels on the
//! plane; its connection cap; and whether it is over its quota.
//!
//! A bucket holds up to [`BURST`] of its rate and starts empty: on a new
//! plane after a deploy as on the first, so a deploy is never a free burst.
//! A relay asks the bucket how much it may read ([`Bucket::allowance`]),
//! waiting while the bucket is in debt, and charges what it moved
//! ([`Bucket::charge`]), which may take the bucket into debt by at most one
//! read. Over time the bytes moved are the rate; in any one second, at most
//! the rate plus the burst.
//!
//! An unlimited direction costs one atomic load per read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use blipless_config::client_limits::{ClientLimits, Quota};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How much of its rate a bucket may save up: what may pass in a burst
/// above the rate.
pub const BURST: Duration = Duration::from_millis(250);

/// Smallest read a limited relay makes (one full-size packet's worth).
pub const MIN_CHUNK: usize = 1500;

/// How much a limited read takes at most: 50 ms of the rate, so shaping is
/// smooth at any rate.
const CHUNK_TIME_DIVISOR: u64 = 20;

/// A token bucket in bytes.
#[derive(Debug, Default)]
pub struct Bucket {
    /// Bytes per second; 0: unlimited.
    rate: AtomicU64,
    /// Tokens (may be negative: debt) and when they were last counted.
    state: Mutex<Option<(f64, Instant)>>,
}

impl Bucket {
    /// Whether it limits anything.
    pub fn is_limited(&self) -> bool {
        self.rate.load(Ordering::Relaxed) > 0
    }

    /// Bytes per second, 0 when unlimited.
    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Sets the rate (bytes per second; 0: unlimited). What was saved up is
    /// kept, within the new burst.
    pub fn set_rate(&self, bytes_per_second: u64) {
        self.rate.store(bytes_per_second, Ordering::Relaxed);
    }

    fn capacity(rate: u64) -> f64 {
        (rate as f64 * BURST.as_secs_f64()).max(MIN_CHUNK as f64)
    }

    /// The tokens now, refilled for the time since last counted.
    fn refill(state: &mut Option<(f64, Instant)>, rate: u64, now: Instant) -> f64 {
        let (tokens, last) = state.get_or_insert((0.0, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * rate as f64).min(Self::capacity(rate));
        *last = now;
        *tokens
    }

    /// How many bytes the next read may take: waits while the bucket is in
    /// debt (cancel-safe: waiting takes nothing). `None`: unlimited.
    pub async fn allowance(&self) -> Option<usize> {
        loop {
            let rate = self.rate();
            if rate == 0 {
                return None;
            }
            let wait = {
                let mut state = self.lock();
                let tokens = Self::refill(&mut state, rate, Instant::now());
                if tokens >= 0.0 {
                    let chunk = (rate / CHUNK_TIME_DIVISOR).max(MIN_CHUNK as u64);
                    let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
                    return Some(chunk);
                }
                Duration::from_secs_f64(-tokens / rate as f64)
            };
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

    /// Takes `bytes` moved (a read the allowance permitted).
    pub fn charge(&self, bytes: usize) {
        let rate = self.rate();
        if rate == 0 || bytes == 0 {
            return;
        }
        let mut state = self.lock();
        Self::refill(&mut state, rate, Instant::now());
        if let Some((tokens, _)) = state.as_mut() {
            *tokens -= bytes as f64;
        }
    }

    /// Polices a packet of `bytes`: true (and charged) if the bucket has
    /// the tokens, false (nothing charged) if it must be dropped.
    pub fn admit_packet(&self, bytes: usize) -> bool {
        let rate = self.rate();
        if rate == 0 {
            return true;
        }
        let mut state = self.lock();
        let tokens = Self::refill(&mut state, rate, Instant::now());
        if tokens < bytes as f64 {
            return false;
        }
        if let Some((tokens, _)) = state.as_mut() {
            *tokens -= bytes as f64;
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(f64, Instant)>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The limits one client has on this plane, changed in place when its
/// record or the node's defaults change.
#[derive(Debug, Default)]
pub struct Limiter {
    /// Customer → destination.
    pub up: Bucket,
    /// Destination → customer.
    pub down: Bucket,
    /// Tunnels open at once on this plane; 0: the node's cap.
    max_connections: AtomicU64,
    /// Whether `quota` is set: read on every limited read, without the lock.
    has_quota: AtomicBool,
    quota: Mutex<Option<Quota>>,
    /// Quota bytes the store had counted at the last look, plus what this
    /// plane moved since.
    quota_used: AtomicU64,
    /// Whether the store's count has been read once.
    quota_known: AtomicBool,
    over_quota: AtomicBool,
    /// Cancelled when the client goes over its quota; replaced when it is
    /// under again.
    over_token: Mutex<CancellationToken>,
}

impl Limiter {
    /// A limiter enforcing `limits` (effective: with the node's defaults).
    pub fn new(limits: &ClientLimits) -> Self {
        let limiter = Self::default();
        limiter.set(limits);
        limiter
    }

    /// Applies new limits.
    pub fn set(&self, limits: &ClientLimits) {
        self.up
            .set_rate(limits.rate_up.map_or(0, |r| r.bytes_per_second()));
        self.down
            .set_rate(limits.rate_down.map_or(0, |r| r.bytes_per_second()));
        self.max_connections.store(
            limits.max_connections.map_or(0, u64::from),
            Ordering::Relaxed,
        );
        let mut quota = self
            .quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *quota != limits.quota {
            *quota = limits.quota;
            self.has_quota
                .store(limits.quota.is_some(), Ordering::Relaxed);
            // A new quota is judged afresh at the next look at the store.
            self.quota_known.store(false, Ordering::Relaxed);
            if limits.quota.is_none() {
                self.under_quota();
            }
        }
    }

    /// The client's own connection cap, if it has one.
    pub fn max_connections(&self) -> Option<u64> {
        Some(self.max_connections.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Its quota, if any.
    pub fn quota(&self) -> Option<Quota> {
        *self
            .quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the quota's count must be read from the store at the next
    /// flush even with no new usage here: never read yet; over (a new
    /// period or a reset may have freed it); or at 80% or more, where
    /// another node's traffic may take it over.
    pub fn quota_needs_look(&self) -> bool {
        let Some(quota) = self.quota() else {
            return false;
        };
        let used = self.quota_used.load(Ordering::Relaxed);
        !self.quota_known.load(Ordering::Relaxed)
            || self.is_over_quota()
            || used.saturating_mul(5) >= quota.bytes.saturating_mul(4)
    }

    /// Whether the client is over its quota now.
    pub fn is_over_quota(&self) -> bool {
        self.over_quota.load(Ordering::Relaxed)
    }

    /// Completes when the client goes over its quota.
    pub fn over_quota_token(&self) -> CancellationToken {
        self.over_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Counts `bytes` this plane moved against the quota, between looks at
    /// the store: the client goes over as soon as this plane sees it, not
    /// at the next flush.
    pub fn charge_quota(&self, bytes: usize) {
        if !self.has_quota.load(Ordering::Relaxed) {
            return;
        }
        let Some(quota) = self.quota() else {
            return;
        };
        let used = self
            .quota_used
            .fetch_add(bytes as u64, Ordering::Relaxed)
            .saturating_add(bytes as u64);
        // Before the store's count is known, what this plane moved alone is
        // a lower bound of it: enough to say "over".
        if used >= quota.bytes {
            self.over_quota();
        }
    }

    /// The store's count after this plane's flush: the truth, fleet-wide.
    pub fn quota_counted(&self, used: u64) {
        let Some(quota) = self.quota() else {
            return;
        };
        self.quota_used.store(used, Ordering::Relaxed);
        self.quota_known.store(true, Ordering::Relaxed);
        if used >= quota.bytes {
            self.over_quota();
        } else {
            self.under_quota();
        }
    }

    fn over_quota(&self) {
        if !self.over_quota.swap(true, Ordering::Relaxed) {
            self.over_token
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .cancel();
        }
    }

    fn under_quota(&self) {
        if self.over_quota.swap(false, Ordering::Relaxed) {
            *self
                .over_token
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = CancellationToken::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_passes_its_rate_and_starts_empty() {
        let bucket = Bucket::default();
        assert_eq!(bucket.allowance().await, None, "unlimited");
        bucket.set_rate(1_000_000);
        let started = Instant::now();
        let mut moved = 0usize;
        while started.elapsed() < Duration::from_secs(10) {
            let chunk = bucket.allowance().await.expect("limited");
            assert!(chunk <= 50_000);
            bucket.charge(chunk);
            moved += chunk;
        }
        // 10 s at 1 MB/s, give or take one chunk, and no burst at the start.
        let expected = 10_000_000f64;
        assert!(
            (moved as f64 - expected).abs() <= 100_000.0,
            "moved {moved} in 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_saves_up_one_burst_at_most() {
        let bucket = Bucket::default();
        bucket.set_rate(1_000_000);
        let _ = bucket.allowance().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let started = Instant::now();
        let mut moved = 0usize;
        while started.elapsed() < Duration::from_secs(1) {
            let chunk = bucket.allowance().await.expect("limited");
            bucket.charge(chunk);
            moved += chunk;
        }
        // One second's rate plus the burst (250 ms), plus one chunk.
        assert!(
            moved <= 1_250_000 + 50_000,
            "moved {moved} in the first second"
        );
        assert!(
            moved >= 1_200_000,
            "moved {moved}: the saved burst was not used"
        );
    }

    #[test]
    fn packets_are_policed() {
        let bucket = Bucket::default();
        assert!(bucket.admit_packet(1500), "unlimited");
        bucket.set_rate(8_000);
        // It starts empty: the first packet waits for tokens.
        assert!(!bucket.admit_packet(1500));
    }

    #[test]
    fn the_quota_is_over_when_the_store_or_this_plane_says_so() {
        let limits = ClientLimits {
            quota: Some("10MB/day".parse().expect("quota")),
            ..ClientLimits::default()
        };
        let limiter = Limiter::new(&limits);
        assert!(limiter.quota_needs_look());
        let token = limiter.over_quota_token();
        // Before the store's count is known, what this plane moved counts.
        limiter.charge_quota(5_000_000);
        assert!(!limiter.is_over_quota());
        limiter.charge_quota(5_000_000);
        assert!(limiter.is_over_quota() && token.is_cancelled());
        limiter.quota_counted(7_000_000);
        let token = limiter.over_quota_token();
        assert!(!limiter.is_over_quota() && !limiter.quota_needs_look());
        limiter.quota_counted(9_000_000);
        assert!(
            !limiter.is_over_quota() && limiter.quota_needs_look(),
            "near it"
        );
        assert!(!token.is_cancelled());
        limiter.charge_quota(999_999);
        assert!(!limiter.is_over_quota());
        limiter.charge_quota(1);
        assert!(limiter.is_over_quota() && token.is_cancelled());
        assert!(limiter.quota_needs_look());
        // A reset (or a new period) frees it.
        limiter.quota_counted(0);
        assert!(!limiter.is_over_quota());
        assert!(!limiter.over_quota_token().is_cancelled());
        // Clearing the quota frees it too.
        limiter.quota_counted(10_000_000);
        assert!(limiter.is_over_quota());
        limiter.set(&ClientLimits::default());
        assert!(!limiter.is_over_quota() && limiter.quota().is_none());
    }
}
