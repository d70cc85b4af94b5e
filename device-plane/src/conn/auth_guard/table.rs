//! The sans-IO [`AuthTable`]: one record per source (its usernames' strikes,
//! its own strikes, what is still to be logged) and the time logic over
//! them, every call given the time as an [`Instant`].

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::log::{round_up_seconds, Flush, Pending, Summary};
use super::{
    printable_username, AuthCounts, Failure, Protocol, Source, Verdict, FIRST_COOL_DOWN,
    FORGET_AFTER, LOG_EVERY, MAX_COOL_DOWN, MAX_LINES_PER_FLUSH, MAX_SOURCES,
    MAX_USERNAMES_PER_SOURCE, SOURCE_USERNAMES, STRIKES, STRIKE_WINDOW,
};

/// Evicted at once when the table is full, so that eviction (a pass over
/// the table) happens once per this many new sources.
const EVICT_BATCH: usize = MAX_SOURCES / 16;

/// A run of strikes within [`STRIKE_WINDOW`] and the cool-down it earns:
/// each source has one for the usernames it fails on, and one per username
/// for its wrong passwords.
#[derive(Debug)]
struct Strikes {
    /// Strikes in the window that started at `window_start`.
    count: u32,
    /// Throttlings so far: the next cool-down is [`FIRST_COOL_DOWN`]
    /// doubled this many times, at most [`MAX_COOL_DOWN`].
    level: u8,
    window_start: Instant,
    /// Throttled until then.
    blocked_until: Option<Instant>,
}

impl Strikes {
    fn new(now: Instant) -> Self {
        Self {
            count: 0,
            level: 0,
            window_start: now,
            blocked_until: None,
        }
    }

    /// The cool-down the next throttling earns.
    fn cool_down(&self) -> Duration {
        FIRST_COOL_DOWN
            .checked_mul(1 << self.level.min(16))
            .map_or(MAX_COOL_DOWN, |doubled| doubled.min(MAX_COOL_DOWN))
    }

    fn blocked_for(&self, now: Instant) -> Option<Duration> {
        self.blocked_until
            .filter(|until| *until > now)
            .map(|until| until - now)
    }

    /// True while `window_start` begins a window that is still counting.
    fn window_open(&self, now: Instant) -> bool {
        self.count > 0 && now.saturating_duration_since(self.window_start) < STRIKE_WINDOW
    }

    /// Counts one strike; the `limit`th within the window throttles for the
    /// next cool-down (and doubles the one after it). Returns that cool-down.
    fn strike(&mut self, limit: u32, now: Instant) -> Option<Duration> {
        if !self.window_open(now) {
            self.count = 0;
            self.window_start = now;
        }
        self.count += 1;
        if self.count < limit {
            return None;
        }
        self.count = 0;
        let throttled_for = self.cool_down();
        self.blocked_until = Some(now + throttled_for);
        if throttled_for < MAX_COOL_DOWN {
            self.level += 1;
        }
        Some(throttled_for)
    }

    fn is_fresh(&self, now: Instant) -> bool {
        !self.window_open(now) && self.blocked_for(now).is_none() && self.level == 0
    }
}

/// One username's wrong passwords from one source (56 bytes).
#[derive(Debug)]
struct UserStrikes {
    /// The username, hashed with the table's key: a fixed size whatever an
    /// attacker sends.
    key: u64,
    strikes: Strikes,
    /// The source's username window this username was last counted in
    /// ([`Entry::windows`]), so that it counts once per window.
    counted_in: u32,
}

/// One source's record.
#[derive(Debug)]
pub(super) struct Entry {
    /// Usernames failed on, counted once each per window
    /// ([`SOURCE_USERNAMES`] throttle the whole source).
    usernames: Strikes,
    /// Windows `usernames` has opened: the current one's number.
    windows: u32,
    /// Wrong passwords per username, at most [`MAX_USERNAMES_PER_SOURCE`].
    users: Vec<UserStrikes>,
    /// The latest failure or throttled attempt.
    last_seen: Instant,
    /// Since the last log line.
    pending: [Pending; 2],
    /// The first event since the last log line.
    pending_since: Option<Instant>,
    last_username: Option<String>,
    last_logged: Option<Instant>,
}

impl Entry {
    fn new(now: Instant) -> Self {
        Self {
            usernames: Strikes::new(now),
            windows: 0,
            users: Vec::new(),
            last_seen: now,
            pending: Default::default(),
            pending_since: None,
            last_username: None,
            last_logged: None,
        }
    }

    /// How long an attempt as the user with `key` (or, with `None`, one
    /// without credentials) stays refused: the source's throttle, and that
    /// username's.
    fn blocked_for(&self, key: Option<u64>, now: Instant) -> Option<Duration> {
        let user = key.and_then(|key| {
            self.users
                .iter()
                .find(|user| user.key == key)
                .and_then(|user| user.strikes.blocked_for(now))
        });
        self.usernames.blocked_for(now).max(user)
    }

    /// The longest throttle at this source, whole or for one username.
    fn longest_block(&self, now: Instant) -> Option<Duration> {
        self.users
            .iter()
            .filter_map(|user| user.strikes.blocked_for(now))
            .chain(self.usernames.blocked_for(now))
            .max()
    }

    /// The record of the username with `key`, made if need be. When the
    /// source already keeps [`MAX_USERNAMES_PER_SOURCE`], one makes room: one
    /// not throttled before one throttled, then the one at the lowest
    /// cool-down level, then the one whose strikes began longest ago. So
    /// new names (at the first level) make room for each other, and a
    /// record is pushed out (its level reset) only by names throttled as
    /// often as it was.
    fn user(&mut self, key: u64, now: Instant) -> &mut UserStrikes {
        if let Some(at) = self.users.iter().position(|user| user.key == key) {
            return &mut self.users[at];
        }
        if self.users.len() >= MAX_USERNAMES_PER_SOURCE {
            let least_kept = self
                .users
                .iter()
                .enumerate()
                .min_by_key(|(_, user)| {
                    let throttled = user.strikes.blocked_for(now).is_some();
                    (throttled, user.strikes.level, user.strikes.window_start)
                })
                .map(|(at, _)| at);
            if let Some(at) = least_kept {
                self.users.swap_remove(at);
            }
        }
        self.users.push(UserStrikes {
            key,
            strikes: Strikes::new(now),
            // Never a window's number: counted in the first it fails in.
            counted_in: u32::MAX,
        });
        let last = self.users.len() - 1;
        &mut self.users[last]
    }

    /// Usernames whose strikes are kept.
    #[cfg(test)]
    pub(super) fn usernames_kept(&self) -> usize {
        self.users.len()
    }

    fn has_pending(&self) -> bool {
        self.pending.iter().any(|p| !p.is_empty())
    }

    fn note(&mut self, now: Instant) {
        self.last_seen = now;
        self.pending_since.get_or_insert(now);
    }

    fn forgettable(&self, now: Instant) -> bool {
        !self.has_pending()
            && self.longest_block(now).is_none()
            && now.saturating_duration_since(self.last_seen) >= FORGET_AFTER
    }

    /// The summary due at `now`, if any; resets what it summarises.
    fn take_summary(&mut self, source: Source, now: Instant) -> Option<Summary> {
        if !self.has_pending() {
            return None;
        }
        if self
            .last_logged
            .is_some_and(|logged| now.saturating_duration_since(logged) < LOG_EVERY)
        {
            return None;
        }
        let since = self.pending_since.take().unwrap_or(now);
        self.last_logged = Some(now);
        Some(Summary {
            source,
            pending: std::mem::take(&mut self.pending),
            seconds: round_up_seconds(now.saturating_duration_since(since)),
            last_username: self.last_username.take(),
            throttled_for: self.longest_block(now),
        })
    }
}

/// The throttle, the log rate limiter and the counters, without a lock or a
/// clock.
#[derive(Debug, Default)]
pub struct AuthTable {
    pub(super) sources: HashMap<Source, Entry>,
    counts: AuthCounts,
    /// Keys the username hashes (random per table, so that no one can
    /// choose usernames that collide).
    usernames: RandomState,
}

impl AuthTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sources kept now.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// True when no source is kept.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The counts so far.
    pub fn counts(&self) -> AuthCounts {
        self.counts
    }

    fn key(&self, username: &[u8]) -> u64 {
        self.usernames.hash_one(username)
    }

    /// Counts a failed login whose source is not known (no throttle keeps
    /// it: the caller ends the connection instead).
    pub fn failed_unkeyed(&mut self, protocol: Protocol) {
        self.counts.add(protocol, 1, 0);
    }

    /// Before checking credentials from `address` for `username` (`None`
    /// when none were sent; an unreadable username is `Some(b"")`): refuses
    /// while the source, or that username at the source, is throttled (and
    /// counts the refusal).
    pub fn check(
        &mut self,
        address: IpAddr,
        protocol: Protocol,
        username: Option<&[u8]>,
        now: Instant,
    ) -> Verdict {
        let source = Source::of(address);
        let Some(entry) = self.sources.get_mut(&source) else {
            return Verdict::Check;
        };
        // Hashed only for a source the table keeps (most logins find none).
        let key = username.map(|username| self.usernames.hash_one(username));
        let Some(retry_after) = entry.blocked_for(key, now) else {
            return Verdict::Check;
        };
        entry.pending[protocol.index()].throttled += 1;
        entry.note(now);
        self.counts.add(protocol, 0, 1);
        Verdict::Throttled { retry_after }
    }

    /// Records a failed authentication from `address`. Returns how long that
    /// username (or the whole source) is throttled for from now on, if it is.
    pub fn failed(
        &mut self,
        address: IpAddr,
        protocol: Protocol,
        failure: Failure<'_>,
        now: Instant,
    ) -> Option<Duration> {
        self.counts.add(protocol, 1, 0);
        // A wrong login's username, and its key (an unreadable one is the
        // empty name).
        let wrong = match failure {
            Failure::Missing => None,
            Failure::Wrong { username } => Some((self.key(username.unwrap_or_default()), username)),
        };
        let source = Source::of(address);
        if !self.sources.contains_key(&source) && self.sources.len() >= MAX_SOURCES {
            self.make_room(now);
        }
        let entry = self
            .sources
            .entry(source)
            .or_insert_with(|| Entry::new(now));
        entry.note(now);
        let pending = &mut entry.pending[protocol.index()];
        pending.failures += 1;
        let Some((key, username)) = wrong else {
            pending.missing += 1;
            return entry.blocked_for(None, now);
        };
        if let Some(username) = username {
            entry.last_username = Some(printable_username(username));
        }
        if let Some(left) = entry.blocked_for(Some(key), now) {
            // Checked just before the cool-down began: no further strike.
            return Some(left);
        }
        // One strike for the username; one for the source if the username
        // is new in the source's window.
        if !entry.usernames.window_open(now) {
            entry.windows = entry.windows.wrapping_add(1) % u32::MAX;
        }
        let window = entry.windows;
        let user = entry.user(key, now);
        let user_throttled = user.strikes.strike(STRIKES, now);
        let new_in_window = user.counted_in != window;
        user.counted_in = window;
        let source_throttled = if new_in_window {
            entry.usernames.strike(SOURCE_USERNAMES, now)
        } else {
            None
        };
        user_throttled.max(source_throttled)
    }

    /// Records a successful authentication from `address` as `username`:
    /// that username starts afresh at the source (what is still to be logged
    /// stays, and so does a throttle of the whole source).
    pub fn succeeded(&mut self, address: IpAddr, username: &[u8], now: Instant) {
        let source = Source::of(address);
        let Some(entry) = self.sources.get_mut(&source) else {
            return;
        };
        let key = self.usernames.hash_one(username);
        entry.users.retain(|user| user.key != key);
        if !entry.has_pending() && entry.users.is_empty() && entry.usernames.is_fresh(now) {
            self.sources.remove(&source);
        }
    }

    /// The log lines due at `now` (at most one per source per
    /// [`LOG_EVERY`]), and forgets sources quiet for [`FORGET_AFTER`].
    pub fn flush(&mut self, now: Instant) -> Flush {
        let mut flush = Flush::default();
        self.sources.retain(|source, entry| {
            if let Some(summary) = entry.take_summary(*source, now) {
                if flush.lines.len() < MAX_LINES_PER_FLUSH {
                    flush.lines.push(summary);
                } else {
                    flush.more_sources += 1;
                    for pending in &summary.pending {
                        flush.more_failures += pending.failures;
                        flush.more_throttled += pending.throttled;
                    }
                }
            }
            !entry.forgettable(now)
        });
        flush
    }

    /// Forgets what can be forgotten, then, if still full, the least
    /// recently seen [`EVICT_BATCH`] sources.
    fn make_room(&mut self, now: Instant) {
        self.sources.retain(|_, entry| !entry.forgettable(now));
        if self.sources.len() < MAX_SOURCES {
            return;
        }
        let mut seen: Vec<Instant> = self.sources.values().map(|e| e.last_seen).collect();
        let cut = EVICT_BATCH.min(seen.len() - 1);
        let (_, oldest_kept, _) = seen.select_nth_unstable(cut);
        let oldest_kept = *oldest_kept;
        self.sources
            .retain(|_, entry| entry.last_seen >= oldest_kept);
        // Many sources seen at the same instant: evict arbitrary ones.
        if self.sources.len() >= MAX_SOURCES {
            let extra: Vec<Source> = self
                .sources
                .keys()
                .take(self.sources.len() + 1 - MAX_SOURCES)
                .copied()
                .collect();
            for source in extra {
                self.sources.remove(&source);
            }
        }
    }
}
