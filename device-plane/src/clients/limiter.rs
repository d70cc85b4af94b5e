//! One client's limits as this device plane enforces them (docs/LIMITS.md):
//! a token bucket each way, shared by all the client's tunnels on the
//! plane; its connection cap; and whether it is over its quota.
//!
//! A bucket holds up to [`BURST`] of its rate and starts with one read's
//! worth (50 ms of the rate): on a new plane after a deploy as on the
//! first, so that a client's first packet is not dropped on an unused
//! bucket, and what queued during a handover's pause (a UDP association's
//! datagrams above all, which are policed, not delayed) mostly passes. A
//! deploy thus gives a client at most about four reads and a packet more
//! than its rate (this one, and the old plane's debt it forgives), about
//! what the handover's pause held back.
//!
//! The bucket may go into debt: a relay whose socket is readable takes one
//! read's worth of tokens ([`Bucket::take`]: 50 ms of the rate) as soon as
//! the bucket is not in debt, reads at most that, and gives back what the
//! read did not use ([`Bucket::refund`]). A packet
//! ([`Bucket::admit_packet`]) passes while the debt is under one read, so
//! packets go first: they cannot wait (they are dropped, not queued), reads
//! can. A client's light packets (its DNS, a call) pass beside its own bulk
//! tunnel, which takes what they leave. (With one threshold for both, a
//! relay waking exactly when the debt was paid took every turn, and dropped
//! about 98% of the client's packets.) Packets at or over the client's rate
//! (its own, or an outsider's sent to its UDP association) would leave its
//! tunnels nothing: a take that packets kept out ([`take_starved`]: the
//! time two reads take to earn, packets having taken a read's worth
//! meanwhile and the take being paid but for them) goes first, taking while
//! the debt is under two reads, a level packets cannot keep it above; the
//! tunnels keep a share (about half in a model of the bucket). Tokens are taken before the
//! bytes move, so however many tunnels share the bucket, in any window of
//! time *t* at most *rate × t* + the burst + three reads + one packet
//! passes.
//!
//! An unlimited direction costs one atomic load per read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use blipless_config::client_limits::{ClientLimits, Quota, SourcePolicy};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How much of its rate a bucket may save up: what may pass in a burst
/// above the rate.
pub const BURST: Duration = Duration::from_millis(250);

/// Smallest read a limited relay makes (one full-size packet's worth).
pub const MIN_CHUNK: usize = 1500;

/// How much a limited read takes: 50 ms of the rate, so shaping is smooth
/// at any rate...
const CHUNK_TIME_DIVISOR: u64 = 20;

/// ...but never more than the relay reads at once (its 256 KiB buffer).
pub const MAX_CHUNK: u64 = 256 * 1024;

/// One read's worth of tokens at `rate` bytes per second.
fn chunk(rate: u64) -> f64 {
    (rate / CHUNK_TIME_DIVISOR).clamp(MIN_CHUNK as u64, MAX_CHUNK) as f64
}

/// How long a take may be kept out by packets before it goes first: the
/// time two reads take to earn (100 ms at most rates; less where a read is
/// capped at [`MAX_CHUNK`], so that tunnels keep their share there too).
/// A client's packets at or over its rate (its own, or an outsider's sent
/// to its UDP association) would otherwise leave its tunnels nothing. Kept
/// out means: this long since the last take, packets took at least one
/// read's worth meanwhile, and without them the take would be paid (so a
/// few light packets, or one large one, beside a slow bulk tunnel do not
/// make its takes go first, which would drop the packets after them).
fn take_starved(rate: u64) -> Duration {
    Duration::from_secs_f64(2.0 * chunk(rate) / rate.max(1) as f64)
}

/// A token bucket in bytes.
#[derive(Debug, Default)]
pub struct Bucket {
    /// Bytes per second; 0: unlimited. Changed under `state`'s lock.
    rate: AtomicU64,
    /// Its level, once used.
    state: Mutex<Option<Level>>,
}

/// A bucket's level.
#[derive(Debug, Clone, Copy)]
struct Level {
    /// Tokens; negative: debt.
    tokens: f64,
    /// When `tokens` was last refilled.
    counted_at: Instant,
    /// When a take last succeeded (or the bucket was first used).
    last_take: Instant,
    /// Bytes of packets that passed since then: packets that took a read's
    /// worth keep a take out long enough to make it go first.
    packet_bytes_since_take: f64,
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
        // Under the lock: a take or packet judged at the old rate is judged
        // wholly before the change, or wholly after.
        let mut state = self.lock();
        let old = self.rate.swap(bytes_per_second, Ordering::Relaxed);
        // A debt run up at the old rate (a read of up to 256 KiB) would
        // take minutes to pay at a much lower one: at most one read of the
        // new rate is kept. (Only when it changes: a record read again with
        // the same rate forgives nothing.)
        if bytes_per_second > 0 && bytes_per_second != old {
            if let Some(level) = state.as_mut() {
                level.tokens = level.tokens.max(-chunk(bytes_per_second));
            }
        }
    }

    fn capacity(rate: u64) -> f64 {
        // Never below one read's worth, or a take could wait forever.
        (rate as f64 * BURST.as_secs_f64()).max(chunk(rate))
    }

    /// The level now, refilled for the time since last counted.
    fn refill(state: &mut Option<Level>, rate: u64, now: Instant) -> &mut Level {
        let level = state.get_or_insert(Level {
            tokens: chunk(rate),
            counted_at: now,
            last_take: now,
            packet_bytes_since_take: 0.0,
        });
        let elapsed = now
            .saturating_duration_since(level.counted_at)
            .as_secs_f64();
        level.tokens = (level.tokens + elapsed * rate as f64).min(Self::capacity(rate));
        level.counted_at = now;
        level
    }

    /// One read's worth of tokens (50 ms of the rate, from [`MIN_CHUNK`] to
    /// [`MAX_CHUNK`]), taken from the bucket: waits until the bucket is out
    /// of debt, or (kept out by packets, [`take_starved`]) until its debt is
    /// under two reads (cancel-safe: nothing is taken until the wait is
    /// over). `None`: unlimited.
    pub async fn take(&self) -> Option<usize> {
        loop {
            match self.try_take()? {
                Ok(taken) => return Some(taken),
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// [`Bucket::take`] without waiting: `Ok(tokens taken)`, or `Err(how
    /// long until they are there)`; `None`: unlimited.
    pub fn try_take(&self) -> Option<Result<usize, Duration>> {
        // An unlimited bucket costs one atomic load; a limited one reads its
        // rate again under the lock (`set_rate` changes it there).
        if self.rate() == 0 {
            return None;
        }
        let mut state = self.lock();
        let rate = self.rate();
        if rate == 0 {
            return None;
        }
        let chunk = chunk(rate);
        let now = Instant::now();
        let level = Self::refill(&mut state, rate, now);
        let starving_time = take_starved(rate);
        let kept_out = level.packet_bytes_since_take >= chunk;
        let starved = kept_out
            && level.tokens + level.packet_bytes_since_take >= 0.0
            && now.saturating_duration_since(level.last_take) >= starving_time;
        // A starved take goes while the debt is under two reads: a level
        // packets (which pass while it is under one) keep it above, however
        // densely they come.
        if level.tokens >= 0.0 || (starved && level.tokens >= -2.0 * chunk) {
            level.tokens -= chunk;
            level.last_take = now;
            level.packet_bytes_since_take = 0.0;
            // A whole number of bytes below the buffer's size.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return Some(Ok(chunk as usize));
        }
        let rate = rate as f64;
        let paid = Duration::from_secs_f64(-level.tokens / rate);
        // Packets passing meanwhile may make it go first sooner: it looks
        // again then (a packet's arrival does not wake it), or at least every
        // `starving_time`.
        let wait = if kept_out {
            let under_two_reads =
                Duration::from_secs_f64((-2.0 * chunk - level.tokens).max(0.0) / rate);
            let paid_but_for_packets = Duration::from_secs_f64(
                (-(level.tokens + level.packet_bytes_since_take)).max(0.0) / rate,
            );
            let starving = (level.last_take + starving_time).saturating_duration_since(now);
            paid.min(under_two_reads.max(starving).max(paid_but_for_packets))
        } else {
            paid.min(starving_time)
        };
        Some(Err(wait.max(Duration::from_millis(1))))
    }

    /// Gives back tokens [`Bucket::take`] took and a read did not use.
    pub fn refund(&self, unused: usize) {
        if unused == 0 || self.rate() == 0 {
            return;
        }
        let mut state = self.lock();
        if let Some(level) = state.as_mut() {
            level.tokens += unused as f64;
        }
    }

    /// Polices a packet of `bytes`: true (and charged) if the bucket's debt
    /// is under one read, false (nothing charged) if it must be dropped. A
    /// packet may deepen the debt, which the next packets and reads wait
    /// out: a packet larger than the bucket can ever hold (a 4 KiB DNS
    /// answer at a low rate) passes while the debt is under one read, and a
    /// read a tunnel took does not keep the client's packets out (module
    /// docs).
    pub fn admit_packet(&self, bytes: usize) -> bool {
        if self.rate() == 0 {
            return true;
        }
        let mut state = self.lock();
        let rate = self.rate();
        if rate == 0 {
            return true;
        }
        let level = Self::refill(&mut state, rate, Instant::now());
        if level.tokens < -chunk(rate) {
            return false;
        }
        level.tokens -= bytes as f64;
        level.packet_bytes_since_take += bytes as f64;
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Level>> {
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
    /// plane moved since, in the period ending at `quota_ends_at`.
    quota_used: AtomicU64,
    /// When the period `quota_used` counts ends, unix seconds (0: unknown).
    quota_ends_at: std::sync::atomic::AtomicI64,
    /// Whether the store's count has been read once.
    quota_known: AtomicBool,
    /// How many times the quota changed: a count read under an earlier
    /// quota (a look in flight across `client set`) is not applied.
    quota_changes: AtomicU64,
    over_quota: AtomicBool,
    /// Cancelled when the client goes over its quota; replaced when it is
    /// under again.
    over_token: Mutex<CancellationToken>,
    /// Whether its direct connections rotate their source.
    rotates: AtomicBool,
    /// Its tunnels open on the fleet's other nodes, as last read from the
    /// store (with a cap only).
    fleet_others: AtomicU64,
    /// What this plane last recorded in the store of its own tunnels.
    reported_live: AtomicU64,
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
        self.rotates.store(
            limits.source == Some(SourcePolicy::Rotate),
            Ordering::Relaxed,
        );
        let mut quota = self
            .quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *quota != limits.quota {
            let same_period = quota.map(|q| q.period) == limits.quota.map(|q| q.period);
            *quota = limits.quota;
            self.quota_changes.fetch_add(1, Ordering::AcqRel);
            drop(quota);
            self.has_quota
                .store(limits.quota.is_some(), Ordering::Relaxed);
            // A new quota is judged afresh at the next look at the store; a
            // new period counts from nothing here until then.
            self.quota_known.store(false, Ordering::Relaxed);
            if !same_period {
                self.quota_used.store(0, Ordering::Relaxed);
                self.quota_ends_at.store(0, Ordering::Relaxed);
            }
            match limits.quota {
                Some(quota) if self.quota_used.load(Ordering::Relaxed) >= quota.bytes => {
                    self.over_quota();
                }
                _ => self.under_quota(),
            }
        }
    }

    /// How its direct connections pick a source (None: sticky).
    pub fn source_policy(&self) -> Option<SourcePolicy> {
        self.rotates
            .load(Ordering::Relaxed)
            .then_some(SourcePolicy::Rotate)
    }

    /// Its tunnels on the fleet's other nodes, as last read.
    pub fn fleet_others(&self) -> u64 {
        self.fleet_others.load(Ordering::Relaxed)
    }

    /// Notes what the store said of the other nodes' tunnels.
    pub fn set_fleet_others(&self, others: u64) {
        self.fleet_others.store(others, Ordering::Relaxed);
    }

    /// What this plane last recorded of its own tunnels; swaps in `now`.
    pub fn swap_reported_live(&self, now: u64) -> u64 {
        self.reported_live.swap(now, Ordering::Relaxed)
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
        let ends_at = self.quota_ends_at.load(Ordering::Relaxed);
        if ends_at > 0 && crate::clients::unix_now() >= ends_at {
            // The period is over: what was counted belongs to the last one.
            self.quota_used.store(0, Ordering::Relaxed);
            self.quota_ends_at.store(0, Ordering::Relaxed);
            self.quota_known.store(false, Ordering::Relaxed);
        }
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

    /// Which quota a look at the store is made under ([`Self::quota_counted_under`]).
    pub fn quota_generation(&self) -> u64 {
        self.quota_changes.load(Ordering::Acquire)
    }

    /// [`Self::quota_counted`], unless the quota changed since `generation`
    /// was read: that count belongs to another quota (maybe another period,
    /// another window), and the next look reads the right one.
    pub fn quota_counted_under(&self, generation: u64, used: u64, ends_at: i64) {
        // Under the quota's lock, so a change cannot slip in between.
        let quota = self
            .quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.quota_changes.load(Ordering::Acquire) != generation {
            return;
        }
        if let Some(quota) = *quota {
            self.apply_count(quota, used, ends_at);
        }
    }

    /// The store's count after this plane's flush (the truth, fleet-wide)
    /// plus what this plane moved since the flush took its usage, in the
    /// period ending at `ends_at`.
    pub fn quota_counted(&self, used: u64, ends_at: i64) {
        if let Some(quota) = self.quota() {
            self.apply_count(quota, used, ends_at);
        }
    }

    fn apply_count(&self, quota: Quota, used: u64, ends_at: i64) {
        self.quota_used.store(used, Ordering::Relaxed);
        self.quota_ends_at.store(ends_at, Ordering::Relaxed);
        self.quota_known.store(true, Ordering::Relaxed);
        if used >= quota.bytes {
            self.over_quota();
        } else {
            self.under_quota();
        }
    }

    /// Marks the client over. The flag changes under the token's lock, so
    /// the flag and the token always agree (over: cancelled).
    fn over_quota(&self) {
        let token = self
            .over_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.over_quota.swap(true, Ordering::Relaxed) {
            token.cancel();
        }
    }

    fn under_quota(&self) {
        let mut token = self
            .over_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.over_quota.swap(false, Ordering::Relaxed) {
            *token = CancellationToken::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes and moves `chunk` bytes of each take until `seconds` are over;
    /// the bytes moved.
    async fn move_for(bucket: &Bucket, seconds: u64, tunnels: usize) -> usize {
        let started = Instant::now();
        let moved = std::sync::atomic::AtomicUsize::new(0);
        let one = || async {
            loop {
                let chunk = bucket.take().await.expect("limited");
                if started.elapsed() > Duration::from_secs(seconds) {
                    // Taken after the window: not moved within it.
                    bucket.refund(chunk);
                    break;
                }
                // Half the reads use only part of what they took.
                let used = if moved.load(Ordering::Relaxed).is_multiple_of(2) {
                    chunk
                } else {
                    chunk / 3
                };
                bucket.refund(chunk - used);
                moved.fetch_add(used, Ordering::Relaxed);
            }
        };
        let all: Vec<_> = (0..tunnels).map(|_| one()).collect();
        futures_util::future::join_all(all).await;
        moved.load(Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_passes_its_rate_and_starts_with_one_read() {
        let bucket = Bucket::default();
        assert_eq!(bucket.take().await, None, "unlimited");
        bucket.set_rate(1_000_000);
        let moved = move_for(&bucket, 10, 1).await;
        // 10 s at 1 MB/s, the read it starts with (50 ms), and at most
        // one read of debt.
        assert!(
            (10_000_000..=10_100_000).contains(&moved),
            "moved {moved} in 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn many_tunnels_share_one_rate_and_never_overdraw_it() {
        let bucket = Bucket::default();
        bucket.set_rate(1_000_000);
        let moved = move_for(&bucket, 10, 50).await;
        assert!(
            moved <= 10_000_000 + 50_000 + 50_000,
            "50 tunnels moved {moved} in 10 s"
        );
        assert!(moved >= 9_500_000, "50 tunnels moved only {moved} in 10 s");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_saves_up_one_burst_at_most() {
        let bucket = Bucket::default();
        bucket.set_rate(1_000_000);
        bucket.refund(0);
        let _ = bucket.take().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let moved = move_for(&bucket, 1, 4).await;
        // One second's rate plus the burst (250 ms), plus one read.
        assert!(
            moved <= 1_250_000 + 50_000,
            "moved {moved} in the first second"
        );
        assert!(
            moved >= 1_150_000,
            "moved {moved}: the saved burst was not used"
        );
    }

    /// Packets are policed against the same bucket: a fresh one lets the
    /// first through (a client's first DNS query on a plane, or what queued
    /// during a deploy's handover), and a flood passes no more than the
    /// rate, the burst and one packet.
    #[tokio::test(start_paused = true)]
    async fn packets_are_policed() {
        let bucket = Bucket::default();
        assert!(bucket.admit_packet(1500), "unlimited");
        bucket.set_rate(8_000);
        assert!(bucket.admit_packet(1500), "a fresh bucket holds one read");
        let mut passed = 1500;
        for _ in 0..1000 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if bucket.admit_packet(1500) {
                passed += 1500;
            }
        }
        // 1 s at 8,000 B/s, the 1,500 bytes it started with, the debt of
        // one read packets may run up, and one packet beyond it.
        assert!(
            (8_000..=8_000 + 1_500 + 1_500 + 1_500).contains(&passed),
            "{passed} bytes of packets passed in 1 s"
        );
    }

    /// A packet larger than the bucket holds (3,125 bytes at 100 kbit/s)
    /// passes when the bucket is not in debt, and leaves a debt the next
    /// packets wait out; it used to be dropped however long the client
    /// waited.
    #[tokio::test(start_paused = true)]
    async fn a_packet_larger_than_the_bucket_passes_and_leaves_a_debt() {
        let bucket = Bucket::default();
        bucket.set_rate(12_500);
        assert!(bucket.admit_packet(4096), "a fresh bucket lets it through");
        assert!(!bucket.admit_packet(1), "and is in debt after it");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(
            !bucket.admit_packet(1),
            "2,596 bytes of debt take 88 ms to be under one read (1,500)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(bucket.admit_packet(1), "paid back");
    }

    /// A client's light packets (here 10% of its rate) pass beside its own
    /// tunnel taking all it can: a read it took does not keep them out.
    /// With one threshold for both, the relay woke as the debt was paid and
    /// took every turn: nearly every packet was dropped.
    #[tokio::test(start_paused = true)]
    async fn a_busy_tunnel_leaves_light_packets_their_way() {
        let bucket = Bucket::default();
        bucket.set_rate(100_000);
        let tunnel = async {
            loop {
                bucket.take().await;
            }
        };
        let packets = async {
            let mut passed = 0;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if bucket.admit_packet(100) {
                    passed += 1;
                }
            }
            passed
        };
        let passed = tokio::select! {
            passed = packets => passed,
            () = tunnel => unreachable!("the tunnel takes for ever"),
        };
        assert!(passed >= 95, "{passed} of 100 light packets passed");
    }

    /// The same at a low rate, where a read takes longer than 100 ms to
    /// earn (8,000 B/s: 187 ms): a few light packets do not make the
    /// tunnel's takes go first, which would drop the packets after them.
    #[tokio::test(start_paused = true)]
    async fn at_a_low_rate_a_busy_tunnel_leaves_light_packets_their_way() {
        let bucket = Bucket::default();
        bucket.set_rate(8_000);
        let tunnel = async {
            loop {
                bucket.take().await;
            }
        };
        let packets = async {
            let mut passed = 0;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if bucket.admit_packet(80) {
                    passed += 1;
                }
            }
            passed
        };
        let passed = tokio::select! {
            passed = packets => passed,
            () = tunnel => unreachable!("the tunnel takes for ever"),
        };
        assert!(passed >= 95, "{passed} of 100 light packets passed");
    }

    /// At a high rate, where a read is capped at 256 KiB (less than 50 ms
    /// of 125 MB/s), a flood still leaves the tunnels a share: a take goes
    /// first after two reads' time (4 ms), not a fixed 100 ms.
    #[tokio::test(start_paused = true)]
    async fn at_a_high_rate_a_flood_leaves_the_tunnels_a_share() {
        let bucket = Bucket::default();
        bucket.set_rate(125_000_000);
        let flood = async {
            loop {
                for _ in 0..100 {
                    let _ = bucket.admit_packet(1400);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let tunnel = async {
            let mut taken = 0usize;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(1) {
                taken += bucket.take().await.unwrap_or(0);
            }
            taken
        };
        let taken = tokio::select! {
            taken = tunnel => taken,
            () = flood => unreachable!("the flood goes on"),
        };
        assert!(
            taken >= 25_000_000,
            "the tunnel moved {taken} bytes in 1 s of a 125 MB/s rate"
        );
    }

    /// At a low rate one large datagram beside a bulk tunnel does not make
    /// the tunnel's next take go first: the light packets after it pass.
    #[tokio::test(start_paused = true)]
    async fn at_a_low_rate_one_large_datagram_does_not_make_the_tunnel_go_first() {
        let bucket = Bucket::default();
        bucket.set_rate(8_000);
        let tunnel = async {
            loop {
                bucket.take().await;
            }
        };
        let packets = async {
            let (mut light, mut passed) = (0, 0);
            for tick in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tick % 10 == 0 {
                    let _ = bucket.admit_packet(1500);
                } else {
                    light += 1;
                    if bucket.admit_packet(80) {
                        passed += 1;
                    }
                }
            }
            (light, passed)
        };
        let (light, passed) = tokio::select! {
            counted = packets => counted,
            () = tunnel => unreachable!("the tunnel takes for ever"),
        };
        assert!(
            passed * 10 >= light * 8,
            "{passed} of {light} light packets passed"
        );
    }

    /// A rate lowered while a read of the old rate was taken keeps one
    /// read of debt at the new rate, no more and no less: the client is not
    /// frozen while a debt of the old rate is paid at the new one.
    #[tokio::test(start_paused = true)]
    async fn a_lowered_rate_keeps_one_read_of_debt() {
        let bucket = Bucket::default();
        bucket.set_rate(125_000_000);
        let taken = bucket.take().await;
        assert_eq!(taken, Some(256 * 1024));
        let _ = bucket.take().await;
        bucket.set_rate(8_000);
        // 1,500 bytes of debt at 8,000 B/s: 187.5 ms until a read.
        match bucket.try_take() {
            Some(Err(wait)) => assert!(
                (Duration::from_millis(100)..=Duration::from_millis(190)).contains(&wait),
                "{wait:?}"
            ),
            other => panic!("a read at once: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(180)).await;
        assert!(
            matches!(bucket.try_take(), Some(Err(_))),
            "a read before the debt is paid"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            matches!(bucket.try_take(), Some(Ok(1500))),
            "paid at 187.5 ms"
        );
    }

    /// Packets at or over the client's rate (its own, or an outsider's sent
    /// to its UDP association) do not keep its tunnels from the bucket for
    /// good: a take kept out for 100 ms goes first.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_packets_leaves_the_tunnels_their_turns() {
        let bucket = Bucket::default();
        bucket.set_rate(100_000);
        let flood = async {
            loop {
                let _ = bucket.admit_packet(1228);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        // 2 s of the rate is 40 reads of 5,000 bytes: a share of a quarter.
        let takes = tokio::time::timeout(Duration::from_secs(2), async {
            for _ in 0..10 {
                bucket.take().await;
            }
        });
        tokio::select! {
            taken = takes => assert!(taken.is_ok(), "the tunnel got no turn in 2 s"),
            () = flood => {}
        }
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
        limiter.quota_counted(7_000_000, i64::MAX);
        let token = limiter.over_quota_token();
        assert!(!limiter.is_over_quota() && !limiter.quota_needs_look());
        limiter.quota_counted(9_000_000, i64::MAX);
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
        limiter.quota_counted(0, i64::MAX);
        assert!(!limiter.is_over_quota());
        assert!(!limiter.over_quota_token().is_cancelled());
        // Clearing the quota frees it too.
        limiter.quota_counted(10_000_000, i64::MAX);
        assert!(limiter.is_over_quota());
        limiter.set(&ClientLimits::default());
        assert!(!limiter.is_over_quota() && limiter.quota().is_none());
        // A quota of another period counts from nothing: the old count does
        // not cut anyone.
        limiter.set(&limits);
        limiter.quota_counted(9_999_999, i64::MAX);
        limiter.set(&ClientLimits {
            quota: Some("1GB/week".parse().expect("quota")),
            ..ClientLimits::default()
        });
        limiter.charge_quota(1);
        assert!(!limiter.is_over_quota());
        // A period that ended: the next charge starts a new count.
        limiter.quota_counted(999_999_999, 1);
        limiter.charge_quota(10);
        assert!(
            !limiter.is_over_quota(),
            "a count from an ended period cut the client"
        );
    }

    /// A look at the store in flight while the quota changes (month → day)
    /// brings back the old quota's count: it is not applied to the new one.
    #[test]
    fn a_count_read_under_an_earlier_quota_is_not_applied() {
        let limiter = Limiter::new(&ClientLimits {
            quota: Some("50GB/month".parse().expect("quota")),
            ..ClientLimits::default()
        });
        let generation = limiter.quota_generation();
        limiter.set(&ClientLimits {
            quota: Some("1GB/day".parse().expect("quota")),
            ..ClientLimits::default()
        });
        // The month's 40 GB, read before the change.
        limiter.quota_counted_under(generation, 40_000_000_000, i64::MAX);
        assert!(
            !limiter.is_over_quota() && limiter.quota_needs_look(),
            "the month's count cut the client under its daily quota"
        );
        limiter.quota_counted_under(limiter.quota_generation(), 2_000_000_000, i64::MAX);
        assert!(
            limiter.is_over_quota(),
            "a count under the new quota applies"
        );
    }
}
