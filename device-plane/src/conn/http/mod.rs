//! An HTTP proxy connection: CONNECT tunnels and absolute-form requests,
//! with `Proxy-Authorization: Basic` on every request, on a kept-alive
//! client connection.
//!
//! hyper parses and answers malformed requests (400) itself. We answer 407
//! for missing or wrong credentials (429 with `Retry-After` while the
//! username, or the whole address, is throttled for failing too often:
//! [`crate::conn::auth_guard`]), 403 for a destination the policy
//! refuses, 502 for one that cannot be reached, 504 for one that does not
//! answer in time.
//!
//! Limits (`limits.rs`, `exchange.rs`): a request head over
//! `limits.header_bytes` gets hyper's 431 and a close, counted; a forwarded
//! request whose origin does not start answering within `timeouts.response`
//! gets 504, and a request body too slow for `timeouts.body_idle` gets 408
//! (both with a close); a response body that stops moving for
//! `timeouts.body_idle` has its connection cut. A request target with
//! userinfo (`user:password@`) gets 400, and is never resolved, connected to
//! or logged as sent (`target.rs`).

use std::convert::Infallible;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use blipless_protocol::channel::{Direction, Migrate, MigrateKind};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::clients::Client;
use crate::conn::auth_guard::{Failure, Protocol, Verdict};
use crate::conn::handover::NotHandedOver;
use crate::conn::tunnel::Tunnel;
use crate::conn::{Context, Mode};
use crate::egress::EgressError;
use blipless_protocol::{http_target, proxy_auth};

mod exchange;
mod forward;
mod io;
mod limits;
mod sliced;
mod target;
mod throttled;
mod turns;
mod watched;

use exchange::Watch;
use forward::forward;
use io::{Counted, LastMoved, Prefixed};
pub use limits::{Counters, Limits};
use turns::{Answer, Received, Turns};

type Body = BoxBody<Bytes, hyper::Error>;

/// Headers that belong to one hop and are not forwarded. `Trailer` is not
/// one of them (RFC 9110 §6.6.2): hyper writes a chunked body's trailer
/// fields only where `Trailer` names them. `TE` is, and is sent again as
/// `TE: trailers` when the client asked for trailers (`forward.rs`).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

/// A CONNECT the service accepted: the tunnel starts once hyper has sent
/// the 200 and given the socket back.
struct AcceptedConnect {
    egress: TcpStream,
    /// The route it left by, which the tunnel watches.
    via: crate::egress::watch::Via,
    client: Arc<Client>,
    /// The tunnel's count, taken when it was admitted.
    counted: super::caps::TunnelCount,
}

type ConnectSlot = Arc<Mutex<Option<AcceptedConnect>>>;

/// The client a connection's bytes are billed to, and charged against the
/// quota of: the one whose request is being served, that is the last to
/// authenticate on the connection (none before the first does). A
/// connection may carry requests of several clients; each is billed for
/// its own (what is read before a request authenticates, its head, goes to
/// the client before it).
#[derive(Clone, Default)]
struct Identity(Arc<Mutex<Option<Arc<Client>>>>);

impl Identity {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Client>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bills what follows to `client`.
    fn set(&self, client: Arc<Client>) {
        *self.lock() = Some(client);
    }

    /// The client billed now, if one authenticated.
    fn current(&self) -> Option<Arc<Client>> {
        self.lock().clone()
    }

    /// The name of the client billed now, if one authenticated.
    fn name(&self) -> Option<String> {
        self.lock()
            .as_ref()
            .map(|client| client.record.name.clone())
    }
}

type ResponseFuture =
    Pin<Box<dyn std::future::Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

/// What a connection comes with: what a predecessor handed over with it,
/// or, for a new one, the first bytes this plane read before registering it.
#[derive(Debug)]
pub struct Adopted {
    /// Bytes read from the client and not processed yet: by the
    /// predecessor, or by this plane before the socket was registered
    /// (a new connection's first bytes, `conn::first_bytes`).
    pub prefix: Vec<u8>,
    /// How many of `prefix` no client has been billed for, to bill to the
    /// first that authenticates like any request bytes: all of it for a
    /// new connection's first bytes, or for a predecessor's when no client
    /// had authenticated there; none when one had (it billed them).
    pub unbilled_up: u64,
    /// The client that authenticated on it, if any.
    pub client: Option<Arc<Client>>,
    /// False when it came back from a handover that found no successor: it
    /// is not handed over in that handover (it closes between requests), only
    /// in one after the plane serves again.
    pub may_hand_over: bool,
    /// The customer's address as the ingress accepted it, for the auth
    /// throttle: an HTTPS connection's socket is one end of a Unix socket
    /// pair and has no IP peer of its own. `None`: the socket's peer.
    pub source: Option<IpAddr>,
}

impl Adopted {
    /// A connection nobody else has served, from `source`.
    pub fn fresh(source: IpAddr) -> Self {
        Self {
            prefix: Vec::new(),
            unbilled_up: 0,
            client: None,
            may_hand_over: true,
            source: Some(source),
        }
    }
}

/// Serves one HTTP proxy customer connection to its end.
pub async fn serve(stream: TcpStream, adopted: Adopted, context: Arc<Context>, id: u64) {
    let mut next = Some((stream, adopted));
    while let Some((stream, adopted)) = next.take() {
        next = serve_until_handover(stream, adopted, &context, id).await;
    }
}

/// Serves the connection until it ends or is handed over; gives it back
/// when it was waiting to be handed over and the plane serves again (its
/// successor died), to be served from the start with what the client sent.
async fn serve_until_handover(
    stream: TcpStream,
    adopted: Adopted,
    context: &Arc<Context>,
    id: u64,
) -> Option<(TcpStream, Adopted)> {
    let Adopted {
        prefix,
        unbilled_up,
        client: known,
        may_hand_over,
        source,
    } = adopted;
    // Served from a time the plane serves, it may go at the next handover,
    // whatever happened at the last (`Context::handover_slot_when`).
    let may_hand_over = may_hand_over || context.mode() == Mode::Serving;
    // Usage is counted on the client socket once a request authenticates,
    // to the client of the request being served ([`Identity`]).
    let identity = Identity::default();
    if let Some(client) = known {
        identity.set(client);
    }
    let connect_slot: ConnectSlot = Arc::new(Mutex::new(None));
    let watch = Arc::new(Watch::default());
    // For the auth throttle. Unknown for an HTTPS connection adopted at a
    // deploy (its socket is one end of a Unix socket pair, and `Migrate`
    // carries no address), or when the customer is gone already.
    let source = source.or_else(|| stream.peer_addr().ok().map(|peer| peer.ip()));
    let moved = Arc::new(LastMoved::new());
    // A client that reads slowly but steadily shows progress per window
    // step, not per megabytes drained (`timeouts.body_idle`).
    blipless_supervise::pace::wake_per_window_step(&stream);
    let io = TokioIo::new(Prefixed {
        prefix,
        offset: 0,
        inner: Counted {
            inner: stream,
            identity: identity.clone(),
            unbilled_up,
            first_write: true,
            moved: moved.clone(),
        },
    });
    let service_context = context.clone();
    let service_connect = connect_slot.clone();
    let service_identity = identity.clone();
    let service_watch = watch.clone();
    let turns = Arc::new(Turns::default());
    let service_turns = turns.clone();
    let service = hyper::service::service_fn(move |request| {
        let context = service_context.clone();
        let identity = service_identity.clone();
        let connect_slot = service_connect.clone();
        let watch = service_watch.clone();
        let (request, turn) = service_turns.begin(request);
        let response: ResponseFuture = Box::pin(async move {
            let response =
                handle(request, context, identity, connect_slot, watch, id, source).await;
            Ok(turn.answer(response))
        });
        response
    });
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(context.handshake_timeout)
        .max_header_size(context.http_limits.header_bytes)
        .max_buf_size(context.http_limits.buffer_bytes())
        .keep_alive(true)
        // A client may shut its side down once its request is sent (`nc
        // -N`, an HTTPS client's close_notify): it still gets the answer.
        .half_close(true)
        .serve_connection(io, service);
    let serving_ended = context.serving_ended();
    tokio::pin!(serving_ended);
    let cut = context.cut_token();
    // The plane stopped serving and hyper was told to stop: it finishes the
    // exchange under way with keep-alive off, else closes at once.
    let mut stopping = false;
    // ...and, if the connection was between exchanges then ([`Turns`]), how
    // many exchanges had begun: it may move to a successor, or close
    // quietly, unless one began since (a request hyper had partly read when
    // told to stop is answered with keep-alive off and the connection
    // closed).
    let mut between_at_stop: Option<u64> = None;
    // Handing over, the plane waits for the exchange under way to end with
    // the connection kept alive, then stops it between exchanges: the
    // client keeps its connection across the deploy. Set while it waits,
    // with what ends the wait early (the plane stops handing over).
    let mut awaiting_turn: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = None;
    // A connection no request has authenticated on gets the handshake
    // timeout to do so, as a SOCKS5 one does: else 407s, one per request
    // head, or a client that stops reading them, would hold a slot and a
    // descriptor until the idle timeout, without any account.
    let unauthenticated_until = tokio::time::Instant::now() + context.handshake_timeout;
    let mut authenticated = identity.current().is_some();
    // A connection the plane cuts ends with a reset when an answer is under
    // way (its end must not read as the answer's: an HTTP/1.0 client's has
    // no length), or when one went out whose end is the connection's (its
    // last bytes may be given to hyper and not yet written), else with a
    // plain close.
    macro_rules! end_cut {
        () => {
            if watch.answer_unfinished() || turns.answer_close_delimited() {
                super::linger::reset(connection.into_parts().io.into_inner().inner.inner);
            }
        };
    }
    let result = loop {
        tokio::select! {
            () = tokio::time::sleep_until(unauthenticated_until), if !authenticated => {
                authenticated = identity.current().is_some();
                if !authenticated {
                    tracing::debug!(id, limit = ?context.handshake_timeout, "http connection closed: no request authenticated in time");
                    return None;
                }
            }
            result = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break result,
            () = &mut serving_ended, if !stopping && awaiting_turn.is_none() => {
                if context.mode() == Mode::Handover && may_hand_over && turns.in_exchange() {
                    awaiting_turn = Some(Box::pin(context.handover_ended()));
                } else {
                    stopping = true;
                    between_at_stop = turns.between().then(|| turns.begun());
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
            () = turns.exchange_ended(), if awaiting_turn.is_some() => {
                // A wake-up can be left from an earlier end, and a
                // pipelined request can begin as one ends: look again.
                if !turns.in_exchange() {
                    awaiting_turn = None;
                    stopping = true;
                    between_at_stop = turns.between().then(|| turns.begun());
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
            () = until(&mut awaiting_turn) => {
                awaiting_turn = None;
                if context.mode() == Mode::Serving {
                    // Its successor died: serving again, until the next
                    // deploy.
                    serving_ended.set(context.serving_ended());
                } else {
                    stopping = true;
                    between_at_stop = turns.between().then(|| turns.begun());
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
            () = cut.cancelled() => {
                end_cut!();
                return None;
            }
            () = moved.idle_for(context.idle_timeout) => {
                tracing::debug!(id, idle = ?context.idle_timeout, "http connection cut: no byte either way");
                end_cut!();
                return None;
            }
            stall = watch.stalled() => {
                // The answer has started: all we can do is end it.
                context.http_counters.body_stalls.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(id, ?stall, "response stalled; connection cut");
                end_cut!();
                return None;
            }
        }
    };
    let stopped_between = between_at_stop == Some(turns.begun()) && turns.between();
    if watch.answer_broken() {
        // An answer whose end is the connection's (HTTP/1.0) would read as
        // whole after a plain close: a reset says it was cut.
        tracing::debug!(id, "the origin's answer broke off; connection reset");
        super::linger::reset(connection.into_parts().io.into_inner().inner.inner);
        return None;
    }
    if let Err(error) = result {
        if error.is_parse() {
            // hyper has answered (431 for a head too large, 400 for one it
            // cannot read); with the client's unread bytes behind it, a
            // plain close would reset the connection and could lose that
            // answer.
            if error.is_parse_too_large() {
                context
                    .http_counters
                    .head_too_large
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    id,
                    limit = context.http_limits.header_bytes,
                    "request head too large; 431"
                );
            } else {
                tracing::debug!(id, %error, "malformed request; 400");
            }
            super::linger::linger_close(connection.into_parts().io.into_inner().inner.inner).await;
            return None;
        }
        tracing::debug!(id, %error, "http connection ended");
        return None;
    }
    let parts = connection.into_parts();
    let Prefixed {
        prefix,
        offset,
        inner,
    } = parts.io.into_inner();
    let pending = pending_in_order(&parts.read_buf, &prefix[offset..]);
    // What of `pending` the client was billed for as it was read (the
    // prefix by its `unbilled_up` or by the predecessor): a CONNECT's
    // tunnel bytes sent with its head. Bytes are billed in the order they
    // were read, so any still unbilled are the last.
    let billed = pending
        .len()
        .saturating_sub(usize::try_from(inner.unbilled_up).unwrap_or(usize::MAX));
    let mut stream = inner.inner;
    if watch.closing() {
        // Our last answer said `Connection: close` (408, 504).
        super::linger::linger_close(stream).await;
        return None;
    }
    let accepted = connect_slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(AcceptedConnect {
        egress,
        via,
        client,
        counted,
    }) = accepted
    {
        let tunnel = Tunnel::established(stream, egress, pending, billed);
        crate::conn::tunnel::run(
            context.clone(),
            MigrateKind::HttpTunnel,
            id,
            client,
            tunnel,
            may_hand_over,
            Some(crate::conn::tunnel::Admitted { counted, via }),
        )
        .await;
        return None;
    }
    // Only a connection stopped between exchanges moves: hyper ends one
    // whose last exchange was meant to be the last, or whose request body
    // it left unread, by itself (or after the exchange the plane stopped
    // it in), and its client waits for the close.
    if context.mode() == Mode::Handover && may_hand_over && stopped_between {
        // Paced like tunnels: one of the handover slots, held until
        // confirmed. The wait ends too when the plane stops handing over
        // (its successor died: served here again, or, finishing, closed) or
        // the drain's grace cuts what is left.
        let slot = tokio::select! {
            slot = context.handover_slot() => Some(slot),
            () = context.handover_ended() => None,
            () = cut.cancelled() => return None,
        };
        let Some(_slot) = slot else {
            if context.mode() == Mode::Finish {
                // Idle between requests: nothing unread to linger over.
                let _ = stream.shutdown().await;
                return None;
            }
            // Serving again (or, a new successor already, handing over
            // again): from the start, which serves it or hands it over.
            let adopted = Adopted {
                unbilled_up: (pending.len() - billed) as u64,
                prefix: pending,
                client: identity.current(),
                may_hand_over: true,
                source,
            };
            return Some((stream, adopted));
        };
        let name = identity.name().unwrap_or_default();
        let unbilled_up = (pending.len() - billed) as u64;
        let migrate = Migrate {
            kind: MigrateKind::HttpIdle,
            connection_id: id,
            client: name,
            up: Direction {
                pending,
                eof: false,
            },
            down: Direction::default(),
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        };
        match context.hand_over(migrate, &[stream.as_fd()]).await {
            Ok(()) => return None,
            // Its successor died before taking it: served here again, and
            // handed over at the next deploy.
            Err(NotHandedOver::NotTaken(migrate)) => {
                let adopted = Adopted {
                    prefix: migrate.up.pending,
                    unbilled_up,
                    client: identity.current(),
                    may_hand_over: true,
                    source,
                };
                return Some((stream, adopted));
            }
            Err(NotHandedOver::Kept(_) | NotHandedOver::NoPipe(_)) => {}
        }
    }
    if stopped_between {
        // Stopped between requests by the plane's drain (no successor to
        // take it): idle, nothing unread to linger over, and a finishing
        // plane should not wait on idle clients.
        let _ = stream.shutdown().await;
        return None;
    }
    // Not a plain close: when an answer went out before the request's body
    // was read (a 407, 403 or 502 for an upload), hyper stops reading, and
    // closing with the rest unread would reset the connection and could
    // lose the answer (RFC 9112 §9.6). A client that ended the connection
    // itself costs one read that finds the end.
    super::linger::linger_close(stream).await;
    None
}

/// What the client sent that hyper left unprocessed, in the order it was
/// sent: hyper's read buffer, then what of the prefix (the predecessor's
/// pending bytes, or this plane's first read) [`Prefixed`] never gave it.
/// `Prefixed` yields the prefix first, one read's room at a time, so while
/// any of it is left the read buffer holds only earlier prefix bytes.
fn pending_in_order(read_buf: &[u8], prefix_left: &[u8]) -> Vec<u8> {
    let mut pending = Vec::with_capacity(read_buf.len() + prefix_left.len());
    pending.extend_from_slice(read_buf);
    pending.extend_from_slice(prefix_left);
    pending
}

/// Completes when `future` does; never while there is none.
async fn until(future: &mut Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>) {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

async fn handle(
    request: Request<Received>,
    context: Arc<Context>,
    identity: Identity,
    connect_slot: ConnectSlot,
    watch: Arc<Watch>,
    id: u64,
    source: Option<IpAddr>,
) -> Response<Body> {
    let client = match authenticate(request.headers(), &context, source) {
        Ok(client) => client,
        Err(refusal) => {
            let mut response = refusal.response();
            let sent_credentials = request
                .headers()
                .contains_key(hyper::header::PROXY_AUTHORIZATION);
            if source.is_none() && sent_credentials {
                // No address to throttle: wrong credentials end the
                // connection, so guessing goes on only over new ones, which
                // have one. (Asking without any gets the usual challenge.)
                response
                    .headers_mut()
                    .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
                watch.close_after_answer();
            }
            return response;
        }
    };
    identity.set(client.clone());
    if request.method() == Method::CONNECT {
        connect(request, context, client, connect_slot, watch, id).await
    } else {
        forward(request, context, client, watch, id).await
    }
}

/// Why a request did not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Credentials missing, malformed or wrong: 407 with a challenge.
    Unauthenticated,
    /// The username at this source, or the whole source, is throttled for
    /// this much longer: 429 with `Retry-After`.
    Throttled(Duration),
}

impl Refusal {
    fn response(self) -> Response<Body> {
        match self {
            Refusal::Unauthenticated => {
                let mut response = plain(
                    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                    "proxy credentials required\n",
                );
                response.headers_mut().insert(
                    hyper::header::PROXY_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"blipless\""),
                );
                response
            }
            Refusal::Throttled(left) => {
                let mut response = plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many failed proxy logins; retry later\n",
                );
                let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                response.headers_mut().insert(
                    hyper::header::RETRY_AFTER,
                    HeaderValue::from(seconds.max(1)),
                );
                response
            }
        }
    }
}

/// Checks a request's `Proxy-Authorization: Basic` through the plane's auth
/// guard. A throttled username or source is refused (429) without its
/// credentials being checked; missing, malformed or wrong credentials are refused (407) and
/// counted (missing ones are no strike towards the throttle). With no
/// `source` known nothing is throttled, and failures are only counted.
fn authenticate(
    headers: &HeaderMap,
    context: &Context,
    source: Option<IpAddr>,
) -> Result<Arc<Client>, Refusal> {
    let header = headers.get(hyper::header::PROXY_AUTHORIZATION);
    let basic = header.and_then(|value| proxy_auth::parse_basic(value.as_bytes()));
    // Who the request logs in as, for the throttle: none without the header,
    // the empty name when it is not readable Basic.
    let username = header.map(|_| basic.as_ref().map_or(&b""[..], |c| c.user()));
    if let Some(source) = source {
        if let Verdict::Throttled { retry_after } =
            context
                .auth
                .check(source, Protocol::Http, username, Instant::now())
        {
            return Err(Refusal::Throttled(retry_after));
        }
    }
    let client = basic.as_ref().and_then(|credentials| {
        context
            .directory
            .authenticate(credentials.user(), credentials.password())
    });
    if let Some(client) = client {
        if let Some((source, username)) = source.zip(username) {
            context.auth.succeeded(source, username, Instant::now());
        }
        return Ok(client);
    }
    let failure = match (header, &basic) {
        (None, _) => Failure::Missing,
        (Some(_), None) => Failure::Wrong { username: None },
        (Some(_), Some(credentials)) => Failure::Wrong {
            username: Some(credentials.user()),
        },
    };
    match source {
        Some(source) => {
            context
                .auth
                .failed(source, Protocol::Http, failure, Instant::now());
        }
        None => context.auth.failed_unkeyed(Protocol::Http),
    }
    Err(Refusal::Unauthenticated)
}

/// The answer to a tunnel or request the client's limits refuse.
fn refused(refusal: super::caps::Refusal) -> Response<Body> {
    match refusal {
        super::caps::Refusal::TunnelCap(_) => plain(
            StatusCode::TOO_MANY_REQUESTS,
            "too many tunnels open for this client\n",
        ),
        super::caps::Refusal::OverQuota => plain(
            StatusCode::FORBIDDEN,
            "this client is over its quota for the current period\n",
        ),
    }
}

pub(super) fn plain(code: StatusCode, text: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    response
}

fn egress_failure(error: &EgressError) -> Response<Body> {
    match error {
        EgressError::Denied(_) => plain(StatusCode::FORBIDDEN, "destination not allowed\n"),
        EgressError::TimedOut(_) => {
            plain(StatusCode::GATEWAY_TIMEOUT, "destination did not answer\n")
        }
        EgressError::LocalResources(_) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "proxy out of resources, try again\n",
        ),
        EgressError::Upstream { error, .. } => plain(
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_GATEWAY),
            "upstream proxy failed or refused the destination\n",
        ),
        EgressError::NoRoute(_) => plain(
            StatusCode::BAD_GATEWAY,
            "no egress route is configured for this client\n",
        ),
        _ => plain(StatusCode::BAD_GATEWAY, "destination unreachable\n"),
    }
}

async fn connect(
    request: Request<Received>,
    context: Arc<Context>,
    client: Arc<Client>,
    connect_slot: ConnectSlot,
    watch: Arc<Watch>,
    id: u64,
) -> Response<Body> {
    let name = client.record.name.clone();
    let target_text = target::text(request.uri());
    let target = match http_target::parse_connect(&target_text) {
        Ok(destination) => target::egress_target(&destination),
        Err(error) => return target::refuse(&context, id, &name, &target_text, error),
    };
    let counted = match context.caps.check_tunnel(&client) {
        Ok(counted) => counted,
        Err(refusal) => {
            tracing::debug!(id, client = %name, ?refusal, "http connect refused: the client's limits");
            return refused(refusal);
        }
    };
    let connected = tokio::select! {
        connected = context.connect_for(&name, &target) => connected,
        // Removed (or its credentials changed) while its connect ran: not
        // a 200 for a tunnel that would be cut at once.
        () = client.revoked.cancelled() => return forward::revoked_answer(&watch),
    };
    let (egress, via) = match connected {
        Ok(connected) => connected,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "http connect failed: {error}");
            return egress_failure(&error);
        }
    };
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    // hyper answers 200, then `serve` takes the socket back and relays.
    *connect_slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(AcceptedConnect {
        egress,
        via,
        client,
        counted,
    });
    Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    /// A prefix longer than one read: hyper's buffer holds its start, the
    /// prefix keeps its end; put together they are the stream as sent.
    #[tokio::test]
    async fn pending_bytes_keep_the_order_they_were_sent_in() {
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let (mut near, far) = tokio::io::duplex(64);
        drop(far);
        let mut prefixed = super::Prefixed {
            prefix: sent.clone(),
            offset: 0,
            inner: &mut near,
        };
        let mut read_buf = vec![0u8; 8192];
        prefixed
            .read_exact(&mut read_buf)
            .await
            .expect("one read's room");
        let left = &prefixed.prefix[prefixed.offset..];
        assert_eq!(super::pending_in_order(&read_buf, left), sent);
    }
}
