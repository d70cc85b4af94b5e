//! Which route an egress socket left by, and waiting for that route to go
//! down (docs/EGRESS.md, "Failover": orphans fail fast).
//!
//! A connection made on this plane knows its route ([`Via::Route`]), so
//! two upstreams on one gateway `host:port` (differing by login) are told
//! apart: one going down closes only its own tunnels. A connection adopted
//! from the predecessor does not know it ([`Via::Unknown`]) and is matched
//! by its socket's addresses ([`Routes::routes_of`]): the exit whose tunnel
//! address it is bound to, or the upstreams this plane has reached at its
//! peer address. It closes once every upstream so matched is down. One
//! adopted before this plane had reached its upstream is matched again
//! once every upstream has had its first probe ([`Routes::probed`]); one
//! whose peer address this plane has not reached by then (a name's other
//! address, an upstream that did not answer) stays unwatched.
//!
//! A route already down when the watch starts closes the connection at
//! once: its token was replaced when it went down and would only tell the
//! next time. `Route::failed` marks the route down before it cancels the
//! token, so taking the token first and then reading `is_up` misses
//! nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;

use super::routes::{Route, Routes};

/// The route an egress connection left by, as far as this plane knows.
#[derive(Debug, Clone)]
pub enum Via {
    /// Direct egress: there is no upstream to lose.
    Direct,
    /// This upstream or WireGuard exit, as the connect chose it.
    Route(Arc<Route>),
    /// Not known: a connection adopted from the predecessor.
    Unknown,
}

impl Via {
    /// Resolves when the route behind `egress` goes down; never for direct
    /// egress, or on a node without upstreams. Reads `egress`'s addresses
    /// now (only for [`Via::Unknown`], with upstreams), so the future
    /// borrows nothing.
    pub fn until_down(
        &self,
        routes: &Arc<Routes>,
        egress: &TcpStream,
    ) -> impl Future<Output = ()> + Send + 'static {
        let watched = match self {
            Via::Direct => Watched::Nothing,
            Via::Route(route) => Watched::Route(route.clone()),
            // No upstreams, no lookup: two system calls a tunnel saves.
            Via::Unknown if routes.upstreams().is_empty() => Watched::Nothing,
            Via::Unknown => Watched::Addresses {
                routes: routes.clone(),
                local: egress.local_addr().ok(),
                peer: egress.peer_addr().ok(),
            },
        };
        async move {
            match watched {
                Watched::Nothing => std::future::pending().await,
                Watched::Addresses {
                    routes,
                    local,
                    peer,
                } => until_all_down(&routes, local, peer).await,
                Watched::Route(route) => until_all_down_of(&[route]).await,
            }
        }
    }
}

enum Watched {
    Nothing,
    Route(Arc<Route>),
    Addresses {
        routes: Arc<Routes>,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    },
}

/// Resolves when every upstream an egress socket with these addresses may
/// go through is down; never if none matches, even after the first probes.
async fn until_all_down(routes: &Routes, local: Option<SocketAddr>, peer: Option<SocketAddr>) {
    let matched = |routes: &Routes| -> Vec<Arc<Route>> {
        routes.routes_of(local, peer).into_iter().cloned().collect()
    };
    let mut candidates = matched(routes);
    if candidates.is_empty() {
        routes.probed().cancelled().await;
        candidates = matched(routes);
    }
    if candidates.is_empty() {
        return std::future::pending().await;
    }
    until_all_down_of(&candidates).await;
}

/// Resolves when every route of `candidates` is down (at once if they are).
async fn until_all_down_of(candidates: &[Arc<Route>]) {
    loop {
        // Tokens first, then the state (see the module's note).
        let mut downs: FuturesUnordered<_> = candidates
            .iter()
            .map(|route| route.down_token().cancelled_owned())
            .collect();
        if candidates.iter().all(|route| !route.is_up()) {
            return;
        }
        // One went down: the others may still be up (then look again).
        downs.next().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use blipless_config::upstreams::{Socks5Upstream, Upstream, UpstreamKind};
    use tokio::net::TcpListener;

    use super::*;

    fn upstream(name: &str) -> Upstream {
        Upstream {
            name: name.into(),
            tags: Vec::new(),
            kind: UpstreamKind::Socks5(Socks5Upstream {
                address: "gateway.example:1080".into(),
                username: Some(format!("{name}-{{client}}")),
                password: None,
            }),
        }
    }

    /// A connected socket and the address it is connected to.
    async fn connected() -> (TcpStream, SocketAddr, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let stream = TcpStream::connect(address).await.expect("connect");
        (stream, address, listener)
    }

    async fn resolved(future: impl Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(100), future)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_known_route_is_watched_alone_though_another_shares_its_gateway() {
        let routes = Arc::new(Routes::new(&[upstream("a"), upstream("b")], 2, 1));
        let (stream, gateway, _listener) = connected().await;
        let [a, b] = [&routes.upstreams()[0], &routes.upstreams()[1]];
        a.succeeded(10, Some(gateway));
        b.succeeded(10, Some(gateway));
        let through_b = Via::Route(b.clone()).until_down(&routes, &stream);
        tokio::pin!(through_b);
        a.failed(1, "login refused");
        assert!(
            !resolved(&mut through_b).await,
            "a's going down cut b's tunnel"
        );
        b.failed(1, "login refused");
        assert!(resolved(&mut through_b).await);
        let direct = Via::Direct.until_down(&routes, &stream);
        assert!(!resolved(direct).await);
    }

    #[tokio::test]
    async fn an_adopted_tunnel_is_cut_when_every_upstream_at_its_address_is_down() {
        let routes = Arc::new(Routes::new(&[upstream("a"), upstream("b")], 2, 1));
        let (stream, gateway, _listener) = connected().await;
        let [a, b] = [&routes.upstreams()[0], &routes.upstreams()[1]];
        a.succeeded(10, Some(gateway));
        b.succeeded(10, Some(gateway));
        let adopted = Via::Unknown.until_down(&routes, &stream);
        tokio::pin!(adopted);
        a.failed(1, "login refused");
        assert!(!resolved(&mut adopted).await, "b may be its upstream");
        b.failed(1, "gateway gone");
        assert!(resolved(&mut adopted).await);
    }

    #[tokio::test]
    async fn an_adopted_tunnel_is_matched_after_the_first_probes() {
        let routes = Arc::new(Routes::new(&[upstream("a")], 2, 1));
        let (stream, gateway, _listener) = connected().await;
        let a = &routes.upstreams()[0];
        // Adopted before this plane's first probe reached the upstream.
        let adopted = Via::Unknown.until_down(&routes, &stream);
        tokio::pin!(adopted);
        assert!(!resolved(&mut adopted).await);
        a.succeeded(10, Some(gateway));
        routes.first_probes_done();
        assert!(!resolved(&mut adopted).await);
        a.failed(1, "gateway gone");
        assert!(resolved(&mut adopted).await, "the tunnel was not watched");
        // A direct tunnel adopted on the same node matches nothing, ever.
        let (direct, _, _other) = connected().await;
        assert!(!resolved(Via::Unknown.until_down(&routes, &direct)).await);
    }

    #[tokio::test]
    async fn a_route_down_when_the_watch_starts_closes_at_once() {
        let routes = Arc::new(Routes::new(&[upstream("a")], 2, 1));
        let (stream, gateway, _listener) = connected().await;
        let a = &routes.upstreams()[0];
        a.succeeded(10, Some(gateway));
        a.failed(1, "gateway gone");
        assert!(resolved(Via::Route(a.clone()).until_down(&routes, &stream)).await);
        assert!(resolved(Via::Unknown.until_down(&routes, &stream)).await);
    }
}
