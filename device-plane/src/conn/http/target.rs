//! Request targets, between hyper and the egress: parsed by the sans-IO
//! [`blipless_protocol::http_target`] before anything is resolved, refused
//! with 400 when they cannot be served, and only ever logged redacted.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use blipless_protocol::http_target::{self, Destination, Host, TargetError};
use hyper::{StatusCode, Uri};

use super::{plain, Body};
use crate::conn::Context;
use crate::egress::Target;

/// The request target as hyper read it (absolute-form, or CONNECT's
/// authority), to be parsed again by our own rules. Never log it as is:
/// [`http_target::redact`] it.
pub(super) fn text(uri: &Uri) -> String {
    uri.to_string()
}

/// Where the egress connects for a destination.
pub(super) fn egress_target(destination: &Destination) -> Target {
    match &destination.host {
        Host::Ip(ip) => Target::Address(SocketAddr::new(*ip, destination.port)),
        Host::Name(name) => Target::Name {
            host: name.clone(),
            port: destination.port,
        },
    }
}

/// The 400 for a target we do not serve, logged (redacted) at debug level:
/// a client's malformed request is not the operator's concern, and hyper
/// does not log its own 400s either.
pub(super) fn refuse(
    context: &Context,
    id: u64,
    client: &str,
    target: &str,
    error: TargetError,
) -> hyper::Response<Body> {
    let target = http_target::redact(target);
    tracing::debug!(id, client, %target, "request target refused: {error}");
    match error {
        TargetError::Userinfo => {
            context
                .http_counters
                .userinfo_refused
                .fetch_add(1, Ordering::Relaxed);
            plain(
                StatusCode::BAD_REQUEST,
                "credentials (user:password@) are not allowed in the request target\n",
            )
        }
        TargetError::UnsupportedScheme | TargetError::NotAbsolute => plain(
            StatusCode::BAD_REQUEST,
            "this is a proxy: send absolute-form http:// requests, or CONNECT for anything else\n",
        ),
        TargetError::MissingPort | TargetError::NotAuthority => {
            plain(StatusCode::BAD_REQUEST, "CONNECT needs host:port\n")
        }
        _ => plain(
            StatusCode::BAD_REQUEST,
            "request needs a valid host and port\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_become_egress_targets() {
        let named = http_target::parse_connect("example.com:443").expect("valid");
        assert_eq!(
            egress_target(&named),
            Target::Name {
                host: "example.com".into(),
                port: 443
            }
        );
        let literal = http_target::parse_connect("[::1]:8080").expect("valid");
        assert_eq!(
            egress_target(&literal),
            Target::Address("[::1]:8080".parse().expect("address"))
        );
    }

    #[test]
    fn hyper_gives_back_the_target_as_sent() {
        for target in [
            "http://u:pw@127.0.0.1:8080/x?y",
            "http://h:81/",
            "example.com:443",
        ] {
            let uri: Uri = target.parse().expect("hyper parses it");
            assert_eq!(text(&uri), target);
        }
        let uri: Uri = "http://h".parse().expect("hyper parses it");
        assert_eq!(
            http_target::parse_absolute(&text(&uri)).map(|f| f.origin_form),
            Ok("/".to_owned())
        );
    }
}
