//! Absolute-form requests (`GET http://host/path`): sent on to the origin
//! in origin form over a fresh egress connection, with `Host` replaced from
//! the request target (RFC 9112 §3.2.2) and hop-by-hop headers stripped; the
//! answer streamed back.
//!
//! The exchange runs under `timeouts.response` and `timeouts.body_idle`
//! ([`super::exchange`]): before the origin's response head, a missed
//! deadline is answered here (408 for a client too slow with its body, 504
//! for an origin that does not answer or read), with `Connection: close`;
//! after it, the connection's [`Watch`] cuts the connection. Either way the
//! origin socket is closed as the exchange ends. So it is when the client is
//! removed or its credentials change (its `revoked` token), as its tunnels
//! are.

use tokio_util::sync::CancellationToken;

use super::exchange::{request_body, response_body, Exchange, OriginGuard, Stall, Watch};
use super::*;

pub(super) async fn forward(
    request: Request<super::turns::Received>,
    context: Arc<Context>,
    client: Arc<Client>,
    watch: Arc<Watch>,
    id: u64,
) -> Response<Body> {
    let name = client.record.name.clone();
    let target_text = target::text(request.uri());
    let parsed = match http_target::parse_absolute(&target_text) {
        Ok(parsed) => parsed,
        Err(error) => return target::refuse(&context, id, &name, &target_text, error),
    };
    let origin_form = match parsed.origin_form.parse() {
        Ok(origin_form) => origin_form,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "bad request target\n"),
    };
    let Ok(host) = HeaderValue::from_str(&parsed.host_header) else {
        return plain(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    if asks_for_websocket(request.version(), request.headers()) {
        // Forwarded, its Upgrade stripped, it reached the origin as a plain
        // GET, whose 400 or 426 said nothing of the proxy.
        tracing::debug!(id, client = %name, "websocket upgrade in absolute form; 501");
        return plain(
            StatusCode::NOT_IMPLEMENTED,
            "WebSocket through this proxy: use CONNECT (for ws:// too)\n",
        );
    }
    let target = target::egress_target(&parsed.destination);
    // A forwarded request holds an egress connection while it runs: it
    // counts against the client's connection cap as a tunnel does
    // (docs/LIMITS.md, "Connection caps"), held by the origin connection.
    let counted = match context.caps.check_tunnel(&client) {
        Ok(counted) => counted,
        Err(refusal) => {
            tracing::debug!(id, client = %name, ?refusal, "http request refused: the client's limits");
            return refused(refusal);
        }
    };
    let (egress, via) = match context.connect_for(&name, &target).await {
        Ok(connected) => connected,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "http forward failed: {error}");
            return egress_failure(&error);
        }
    };
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    // Through an upstream, the exchange ends when the upstream goes down
    // (docs/EGRESS.md, "Failover"), as a tunnel does.
    let route_down = via.until_down(&context.egress.routes, &egress);
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(
        super::throttled::Throttled::new(egress, client.limiter.clone()),
    ))
    .await
    {
        Ok(pair) => pair,
        Err(_) => return plain(StatusCode::BAD_GATEWAY, "destination unreachable\n"),
    };
    // The origin connection lives as long as the exchange: dropping the
    // guard (an early answer here, or the response body done or dropped)
    // closes it.
    let origin = CancellationToken::new();
    let origin_over = origin.clone();
    let over_quota = client.limiter.over_quota_token();
    let revoked = client.revoked.clone();
    tokio::spawn(async move {
        tokio::select! {
            result = connection => {
                if let Err(error) = result {
                    tracing::debug!(id, %error, "origin connection ended");
                }
            }
            () = origin_over.cancelled() => {}
            () = route_down => {
                tracing::info!(id, "http exchange cut: its upstream went down");
            }
            () = over_quota.cancelled() => {
                tracing::info!(id, "http exchange cut: its client is over its quota");
            }
            () = revoked.cancelled() => {
                tracing::info!(id, "http exchange cut: its client was removed or its credentials changed");
            }
        }
    });
    let origin_guard = OriginGuard {
        _connection: origin.drop_guard(),
        _counted: counted,
    };
    // Told apart from the origin's failure below: a quota reached while the
    // origin answers is the client's limit, not the origin's fault.
    let quota_reached = client.limiter.over_quota_token();
    // Origin form toward the origin, hop-by-hop headers stripped, Host from
    // the target whatever the client sent.
    let (mut parts, body) = request.into_parts();
    parts.uri = origin_form;
    // Our own version toward the origin, as toward the client below (RFC
    // 9110 §6.2: an intermediary sends its own).
    parts.version = hyper::Version::HTTP_11;
    let asks_for_trailers = asks_for_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if asks_for_trailers {
        // The client takes trailer fields, and so do we (hyper passes them
        // on): the origin is told on this hop (RFC 9110 §10.1.4).
        parts
            .headers
            .insert(hyper::header::TE, HeaderValue::from_static("trailers"));
        parts
            .headers
            .append(hyper::header::CONNECTION, HeaderValue::from_static("te"));
    }
    parts.headers.insert(hyper::header::HOST, host);
    let exchange = Exchange::new(context.http_limits);
    let request = Request::from_parts(parts, request_body(body, exchange.clone()));
    // The revocation first: it also cuts the origin connection, and the
    // request's failure that follows must not be taken for the origin's.
    let answer = tokio::select! {
        biased;
        () = client.revoked.cancelled() => return revoked_answer(&watch),
        answer = sender.send_request(request) => answer,
        stall = exchange.stalled() => return missed(stall, &context, &watch, id),
    };
    match answer {
        // Upgrade was stripped from the request, so a 101 is the origin's
        // mistake: passed on, it ended the customer's connection (hyper
        // takes it as the last answer) or left its next bytes unparsed.
        Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            tracing::debug!(id, "origin switched protocols unasked; 502");
            let mut response = plain(
                StatusCode::BAD_GATEWAY,
                "destination switched protocols (use CONNECT for WebSocket)\n",
            );
            response
                .headers_mut()
                .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            watch.close_after_answer();
            response
        }
        Ok(response) => {
            exchange.answered();
            watch.follow(exchange.clone());
            let (mut parts, body) = response.into_parts();
            // An HTTP/1.0 origin's answer goes out as ours, HTTP/1.1 (hyper
            // says 1.0 to a 1.0 client itself): passed on as 1.0, it made
            // hyper end a keep-alive client's connection after it.
            parts.version = hyper::Version::HTTP_11;
            // Both framings (RFC 9112 §6.3): hyper decoded the body as
            // chunked and refuses to send both, so the client got nothing
            // at all; an intermediary removes Content-Length. Looked at
            // before the hop-by-hop headers go: an origin that names
            // Transfer-Encoding in Connection must not leave a stale length.
            let chunked = parts.headers.contains_key(hyper::header::TRANSFER_ENCODING);
            strip_hop_by_hop(&mut parts.headers);
            if chunked {
                parts.headers.remove(hyper::header::CONTENT_LENGTH);
            }
            let body = response_body(body, exchange, origin_guard);
            Response::from_parts(parts, body.boxed())
        }
        Err(_) if client.revoked.is_cancelled() => revoked_answer(&watch),
        Err(_) if quota_reached.is_cancelled() => {
            tracing::debug!(id, "client over its quota mid-request; 403");
            let mut response = refused(crate::conn::caps::Refusal::OverQuota);
            response
                .headers_mut()
                .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            watch.close_after_answer();
            response
        }
        // The client's own body failed (malformed chunks, or shorter than
        // its Content-Length): a 400 and a close, not the origin's 502.
        Err(error) if exchange.request_failed() => {
            tracing::debug!(id, %error, "request body unreadable; 400");
            let mut response = plain(StatusCode::BAD_REQUEST, "request body unreadable\n");
            response
                .headers_mut()
                .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            watch.close_after_answer();
            response
        }
        Err(error) => {
            tracing::info!(id, %error, "origin failed mid-request");
            plain(StatusCode::BAD_GATEWAY, "destination failed\n")
        }
    }
}

/// The answer to a deadline missed before the origin answered; the
/// connection closes after it.
fn missed(stall: Stall, context: &Context, watch: &Watch, id: u64) -> Response<Body> {
    let counters = &context.http_counters;
    let mut response = match stall {
        Stall::ClientBody => {
            counters.body_stalls.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(id, "request body too slow; 408");
            plain(StatusCode::REQUEST_TIMEOUT, "request body too slow\n")
        }
        Stall::OriginIntake | Stall::Response | Stall::ResponseBody => {
            counters.response_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(id, ?stall, "origin did not answer in time; 504");
            plain(
                StatusCode::GATEWAY_TIMEOUT,
                "destination did not answer in time\n",
            )
        }
    };
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    watch.close_after_answer();
    response
}

/// The answer to an exchange whose client was removed, or whose
/// credentials changed, before the origin answered (docs/OPERATIONS.md,
/// "Removing a client"): authenticate again, on a new connection; this one closes.
/// After the answer has started, cutting the origin connection ends the
/// response body, and hyper the connection with it.
pub(super) fn revoked_answer(watch: &Watch) -> Response<Body> {
    let mut response = plain(
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        "these proxy credentials are no longer valid\n",
    );
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"blipless\""),
    );
    headers.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    watch.close_after_answer();
    response
}

/// Whether the request's `TE` lists `trailers` (RFC 9110 §10.1.4; it takes
/// no parameters, and hyper writes trailers to the client only for the bare
/// token): the client will take the answer's trailer fields. Its other
/// codings are this hop's and are not passed on.
fn asks_for_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(hyper::header::TE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
        .any(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"trailers"))
}

/// Whether the request asks to switch to WebSocket (`Upgrade: websocket`,
/// named in `Connection`, over HTTP/1.1: RFC 9110 §7.8 has an upgrade
/// ignored otherwise), which is not forwarded; other upgrades (h2c) are
/// optional for the client, which goes on in HTTP/1.1 when the Upgrade is
/// dropped.
fn asks_for_websocket(version: hyper::Version, headers: &HeaderMap) -> bool {
    let upgrade_named = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
        .any(|name| name.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    version >= hyper::Version::HTTP_11
        && upgrade_named
        && headers
            .get_all(hyper::header::UPGRADE)
            .iter()
            .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
            .any(|protocol| {
                let protocol = protocol.trim_ascii();
                let name = protocol
                    .split(|byte| *byte == b'/')
                    .next()
                    .unwrap_or(protocol);
                name.eq_ignore_ascii_case(b"websocket")
            })
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    // Split as bytes: one byte that is not text in the value must not hide
    // the names beside it.
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|byte| *byte == b','))
        .filter_map(|name| std::str::from_utf8(name).ok())
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    for name in HOP_BY_HOP.iter().copied().map(String::from).chain(named) {
        headers.remove(name.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn a_websocket_upgrade_is_told_from_what_only_looks_like_one() {
        use hyper::Version;
        let asks = |version, fields: &[(&'static str, &'static str)]| {
            asks_for_websocket(version, &headers(fields))
        };
        let upgrade = [
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
        ];
        assert!(asks(Version::HTTP_11, &upgrade));
        assert!(asks(
            Version::HTTP_11,
            &[("connection", "upgrade"), ("upgrade", "h2c, websocket/13")]
        ));
        // Not named in Connection, or over HTTP/1.0: no upgrade at all.
        assert!(!asks(Version::HTTP_11, &[("upgrade", "websocket")]));
        assert!(!asks(Version::HTTP_10, &upgrade));
        // Another protocol, or one that only begins like it.
        assert!(!asks(
            Version::HTTP_11,
            &[("connection", "upgrade"), ("upgrade", "h2c")]
        ));
        assert!(!asks(
            Version::HTTP_11,
            &[("connection", "upgrade"), ("upgrade", "websockets")]
        ));
    }

    #[test]
    fn te_trailers_is_found_among_other_codings() {
        assert!(asks_for_trailers(&headers(&[("te", "trailers")])));
        assert!(asks_for_trailers(&headers(&[(
            "te",
            "gzip;q=0.5, Trailers"
        )])));
        assert!(asks_for_trailers(&headers(&[
            ("te", "gzip"),
            ("te", "trailers")
        ])));
        assert!(!asks_for_trailers(&headers(&[("te", "gzip, deflate")])));
        assert!(!asks_for_trailers(&headers(&[("te", "trailersx")])));
        assert!(!asks_for_trailers(&headers(&[("te", "trailers;q=0")])));
        assert!(!asks_for_trailers(&HeaderMap::new()));
    }

    #[test]
    fn trailer_is_end_to_end_and_te_is_not() {
        let mut fields = headers(&[
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
        ]);
        strip_hop_by_hop(&mut fields);
        assert_eq!(
            fields.get("trailer").map(|v| v.as_bytes()),
            Some(&b"x-sum"[..])
        );
        for gone in ["te", "connection", "x-hop", "keep-alive"] {
            assert!(fields.get(gone).is_none(), "{gone} passed on");
        }
    }
}
