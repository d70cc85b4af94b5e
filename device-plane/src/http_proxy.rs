//! An HTTP proxy connection: CONNECT tunnels and absolute-form requests,
//! with `Proxy-Authorization: Basic` on every request, on a kept-alive
//! client connection.
//!
//! hyper parses and answers malformed requests (400) itself. We answer 407
//! for missing or wrong credentials, 403 for a destination the policy
//! refuses, 502 for one that cannot be reached, 504 for one that does not
//! answer in time.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::clients::{Client, Meter};
use crate::egress::{EgressError, Target};
use crate::relay::relay;
use crate::serve::Context;

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

/// Serves one HTTP proxy customer connection to its end.
pub async fn serve(stream: TcpStream, context: Arc<Context>, id: u64) {
    // Usage is counted on the client socket once a request authenticates.
    let meter_slot: Arc<OnceLock<Arc<Meter>>> = Arc::new(OnceLock::new());
    let io = TokioIo::new(Counted {
        inner: stream,
        meter: meter_slot.clone(),
    });
    let service_context = context.clone();
    let service = hyper::service::service_fn(move |request| {
        let context = service_context.clone();
        let meter_slot = meter_slot.clone();
        async move { Ok::<_, Infallible>(handle(request, context, meter_slot, id).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(context.handshake_timeout)
        .keep_alive(true)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = context.draining.cancelled() => {
            // Finish the request in flight, then close instead of idling.
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                result = connection.as_mut() => result,
                () = context.cut_all.cancelled() => return,
            }
        }
        () = context.cut_all.cancelled() => return,
    };
    if let Err(error) = result {
        tracing::debug!(id, %error, "http connection ended");
    }
}

async fn handle(
    request: Request<Incoming>,
    context: Arc<Context>,
    meter_slot: Arc<OnceLock<Arc<Meter>>>,
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
    let _ = meter_slot.set(client.meter.clone());
    if request.method() == Method::CONNECT {
        connect(request, context, client, id).await
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
    let egress = match context.egress.connect(&name, &target).await {
        Ok(egress) => egress,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "http connect failed: {error}");
            return egress_failure(&error);
        }
    };
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    let tunnel_context = context.clone();
    context.connections.spawn(async move {
        let upgraded = match hyper::upgrade::on(request).await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(id, %error, "CONNECT upgrade failed");
                return;
            }
        };
        // The client socket is already metered (Counted): count nothing twice.
        let unmetered = Meter::default();
        let cut = tunnel_context.cut_all.child_token();
        let end = tokio::select! {
            end = relay(TokioIo::new(upgraded), egress, &[], &unmetered, tunnel_context.idle_timeout, &cut) => end,
            () = client.revoked.cancelled() => crate::relay::RelayEnd::Cut,
        };
        tracing::debug!(id, client = %name, %target, ?end, "http tunnel closed");
    });
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
    let egress = match context.egress.connect(&name, &target).await {
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
    meter: Arc<OnceLock<Arc<Meter>>>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(meter)) = (&poll, self.meter.get()) {
            meter
                .up
                .fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
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
        if let (Poll::Ready(Ok(n)), Some(meter)) = (&poll, self.meter.get()) {
            meter.down.fetch_add(*n as u64, Ordering::Relaxed);
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
