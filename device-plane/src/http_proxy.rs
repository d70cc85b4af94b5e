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
use crate::egress::{EgressError, Target};
use crate::relay::Tunnel;
use crate::serve::{Context, Mode};

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
        crate::tunnel::run(
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

async fn forward(
    mut request: Request<Incoming>,
    context: Arc<Context>,
    client: Arc<Client>,
    id: u64,
) -> Response<Body> {
    let uri = request.uri().clone();
    if uri.scheme_str() != Some("http") {
        return plain(
            StatusCode::BAD_REQUEST,
            "this is a proxy: send absolute-form http:// requests, or CONNECT for anything else\n",
        );
    }
    let Some(target) = uri
        .authority()
        .and_then(|a| parse_authority(a.as_str(), Some(80)))
    else {
        return plain(StatusCode::BAD_REQUEST, "request needs a host\n");
    };
    let name = client.record.name.clone();
    let egress = match context.connect_for(&name, &target).await {
        Ok(egress) => egress,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "http forward failed: {error}");
            return egress_failure(&error);
        }
    };
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(egress)).await {
            Ok(pair) => pair,
            Err(_) => return plain(StatusCode::BAD_GATEWAY, "destination unreachable\n"),
        };
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(id, %error, "origin connection ended");
        }
    });
    // Origin-form toward the origin, hop-by-hop headers stripped.
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    match path.parse() {
        Ok(origin_form) => *request.uri_mut() = origin_form,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "bad request target\n"),
    }
    strip_hop_by_hop(request.headers_mut());
    if let Some(authority) = uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            request
                .headers_mut()
                .entry(hyper::header::HOST)
                .or_insert(host);
        }
    }
    match sender.send_request(request).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(error) => {
            tracing::info!(id, %error, "origin failed mid-request");
            plain(StatusCode::BAD_GATEWAY, "destination failed\n")
        }
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for name in HOP_BY_HOP.iter().copied().map(String::from).chain(named) {
        headers.remove(name.as_str());
    }
}

/// The client socket, counting bytes into the client's meter once known.
struct Counted {
    inner: TcpStream,
    identity: Identity,
    /// Bytes read before any request authenticated (the first request's
    /// head, usually): billed to the first client that does.
    unbilled_up: u64,
}

impl Counted {
    /// Counts `up` and `down` bytes, carrying reads over until a client is known.
    fn count(&mut self, up: u64, down: u64) {
        let Some(client) = self.identity.get().cloned() else {
            self.unbilled_up += up;
            return;
        };
        let up = up + std::mem::take(&mut self.unbilled_up);
        if up > 0 {
            client.meter.up.fetch_add(up, Ordering::Relaxed);
        }
        if down > 0 {
            client.meter.down.fetch_add(down, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let read = (buf.filled().len() - before) as u64;
            self.count(read, 0);
        }
        poll
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &poll {
            let written = *n as u64;
            self.count(0, written);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A socket that first yields bytes a predecessor read from it already.
struct Prefixed<T> {
    prefix: Vec<u8>,
    offset: usize,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let take = buf.remaining().min(self.prefix.len() - self.offset);
            let from = self.offset;
            buf.put_slice(&self.prefix[from..from + take]);
            self.offset += take;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
