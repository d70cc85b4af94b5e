//! The HTTP proxy's limits (`timeouts.response`, `timeouts.body_idle`,
//! `limits.header_bytes`) and the counters of what they refused.
//!
//! The head limit is hyper's own: `max_header_size` answers 431 and ends the
//! connection, and `max_buf_size` (the same number) bounds what a connection
//! buffers before its head is complete, so an unauthenticated client holds
//! at most `limits.header_bytes` of it. The timeouts are in
//! [`super::exchange`].

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The limits of forwarded requests and request heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `timeouts.response`: the origin must start its answer (the response
    /// head) this long after the request body ended, or the client gets 504.
    pub response: Duration,
    /// `timeouts.body_idle`: a request body moving less than 1 KiB
    /// (`exchange::MIN_REQUEST_PROGRESS`), or a response body moving no
    /// byte, for this long ends the exchange.
    pub body_idle: Duration,
    /// `limits.header_bytes`: the largest request head (request line and
    /// headers); a larger one gets 431 and the connection is closed. At
    /// least 8192, hyper's smallest buffer.
    pub header_bytes: usize,
}

impl Limits {
    /// The limits a configuration sets.
    pub fn from_config(config: &blipless_config::Config) -> Self {
        Self {
            response: config.timeouts.response,
            body_idle: config.timeouts.body_idle,
            header_bytes: config.limits.header_bytes,
        }
    }

    /// hyper's buffer limit: the head limit, never under hyper's minimum.
    pub(super) fn buffer_bytes(&self) -> usize {
        self.header_bytes.max(8192)
    }
}

impl Default for Limits {
    /// The documented defaults (30 s, 30 s, 32 KiB).
    fn default() -> Self {
        Self {
            response: Duration::from_secs(30),
            body_idle: Duration::from_secs(30),
            header_bytes: 32 * 1024,
        }
    }
}

/// What the HTTP proxy refused, since the plane started (`Context::http_counters`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Request heads over `limits.header_bytes`, answered 431.
    pub head_too_large: AtomicU64,
    /// Forwarded requests answered 504 because the origin did not answer,
    /// or did not take the request body, in time.
    pub response_timeouts: AtomicU64,
    /// Exchanges ended because a body made no progress: 408 when nothing
    /// was answered yet, else the connection was cut.
    pub body_stalls: AtomicU64,
    /// Request targets refused (400) for carrying userinfo.
    pub userinfo_refused: AtomicU64,
}
