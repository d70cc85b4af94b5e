//! The deadlines of one forwarded exchange (an absolute-form request and
//! the origin's answer): `timeouts.response` and `timeouts.body_idle`.
//!
//! An [`Exchange`] keeps the progress of both bodies: [`RequestBody`] watches
//! the client's request body on its way to the origin, [`ResponseBody`] the
//! origin's response body on its way to the client, and each reports every
//! frame. [`Exchange::stalled`] completes at the first deadline missed:
//!
//! - the request body moved less than [`MIN_REQUEST_PROGRESS`] (and did not
//!   end) within a `body_idle` window: the client is too slow
//!   ([`Stall::ClientBody`]), or the origin does not read it
//!   ([`Stall::OriginIntake`]), told apart by who the body was waiting for;
//! - the origin did not send its response head within `response` of the
//!   request body's end ([`Stall::Response`]);
//! - the response body moved no byte within `body_idle`, because the origin
//!   went silent or the client stopped reading ([`Stall::ResponseBody`]).
//!
//! A request body must keep a minimum pace because a byte at a time would
//! otherwise hold the exchange open for ever; a response body only has to
//! keep moving, since event streams and long polls legitimately send a few
//! bytes now and then.
//!
//! `forward.rs` waits on [`Exchange::stalled`] until the response head
//! (and answers 408 or 504 itself); after that the connection's [`Watch`]
//! does, in `serve`, which cuts the connection: the client has a status
//! line already. Each exchange owns its origin connection's task through an
//! [`OriginGuard`]: when the exchange ends, however it ends, the origin
//! socket is closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hyper::body::{Body as HttpBody, Incoming};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use super::sliced::Sliced;
use super::turns::Received;
use super::watched::{Polled, Watched, Watcher};
use super::Limits;

/// A request body must move at least this many bytes in each
/// `timeouts.body_idle` window (or end within it).
pub(crate) const MIN_REQUEST_PROGRESS: u64 = 1024;

/// Which deadline an exchange missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stall {
    /// The client sent too little of its request body in a window.
    ClientBody,
    /// The origin took too little of the request body in a window.
    OriginIntake,
    /// The origin did not start its answer in time after the request.
    Response,
    /// The response body moved nothing in a window.
    ResponseBody,
}

/// What an exchange holds until it is over: dropped, it cancels the origin
/// connection's task and gives the client's tunnel count back, at once (not
/// when that task next runs: a pipelined request read meanwhile would be
/// judged against the client's cap with this exchange still counted).
#[derive(Debug)]
pub(super) struct OriginGuard {
    /// Cancels the origin connection's task.
    pub(super) _connection: DropGuard,
    /// The exchange's place under the client's connection cap.
    pub(super) _counted: crate::conn::caps::TunnelCount,
}

#[derive(Debug)]
struct State {
    /// The current request-body window and what it has moved so far.
    window_start: Instant,
    window_bytes: u64,
    /// The request body's last poll found no bytes from the client yet.
    waiting_on_client: bool,
    /// When the request body ended.
    request_done: Option<Instant>,
    /// Whether the response head has been passed to the client.
    answered: bool,
    /// The last response-body frame (or the head).
    response_last: Instant,
    response_done: bool,
    /// The origin's response body broke off (a reset, a malformed chunk, a
    /// close before its length).
    response_broken: bool,
    /// Reading the client's request body failed (malformed chunks, or the
    /// client ended it short): the request's failure is the client's.
    request_failed: bool,
}

/// One forwarded exchange's progress.
#[derive(Debug)]
pub(super) struct Exchange {
    limits: Limits,
    state: Mutex<State>,
    /// Woken when a phase ends (request body, head, response body).
    changed: Notify,
}

impl Exchange {
    /// An exchange starting now.
    pub(super) fn new(limits: Limits) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            limits,
            state: Mutex::new(State {
                window_start: now,
                window_bytes: 0,
                waiting_on_client: false,
                request_done: None,
                answered: false,
                response_last: now,
                response_done: false,
                response_broken: false,
                request_failed: false,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn request_moved(&self, bytes: u64) {
        let mut state = self.lock();
        state.waiting_on_client = false;
        state.window_bytes += bytes;
        if state.window_bytes >= MIN_REQUEST_PROGRESS {
            state.window_start = Instant::now();
            state.window_bytes = 0;
        }
    }

    /// Whether reading the client's request body failed.
    pub(super) fn request_failed(&self) -> bool {
        self.lock().request_failed
    }

    fn request_waiting(&self) {
        self.lock().waiting_on_client = true;
    }

    fn request_done(&self) {
        let mut state = self.lock();
        if state.request_done.is_none() {
            state.request_done = Some(Instant::now());
            drop(state);
            self.changed.notify_waiters();
        }
    }

    /// The response head went to the client: from now on the response body
    /// must keep moving.
    pub(super) fn answered(&self) {
        let mut state = self.lock();
        state.answered = true;
        state.response_last = Instant::now();
        drop(state);
        self.changed.notify_waiters();
    }

    fn response_moved(&self) {
        self.lock().response_last = Instant::now();
    }

    /// The origin's response body broke off.
    fn response_broke(&self) {
        self.lock().response_broken = true;
        self.response_done();
    }

    /// Whether the response head went to the client and its body has not
    /// ended.
    fn answer_unfinished(&self) -> bool {
        let state = self.lock();
        state.answered && !state.response_done
    }

    /// Whether the origin's response body broke off.
    pub(super) fn response_broken(&self) -> bool {
        self.lock().response_broken
    }

    fn response_done(&self) {
        let mut state = self.lock();
        if !state.response_done {
            state.response_done = true;
            drop(state);
            self.changed.notify_waiters();
        }
    }

    /// The response body is gone (done, or dropped with the connection):
    /// the exchange is over, and its request body, dropped with the origin
    /// connection, is no longer watched either.
    fn finished(&self) {
        let mut state = self.lock();
        state.response_done = true;
        if state.request_done.is_none() {
            state.request_done = Some(Instant::now());
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// The next deadline and what missing it means; `None` once both
    /// bodies are done.
    fn deadline(&self) -> Option<(Instant, Stall)> {
        let state = self.lock();
        let mut first: Option<(Instant, Stall)> = None;
        let mut consider = |at: Instant, stall| {
            if first.is_none_or(|(earliest, _)| at < earliest) {
                first = Some((at, stall));
            }
        };
        match state.request_done {
            None => consider(
                state.window_start + self.limits.body_idle,
                if state.waiting_on_client {
                    Stall::ClientBody
                } else {
                    Stall::OriginIntake
                },
            ),
            Some(done) if !state.answered => consider(done + self.limits.response, Stall::Response),
            Some(_) => {}
        }
        if state.answered && !state.response_done {
            consider(
                state.response_last + self.limits.body_idle,
                Stall::ResponseBody,
            );
        }
        first
    }

    /// Completes when the exchange misses a deadline; never once both
    /// bodies are done.
    pub(super) async fn stalled(&self) -> Stall {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let Some((deadline, _)) = self.deadline() else {
                changed.await;
                continue;
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    // Progress may have moved the deadline since.
                    if let Some((deadline, stall)) = self.deadline() {
                        if deadline <= Instant::now() {
                            return stall;
                        }
                    }
                }
                () = &mut changed => {}
            }
        }
    }
}

/// The client's request body, reporting its progress to the exchange.
pub(super) type RequestBody = Watched<Received, Arc<Exchange>>;

/// Watches `body` for `exchange`.
pub(super) fn request_body(body: Received, exchange: Arc<Exchange>) -> RequestBody {
    if body.is_end_stream() {
        exchange.request_done();
    }
    Watched::new(body, exchange)
}

impl Watcher for Arc<Exchange> {
    fn polled(&mut self, polled: Polled) {
        match polled {
            Polled::Pending => self.request_waiting(),
            Polled::Frame { bytes, last } => {
                self.request_moved(bytes);
                if last {
                    self.request_done();
                }
            }
            Polled::End => self.request_done(),
            // The client's body is malformed or ended short: the request
            // fails on its own, and the failure is the client's.
            Polled::Failed => self.lock().request_failed = true,
        }
    }
}

/// The origin's response body, reporting its progress to the exchange and
/// holding the origin connection open until it is done or dropped.
/// It goes in [slices](super::sliced), so that progress is seen as the
/// client reads, not once per frame of the origin's.
pub(super) type ResponseBody = Watched<Sliced<Incoming>, Origin>;

/// Watches the origin's `body` for `exchange`; the origin connection
/// (`origin`) closes when the body is done with.
pub(super) fn response_body(
    body: Incoming,
    exchange: Arc<Exchange>,
    origin: OriginGuard,
) -> ResponseBody {
    if body.is_end_stream() {
        exchange.response_done();
    }
    Watched::new(
        Sliced::new(body),
        Origin {
            exchange,
            _connection: origin,
        },
    )
}

/// What a response body holds of its exchange: the exchange, told of its
/// progress and, when the body goes, that it finished; and the origin
/// connection, closed then.
pub(super) struct Origin {
    exchange: Arc<Exchange>,
    _connection: OriginGuard,
}

impl Watcher for Origin {
    fn polled(&mut self, polled: Polled) {
        match polled {
            Polled::Pending => {}
            Polled::Frame { last, .. } => {
                self.exchange.response_moved();
                if last {
                    self.exchange.response_done();
                }
            }
            Polled::End => self.exchange.response_done(),
            Polled::Failed => self.exchange.response_broke(),
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.exchange.finished();
    }
}

/// One client connection's view of its exchanges: the one whose answer is
/// on its way (the connection is cut if it stalls), and whether the last
/// answer closes the connection.
#[derive(Debug, Default)]
pub(super) struct Watch {
    current: Mutex<Option<Arc<Exchange>>>,
    changed: Notify,
    closing: AtomicBool,
}

impl Watch {
    /// Follows an exchange whose response head has gone to the client.
    pub(super) fn follow(&self, exchange: Arc<Exchange>) {
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(exchange);
        self.changed.notify_waiters();
    }

    /// The answer just given ends the connection (`Connection: close`): it
    /// is closed after it, never handed over.
    pub(super) fn close_after_answer(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// Whether the followed exchange's answer broke off at the origin: the
    /// client must not take the connection's end for the answer's.
    pub(super) fn answer_broken(&self) -> bool {
        self.followed_is(Exchange::response_broken)
    }

    /// Whether the followed exchange's answer has started and not ended:
    /// cut now, the client must learn that it is cut.
    pub(super) fn answer_unfinished(&self) -> bool {
        self.followed_is(Exchange::answer_unfinished)
    }

    /// Whether there is a followed exchange and `test` holds for it.
    fn followed_is(&self, test: impl FnOnce(&Exchange) -> bool) -> bool {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_deref()
            .is_some_and(test)
    }

    /// Whether an answer said the connection ends.
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Completes when the followed exchange stalls after its answer started.
    pub(super) async fn stalled(&self) -> Stall {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let current = self
                .current
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            match current {
                Some(exchange) => tokio::select! {
                    stall = exchange.stalled() => return stall,
                    () = &mut changed => {}
                },
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> Limits {
        Limits {
            response: Duration::from_secs(5),
            body_idle: Duration::from_secs(2),
            header_bytes: 8192,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_origin_misses_the_response_deadline() {
        let exchange = Exchange::new(limits());
        exchange.request_done();
        let started = Instant::now();
        assert_eq!(exchange.stalled().await, Stall::Response);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_request_body_is_a_client_stall() {
        let exchange = Exchange::new(limits());
        let trickle = {
            let exchange = exchange.clone();
            async move {
                loop {
                    exchange.request_moved(1);
                    exchange.request_waiting();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let started = Instant::now();
        tokio::select! {
            stall = exchange.stalled() => assert_eq!(stall, Stall::ClientBody),
            () = trickle => unreachable!(),
        }
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_pace_then_a_quick_answer_never_stalls() {
        let exchange = Exchange::new(limits());
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            exchange.request_moved(MIN_REQUEST_PROGRESS);
        }
        exchange.request_done();
        tokio::time::sleep(Duration::from_secs(4)).await;
        exchange.answered();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            exchange.response_moved();
        }
        exchange.response_done();
        let stalled = tokio::time::timeout(Duration::from_secs(3600), exchange.stalled()).await;
        assert!(stalled.is_err(), "a finished exchange never stalls");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_before_the_request_body_ended_ends_it_too() {
        // The origin answered early and the answer is done: the request
        // body, dropped with the origin connection, no longer counts.
        let exchange = Exchange::new(limits());
        exchange.request_moved(10);
        exchange.answered();
        exchange.finished();
        let stalled = tokio::time::timeout(Duration::from_secs(3600), exchange.stalled()).await;
        assert!(stalled.is_err(), "a finished exchange never stalls");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_the_origin_does_not_take_is_its_stall() {
        let exchange = Exchange::new(limits());
        exchange.request_moved(10);
        assert_eq!(exchange.stalled().await, Stall::OriginIntake);
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_body_that_stops_is_cut_through_the_watch() {
        let watch = Watch::default();
        let exchange = Exchange::new(limits());
        exchange.request_done();
        tokio::time::sleep(Duration::from_secs(1)).await;
        exchange.answered();
        watch.follow(exchange.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        exchange.response_moved();
        let started = Instant::now();
        assert_eq!(watch.stalled().await, Stall::ResponseBody);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }
}
