//! What the plane tells the ingress about its routes, for `/status`,
//! `blipless-ctl egress` and `/metrics`.

use std::sync::atomic::Ordering;

use blipless_protocol::channel::RouteReport;

use super::routes::{RouteKind, Routes};
use crate::identity::Identities;

/// Every route of the node with its health and how many windows hold it.
pub fn routes(routes: &Routes, identities: &Identities) -> Vec<RouteReport> {
    let members = identities.window_members();
    routes
        .all()
        .filter(|route| !routes.upstreams().is_empty() || route.name == super::routes::DIRECT)
        .map(|route| RouteReport {
            name: route.name.clone(),
            kind: match route.kind {
                RouteKind::Direct => "direct".into(),
                RouteKind::Socks5 { .. } => "socks5".into(),
                RouteKind::Wireguard(_) => "wireguard".into(),
            },
            up: route.is_up(),
            latency_us: route.latency_us(),
            error: route.last_error(),
            // A node without upstreams keeps no windows: every client with
            // an identity open here goes direct.
            clients: if routes.upstreams().is_empty() {
                identities.live()
            } else {
                members.get(&route.name).copied().unwrap_or(0)
            },
            opened: route.opened.load(Ordering::Relaxed),
            downs: route.downs.load(Ordering::Relaxed),
        })
        .collect()
}
