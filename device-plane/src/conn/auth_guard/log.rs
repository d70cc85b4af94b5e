//! The log lines: what a source did since its last line ([`Pending`],
//! [`Summary`] and its wording), a flush's lines ([`Flush`]), and
//! [`log_every_second`], the one task that writes them.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{AuthGuard, Protocol, Source, LOG_EVERY, MAX_USERNAME_CHARS};

/// What one source did on one protocol since its last log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Failed authentications.
    pub failures: u64,
    /// Of those, attempts without credentials.
    pub missing: u64,
    /// Attempts refused while throttled.
    pub throttled: u64,
}

impl Pending {
    pub(super) fn is_empty(&self) -> bool {
        self.failures == 0 && self.throttled == 0
    }
}

/// One log line: what a source did since its previous line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The source.
    pub source: Source,
    /// By protocol ([`Protocol::Socks5`], [`Protocol::Http`]).
    pub pending: [Pending; 2],
    /// The period covered, rounded up to whole seconds (at least 1).
    pub seconds: u64,
    /// The last username seen, escaped and truncated when shown.
    pub last_username: Option<String>,
    /// How long the source stays throttled, if it is.
    pub throttled_for: Option<Duration>,
}

fn plural(count: u64, one: &'static str, many: &'static str) -> &'static str {
    if count == 1 {
        one
    } else {
        many
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for protocol in Protocol::ALL {
            let pending = &self.pending[protocol.index()];
            if pending.failures > 0 {
                let mut part = format!(
                    "{} failed {} {}",
                    pending.failures,
                    protocol.name(),
                    plural(pending.failures, "authentication", "authentications")
                );
                if pending.missing > 0 {
                    part.push_str(&format!(" ({} without credentials)", pending.missing));
                }
                parts.push(part);
            }
            if pending.throttled > 0 {
                parts.push(format!(
                    "{} {} {} refused while throttled",
                    pending.throttled,
                    protocol.name(),
                    plural(pending.throttled, "attempt", "attempts")
                ));
            }
        }
        write!(
            f,
            "{} from {} in the last {}s",
            parts.join(", "),
            self.source,
            self.seconds
        )?;
        if let Some(username) = &self.last_username {
            write!(f, ", last username {username:?}")?;
        }
        if let Some(left) = self.throttled_for {
            write!(f, "; throttled for {}s more", round_up_seconds(left))?;
        }
        Ok(())
    }
}

/// Whole seconds, rounded up, at least 1.
pub(super) fn round_up_seconds(duration: Duration) -> u64 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    seconds.max(1)
}

/// A username as it may be kept and logged: lossy UTF-8, at most
/// [`MAX_USERNAME_CHARS`] characters.
pub fn printable_username(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .take(MAX_USERNAME_CHARS)
        .collect()
}

/// What a flush produced: lines for at most
/// [`MAX_LINES_PER_FLUSH`](super::MAX_LINES_PER_FLUSH) sources
/// and, beyond them, a sum over the rest.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flush {
    /// One per source.
    pub lines: Vec<Summary>,
    /// Sources beyond the first [`MAX_LINES_PER_FLUSH`](super::MAX_LINES_PER_FLUSH).
    pub more_sources: u64,
    /// Their failures.
    pub more_failures: u64,
    /// Their throttled attempts.
    pub more_throttled: u64,
}

impl AuthGuard {
    /// Writes the log lines due at `now`.
    pub fn log_due(&self, now: Instant) {
        let flush = self.table().flush(now);
        for summary in &flush.lines {
            tracing::warn!(source = %summary.source, "{summary}");
        }
        if flush.more_sources > 0 {
            tracing::warn!(
                "{} failed authentications and {} attempts refused while throttled from {} more sources in the last second",
                flush.more_failures,
                flush.more_throttled,
                flush.more_sources
            );
        }
    }
}

/// Logs what is due every [`LOG_EVERY`] until `stop`, then once more.
pub async fn log_every_second(guard: Arc<AuthGuard>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(LOG_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => guard.log_due(Instant::now()),
            () = stop.cancelled() => break,
        }
    }
    // Whatever the last second held, even if a line went out less than a second ago.
    guard.log_due(Instant::now() + LOG_EVERY);
}
