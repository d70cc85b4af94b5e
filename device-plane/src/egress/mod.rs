//! Egress: the routes out of the node (direct, SOCKS5 upstreams), the
//! windows that choose among them, and direct connects under the address
//! policy (docs/EGRESS.md).
//!
//! Default deny: loopback, private, link-local (metadata included), CGNAT,
//! multicast, broadcast, reserved and unspecified addresses are refused
//! unless `egress.allow` lists them, and so is every address of the host's
//! own interfaces ([`HostAddresses`], read again every 30 s) and every
//! public address the configuration names as the node's (behind a 1:1
//! NAT), whatever its range: a client must not reach the node's own
//! services through its public address. The check is on every *resolved* address, so a name that
//! resolves to a private (or the host's own) address is refused too. The
//! WireGuard packet path applies the same [`Egress::permits`] to every inner
//! destination. A destination with both IPv6 and IPv4 addresses is
//! connected by Happy Eyeballs ([`eyeballs`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use tokio::net::{TcpSocket, TcpStream};

pub mod eyeballs;
pub mod host_addresses;
pub mod lookups;
pub mod report;
pub mod routes;
pub mod upstream_addresses;
pub mod upstream_socks;
pub mod via;
pub mod watch;
pub mod window;

use self::host_addresses::HostAddresses;

/// Where a customer wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An address given literally.
    Address(SocketAddr),
    /// A name to resolve here.
    Name {
        /// The host name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Address(address) => write!(f, "{address}"),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Why a connection to a target was not made.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// Every address of the target is refused by policy.
    #[error("destination {0} is not allowed")]
    Denied(String),
    /// The name did not resolve.
    #[error("cannot resolve {0}")]
    Unresolvable(String),
    /// The destination refused the connection.
    #[error("connection refused by {0}")]
    Refused(SocketAddr),
    /// The network or host is unreachable.
    #[error("{0} is unreachable: {1}")]
    Unreachable(SocketAddr, std::io::Error),
    /// No answer within the connect timeout.
    #[error("no answer from {0} within the connect timeout")]
    TimedOut(String),
    /// This process cannot open another socket (out of file descriptors or
    /// buffers), or no local port is left for this destination: an
    /// operator problem, not the destination's.
    #[error("no local resources for another connection: {0}")]
    LocalResources(std::io::Error),
    /// The client's source address cannot be bound here (no longer on this
    /// host): its identity must be evicted and a new one allocated.
    #[error("source address {0} cannot be used: {1}")]
    SourceUnusable(IpAddr, std::io::Error),
    /// The upstream failed or refused the destination.
    #[error("upstream {route}: {error}")]
    Upstream {
        /// The upstream's name.
        route: String,
        /// What went wrong.
        error: upstream_socks::UpstreamError,
    },
    /// The route carries no address family the destination has: an
    /// IPv6-only destination through a WireGuard exit, whose tunnel
    /// address is IPv4. The next route of the client's window may carry it;
    /// the route itself is not at fault.
    #[error("{0} has no address this route can reach (IPv4 only)")]
    FamilyUnsupported(String),
    /// The client's policy allows no route this node has (an unknown
    /// upstream or tag).
    #[error("no egress route for policy {0}")]
    NoRoute(String),
}

/// The egress policy and connector.
#[derive(Debug, Clone)]
pub struct Egress {
    allow: Vec<IpNet>,
    connect_timeout: Duration,
    host: HostAddresses,
    /// Direct and the upstreams, with their health.
    pub routes: std::sync::Arc<routes::Routes>,
    /// Name lookups for customers' destinations, bounded per plane.
    pub lookups: lookups::Lookups,
    /// Lookups of upstreams' own names, bounded apart from customers'.
    pub upstream_lookups: lookups::Lookups,
}

impl Egress {
    /// An egress with this allow-list and connect timeout, refusing the
    /// host's own addresses as they are now and (inside a tokio runtime) as
    /// they change ([`HostAddresses::watch`]).
    pub fn new(allow: Vec<IpNet>, connect_timeout: Duration) -> Self {
        Self::with_host_addresses(allow, connect_timeout, HostAddresses::watch())
    }

    /// An egress that takes `host` for the host's own addresses.
    pub fn with_host_addresses(
        allow: Vec<IpNet>,
        connect_timeout: Duration,
        host: HostAddresses,
    ) -> Self {
        Self {
            allow,
            connect_timeout,
            host,
            routes: std::sync::Arc::default(),
            lookups: lookups::Lookups::default(),
            upstream_lookups: upstream_addresses::lookups(),
        }
    }

    /// The same egress with these routes.
    pub fn with_routes(mut self, routes: std::sync::Arc<routes::Routes>) -> Self {
        self.routes = routes;
        self
    }

    /// True when the policy lets customers reach `ip`: `egress.allow` lists
    /// it, or it is neither in a range denied by default nor one of the
    /// host's own addresses, also in IPv6 clothing (`64:ff9b::` and the
    /// other forms [`embedded_v4`] reads, which a translator on the path
    /// would deliver to the host).
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        let host_disguised = match ip {
            IpAddr::V6(v6) => embedded_v4(v6)
                .into_iter()
                .flatten()
                .any(|v4| self.host.contains(IpAddr::V4(v4))),
            IpAddr::V4(_) => false,
        };
        self.allow.iter().any(|net| net.contains(&ip))
            || !(denied_by_default(ip) || self.host.contains(ip) || host_disguised)
    }

    /// Resolves `target` (a name as one of `client`'s lookups,
    /// [`lookups`]), keeps the permitted addresses, and connects to the
    /// first that answers (IPv6 and IPv4 raced, [`eyeballs`]), from `source`
    /// when it is of the same family.
    pub async fn connect(
        &self,
        client: &str,
        source: Option<IpAddr>,
        target: &Target,
    ) -> Result<TcpStream, EgressError> {
        self.connect_from(client, source, false, target).await
    }

    /// [`Egress::connect`]; with `source_only`, only addresses of the
    /// source's family are tried (a WireGuard exit's tunnel address: an
    /// unbound socket would leave directly).
    pub async fn connect_from(
        &self,
        client: &str,
        source: Option<IpAddr>,
        source_only: bool,
        target: &Target,
    ) -> Result<TcpStream, EgressError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let candidates: Vec<SocketAddr> = match target {
            Target::Address(address) => vec![*address],
            Target::Name { host, port } => self
                .lookups
                .resolve(client, host, *port, deadline)
                .await
                .map_err(|error| match error {
                    lookups::LookupError::TimedOut => EgressError::TimedOut(target.to_string()),
                    lookups::LookupError::Failed => EgressError::Unresolvable(host.clone()),
                })?,
        };
        if candidates.is_empty() {
            return Err(EgressError::Unresolvable(target.to_string()));
        }
        // An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, given or resolved)
        // is connected to as the IPv4 address it is, as the policy judges
        // it: as IPv6 it would not match an IPv4 source, and would leave
        // unbound, from the node's own address rather than the client's.
        let permitted: Vec<SocketAddr> = candidates
            .into_iter()
            .map(canonical_addr)
            .filter(|a| self.permits(a.ip()))
            .collect();
        if permitted.is_empty() {
            return Err(EgressError::Denied(target.to_string()));
        }
        let permitted: Vec<SocketAddr> = permitted
            .into_iter()
            .filter(|a| !source_only || source.is_some_and(|s| s.is_ipv4() == a.is_ipv4()))
            .collect();
        if permitted.is_empty() {
            return Err(EgressError::FamilyUnsupported(target.to_string()));
        }
        // Both families, interleaved and staggered (RFC 8305): whichever the
        // destination offers and answers first.
        let ordered = eyeballs::interleave(permitted);
        let attempts = eyeballs::race(&ordered, eyeballs::ATTEMPT_DELAY, |address| {
            connect_one(source.filter(|s| s.is_ipv4() == address.is_ipv4()), address)
        });
        match tokio::time::timeout_at(deadline, attempts).await {
            Err(_) | Ok(Err(None)) => Err(EgressError::TimedOut(target.to_string())),
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(Some(error))) => Err(error),
        }
    }
}

/// Connects to one address, bound to `source` if given.
async fn connect_one(
    source: Option<IpAddr>,
    address: SocketAddr,
) -> Result<TcpStream, EgressError> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|error| {
        tracing::warn!(%error, "cannot open an egress socket: raise the open-file limit (LimitNOFILE)");
        EgressError::LocalResources(error)
    })?;
    if let Some(source) = source {
        // The port is chosen at connect, per destination: a bound socket
        // holds no port of its own (IP_BIND_ADDRESS_NO_PORT), so a busy
        // source address is not out of ports at some 28,000 sockets (TIME_WAIT
        // included) in all.
        if let Err(error) = nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::IpBindAddressNoPort,
            &true,
        ) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(%error, "IP_BIND_ADDRESS_NO_PORT not available: each egress socket bound to a source address holds a port of its own");
            });
        }
        socket
            .bind(SocketAddr::new(source, 0))
            .map_err(|error| bind_failed(source, error))?;
    }
    match socket.connect(address).await {
        Ok(stream) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(EgressError::Refused(address))
        }
        Err(error) => match source {
            // No local port left on the source for this destination: ours
            // to fix, not the destination's fault. (Unbound, EADDRNOTAVAIL
            // can also mean no usable address of the family: unreachable.)
            Some(source) if error.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                warn_out_of_ports(source, Some(address), &error);
                Err(EgressError::LocalResources(error))
            }
            _ => Err(EgressError::Unreachable(address, error)),
        },
    }
}

/// What a failed bind to a client's source address means: the address is
/// not on this host (EADDRNOTAVAIL, and anything else the bind refuses): the
/// identity must move; but no port left on it (EADDRINUSE) is a busy node,
/// not a reason to move the client off its address for good.
fn bind_failed(source: IpAddr, error: std::io::Error) -> EgressError {
    if error.raw_os_error() == Some(libc::EADDRINUSE) {
        warn_out_of_ports(source, None, &error);
        EgressError::LocalResources(error)
    } else {
        EgressError::SourceUnusable(source, error)
    }
}

/// Says, at most once a minute, that a source address ran out of local
/// ports: the customers get a local shortage (SOCKS5 general failure, HTTP
/// 503), and the operator the cause.
fn warn_out_of_ports(source: IpAddr, destination: Option<SocketAddr>, error: &std::io::Error) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last.saturating_add(60)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(%source, ?destination, %error, "egress source address out of local ports: widen net.ipv4.ip_local_port_range, or add addresses to egress.sources");
    }
}

/// An IPv4-mapped IPv6 address is judged (and connected to) as the IPv4
/// address it carries.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// [`canonical`], with the port.
pub(crate) fn canonical_addr(address: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical(address.ip()), address.port())
}

fn denied_by_default(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => denied_v4(ip),
        IpAddr::V6(ip) => denied_v6(ip),
    }
}

fn denied_v4(ip: Ipv4Addr) -> bool {
    let [a, b, _, _] = ip.octets();
    ip.is_unspecified()
        || a == 0                                   // 0.0.0.0/8 "this network"
        || ip.is_loopback()                         // 127.0.0.0/8
        || ip.is_private()                          // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local()                       // 169.254/16, metadata 169.254.169.254
        || (a == 100 && (64..128).contains(&b))     // 100.64/10 CGNAT
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // 192.0.0.0/24 protocol assignments
        || (a == 198 && (b == 18 || b == 19))       // 198.18/15 benchmarking
        || ip.is_multicast()                        // 224/4
        || a >= 240                                 // 240/4 reserved, broadcast
        || ip.is_documentation()
}

fn denied_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let first = s[0];
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00                // fc00::/7 unique local (fd00:ec2::254 metadata)
        || (first & 0xffc0) == 0xfe80                // fe80::/10 link-local
        || (first & 0xffc0) == 0xfec0                // fec0::/10 site-local
        || (first == 0x2001 && s[1] == 0x0db8)       // 2001:db8::/32 documentation
        || (first == 0x0100 && s[1..4] == [0; 3])    // 100::/64 discard-only
        || (first == 0x2001 && s[1] == 0x0002 && s[2] == 0) // 2001:2::/48 benchmarking
        || (first == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001) // 64:ff9b:1::/48 local-use NAT64
        || embedded_v4(ip).into_iter().flatten().any(denied_v4)
}

/// The IPv4 addresses an IPv6 address carries where a translator or tunnel
/// would deliver to them, so that one can judge it as those (a denied IPv4
/// address must not be reachable in IPv6 clothing):
/// - `::a.b.c.d` (IPv4-compatible, deprecated);
/// - `::ffff:0:a.b.c.d` (IPv4-translated, RFC 2765);
/// - `64:ff9b::a.b.c.d` (NAT64 well-known prefix, RFC 6052);
/// - `2002:AABB:CCDD::/48` (6to4, RFC 3056: the relay's IPv4 in bits 16-48);
/// - `2001:0::/32` (Teredo, RFC 4380: the server's IPv4 in bits 32-64, the
///   client's, inverted, in the last 32).
///
/// (IPv4-mapped `::ffff:a.b.c.d` is turned into IPv4 before, by [`canonical`].)
/// No allocation: it runs for every destination.
fn embedded_v4(ip: Ipv6Addr) -> [Option<Ipv4Addr>; 2] {
    let s = ip.segments();
    let low = Ipv4Addr::from((u128::from(ip) & 0xffff_ffff) as u32);
    let pair = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let compatible = s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback();
    let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
    let nat64 = s[0] == 0x0064 && s[1] == 0xff9b && s[2..6] == [0; 4];
    if compatible || translated || nat64 {
        [Some(low), None]
    } else if s[0] == 0x2002 {
        [Some(pair(s[1], s[2])), None]
    } else if s[0] == 0x2001 && s[1] == 0 {
        [
            Some(pair(s[2], s[3])),
            Some(Ipv4Addr::from(!u32::from(low))),
        ]
    } else {
        [None, None]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_out_of_ports_keeps_its_clients_and_one_not_on_the_host_moves_them() {
        let source: IpAddr = "192.0.2.7".parse().expect("ip");
        let in_use = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        assert!(matches!(
            bind_failed(source, in_use),
            EgressError::LocalResources(_)
        ));
        let gone = std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        assert!(matches!(
            bind_failed(source, gone),
            EgressError::SourceUnusable(..)
        ));
    }

    #[tokio::test]
    async fn an_ipv4_mapped_destination_leaves_from_the_clients_ipv4_source() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let e = egress(&["127.0.0.0/8"]);
        let source: IpAddr = "127.0.0.2".parse().expect("ip");
        let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{port}")
            .parse()
            .expect("address");
        let stream = e
            .connect("alice", Some(source), &Target::Address(mapped))
            .await
            .expect("connect");
        let (_, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer.ip(), source, "left from the client's source");
        drop(stream);
    }

    #[tokio::test]
    async fn a_bound_egress_socket_takes_its_port_at_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = listener.local_addr().expect("address");
        let source = Some("127.0.0.1".parse().expect("ip"));
        let stream = connect_one(source, at).await.expect("connect");
        let no_port =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::IpBindAddressNoPort)
                .expect("getsockopt");
        assert!(
            no_port,
            "IP_BIND_ADDRESS_NO_PORT on a socket bound to a source"
        );
    }

    fn egress(allow: &[&str]) -> Egress {
        let allow = allow.iter().map(|a| a.parse().expect("cidr")).collect();
        Egress::with_host_addresses(allow, Duration::from_secs(1), HostAddresses::default())
    }

    #[test]
    fn the_hosts_own_addresses_are_denied_unless_allowed() {
        let own = ["100.128.0.1", "2606:4700::1111"];
        let host = HostAddresses::fixed(own.iter().map(|a| a.parse().expect("ip")));
        let e = Egress::with_host_addresses(Vec::new(), Duration::from_secs(1), host.clone());
        let disguised = [
            "::ffff:100.128.0.1",
            "64:ff9b::100.128.0.1",
            "2002:6480:1::1",
            "::ffff:0:100.128.0.1",
        ];
        for address in own.iter().chain(&disguised) {
            assert!(
                !e.permits(address.parse().expect("ip")),
                "{address} is the host's own: denied"
            );
        }
        assert!(e.permits("100.128.0.2".parse().expect("ip")));
        let allowed = Egress::with_host_addresses(
            vec!["100.128.0.1/32".parse().expect("cidr")],
            Duration::from_secs(1),
            host,
        );
        assert!(allowed.permits("100.128.0.1".parse().expect("ip")));
        assert!(!allowed.permits("2606:4700::1111".parse().expect("ip")));
    }

    #[tokio::test]
    async fn a_connect_to_one_of_the_hosts_addresses_is_denied() {
        // Whatever addresses this machine has: each is refused before any
        // connection is tried (a non-loopback one is the case that matters;
        // loopback is denied by its range anyway).
        let e = Egress::new(Vec::new(), Duration::from_secs(1));
        for address in host_addresses::read().expect("getifaddrs") {
            let target = Target::Address(SocketAddr::new(address, 9));
            assert!(
                matches!(
                    e.connect("alice", None, &target).await,
                    Err(EgressError::Denied(_))
                ),
                "{address}"
            );
        }
    }

    #[test]
    fn default_deny_covers_the_special_ranges() {
        let e = egress(&[]);
        for denied in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::",
            // IPv4 in IPv6 clothing: 6to4 of 169.254.169.254 and of 10.0.0.1,
            // NAT64 and IPv4-translated of loopback, Teredo with a private
            // server or a private (inverted) client.
            "2002:a9fe:a9fe::",
            "2002:a00:1:1::5",
            "64:ff9b::7f00:1",
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            "::10.0.0.1",
            "2001:0:a00:1::1",
            "2001:0:808:808::f5ff:fffe",
            // Local-use NAT64, discard-only, benchmarking, documentation.
            "64:ff9b:1::1",
            "100::1",
            "2001:2::1",
            "2001:db8::1",
        ] {
            assert!(
                !e.permits(denied.parse().expect("ip")),
                "{denied} must be denied"
            );
        }
        for allowed in [
            "1.1.1.1",
            "8.8.8.8",
            "2606:4700::1111",
            "100.128.0.1",
            // The same families carrying public IPv4 addresses.
            "2002:808:808::1",
            "64:ff9b::808:808",
            "2001:0:808:808::f7f7:f7f7",
        ] {
            assert!(
                e.permits(allowed.parse().expect("ip")),
                "{allowed} must be allowed"
            );
        }
    }

    #[test]
    fn every_denied_ipv4_address_is_denied_in_each_ipv6_form_that_carries_it() {
        let e = egress(&[]);
        let forms = |v4: Ipv4Addr| {
            let [a, b, c, d] = v4.octets();
            let hi = u16::from_be_bytes([a, b]);
            let lo = u16::from_be_bytes([c, d]);
            let inverted = !u32::from(v4);
            [
                Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo),
                Ipv6Addr::new(0x2001, 0, hi, lo, 0, 0, 0, 1),
                Ipv6Addr::new(
                    0x2001,
                    0,
                    0x0808,
                    0x0808,
                    0,
                    0,
                    (inverted >> 16) as u16,
                    inverted as u16,
                ),
            ]
        };
        for v4 in [
            "127.0.0.1",
            "10.20.30.40",
            "172.31.255.1",
            "192.168.0.1",
            "169.254.169.254",
            "100.100.100.100",
            "0.1.2.3",
            "198.18.0.1",
        ] {
            let v4: Ipv4Addr = v4.parse().expect("ip");
            assert!(!e.permits(IpAddr::V4(v4)), "{v4}");
            for v6 in forms(v4) {
                assert!(!e.permits(IpAddr::V6(v6)), "{v6} carries {v4}");
            }
        }
    }

    #[test]
    fn allow_list_overrides_the_deny() {
        let e = egress(&["127.0.0.1/32"]);
        assert!(e.permits("127.0.0.1".parse().expect("ip")));
        assert!(e.permits("::ffff:127.0.0.1".parse().expect("ip")));
        assert!(!e.permits("127.0.0.2".parse().expect("ip")));
    }

    /// Through a WireGuard exit (an IPv4 source that must be used), an
    /// IPv6 destination is not refused as if forbidden: the route cannot
    /// carry it, and the caller tries the next one. A forbidden destination
    /// stays forbidden. Nothing is sent: both fail before any connect.
    #[tokio::test]
    async fn an_ipv6_destination_through_an_ipv4_only_route_is_unsupported_not_denied() {
        let e = egress(&[]);
        let exit = Some("10.9.0.2".parse().expect("ip"));
        let ipv6 = Target::Address("[2606:4700::1111]:80".parse().expect("address"));
        assert!(matches!(
            e.connect_from("alice", exit, true, &ipv6).await,
            Err(EgressError::FamilyUnsupported(_))
        ));
        let forbidden = Target::Address("[fd00:ec2::254]:80".parse().expect("address"));
        assert!(matches!(
            e.connect_from("alice", exit, true, &forbidden).await,
            Err(EgressError::Denied(_))
        ));
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_denied_address_is_denied() {
        let e = egress(&[]);
        let target = Target::Name {
            host: "localhost".into(),
            port: 9,
        };
        assert!(matches!(
            e.connect("alice", None, &target).await,
            Err(EgressError::Denied(_))
        ));
    }
}
