//! The sans-IO [`AuthTable`]: one record per source (strikes, cool-down,
//! what is still to be logged) and the time logic over them, every call
//! given the time as an [`Instant`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::log::{round_up_seconds, Flush, Pending, Summary};
use super::{
    printable_username, AuthCounts, Failure, Protocol, Source, Verdict, FIRST_COOL_DOWN,
    FORGET_AFTER, LOG_EVERY, MAX_COOL_DOWN, MAX_LINES_PER_FLUSH, MAX_SOURCES, STRIKES,
    STRIKE_WINDOW,
};

/// Evicted at once when the table is full, so that eviction (a pass over
/// the table) happens once per this many new sources.
const EVICT_BATCH: usize = MAX_SOURCES / 16;

/// One source's record.
#[derive(Debug)]
pub(super) struct Entry {
    /// Strikes in the window that started at `window_start`.
    strikes: u32,
    window_start: Instant,
    /// Throttled until then.
    blocked_until: Option<Instant>,
    /// The next cool-down.
    cool_down: Duration,
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
            strikes: 0,
            window_start: now,
            blocked_until: None,
            cool_down: FIRST_COOL_DOWN,
            last_seen: now,
            pending: Default::default(),
            pending_since: None,
            last_username: None,
            last_logged: None,
        }
    }

    fn blocked_for(&self, now: Instant) -> Option<Duration> {
        self.blocked_until
            .filter(|until| *until > now)
            .map(|until| until - now)
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
            && self.blocked_for(now).is_none()
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
            throttled_for: self.blocked_for(now),
        })
    }
}

/// The throttle, the log rate limiter and the counters, without a lock or a
/// clock.
#[derive(Debug, Default)]
pub struct AuthTable {
    pub(super) sources: HashMap<Source, Entry>,
    counts: AuthCounts,
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

    /// Counts a failed login whose source is not known (no throttle keeps
    /// it: the caller ends the connection instead).
    pub fn failed_unkeyed(&mut self, protocol: Protocol) {
        self.counts.add(protocol, 1, 0);
    }

    /// Before checking credentials from `address`: refuses while its source
    /// is throttled (and counts the refusal).
    pub fn check(&mut self, address: IpAddr, protocol: Protocol, now: Instant) -> Verdict {
        let source = Source::of(address);
        let Some(entry) = self.sources.get_mut(&source) else {
            return Verdict::Check;
        };
        let Some(retry_after) = entry.blocked_for(now) else {
            return Verdict::Check;
        };
        entry.pending[protocol.index()].throttled += 1;
        entry.note(now);
        self.counts.add(protocol, 0, 1);
        Verdict::Throttled { retry_after }
    }

    /// Records a failed authentication from `address`. Returns how long the
    /// source is throttled for from now on, if it is.
    pub fn failed(
        &mut self,
        address: IpAddr,
        protocol: Protocol,
        failure: Failure<'_>,
        now: Instant,
    ) -> Option<Duration> {
        self.counts.add(protocol, 1, 0);
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
        let Failure::Wrong { username } = failure else {
            pending.missing += 1;
            return entry.blocked_for(now);
        };
        if let Some(username) = username {
            entry.last_username = Some(printable_username(username));
        }
        if let Some(left) = entry.blocked_for(now) {
            // Checked just before the cool-down began: no further strike.
            return Some(left);
        }
        if entry.strikes == 0 || now.saturating_duration_since(entry.window_start) >= STRIKE_WINDOW
        {
            entry.strikes = 0;
            entry.window_start = now;
        }
        entry.strikes += 1;
        if entry.strikes < STRIKES {
            return None;
        }
        entry.strikes = 0;
        entry.blocked_until = Some(now + entry.cool_down);
        let throttled_for = entry.cool_down;
        entry.cool_down = (entry.cool_down * 2).min(MAX_COOL_DOWN);
        Some(throttled_for)
    }

    /// Records a successful authentication from `address`: the source starts
    /// afresh (what is still to be logged about it stays).
    pub fn succeeded(&mut self, address: IpAddr) {
        let source = Source::of(address);
        let Some(entry) = self.sources.get_mut(&source) else {
            return;
        };
        if entry.has_pending() {
            entry.strikes = 0;
            entry.blocked_until = None;
            entry.cool_down = FIRST_COOL_DOWN;
        } else {
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
