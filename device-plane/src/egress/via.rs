//! Connecting through a route: direct, or a SOCKS5 upstream's handshake
//! (docs/EGRESS.md, "Streams through an upstream"), and the health probes.
//!
//! Through an upstream, a literal destination address is checked against
//! the same default deny as direct egress; a name is passed on unresolved
//! (the provider resolves it where its exit is), but for `localhost` names,
//! held to the deny as loopback. The upstream's own address
//! is the operator's and is not checked. After the handshake the egress
//! socket is a kernel TCP socket like any other, so the tunnel migrates
//! across deploys byte-exact as a direct one does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_protocol::numeric_host::{self, HostKind};
use blipless_protocol::socks5::Destination;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::lookups::Lookups;
use super::routes::{Route, RouteKind, Routes};
use super::upstream_addresses::AddressError;
use super::upstream_socks::{self, UpstreamCredentials, UpstreamError};
use super::{eyeballs, Egress, EgressError, Target};

/// Whether `error` says the upstream is broken (counted against its health
/// and a reason to try the next route), rather than that it refused this
/// destination, could not reach it in time (it took our request and was
/// still trying: a blackholed destination must not take a shared upstream
/// down for every client), that our own request could not be encoded, or
/// that this node is short of descriptors or ports (which marking the
/// upstream down would turn into every tunnel through it cut).
pub fn is_upstream_fault(error: &UpstreamError) -> bool {
    use blipless_protocol::socks5::client::ClientError;
    !matches!(
        error,
        UpstreamError::Refused { .. }
            | UpstreamError::DestinationTimedOut
            | UpstreamError::ClosedAtConnect
            | UpstreamError::LocalResources(_)
            | UpstreamError::Protocol(
                ClientError::UnencodableDomain { .. }
                    | ClientError::EmptyCredentials
                    | ClientError::CredentialsTooLong
            )
    )
}

/// Whether `error`, met connecting through `route`, counts against the
/// route's health: an upstream fault ([`is_upstream_fault`]), except a
/// refused login whose username names the client (`{client}`,
/// `{session}`). Then the provider refuses that one sub-user (its balance,
/// its own concurrency cap, its name), not everyone, and one client's
/// parallel refusals must not cut every tunnel through it. (Nor does the
/// probe's, which logs in as [`PROBE_CLIENT`]: `probe_forever`.)
fn counts_against(route: &Route, error: &UpstreamError) -> bool {
    if matches!(error, UpstreamError::AuthRefused) && username_names_the_client(route) {
        return false;
    }
    is_upstream_fault(error)
}

/// Whether `route`'s username template has a `{client}` or `{session}`.
fn username_names_the_client(route: &Route) -> bool {
    match &route.kind {
        RouteKind::Socks5 {
            username: Some(username),
            ..
        } => username.contains("{client}") || username.contains("{session}"),
        _ => false,
    }
}

/// The `{client}` a probe fills a username template with.
const PROBE_CLIENT: &str = "blipless-probe";
/// The `{session}` a probe fills it with: 16 hex digits, as a client's
/// session is, so that a provider that checks the session's form does not
/// refuse the probe (and the upstream flap down with every probe).
const PROBE_SESSION: &str = "0000000000000000";

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

/// Connects to `route`'s upstream at `address` before `deadline`: its
/// addresses as [`UpstreamAddresses`] knows them (a name looked up in the
/// upstream pool `lookups`, its answer kept a while), raced as a
/// destination's are ([`eyeballs`]): one that does not answer costs
/// [`eyeballs::ATTEMPT_DELAY`], not the whole deadline.
async fn reach(
    lookups: &Lookups,
    route: &Route,
    address: &str,
    deadline: tokio::time::Instant,
) -> Result<TcpStream, UpstreamError> {
    let addresses = route
        .resolved
        .resolve(lookups, &route.name, address, deadline)
        .await
        .map_err(|error| match error {
            AddressError::TimedOut => UpstreamError::TimedOut,
            AddressError::Unresolvable | AddressError::NotHostPort => UpstreamError::Unresolvable,
        })?;
    let ordered = eyeballs::interleave(addresses.to_vec());
    let attempts = eyeballs::race(&ordered, eyeballs::ATTEMPT_DELAY, |address| async move {
        let stream = TcpStream::connect(address).await?;
        let _ = stream.set_nodelay(true);
        Ok::<_, std::io::Error>(stream)
    });
    match tokio::time::timeout_at(deadline, attempts).await {
        Err(_) | Ok(Err(None)) => Err(UpstreamError::TimedOut),
        Ok(Err(Some(error))) if is_local_shortage(&error) => {
            Err(UpstreamError::LocalResources(error))
        }
        Ok(Err(Some(error))) => Err(UpstreamError::Io(error)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Whether a connect failed for want of something on this node: file
/// descriptors (`EMFILE`, `ENFILE`), kernel memory (`ENOBUFS`, `ENOMEM`) or
/// a local port toward that address (`EADDRNOTAVAIL`: every connection to
/// one upstream shares its address and port, so a busy node runs out).
fn is_local_shortage(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
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
            // socket into the exit; its health comes from handshakes, and
            // from connections through it (below).
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
                // A connection through the exit is proof it carries
                // traffic: a route marked down (probes lost while idle, or
                // not yet looked at again since it came back) is up, and
                // what it carries is not cut the moment it opens because
                // the route still says down.
                if !route.is_up() {
                    route.reached(None);
                }
                return Ok(stream);
            }
            RouteKind::Socks5 { address, .. } => address,
        };
        let destination = match target {
            Target::Address(address) if !self.permits(address.ip()) => {
                return Err(EgressError::Denied(target.to_string()));
            }
            // As the policy judged it: `::ffff:a.b.c.d` goes to the upstream
            // as the IPv4 address it is (an IPv4-only upstream refuses the
            // IPv6 form).
            Target::Address(address) => Destination::Ip(super::canonical_addr(*address)),
            // A name that is an address in disguise (`127.1`, `2130706433`)
            // is held to the same deny as one given literally.
            Target::Name { host, port } => match numeric_host::classify(host) {
                // Names for the upstream host itself (RFC 6761): its
                // loopback is no more the customers' than ours is (unless
                // `egress.allow` lets loopback through).
                HostKind::Name
                    if loopback_named(host).is_some_and(|loopback| !self.permits(loopback)) =>
                {
                    return Err(EgressError::Denied(target.to_string()));
                }
                HostKind::Name => Destination::Domain {
                    host: host.clone(),
                    port: *port,
                },
                HostKind::Address(ip) if self.permits(ip) => {
                    Destination::Ip(super::canonical_addr(std::net::SocketAddr::new(ip, *port)))
                }
                HostKind::Address(_) | HostKind::NotAName => {
                    return Err(EgressError::Denied(target.to_string()));
                }
            },
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let failed = |error: UpstreamError| {
            if counts_against(route, &error) {
                route.failed(self.routes.failure_threshold, &error.to_string());
            }
            EgressError::Upstream {
                route: route.name.clone(),
                error,
            }
        };
        let mut stream = reach(&self.upstream_lookups, route, address, deadline)
            .await
            .map_err(failed)?;
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

/// The loopback address `host` names to an upstream's resolver (any case,
/// with or without the root's trailing dot), None for other names:
/// `localhost` and names under `.localhost` (RFC 6761, 6.3), and the
/// loopback aliases of distributions' `/etc/hosts`, names whose first label
/// is one of [`LOOPBACK_LABELS`] (`localhost.localdomain`, `ip6-loopback`).
/// docs/EGRESS.md promises exactly this list. `::1` for the IPv6 aliases
/// (`localhost6`, `ip6-localhost`, `ip6-loopback`), else 127.0.0.1.
fn loopback_named(host: &str) -> Option<std::net::IpAddr> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let first = host.split('.').next().unwrap_or_default();
    if !host.ends_with(".localhost") && !LOOPBACK_LABELS.contains(&first) {
        return None;
    }
    Some(
        if matches!(first, "localhost6" | "ip6-localhost" | "ip6-loopback") {
            std::net::Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        },
    )
}

/// First labels that `/etc/hosts` on Debian, Ubuntu, Fedora and Alpine
/// maps to loopback.
const LOOPBACK_LABELS: [&str; 5] = [
    "localhost",
    "localhost4",
    "localhost6",
    "ip6-localhost",
    "ip6-loopback",
];

fn elapsed_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Probes one upstream: connect and the SOCKS5 greeting (and credentials).
async fn probe(
    lookups: &Lookups,
    route: &Route,
    timeout: Duration,
) -> Result<(u64, Option<std::net::SocketAddr>), UpstreamError> {
    let RouteKind::Socks5 { address, .. } = &route.kind else {
        return Ok((0, None));
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut stream = reach(lookups, route, address, deadline).await?;
    let credentials = credentials(route, PROBE_CLIENT, PROBE_SESSION);
    match upstream_socks::probe(&mut stream, credentials.as_ref(), deadline).await {
        Ok(()) => {}
        // A provider that takes only its registered sub-users refuses
        // `blipless-probe`: it answered, so it is up. Counted as a failure,
        // it took the upstream down every two probes (cutting every tunnel
        // through it), and the next customer's login brought it back.
        Err(UpstreamError::AuthRefused) if username_names_the_client(route) => {
            tracing::debug!(route = %route.name, "egress probe's login refused (a per-client username): the upstream answered");
        }
        Err(error) => return Err(error),
    }
    Ok((elapsed_us(started), stream.peer_addr().ok()))
}

/// Probes every upstream every `interval` (the first at once), each on its
/// own task so one slow upstream delays no other, until `shutdown`. Says
/// when every upstream has had its first ([`Routes::first_probes_done`]).
pub async fn probe_forever(
    routes: Arc<Routes>,
    lookups: Lookups,
    interval: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut probers = tokio::task::JoinSet::new();
    let socks = routes
        .upstreams()
        .iter()
        .filter(|route| matches!(route.kind, RouteKind::Socks5 { .. }))
        .count();
    let first_pending = Arc::new(std::sync::atomic::AtomicUsize::new(socks));
    if socks == 0 {
        routes.first_probes_done();
    }
    for index in 0..routes.upstreams().len() {
        if !matches!(routes.upstreams()[index].kind, RouteKind::Socks5 { .. }) {
            // A WireGuard exit's health is its handshakes (`wg::exit`).
            continue;
        }
        let (routes, lookups, shutdown) = (routes.clone(), lookups.clone(), shutdown.clone());
        let first_pending = first_pending.clone();
        probers.spawn(async move {
            let route = &routes.upstreams()[index];
            let mut first = true;
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = shutdown.cancelled() => return,
                }
                match probe(&lookups, route, timeout).await {
                    Ok((latency_us, peer)) => route.succeeded(latency_us, peer),
                    // Says nothing of the upstream.
                    Err(error @ UpstreamError::LocalResources(_)) => {
                        tracing::debug!(route = %route.name, %error, "egress probe not made");
                    }
                    Err(error) => {
                        tracing::debug!(route = %route.name, %error, "egress probe failed");
                        route.failed(routes.failure_threshold, &error.to_string());
                    }
                }
                if std::mem::take(&mut first)
                    && first_pending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1
                {
                    routes.first_probes_done();
                }
            }
        });
    }
    while probers.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use blipless_config::upstreams::{Socks5Upstream, Upstream, UpstreamKind};
    use tokio::net::TcpListener;

    use super::*;

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(10)
    }

    fn route_at(address: String) -> Arc<Route> {
        route_as(address, None)
    }

    fn route_as(address: String, username: Option<&str>) -> Arc<Route> {
        let routes = Routes::new(
            &[Upstream {
                name: "up".into(),
                tags: Vec::new(),
                kind: UpstreamKind::Socks5(Socks5Upstream {
                    address,
                    username: username.map(Into::into),
                    password: None,
                }),
            }],
            2,
            2,
        );
        routes.upstreams()[0].clone()
    }

    #[test]
    fn localhost_names_are_told_from_other_names() {
        for host in [
            "localhost",
            "LocalHost.",
            "a.localhost",
            "x.y.LOCALHOST.",
            "localhost.localdomain",
            "localhost4",
            "localhost6.localdomain6",
            "ip6-localhost",
            "IP6-LOOPBACK.",
            "localhost.example",
        ] {
            assert!(loopback_named(host).is_some(), "{host}");
        }
        for host in [
            "notlocalhost",
            "localhostx",
            "a.localhost4",
            "ip6-allnodes",
            "example.com",
            "",
        ] {
            assert!(loopback_named(host).is_none(), "{host}");
        }
        // An IPv6 alias is judged by ::1: allowing 127.0.0.1 lets
        // `localhost` through, not `ip6-loopback`.
        let v6 = std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST);
        for host in ["ip6-loopback", "localhost6.localdomain6", "IP6-LOCALHOST."] {
            assert_eq!(loopback_named(host), Some(v6), "{host}");
        }
        assert_eq!(
            loopback_named("localhost"),
            Some(std::net::Ipv4Addr::LOCALHOST.into())
        );
    }

    /// A provider that refuses one client's sub-user (`user-{client}`)
    /// does not take the upstream down for every client; a refused fixed
    /// username is the upstream's (our configuration's) fault, as before.
    #[test]
    fn a_refused_login_counts_against_the_route_only_with_a_fixed_username() {
        let refused = UpstreamError::AuthRefused;
        for per_client in [
            "user-{client}",
            "user-{client}-session-{session}",
            "s-{session}",
        ] {
            let route = route_as("127.0.0.1:1".into(), Some(per_client));
            assert!(!counts_against(&route, &refused), "{per_client}");
            let io = UpstreamError::Io(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
            assert!(counts_against(&route, &io), "{per_client}");
        }
        let fixed = route_as("127.0.0.1:1".into(), Some("operator"));
        assert!(counts_against(&fixed, &refused));
        assert!(counts_against(&route_at("127.0.0.1:1".into()), &refused));
    }

    /// Out of descriptors or local ports is this node's shortage: the
    /// upstream is not marked down for it (every tunnel through it would be
    /// cut), and the customer gets a general failure or 503.
    #[test]
    fn a_local_shortage_is_not_the_upstreams_fault() {
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::EADDRNOTAVAIL,
            libc::ENOBUFS,
        ] {
            let error = std::io::Error::from_raw_os_error(errno);
            assert!(is_local_shortage(&error), "{error}");
            let error = UpstreamError::LocalResources(error);
            assert!(!is_upstream_fault(&error));
            assert_eq!(error.http_status(), 503);
        }
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(!is_local_shortage(&refused));
        assert!(is_upstream_fault(&UpstreamError::Io(refused)));
    }

    #[tokio::test]
    async fn an_upstream_is_reached_by_address_and_by_name() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let lookups = Lookups::default();
        for address in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
            let route = route_at(address.clone());
            let stream = reach(&lookups, &route, &address, soon())
                .await
                .unwrap_or_else(|error| panic!("{address}: {error}"));
            assert_eq!(stream.peer_addr().expect("peer").port(), port);
        }
    }

    /// An upstream that refuses every login, as a provider that takes only
    /// its registered sub-users refuses `blipless-probe`; counts the
    /// logins it refused.
    async fn refuse_every_login(
        listener: TcpListener,
        refused: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = [0u8; 2];
            let mut methods = vec![0u8; 255];
            let mut field = vec![0u8; 255];
            let exchange = async {
                stream.read_exact(&mut head).await?;
                stream
                    .read_exact(&mut methods[..usize::from(head[1])])
                    .await?;
                stream.write_all(&[5, 2]).await?;
                stream.read_exact(&mut head).await?;
                stream
                    .read_exact(&mut field[..usize::from(head[1])])
                    .await?;
                stream.read_exact(&mut head[..1]).await?;
                stream
                    .read_exact(&mut field[..usize::from(head[0])])
                    .await?;
                stream.write_all(&[1, 1]).await
            };
            if exchange.await.is_ok() {
                refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// A probe refused at login shows an upstream whose username names the
    /// client alive (the provider refuses `blipless-probe`, not everyone);
    /// with a fixed username it is the operator's credentials at fault and
    /// takes the upstream down.
    #[tokio::test]
    async fn a_probe_refused_at_login_takes_down_only_a_fixed_username() {
        for (username, stays_up) in [("user-{client}", true), ("operator", false)] {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("address").to_string();
            let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            tokio::spawn(refuse_every_login(listener, refused.clone()));
            let routes = Arc::new(Routes::new(
                &[Upstream {
                    name: "up".into(),
                    tags: Vec::new(),
                    kind: UpstreamKind::Socks5(Socks5Upstream {
                        address,
                        username: Some(username.into()),
                        password: Some(blipless_config::upstreams::Secret::new("pw".into())),
                    }),
                }],
                2,
                2,
            ));
            let shutdown = CancellationToken::new();
            let probing = tokio::spawn(probe_forever(
                routes.clone(),
                Lookups::default(),
                Duration::from_millis(20),
                Duration::from_secs(5),
                shutdown.clone(),
            ));
            let started = Instant::now();
            while refused.load(std::sync::atomic::Ordering::SeqCst) < 5 {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "{username}: probes"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            shutdown.cancel();
            probing.await.expect("probes end");
            let route = &routes.upstreams()[0];
            let downs = route.downs.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(downs == 0, stays_up, "{username}: {downs} downs");
            assert_eq!(route.is_up(), stays_up, "{username}");
        }
    }

    /// An IPv4-mapped destination goes to the upstream as the IPv4 address
    /// it is (address type 1), as the policy judged it: an IPv4-only
    /// upstream refuses the IPv6 form. So does one given as a name that is
    /// an address.
    #[tokio::test]
    async fn a_mapped_destination_goes_to_the_upstream_as_ipv4() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let route = route_at(listener.local_addr().expect("address").to_string());
        let upstream = tokio::spawn(async move {
            let mut types = Vec::new();
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut greeting = [0u8; 3];
                stream.read_exact(&mut greeting).await.expect("greeting");
                stream.write_all(&[5, 0]).await.expect("method");
                let mut request = [0u8; 4];
                stream.read_exact(&mut request).await.expect("request");
                types.push(request[3]);
                stream
                    .write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])
                    .await
                    .expect("reply");
            }
            types
        });
        let egress = Egress::with_host_addresses(
            vec!["203.0.113.0/24".parse().expect("cidr")],
            Duration::from_secs(5),
            crate::egress::HostAddresses::default(),
        );
        let mapped: std::net::SocketAddr = "[::ffff:203.0.113.5]:443".parse().expect("address");
        for target in [
            Target::Address(mapped),
            Target::Name {
                host: "::ffff:203.0.113.5".into(),
                port: 443,
            },
        ] {
            egress
                .connect_via(&route, None, &target, "alice", "0000000000000000")
                .await
                .unwrap_or_else(|error| panic!("{target:?}: {error}"));
        }
        assert_eq!(upstream.await.expect("upstream"), [1, 1]);
    }

    /// A name waits for one of the pool's places, and fails as timed out
    /// when none comes; an address takes none.
    #[tokio::test]
    async fn an_upstreams_name_is_one_of_the_pools_bounded_lookups() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let no_places = Lookups::new(0, 1);
        let by_name = format!("localhost:{port}");
        let by_name = reach(
            &no_places,
            &route_at(by_name.clone()),
            &by_name,
            tokio::time::Instant::now() + Duration::from_millis(200),
        )
        .await;
        assert!(
            matches!(by_name, Err(UpstreamError::TimedOut)),
            "{by_name:?}"
        );
        let literal = format!("127.0.0.1:{port}");
        reach(&no_places, &route_at(literal.clone()), &literal, soon())
            .await
            .expect("an address needs no lookup");
    }
}
