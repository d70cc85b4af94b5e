//! Where a kept-alive connection stands between its exchanges, so that a
//! deploy hands over only a connection that can go on
//! (docs/ARCHITECTURE.md, "Kept-alive HTTP connections").
//!
//! hyper serves one exchange at a time on an HTTP/1.1 connection, and ends
//! the connection itself after one either side meant to be the last
//! (`Connection: close`, HTTP/1.0 without `keep-alive`) or whose request
//! body it did not read to the end (an upload answered before its body was
//! read: what is unread would be taken for the next request). Such a
//! connection must close, not move: its client waits for the close, or its
//! unread body would reach the successor as requests.
//!
//! [`Turns`] follows the exchanges: [`Turns::begin`] when hyper hands the
//! service a request, the end when hyper drops the answer's body (written
//! to the end, or given up with the connection). The request body is
//! watched as [`Received`], which notes its end. A connection is
//! [`between`](Turns::between) exchanges when none is open and the last
//! one left it fit to go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hyper::body::{Body as HttpBody, Incoming};
use hyper::header::{HeaderMap, CONNECTION, CONTENT_LENGTH};
use hyper::{Request, Response, Version};
use tokio::sync::Notify;

use super::watched::{Polled, Watched, Watcher};
use super::Body;

/// The exchanges of one connection.
#[derive(Debug)]
pub(super) struct Turns {
    /// An exchange has begun and its answer's body is not done yet.
    open: AtomicBool,
    /// The last exchange to end left the connection fit to go on (true
    /// before the first).
    reusable: AtomicBool,
    /// The open exchange's request body has been read to its end.
    request_read: AtomicBool,
    /// Woken each time an exchange ends.
    ended: Notify,
    /// Exchanges begun so far.
    begun: AtomicU64,
    /// An answer went out whose end is the connection's (an HTTP/1.0
    /// client's of unknown length): until hyper closes the connection
    /// after it, the client cannot have it whole.
    close_delimited: AtomicBool,
}

impl Default for Turns {
    fn default() -> Self {
        Self {
            open: AtomicBool::new(false),
            reusable: AtomicBool::new(true),
            request_read: AtomicBool::new(true),
            ended: Notify::new(),
            begun: AtomicU64::new(0),
            close_delimited: AtomicBool::new(false),
        }
    }
}

impl Turns {
    /// Whether an answer went out whose end is the connection's: a cut
    /// before hyper closes the connection leaves it short at the client,
    /// even with its last bytes given to hyper.
    pub(super) fn answer_close_delimited(&self) -> bool {
        self.close_delimited.load(Ordering::Acquire)
    }

    /// Notes that hyper handed the service `request`; gives back the
    /// request with its body wrapped to note its end, and the [`Turn`] the
    /// answer's body carries to note the exchange's.
    pub(super) fn begin(self: &Arc<Self>, request: Request<Incoming>) -> (Request<Received>, Turn) {
        self.begun.fetch_add(1, Ordering::AcqRel);
        self.open.store(true, Ordering::Release);
        self.request_read
            .store(request.body().is_end_stream(), Ordering::Release);
        let turn = Turn {
            turns: self.clone(),
            request_version: request.version(),
            request_keeps_alive: keeps_alive(request.version(), request.headers()),
            answer_closes: false,
        };
        let turns = self.clone();
        let request = request.map(|inner| Watched::new(inner, turns));
        (request, turn)
    }

    /// Whether an exchange is under way.
    pub(super) fn in_exchange(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// How many exchanges have begun.
    pub(super) fn begun(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// Whether the connection is between exchanges and may go on: none is
    /// under way, and the last kept the connection alive with its request
    /// read to the end.
    pub(super) fn between(&self) -> bool {
        !self.in_exchange() && self.reusable.load(Ordering::Acquire)
    }

    /// Completes after an exchange ends (at once if one ended since the
    /// last call: a stored wake-up, so check [`Self::in_exchange`] after).
    pub(super) async fn exchange_ended(&self) {
        self.ended.notified().await;
    }
}

/// One exchange, from its request to the end of its answer's body: carried
/// by that body ([`Answer`]), so that it ends when hyper drops the body.
#[derive(Debug)]
pub(super) struct Turn {
    turns: Arc<Turns>,
    request_version: Version,
    request_keeps_alive: bool,
    answer_closes: bool,
}

impl Turn {
    /// Wraps the service's `response` so that the exchange ends with its
    /// body; notes whether the answer ends the connection.
    pub(super) fn answer(mut self, response: Response<Body>) -> Response<Answer> {
        let headers = response.headers();
        // An HTTP/1.0 client's answer of unknown length is delimited by the
        // close.
        let close_delimited =
            self.request_version == Version::HTTP_10 && !headers.contains_key(CONTENT_LENGTH);
        if close_delimited {
            self.turns.close_delimited.store(true, Ordering::Release);
        }
        self.answer_closes = has_token(headers, "close") || close_delimited;
        response.map(|inner| Watched::new(inner, self))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let turns = &self.turns;
        let reusable = self.request_keeps_alive
            && !self.answer_closes
            && turns.request_read.load(Ordering::Acquire);
        turns.reusable.store(reusable, Ordering::Release);
        turns.open.store(false, Ordering::Release);
        turns.ended.notify_one();
    }
}

/// Whether a request with these `headers` lets the connection go on after
/// it, as hyper judges it (RFC 9112 §9.3): HTTP/1.1 unless it says
/// `close`, HTTP/1.0 only if it says `keep-alive`.
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    match version {
        Version::HTTP_11 => !has_token(headers, "close"),
        Version::HTTP_10 => has_token(headers, "keep-alive") && !has_token(headers, "close"),
        _ => false,
    }
}

/// Whether a `Connection` header lists `token` (case-insensitive).
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers.get_all(CONNECTION).iter().any(|value| {
        value
            .as_bytes()
            .split(|&byte| byte == b',')
            .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// A request's body, noting when it has been read to its end.
pub(super) type Received = Watched<Incoming, Arc<Turns>>;

impl Watcher for Arc<Turns> {
    fn polled(&mut self, polled: Polled) {
        if matches!(polled, Polled::End | Polled::Frame { last: true, .. }) {
            self.request_read.store(true, Ordering::Release);
        }
    }
}

/// An answer's body, ending its exchange when hyper drops it (and with it
/// the [`Turn`]).
pub(super) type Answer = Watched<Body, Turn>;

impl Watcher for Turn {
    fn polled(&mut self, _: Polled) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};

    fn request(version: Version, connection: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().version(version).uri("http://a/");
        if let Some(value) = connection {
            builder = builder.header(CONNECTION, value);
        }
        builder.body(()).expect("request")
    }

    #[test]
    fn keep_alive_is_judged_as_hyper_judges_it() {
        let judged = |version, connection| {
            let request = request(version, connection);
            keeps_alive(request.version(), request.headers())
        };
        assert!(judged(Version::HTTP_11, None));
        assert!(judged(Version::HTTP_11, Some("Keep-Alive, TE")));
        assert!(!judged(Version::HTTP_11, Some("TE, Close")));
        assert!(!judged(Version::HTTP_10, None));
        assert!(judged(Version::HTTP_10, Some("keep-alive")));
        assert!(!judged(Version::HTTP_10, Some("keep-alive, close")));
    }

    /// The end of an answer's body ends the exchange; whether the
    /// connection may go on is the last exchange's.
    #[test]
    fn an_exchange_ends_with_its_answer_and_leaves_the_connection_as_it_found_it() {
        let turns = Arc::new(Turns::default());
        assert!(turns.between());
        let answer = |closes: bool| {
            let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
            if closes {
                response
                    .headers_mut()
                    .insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
            }
            response
        };
        // No body on the request: read at once. hyper's `Incoming` cannot
        // be made outside hyper, so the turn is built by hand.
        let turn = |keeps_alive: bool| {
            turns.open.store(true, Ordering::Release);
            turns.request_read.store(true, Ordering::Release);
            Turn {
                turns: turns.clone(),
                request_version: Version::HTTP_11,
                request_keeps_alive: keeps_alive,
                answer_closes: false,
            }
        };
        let sent = turn(true).answer(answer(false));
        assert!(turns.in_exchange() && !turns.between());
        drop(sent);
        assert!(turns.between());
        drop(turn(true).answer(answer(true)));
        assert!(!turns.in_exchange() && !turns.between());
        drop(turn(false).answer(answer(false)));
        assert!(!turns.between());
        // A body left unread spoils the connection.
        let unread = turn(true);
        turns.request_read.store(false, Ordering::Release);
        drop(unread.answer(answer(false)));
        assert!(!turns.between());
        drop(turn(true).answer(answer(false)));
        assert!(turns.between());
    }
}
