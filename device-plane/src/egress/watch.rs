//! Which route an egress socket left by, and waiting for that route to go
//! down (docs/EGRESS.md, "Failover": orphans fail fast).
//!
//! A connection made on this plane knows its route ([`Via::Route`]), so
//! two upstreams on one gateway `host:port` (differing by login) are told
//! apart: one going down closes only its own tunnels. A connection adopted
//! from the predecessor does not know it ([`Via::Unknown`]) and is matched
//! by its socket's addresses ([`Routes::routes_of`]): the exit whose tunnel
//! address it is bound to, or the upstreams reached at its peer address.
//! It is then closed only when every upstream that may be its own is down,
//! and one adopted before this plane has reached its upstream (the first
//! probe still running) is matched as soon as the upstream is reached.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;
use tokio_util::sync::WaitForCancellationFutureOwned;

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
            Via::Route(route) => Watched::Route(route.down_token().cancelled_owned()),
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
                Watched::Route(down) => down.await,
                Watched::Addresses {
                    routes,
                    local,
                    peer,
                } => until_all_down(&routes, local, peer).await,
            }
        }
    }
}

enum Watched {
    Nothing,
    Route(WaitForCancellationFutureOwned),
    Addresses {
        routes: Arc<Routes>,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    },
}

/// Resolves when every upstream an egress socket with these addresses may
/// go through is down, once there is one.
async fn until_all_down(routes: &Routes, local: Option<SocketAddr>, peer: Option<SocketAddr>) {
    loop {
        // Asked for before looking, so an address learned in between is
        // not missed.
        let learned = routes.learned.notified();
        tokio::pin!(learned);
        learned.as_mut().enable();
        let candidates: Vec<Arc<Route>> =
            routes.routes_of(local, peer).into_iter().cloned().collect();
        if candidates.is_empty() {
            learned.await;
            continue;
        }
        let mut downs: FuturesUnordered<_> = candidates
            .iter()
            .map(|route| route.down_token().cancelled_owned())
            .collect();
        tokio::select! {
            _ = downs.next() => {
                if candidates.iter().all(|route| !route.is_up()) {
                    return;
                }
                // Another upstream at this address is still up: it may be
                // this connection's.
            }
            // Another upstream may be reached at this address now.
            () = &mut learned => {}
        }
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
    async fn an_adopted_tunnel_is_matched_once_its_upstream_is_reached() {
        let routes = Arc::new(Routes::new(&[upstream("a")], 2, 1));
        let (stream, gateway, _listener) = connected().await;
        let a = &routes.upstreams()[0];
        // Adopted before this plane's first probe reached the upstream.
        let adopted = Via::Unknown.until_down(&routes, &stream);
        tokio::pin!(adopted);
        assert!(!resolved(&mut adopted).await);
        a.succeeded(10, Some(gateway));
        assert!(!resolved(&mut adopted).await);
        a.failed(1, "gateway gone");
        assert!(resolved(&mut adopted).await, "the tunnel was not watched");
    }
}
