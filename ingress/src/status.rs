//! The status listener: `/status` for load balancers, `/metrics` for Prometheus.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::node::{Node, Readiness};

/// `/metrics`' content type: prometheus-client writes OpenMetrics 1.0 text.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Status connections served at once; one more is closed when accepted.
const MAX_CONNECTIONS: usize = 256;
/// A status connection is asked to close after this long: it closes between
/// requests (a scraper's or a load balancer's kept-alive connection simply
/// reconnects) ...
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// ... and is cut if it has not closed this much later (a client that sent
/// requests and stopped reading the answers).
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// Serves status requests until `shutdown`. Each connection is bounded in
/// time ([`CONNECTION_LIFETIME`], [`CLOSE_GRACE`]) and their number by
/// [`MAX_CONNECTIONS`]: the listener shares the ingress's descriptors with
/// the customers'.
pub async fn serve(listener: TcpListener, node: Arc<Node>, shutdown: CancellationToken) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "status accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(
                max = MAX_CONNECTIONS,
                "status connection closed: too many open"
            );
            continue;
        };
        let node = node.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request| {
                let node = node.clone();
                async move { Ok::<_, Infallible>(respond(&node, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = tokio::time::sleep(CONNECTION_LIFETIME) => {
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await {
                        Ok(ended) => ended,
                        Err(_) => {
                            tracing::debug!("status connection cut: still busy after being asked to close");
                            return;
                        }
                    }
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "status connection ended");
            }
        });
    }
}

fn respond(node: &Node, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET\n".into(),
            "text/plain",
        );
    }
    match request.uri().path() {
        "/status" => {
            let readiness = node.readiness();
            let code = if readiness == Readiness::Ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            // The word first, as load balancers read it; then each egress
            // route that is down, for an operator (it does not change the
            // code: the node serves through the routes that are up).
            let mut body = format!("{}\n", readiness.as_str());
            for route in node.routes_down() {
                body.push_str(&format!(
                    "upstream {} down: {}\n",
                    route.name,
                    route.error.as_deref().unwrap_or("not answering")
                ));
            }
            // Which builds run, so the old and the new plane of a deploy
            // can be told apart.
            body.push_str(&format!("ingress {}\n", blipless_config::build::VERSION));
            let report = node.status_report();
            if let Some(tls) = report.tls {
                body.push_str(&format!(
                    "tls certificate expires {} (in {} days)\n",
                    tls.not_after,
                    tls.expires_in_seconds.div_euclid(86_400)
                ));
            }
            for plane in report.device_planes {
                body.push_str(&format!(
                    "device plane {} {}: {}\n",
                    plane.generation, plane.state, plane.software
                ));
            }
            text(code, body, "text/plain")
        }
        "/metrics" => text(
            StatusCode::OK,
            node.render_metrics(),
            // What prometheus-client writes: OpenMetrics 1.0 text.
            METRICS_CONTENT_TYPE,
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "try /status or /metrics\n".into(),
            "text/plain",
        ),
    }
}

fn text(code: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
