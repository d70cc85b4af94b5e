//! An HTTP proxy connection: CONNECT tunnels and absolute-form requests,
//! with `Proxy-Authorization: Basic` on every request, on a kept-alive
//! client connection.
//!
//! hyper parses and answers malformed requests (400) itself. We answer 407
//! for missing or wrong credentials, 403 for a destination the policy
//! refuses, 502 for one that cannot be reached, 504 for one that does not
//! answer in time.

use std::convert::Infallible;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context as TaskContext, Poll};

use base64::Engine as _;
use blipless_protocol::channel::{Direction, Migrate, MigrateKind};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::clients::Client;
use crate::conn::tunnel::Tunnel;
use crate::conn::{Context, Mode};
use crate::egress::{EgressError, Target};

mod forward;
mod io;

use forward::forward;
use io::{Counted, Prefixed};

type Body = BoxBody<Bytes, hyper::Error>;

/// Headers that belong to one hop and are not forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// A CONNECT the service accepted: the tunnel starts once hyper has sent
/// the 200 and given the socket back.
struct AcceptedConnect {
    egress: TcpStream,
    client: Arc<Client>,
}

type ConnectSlot = Arc<Mutex<Option<AcceptedConnect>>>;

/// The client billed for a connection's bytes, once one authenticated.
type Identity = Arc<OnceLock<Arc<Client>>>;

type ResponseFuture =
    Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// What a predecessor handed over with a connection (empty for a new one).
#[derive(Debug)]
pub struct Adopted {
    /// Bytes the predecessor read from the client and did not process.
    pub prefix: Vec<u8>,
    /// The client that authenticated on it, if any.
    pub client: Option<Arc<Client>>,
    /// False when it came back from a handover that found no successor.
    pub may_hand_over: bool,
}

impl Adopted {
    /// A connection nobody else has served.
    pub fn fresh() -> Self {
        Self {
            prefix: Vec::new(),
            client: None,
            may_hand_over: true,
        }
    }
}

/// Serves one HTTP proxy customer connection to its end.
pub async fn serve(stream: TcpStream, adopted: Adopted, context: Arc<Context>, id: u64) {
    let Adopted {
        prefix,
        client: known,
        may_hand_over,
    } = adopted;
    // Usage is counted on the client socket once a request authenticates
    // (the first client to authenticate on a connection is the one billed).
    let identity: Identity = Arc::new(OnceLock::new());
    if let Some(client) = known {
        let _ = identity.set(client);
    }
    let connect_slot: ConnectSlot = Arc::new(Mutex::new(None));
    let io = TokioIo::new(Prefixed {
        prefix,
        offset: 0,
        inner: Counted {
            inner: stream,
            identity: identity.clone(),
            unbilled_up: 0,
        },
    });
    let service_context = context.clone();
    let service_connect = connect_slot.clone();
    let service_identity = identity.clone();
    let service = hyper::service::service_fn(move |request| {
        let context = service_context.clone();
        let identity = service_identity.clone();
        let connect_slot = service_connect.clone();
        let response: ResponseFuture =
            Box::pin(async move { Ok(handle(request, context, identity, connect_slot, id).await) });
        response
    });
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(context.handshake_timeout)
        .keep_alive(true)
        .serve_connection(io, service);
    let serving_ended = context.serving_ended();
    tokio::pin!(serving_ended);
    let cut = context.cut_token();
    let mut stopping = false;
    let result = loop {
        tokio::select! {
            result = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break result,
            () = &mut serving_ended, if !stopping => {
                // Finish the request in flight, then stop between requests.
                stopping = true;
                Pin::new(&mut connection).graceful_shutdown();
            }
            () = cut.cancelled() => return,
        }
    };
    if let Err(error) = result {
        tracing::debug!(id, %error, "http connection ended");
        return;
    }
    let parts = connection.into_parts();
    let Prefixed {
        prefix,
        offset,
        inner,
    } = parts.io.into_inner();
    let mut pending = prefix[offset..].to_vec();
    pending.extend_from_slice(&parts.read_buf);
    let mut stream = inner.inner;
    let accepted = connect_slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(AcceptedConnect { egress, client }) = accepted {
        let tunnel = Tunnel::established(stream, egress, pending);
        crate::conn::tunnel::run(
            context,
            MigrateKind::HttpTunnel,
            id,
            client,
            tunnel,
            may_hand_over,
        )
        .await;
        return;
    }
    if context.mode() == Mode::Handover && may_hand_over {
        // Paced like tunnels: one of the handover slots, held until confirmed.
        let _slot = context.handover_slot().await;
        let name = identity
            .get()
            .map(|client| client.record.name.clone())
            .unwrap_or_default();
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
        };
        if context.hand_over(migrate, &[stream.as_fd()]).await.is_ok() {
            return;
        }
    }
    let _ = stream.shutdown().await;
}

async fn handle(
    request: Request<Incoming>,
    context: Arc<Context>,
    identity: Identity,
    connect_slot: ConnectSlot,
    id: u64,
) -> Response<Body> {
    let Some(client) = authenticate(request.headers(), &context) else {
        let mut response = plain(
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "proxy credentials required\n",
        );
        response.headers_mut().insert(
            hyper::header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"blipless\""),
        );
        return response;
    };
    let _ = identity.set(client.clone());
    if request.method() == Method::CONNECT {
        connect(request, context, client, connect_slot, id).await
    } else {
        forward(request, context, client, id).await
    }
}

fn authenticate(headers: &HeaderMap, context: &Context) -> Option<Arc<Client>> {
    let value = headers
        .get(hyper::header::PROXY_AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    context
        .directory
        .authenticate(&decoded[..colon], &decoded[colon + 1..])
}

fn plain(code: StatusCode, text: &'static str) -> Response<Body> {
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
        _ => plain(StatusCode::BAD_GATEWAY, "destination unreachable\n"),
    }
}

/// Splits "host:port" (with [v6] brackets) into a target.
fn parse_authority(authority: &str, default_port: Option<u16>) -> Option<Target> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, _)) if !host.ends_with(']') && host.contains(':') => (authority, default_port?),
        Some((host, port)) => (host, port.parse().ok()?),
        None => (authority, default_port?),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some(match host.parse() {
        Ok(ip) => Target::Address(std::net::SocketAddr::new(ip, port)),
        Err(_) => Target::Name {
            host: host.to_string(),
            port,
        },
    })
}

async fn connect(
    request: Request<Incoming>,
    context: Arc<Context>,
    client: Arc<Client>,
    connect_slot: ConnectSlot,
    id: u64,
) -> Response<Body> {
    let Some(target) = request
        .uri()
        .authority()
        .and_then(|a| parse_authority(a.as_str(), None))
    else {
        return plain(StatusCode::BAD_REQUEST, "CONNECT needs host:port\n");
    };
    let name = client.record.name.clone();
    let egress = match context.connect_for(&name, &target).await {
        Ok(egress) => egress,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "http connect failed: {error}");
            return egress_failure(&error);
        }
    };
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    // hyper answers 200, then `serve` takes the socket back and relays.
    *connect_slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) =
        Some(AcceptedConnect { egress, client });
    Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse() {
        let t = |s, d| parse_authority(s, d);
        assert_eq!(
            t("example.com:443", None),
            Some(Target::Name {
                host: "example.com".into(),
                port: 443
            })
        );
        assert_eq!(
            t("example.com", Some(80)),
            Some(Target::Name {
                host: "example.com".into(),
                port: 80
            })
        );
        assert_eq!(t("example.com", None), None);
        assert_eq!(
            t("[::1]:8080", None),
            Some(Target::Address("[::1]:8080".parse().expect("addr")))
        );
        assert_eq!(
            t("127.0.0.1:80", None),
            Some(Target::Address("127.0.0.1:80".parse().expect("addr")))
        );
        assert_eq!(t(":80", None), None);
        assert_eq!(t("host:notaport", None), None);
    }
}
