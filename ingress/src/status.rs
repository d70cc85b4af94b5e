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

/// Serves status requests until `shutdown`.
pub async fn serve(listener: TcpListener, node: Arc<Node>, shutdown: CancellationToken) {
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
        let node = node.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let node = node.clone();
                async move { Ok::<_, Infallible>(respond(&node, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = connection.await {
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
