//! Failed proxy authentications: counted by protocol, logged at most once per
//! second per source with a count, and throttled per username at a source
//! and per source.
//!
//! Sans-IO: no sockets and no clock. Every call takes the time as an
//! [`Instant`], so the time-based behaviour is tested by passing instants.
//! [`AuthTable`] is the whole logic; [`AuthGuard`] is the table behind a
//! mutex, shared by every connection of the plane (`Context::auth`), plus
//! [`log_every_second`], the one task that writes the summaries to the log.
//!
//! The rules (docs/DECISIONS.md, "Failed authentication"):
//!
//! - A source is an IPv4 address or an IPv6 /64 (one host's usual share).
//! - [`STRIKES`] wrong passwords for one username from a source within
//!   [`STRIKE_WINDOW`] throttle that username at that source for a
//!   cool-down: [`FIRST_COOL_DOWN`], doubling with each further throttling
//!   up to [`MAX_COOL_DOWN`]. Other usernames from the same address (the
//!   other customers behind one NAT) are still checked.
//! - Wrong logins naming [`SOURCE_USERNAMES`] different usernames (unknown
//!   ones, and an unreadable one, included) from a source within
//!   [`STRIKE_WINDOW`] throttle the whole source the same way: a guess across
//!   many accounts.
//! - While throttled, an attempt is refused without checking its
//!   credentials, with the protocol's own refusal (the callers: SOCKS5 auth
//!   status failure, HTTP 429 with `Retry-After`), and counted as throttled.
//! - A missing `Proxy-Authorization` is counted and logged as a failure but
//!   is no strike: it guesses nothing, and it is how a challenge-response
//!   client starts.
//! - A success resets its username at the source. A source with no failure for
//!   [`FORGET_AFTER`] is forgotten; at most [`MAX_SOURCES`] are kept, the
//!   least recently seen evicted first.
//! - Usernames are attacker-chosen bytes: kept as a lossy UTF-8 string of at
//!   most [`MAX_USERNAME_CHARS`] characters and logged with `{:?}`. Passwords
//!   are never given to this module.
//!
//! The files: this one holds the rules' constants, the types the callers
//! use and [`AuthGuard`]; `table.rs` the sans-IO [`AuthTable`] and its time
//! logic; `log.rs` the log lines ([`Summary`], [`Flush`]) and
//! [`log_every_second`].

use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod log;
mod table;
#[cfg(test)]
mod tests;

pub use log::{log_every_second, printable_username, Flush, Pending, Summary};
pub use table::AuthTable;

/// Wrong passwords for one username from one source within [`STRIKE_WINDOW`]
/// that throttle that username there.
pub const STRIKES: u32 = 5;
/// Different usernames failed on from one source within [`STRIKE_WINDOW`]
/// that throttle the whole source.
pub const SOURCE_USERNAMES: u32 = 10;
/// Usernames whose strikes a source keeps at most (more than
/// [`SOURCE_USERNAMES`], so a source is throttled before it runs out; few,
/// as every one of [`MAX_SOURCES`] sources may fill them).
pub const MAX_USERNAMES_PER_SOURCE: usize = SOURCE_USERNAMES as usize + 2;
/// The window [`STRIKES`] are counted in (from the first strike).
pub const STRIKE_WINDOW: Duration = Duration::from_secs(10);
/// The first cool-down.
pub const FIRST_COOL_DOWN: Duration = Duration::from_secs(1);
/// The longest cool-down: each throttling of a source doubles it up to this.
pub const MAX_COOL_DOWN: Duration = Duration::from_secs(60);
/// A source with no failure (and no throttled attempt) for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Sources kept at most; beyond, the least recently seen are evicted.
pub const MAX_SOURCES: usize = 65_536;
/// At most one log line per source this often.
pub const LOG_EVERY: Duration = Duration::from_secs(1);
/// Longest username kept and logged, in characters.
pub const MAX_USERNAME_CHARS: usize = 64;
/// Log lines naming a source per flush; the rest are summed in one more line.
pub const MAX_LINES_PER_FLUSH: usize = 32;

/// The proxy protocol an attempt came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// SOCKS5, username/password (RFC 1929).
    Socks5,
    /// HTTP proxy, `Proxy-Authorization: Basic`.
    Http,
}

impl Protocol {
    const ALL: [Protocol; 2] = [Protocol::Socks5, Protocol::Http];

    fn index(self) -> usize {
        match self {
            Protocol::Socks5 => 0,
            Protocol::Http => 1,
        }
    }

    /// The name log lines use.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Socks5 => "SOCKS5",
            Protocol::Http => "HTTP proxy",
        }
    }
}

/// Where failures are counted together: an IPv4 address (an IPv4-mapped
/// IPv6 address counts as its IPv4 address), or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    /// The source a peer address belongs to.
    pub fn of(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(v4) => Source(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Source(IpAddr::V6(prefix.into()))
                }
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// What an authentication attempt may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Check the credentials.
    Check,
    /// Refuse without checking: the source, or this username at the
    /// source, is throttled for this much longer.
    Throttled {
        /// Until the cool-down ends.
        retry_after: Duration,
    },
}

/// How an authentication failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<'a> {
    /// No credentials at all (HTTP without `Proxy-Authorization`): counted
    /// and logged, no strike.
    Missing,
    /// Wrong, unknown or malformed credentials: a strike. The username when
    /// there was one to read.
    Wrong {
        /// The username as sent (attacker-chosen bytes).
        username: Option<&'a [u8]>,
    },
}

/// Failed and throttled attempts by protocol, since the plane started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthCounts {
    /// Failed SOCKS5 authentications (credentials checked and wrong).
    pub socks5_failures: u64,
    /// SOCKS5 attempts refused while throttled.
    pub socks5_throttled: u64,
    /// HTTP 407s (credentials missing, malformed or wrong).
    pub http_failures: u64,
    /// HTTP attempts refused while throttled (429).
    pub http_throttled: u64,
}

impl AuthCounts {
    /// What was counted after `earlier` (each count never below 0).
    pub fn since(&self, earlier: &AuthCounts) -> AuthCounts {
        AuthCounts {
            socks5_failures: self.socks5_failures.saturating_sub(earlier.socks5_failures),
            socks5_throttled: self
                .socks5_throttled
                .saturating_sub(earlier.socks5_throttled),
            http_failures: self.http_failures.saturating_sub(earlier.http_failures),
            http_throttled: self.http_throttled.saturating_sub(earlier.http_throttled),
        }
    }

    fn add(&mut self, protocol: Protocol, failures: u64, throttled: u64) {
        let (f, t) = match protocol {
            Protocol::Socks5 => (&mut self.socks5_failures, &mut self.socks5_throttled),
            Protocol::Http => (&mut self.http_failures, &mut self.http_throttled),
        };
        *f = f.saturating_add(failures);
        *t = t.saturating_add(throttled);
    }
}

/// The plane's [`AuthTable`], shared by every connection, and what has
/// already been reported to the ingress.
#[derive(Debug, Default)]
pub struct AuthGuard {
    table: Mutex<AuthTable>,
    reported: Mutex<AuthCounts>,
}

impl AuthGuard {
    /// An empty guard.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, AuthTable> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`AuthTable::check`].
    pub fn check(
        &self,
        address: IpAddr,
        protocol: Protocol,
        username: Option<&[u8]>,
        now: Instant,
    ) -> Verdict {
        self.table().check(address, protocol, username, now)
    }

    /// [`AuthTable::failed`].
    pub fn failed(
        &self,
        address: IpAddr,
        protocol: Protocol,
        failure: Failure<'_>,
        now: Instant,
    ) -> Option<Duration> {
        self.table().failed(address, protocol, failure, now)
    }

    /// [`AuthTable::failed_unkeyed`].
    pub fn failed_unkeyed(&self, protocol: Protocol) {
        self.table().failed_unkeyed(protocol);
    }

    /// [`AuthTable::succeeded`].
    pub fn succeeded(&self, address: IpAddr, username: &[u8], now: Instant) {
        self.table().succeeded(address, username, now);
    }

    /// The counts so far.
    pub fn counts(&self) -> AuthCounts {
        self.table().counts()
    }

    /// The counts last sent to the ingress (by any attachment).
    pub fn reported(&self) -> AuthCounts {
        *self
            .reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes that the ingress has been sent `counts`.
    pub fn set_reported(&self, counts: AuthCounts) {
        *self
            .reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = counts;
    }
}
