//! Connecting through a route: direct, or a SOCKS5 upstream's handshake
//! (docs/EGRESS.md, "Streams through an upstream"), and the health probes.
//!
//! Through an upstream, a literal destination address is checked against
//! the same default deny as direct egress; a name is passed on unresolved
//! (the provider resolves it where its exit is). The upstream's own address
//! is the operator's and is not checked. After the handshake the egress
//! socket is a kernel TCP socket like any other, so the tunnel migrates
//! across deploys byte-exact as a direct one does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_protocol::numeric_host::{self, HostKind};
use blipless_protocol::socks5::Destination;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::routes::{Route, RouteKind, Routes};
use super::upstream_socks::{self, UpstreamCredentials, UpstreamError};
use super::{Egress, EgressError, Target};

/// Whether `error` says the upstream is broken (counted against its health
/// and a reason to try the next route), rather than that it refused this
/// destination, could not reach it in time (it took our request and was
/// still trying: a blackholed destination must not take a shared upstream
/// down for every client), or that our own request could not be encoded.
pub fn is_upstream_fault(error: &UpstreamError) -> bool {
    use blipless_protocol::socks5::client::ClientError;
    !matches!(
        error,
        UpstreamError::Refused { .. }
            | UpstreamError::DestinationTimedOut
            | UpstreamError::ClosedAtConnect
            | UpstreamError::Protocol(
                ClientError::UnencodableDomain { .. }
                    | ClientError::EmptyCredentials
                    | ClientError::CredentialsTooLong
            )
    )
}

/// The `{client}` and `{session}` a probe fills a username template with.
const PROBE_CLIENT: &str = "blipless-probe";

/// The username and password to offer `route` for `client` with `session`.
fn credentials(route: &Route, client: &str, session: &str) -> Option<UpstreamCredentials> {
    let RouteKind::Socks5 {
        username, password, ..
    } = &route.kind
    else {
        return None;
    };
    let username = username.as_ref()?;
    Some(UpstreamCredentials {
        username: username
            .replace("{client}", client)
            .replace("{session}", session),
        password: password
            .as_ref()
            .map(|p| p.expose().to_owned())
            .unwrap_or_default(),
    })
}

/// Connects to an upstream's `host:port` before `deadline`.
async fn reach(address: &str, deadline: tokio::time::Instant) -> Result<TcpStream, UpstreamError> {
    let attempt = async {
        let stream = TcpStream::connect(address).await?;
        let _ = stream.set_nodelay(true);
        Ok::<_, std::io::Error>(stream)
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Err(_) => Err(UpstreamError::TimedOut),
        Ok(Err(error)) => Err(UpstreamError::Io(error)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

impl Egress {
    /// Connects `client` (with its sticky `session`) to `target` through
    /// `route`, from `source` when direct. A failure of the upstream itself
    /// counts against the route's health; a refusal of the destination by
    /// a working upstream does not.
    pub async fn connect_via(
        &self,
        route: &Route,
        source: Option<std::net::IpAddr>,
        target: &Target,
        client: &str,
        session: &str,
    ) -> Result<TcpStream, EgressError> {
        let address = match &route.kind {
            RouteKind::Direct => return self.connect(client, source, target).await,
            // The host's rule for the exit's tunnel address routes the
            // socket into the exit; its health comes from handshakes.
            RouteKind::Wireguard(exit) => {
                let stream = self
                    .connect_from(
                        client,
                        Some(std::net::IpAddr::V4(exit.address)),
                        true,
                        target,
                    )
                    .await?;
                route
                    .opened
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(stream);
            }
            RouteKind::Socks5 { address, .. } => address,
        };
        let destination = match target {
            Target::Address(address) if !self.permits(address.ip()) => {
                return Err(EgressError::Denied(target.to_string()));
            }
            Target::Address(address) => Destination::Ip(*address),
            // A name that is an address in disguise (`127.1`, `2130706433`)
            // is held to the same deny as one given literally.
            Target::Name { host, port } => match numeric_host::classify(host) {
                HostKind::Name => Destination::Domain {
                    host: host.clone(),
                    port: *port,
                },
                HostKind::Address(ip) if self.permits(ip) => {
                    Destination::Ip(std::net::SocketAddr::new(ip, *port))
                }
                HostKind::Address(_) | HostKind::NotAName => {
                    return Err(EgressError::Denied(target.to_string()));
                }
            },
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let failed = |error: UpstreamError| {
            if is_upstream_fault(&error) {
                route.failed(self.routes.failure_threshold, &error.to_string());
            }
            EgressError::Upstream {
                route: route.name.clone(),
                error,
            }
        };
        let mut stream = reach(address, deadline).await.map_err(failed)?;
        let credentials = credentials(route, client, session);
        upstream_socks::handshake(&mut stream, credentials.as_ref(), &destination, deadline)
            .await
            .map_err(failed)?;
        route.succeeded(elapsed_us(started), stream.peer_addr().ok());
        route
            .opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(stream)
    }
}

fn elapsed_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Probes one upstream: connect and the SOCKS5 greeting (and credentials).
async fn probe(
    route: &Route,
    timeout: Duration,
) -> Result<(u64, Option<std::net::SocketAddr>), UpstreamError> {
    let RouteKind::Socks5 { address, .. } = &route.kind else {
        return Ok((0, None));
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut stream = reach(address, deadline).await?;
    let credentials = credentials(route, PROBE_CLIENT, PROBE_CLIENT);
    upstream_socks::probe(&mut stream, credentials.as_ref(), deadline).await?;
    Ok((elapsed_us(started), stream.peer_addr().ok()))
}

/// Probes every upstream every `interval` (the first at once), each on its
/// own task so one slow upstream delays no other, until `shutdown`.
pub async fn probe_forever(
    routes: Arc<Routes>,
    interval: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut probers = tokio::task::JoinSet::new();
    for index in 0..routes.upstreams().len() {
        if !matches!(routes.upstreams()[index].kind, RouteKind::Socks5 { .. }) {
            // A WireGuard exit's health is its handshakes (`wg::exit`).
            continue;
        }
        let (routes, shutdown) = (routes.clone(), shutdown.clone());
        probers.spawn(async move {
            let route = &routes.upstreams()[index];
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = shutdown.cancelled() => return,
                }
                match probe(route, timeout).await {
                    Ok((latency_us, peer)) => route.succeeded(latency_us, peer),
                    Err(error) => {
                        tracing::debug!(route = %route.name, %error, "egress probe failed");
                        route.failed(routes.failure_threshold, &error.to_string());
                    }
                }
            }
        });
    }
    while probers.join_next().await.is_some() {}
}
