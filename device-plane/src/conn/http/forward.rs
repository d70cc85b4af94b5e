//! Absolute-form requests (`GET http://host/path`): sent on to the origin
//! over a fresh egress connection, hop-by-hop headers stripped, the answer
//! streamed back.

use super::*;

pub(super) async fn forward(
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
