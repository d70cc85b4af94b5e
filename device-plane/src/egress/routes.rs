//! The node's egress routes and their health: `direct` and each configured
//! upstream (docs/EGRESS.md, "Routes" and "Health").
//!
//! An upstream is marked down after `egress.probe.failures` consecutive
//! failures, of its probes or of customer connections through it, and up
//! again by one success. Going down cancels the route's token, which every
//! tunnel through it watches: orphans fail fast (the customer's connection
//! closes) instead of hanging on a dead exit.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use blipless_config::upstreams::{Secret, Upstream, UpstreamKind, WireguardExit};
use blipless_store::EgressPolicy;
use tokio_util::sync::CancellationToken;

use super::window::Candidate;

/// The direct route's name.
pub const DIRECT: &str = "direct";

/// How a route reaches destinations.
#[derive(Debug)]
pub enum RouteKind {
    /// Kernel sockets from this node.
    Direct,
    /// Through a SOCKS5 upstream.
    Socks5 {
        /// `host:port`.
        address: String,
        /// The username template ({client}, {session}).
        username: Option<String>,
        /// The password.
        password: Option<Secret>,
    },
    /// Through a WireGuard exit: kernel sockets bound to the exit's tunnel
    /// address, which the host's rules route into its TUN device.
    Wireguard(Box<WireguardExit>),
}

/// One route and what is known of its health.
#[derive(Debug)]
pub struct Route {
    /// `direct` or the upstream's name.
    pub name: String,
    /// The upstream's tags.
    pub tags: Vec<String>,
    /// How it reaches destinations.
    pub kind: RouteKind,
    up: AtomicBool,
    failures: AtomicUsize,
    /// Latency of the last successful probe or connect, µs; 0: not measured.
    latency_us: AtomicU64,
    /// Tunnels opened through it since start.
    pub opened: AtomicU64,
    /// Times it went down.
    pub downs: AtomicU64,
    /// Cancelled when it goes down; replaced by a fresh one.
    down_token: Mutex<CancellationToken>,
    /// The addresses it was last reached at: an adopted tunnel's egress
    /// socket is matched to its route by its peer address.
    addresses: Mutex<Vec<SocketAddr>>,
    /// A SOCKS5 upstream's own addresses, resolved and kept.
    pub resolved: super::upstream_addresses::UpstreamAddresses,
    /// Why it is down, if it is.
    last_error: Mutex<Option<String>>,
}

impl Route {
    fn new(name: String, tags: Vec<String>, kind: RouteKind) -> Self {
        Self {
            name,
            tags,
            kind,
            // Up until shown otherwise: a node starts serving at once, and the
            // first probe (at start) corrects it within the probe timeout.
            up: AtomicBool::new(true),
            failures: AtomicUsize::new(0),
            latency_us: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            downs: AtomicU64::new(0),
            down_token: Mutex::new(CancellationToken::new()),
            addresses: Mutex::new(Vec::new()),
            resolved: Default::default(),
            last_error: Mutex::new(None),
        }
    }

    /// Whether it is up now.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Its latency in µs, if measured.
    pub fn latency_us(&self) -> Option<u64> {
        Some(self.latency_us.load(Ordering::Relaxed)).filter(|&l| l > 0)
    }

    /// Why it went down, while it is down.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// A success (probe or connect) after `latency_us`, reaching `peer`.
    pub fn succeeded(&self, latency_us: u64, peer: Option<SocketAddr>) {
        // A smoothed latency: one slow answer does not reorder anything
        // anyway (windows do not re-rank healthy members), but the figure
        // shown is steadier.
        let old = self.latency_us.load(Ordering::Relaxed);
        let new = if old == 0 {
            latency_us.max(1)
        } else {
            ((old * 7 + latency_us) / 8).max(1)
        };
        self.latency_us.store(new, Ordering::Relaxed);
        self.reached(peer);
    }

    /// A success that measured no latency (traffic seen, a connection
    /// made): the route is up, and its latency stays what it was, unknown
    /// included. (A made-up figure for an unmeasured route ranked it ahead
    /// of every measured one.)
    pub fn reached(&self, peer: Option<SocketAddr>) {
        self.failures.store(0, Ordering::Relaxed);
        if let Some(peer) = peer {
            let mut addresses = lock(&self.addresses);
            if !addresses.contains(&peer) {
                addresses.push(peer);
                if addresses.len() > 16 {
                    addresses.remove(0);
                }
            }
        }
        if !self.up.swap(true, Ordering::Relaxed) {
            *lock(&self.last_error) = None;
            tracing::info!(route = %self.name, "egress route is up again");
        }
    }

    /// A failure; the `threshold`-th in a row marks the route down and
    /// cancels its tunnels. Returns whether this call marked it down.
    pub fn failed(&self, threshold: usize, error: &str) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < threshold.max(1) || !self.up.swap(false, Ordering::Relaxed) {
            return false;
        }
        *lock(&self.last_error) = Some(error.to_owned());
        self.downs.fetch_add(1, Ordering::Relaxed);
        let token = std::mem::take(&mut *lock(&self.down_token));
        token.cancel();
        tracing::warn!(route = %self.name, failures, %error, "egress route is down: its tunnels are closed, windows refill");
        true
    }

    /// Cancelled when the route next goes down.
    pub fn down_token(&self) -> CancellationToken {
        lock(&self.down_token).clone()
    }

    fn reached_at(&self, peer: SocketAddr) -> bool {
        lock(&self.addresses).contains(&peer)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every route of the node.
#[derive(Debug)]
pub struct Routes {
    direct: Arc<Route>,
    upstreams: Vec<Arc<Route>>,
    /// Cancelled once every SOCKS5 upstream has had its first probe
    /// ([`Routes::first_probes_done`]): by then the plane has reached each
    /// one that answers, and knows its address.
    probed: CancellationToken,
    /// Consecutive failures that mark an upstream down.
    pub failure_threshold: usize,
    /// Routes per window.
    pub window_size: usize,
}

impl Default for Routes {
    fn default() -> Self {
        Self::new(&[], 2, 2)
    }
}

impl Routes {
    /// Direct plus the configured upstreams.
    pub fn new(upstreams: &[Upstream], window_size: usize, failure_threshold: usize) -> Self {
        let upstreams = upstreams
            .iter()
            .map(|upstream| {
                let kind = match &upstream.kind {
                    UpstreamKind::Socks5(socks) => RouteKind::Socks5 {
                        address: socks.address.clone(),
                        username: socks.username.clone(),
                        password: socks.password.clone(),
                    },
                    UpstreamKind::Wireguard(exit) => RouteKind::Wireguard(Box::new(exit.clone())),
                };
                Arc::new(Route::new(
                    upstream.name.clone(),
                    upstream.tags.clone(),
                    kind,
                ))
            })
            .collect();
        Self {
            direct: Arc::new(Route::new(DIRECT.into(), Vec::new(), RouteKind::Direct)),
            upstreams,
            probed: CancellationToken::new(),
            failure_threshold,
            window_size: window_size.max(1),
        }
    }

    /// Says every SOCKS5 upstream has had its first probe.
    pub fn first_probes_done(&self) {
        self.probed.cancel();
    }

    /// Cancelled once every SOCKS5 upstream has had its first probe.
    pub fn probed(&self) -> CancellationToken {
        self.probed.clone()
    }

    /// The upstreams, in configuration order.
    pub fn upstreams(&self) -> &[Arc<Route>] {
        &self.upstreams
    }

    /// Whether a client with `policy` may leave straight from the node for
    /// what goes only directly (UDP associations, IPv6 inside the WireGuard
    /// tunnel: neither is carried through upstreams or exits): `direct`, or
    /// `any` on a node without upstreams, where `any` means `direct`.
    pub fn leaves_directly(&self, policy: &blipless_store::EgressPolicy) -> bool {
        use blipless_store::EgressPolicy;
        match policy {
            EgressPolicy::Direct => true,
            EgressPolicy::Any => self.upstreams.is_empty(),
            EgressPolicy::Upstream(_) | EgressPolicy::Tags(_) => false,
        }
    }

    /// Every route: direct first, then the upstreams.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Route>> {
        std::iter::once(&self.direct).chain(self.upstreams.iter())
    }

    /// The route of this name.
    pub fn get(&self, name: &str) -> Option<&Arc<Route>> {
        self.all().find(|route| route.name == name)
    }

    /// The routes `policy` allows. `any` is every upstream when there are
    /// some (a node with upstreams does not leak customers out of its own
    /// address unless a policy says `direct`), else direct.
    pub fn allowed(&self, policy: &EgressPolicy) -> Vec<&Arc<Route>> {
        match policy {
            EgressPolicy::Direct => vec![&self.direct],
            EgressPolicy::Any if self.upstreams.is_empty() => vec![&self.direct],
            _ => self.allowed_upstreams(policy).collect(),
        }
    }

    /// The upstreams `policy` allows (none for `direct`).
    fn allowed_upstreams<'a, 'p>(
        &'a self,
        policy: &'p EgressPolicy,
    ) -> impl Iterator<Item = &'a Arc<Route>> + use<'a, 'p> {
        self.upstreams.iter().filter(move |route| match policy {
            EgressPolicy::Direct => false,
            EgressPolicy::Any => true,
            EgressPolicy::Upstream(name) => &route.name == name,
            EgressPolicy::Tags(tags) => route.tags.iter().any(|tag| tags.contains(tag)),
        })
    }

    /// Whether every route `policy` allows is a WireGuard exit: its
    /// clients' packets have nowhere to go but an exit. So is a policy that
    /// allows nothing on this node (an upstream it does not have): its
    /// clients have no route at all.
    pub fn allows_only_exits(&self, policy: &EgressPolicy) -> bool {
        !self.leaves_directly(policy)
            && self
                .allowed_upstreams(policy)
                .all(|route| matches!(route.kind, RouteKind::Wireguard(_)))
    }

    /// Whether `policy` allows the WireGuard exit whose mark is `mark`.
    pub fn allows_exit_marked(&self, policy: &EgressPolicy, mark: u32) -> bool {
        self.allowed_upstreams(policy)
            .any(|route| matches!(&route.kind, RouteKind::Wireguard(exit) if exit.mark == mark))
    }

    /// The window for `policy`, refilled from `current`
    /// ([`super::window::refill`]).
    pub fn window(&self, policy: &EgressPolicy, current: &[String]) -> Vec<String> {
        let allowed = self.allowed(policy);
        let candidates: Vec<Candidate<'_>> = allowed
            .iter()
            .map(|route| Candidate {
                name: &route.name,
                up: route.is_up(),
                latency_us: route.latency_us(),
            })
            .collect();
        super::window::refill(current, &candidates, self.window_size)
    }

    /// The upstreams an egress socket may go through: the WireGuard exit
    /// whose tunnel address it is bound to (`local`), else every SOCKS5
    /// upstream reached at its peer address (`peer`): more than one when
    /// upstreams share a gateway `host:port` and differ by login.
    pub fn routes_of(
        &self,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    ) -> Vec<&Arc<Route>> {
        let exit = self.upstreams.iter().find(|route| match &route.kind {
            RouteKind::Wireguard(exit) => {
                local.is_some_and(|l| l.ip() == std::net::IpAddr::V4(exit.address))
            }
            _ => false,
        });
        if let Some(exit) = exit {
            return vec![exit];
        }
        self.upstreams
            .iter()
            .filter(|route| matches!(route.kind, RouteKind::Socks5 { .. }))
            .filter(|route| peer.is_some_and(|p| route.reached_at(p)))
            .collect()
    }

    /// The WireGuard exits, with their routes.
    pub fn exits(&self) -> impl Iterator<Item = (&Arc<Route>, &WireguardExit)> {
        self.upstreams.iter().filter_map(|route| match &route.kind {
            RouteKind::Wireguard(exit) => Some((route, exit.as_ref())),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blipless_config::upstreams::Socks5Upstream;

    fn upstream(name: &str, tags: &[&str]) -> Upstream {
        Upstream {
            name: name.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            kind: UpstreamKind::Socks5(Socks5Upstream {
                address: "127.0.0.1:1".into(),
                username: None,
                password: None,
            }),
        }
    }

    #[test]
    fn policies_select_routes() {
        let routes = Routes::new(
            &[upstream("a", &["eu"]), upstream("b", &["us", "dc"])],
            2,
            2,
        );
        let names = |policy: EgressPolicy| -> Vec<String> {
            routes
                .allowed(&policy)
                .iter()
                .map(|r| r.name.clone())
                .collect()
        };
        assert_eq!(names(EgressPolicy::Any), ["a", "b"]);
        assert_eq!(names(EgressPolicy::Direct), ["direct"]);
        assert_eq!(names(EgressPolicy::Upstream("b".into())), ["b"]);
        assert_eq!(
            names(EgressPolicy::Tags(vec!["dc".into(), "eu".into()])),
            ["a", "b"]
        );
        assert!(names(EgressPolicy::Upstream("zz".into())).is_empty());
        assert_eq!(
            Routes::default().allowed(&EgressPolicy::Any)[0].name,
            DIRECT
        );
    }

    fn exit(name: &str, tags: &[&str], mark: u32) -> Upstream {
        let text = "[Interface]\nPrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n\
                    Address = 10.2.0.2/32\n\n[Peer]\n\
                    PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n\
                    Endpoint = 127.0.0.1:51820\nAllowedIPs = 0.0.0.0/0\n";
        Upstream {
            name: name.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            kind: UpstreamKind::Wireguard(WireguardExit {
                path: "exit.conf".into(),
                file: blipless_config::wg_quick::parse(text).expect("wg-quick"),
                address: std::net::Ipv4Addr::new(10, 2, 0, 2),
                tun: format!("blx{mark}"),
                mark,
            }),
        }
    }

    #[test]
    fn policies_that_allow_only_exits_and_which_marks_they_allow() {
        let routes = Routes::new(
            &[
                exit("nl", &["eu"], 7),
                exit("de", &["eu"], 8),
                upstream("socks", &["us"]),
            ],
            2,
            2,
        );
        let eu = EgressPolicy::Tags(vec!["eu".into()]);
        assert!(routes.allows_only_exits(&eu));
        assert!(routes.allows_only_exits(&EgressPolicy::Upstream("nl".into())));
        assert!(
            !routes.allows_only_exits(&EgressPolicy::Any),
            "a SOCKS5 upstream too"
        );
        assert!(!routes.allows_only_exits(&EgressPolicy::Direct));
        assert!(!routes.allows_only_exits(&EgressPolicy::Upstream("socks".into())));
        assert!(
            routes.allows_only_exits(&EgressPolicy::Upstream("gone".into())),
            "nothing allowed: no route, not direct"
        );
        assert!(routes.allows_exit_marked(&eu, 7) && routes.allows_exit_marked(&eu, 8));
        assert!(!routes.allows_exit_marked(&EgressPolicy::Upstream("nl".into()), 8));
        assert!(!routes.allows_exit_marked(&EgressPolicy::Direct, 7));
        let exits_only = Routes::new(&[exit("nl", &[], 7)], 2, 2);
        assert!(exits_only.allows_only_exits(&EgressPolicy::Any));
        assert!(!Routes::default().allows_only_exits(&EgressPolicy::Any));
        assert!(Routes::default().allows_only_exits(&EgressPolicy::Upstream("nl".into())));
    }

    #[test]
    fn only_direct_and_any_without_upstreams_leave_directly() {
        let bare = Routes::default();
        assert!(bare.leaves_directly(&EgressPolicy::Direct));
        assert!(bare.leaves_directly(&EgressPolicy::Any));
        let with = Routes::new(&[upstream("a", &["eu"])], 2, 2);
        assert!(with.leaves_directly(&EgressPolicy::Direct));
        assert!(!with.leaves_directly(&EgressPolicy::Any));
        assert!(!with.leaves_directly(&EgressPolicy::Upstream("a".into())));
        assert!(!with.leaves_directly(&EgressPolicy::Tags(vec!["eu".into()])));
    }

    /// A route brought up by traffic or a connection, before any probe
    /// measured it, stays unmeasured (ranked after measured routes), not
    /// 1 µs (ranked ahead of all of them, for good, since a busy exit is
    /// not probed again).
    #[test]
    fn a_success_that_measured_nothing_leaves_the_latency_unknown() {
        let routes = Routes::new(&[upstream("a", &[])], 2, 2);
        let route = &routes.upstreams()[0];
        assert!(route.failed(1, "no answer"));
        route.reached(None);
        assert!(route.is_up());
        assert_eq!(route.latency_us(), None);
        route.succeeded(2000, None);
        route.reached(None);
        assert_eq!(route.latency_us(), Some(2000), "a measured one is kept");
    }

    #[test]
    fn failures_mark_down_once_and_cancel_tunnels_and_a_success_brings_it_back() {
        let routes = Routes::new(&[upstream("a", &[])], 2, 2);
        let route = &routes.upstreams()[0];
        let token = route.down_token();
        assert!(!route.failed(2, "refused"), "one failure is not enough");
        assert!(route.is_up());
        assert!(route.failed(2, "refused"));
        assert!(!route.failed(2, "refused"), "already down");
        assert!(!route.is_up() && token.is_cancelled());
        assert_eq!(route.last_error().as_deref(), Some("refused"));
        let peer: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        route.succeeded(1500, Some(peer));
        assert!(route.is_up() && !route.down_token().is_cancelled());
        assert_eq!(route.latency_us(), Some(1500));
        let names: Vec<&str> = routes
            .routes_of(None, Some(peer))
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["a"]);
    }
}
