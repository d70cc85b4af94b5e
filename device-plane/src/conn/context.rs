//! What every connection handler shares: the clients, the egress, the
//! timeouts, the plane's mode, and the way to hand a connection over.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch, Semaphore};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use tokio::net::TcpStream;

use super::auth_guard::AuthGuard;
use super::handover::Answer;
use crate::clients::Directory;
use crate::egress::routes::DIRECT;
use crate::egress::watch::Via;
use crate::egress::{Egress, EgressError, Target};
use crate::identity::Identities;
use blipless_store::EgressPolicy;

/// What the plane asks of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve normally.
    Serving,
    /// A successor is active: hand every connection over as soon as it is
    /// between requests (HTTP) or established (tunnels).
    Handover,
    /// No successor: finish within the grace; idle HTTP connections close.
    Finish,
}

/// Shared by every connection this plane serves.
#[derive(Debug)]
pub struct Context {
    /// Known clients.
    pub directory: Arc<Directory>,
    /// Client identities: egress identities and activity.
    pub identities: Arc<Identities>,
    /// The egress policy and connector.
    pub egress: Egress,
    /// Time a customer has to finish its proxy handshake.
    pub handshake_timeout: Duration,
    /// A tunnel with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Failed authentications: counted, logged rate-limited, throttled per source.
    pub auth: Arc<AuthGuard>,
    /// The HTTP proxy's timeouts and head limit (`with_http_limits`).
    pub http_limits: super::http::Limits,
    /// What the HTTP proxy refused (431, 408, 504, userinfo).
    pub http_counters: super::http::Counters,
    /// Every live connection task.
    pub connections: TaskTracker,
    /// Serving, handing over, or finishing.
    pub mode: watch::Sender<Mode>,
    /// Cancelled when the drain grace is over: everything still open is cut.
    /// Replaced by a fresh one if the plane is re-activated afterwards.
    cut_all: Mutex<CancellationToken>,
    /// Descriptors kept in reserve: near the open-file limit new
    /// connections are refused, never the channel lost. Shared with the
    /// DNS gateway's TCP connections (`with_fds`).
    pub fds: Arc<super::fd_budget::FdBudget>,
    /// What the WireGuard DNS gateway counted, when there is one
    /// (`with_dns_counters`): reported with the refusals.
    pub dns_counters: Option<Arc<crate::wg::dns::DnsCounters>>,
    /// The WireGuard packet path's counters (`with_packet_counters`):
    /// reported with the refusals.
    pub packet_counters: Arc<crate::wg::packets::PacketCounters>,
    /// The running counts the last report carried, by any attachment: the
    /// next attachment reports from them, so what was counted after the
    /// last report of a channel that ended is reported on the next one.
    reported_counts: Mutex<blipless_protocol::channel::DeviceReport>,
    /// `limits.connections` and `limits.tunnels_per_client` (`with_caps`).
    pub caps: super::caps::Caps,
    /// Connections taken since start (accepted and adopted).
    pub taken: AtomicU64,
    /// Connections handed to a successor.
    pub migrated: AtomicU64,
    /// The device channel, while attached: handovers go through it.
    pub(super) channel: Mutex<Option<Arc<UnixSeqpacket>>>,
    /// Handovers in flight at once: a tunnel keeps relaying until it holds
    /// one, so each pauses only for its own handover, not for the whole queue.
    pub(super) handover_slots: Arc<Semaphore>,
    /// Handovers sent and not yet answered (MigrateDone, MigrateNotTaken).
    pub(super) awaiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Of those, the ones whose Migrate went out (counted in `migrated`)
    /// and whose sender still waits: open here, but handed over.
    pub(super) sent_awaiting: AtomicU64,
    /// A SOCKS5 UDP association with no datagram for this long is closed
    /// (`with_udp_idle_timeout`; 2 minutes by default).
    pub udp_idle_timeout: Duration,
    /// The address UDP ASSOCIATE replies name for the relay behind a 1:1
    /// NAT (`proxy.udp_public_address`; `with_udp_public_address`).
    pub udp_public_address: Option<IpAddr>,
    /// The ingress attached now passes UDP associations on at a deploy
    /// (its Welcome said so); with an older one they close instead.
    pub channel_passes_udp: AtomicBool,
    /// The ingress attached now accepts with TCP_NODELAY inherited from its
    /// listeners (its Welcome said so); with an older one it is set here.
    pub accepted_nodelay: AtomicBool,
    /// What the SOCKS5 UDP relays dropped, by reason.
    pub udp_counters: super::udp_associate::Counters,
}

impl Context {
    /// A context serving normally, not yet attached.
    pub fn new(
        directory: Arc<Directory>,
        identities: Arc<Identities>,
        egress: Egress,
        handshake_timeout: Duration,
        idle_timeout: Duration,
        auth: Arc<AuthGuard>,
    ) -> Self {
        Self {
            directory,
            identities,
            egress,
            handshake_timeout,
            idle_timeout,
            auth,
            http_limits: super::http::Limits::default(),
            http_counters: super::http::Counters::default(),
            connections: TaskTracker::new(),
            mode: watch::channel(Mode::Serving).0,
            cut_all: Mutex::new(CancellationToken::new()),
            fds: Arc::new(super::fd_budget::FdBudget::from_rlimit()),
            dns_counters: None,
            packet_counters: Arc::default(),
            reported_counts: Mutex::default(),
            caps: super::caps::Caps::default(),
            taken: AtomicU64::new(0),
            migrated: AtomicU64::new(0),
            channel: Mutex::new(None),
            handover_slots: Arc::new(Semaphore::new(super::handover::HANDOVER_SLOTS)),
            awaiting: Mutex::new(HashMap::new()),
            sent_awaiting: AtomicU64::new(0),
            udp_idle_timeout: Duration::from_secs(120),
            udp_public_address: None,
            channel_passes_udp: AtomicBool::new(false),
            accepted_nodelay: AtomicBool::new(false),
            udp_counters: super::udp_associate::Counters::default(),
        }
    }

    /// The same context naming `address` in UDP ASSOCIATE replies, for
    /// customers of its family.
    pub fn with_udp_public_address(mut self, address: Option<IpAddr>) -> Self {
        self.udp_public_address = address;
        self
    }

    /// The same context with this idle timeout for SOCKS5 UDP associations.
    pub fn with_udp_idle_timeout(mut self, timeout: Duration) -> Self {
        self.udp_idle_timeout = timeout;
        self
    }

    /// The same context with these caps on connections and tunnels.
    pub fn with_caps(mut self, caps: super::caps::Caps) -> Self {
        self.caps = caps;
        self
    }

    /// The running counts the last report carried (see `reported_counts`).
    pub fn reported_counts(&self) -> blipless_protocol::channel::DeviceReport {
        self.reported_counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Notes that a report carried the running counts `counts`.
    pub fn set_reported_counts(&self, counts: blipless_protocol::channel::DeviceReport) {
        *self
            .reported_counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = counts;
    }

    /// The same context reporting the WireGuard packet path's counters.
    pub fn with_packet_counters(
        mut self,
        counters: Arc<crate::wg::packets::PacketCounters>,
    ) -> Self {
        self.packet_counters = counters;
        self
    }

    /// The same context reporting the DNS gateway's counters.
    pub fn with_dns_counters(mut self, counters: Option<Arc<crate::wg::dns::DnsCounters>>) -> Self {
        self.dns_counters = counters;
        self
    }

    /// The same context with this descriptor budget (shared with the DNS
    /// gateway, whose TCP connections it counts).
    pub fn with_fds(mut self, fds: Arc<super::fd_budget::FdBudget>) -> Self {
        self.fds = fds;
        self
    }

    /// The same context with these HTTP proxy limits.
    pub fn with_http_limits(mut self, limits: super::http::Limits) -> Self {
        self.http_limits = limits;
        self
    }

    /// Connects `client` to `target` through its egress window on this node
    /// (docs/EGRESS.md, "Windows"): the first member that is up, the next
    /// if an upstream fails. The window and the client's identity (source
    /// address, sticky session) are opened on first use and kept across
    /// deploys. A source address that can no longer be bound evicts the
    /// identity; the connect is retried once with a new one.
    /// Returns the connection with the route it left by, which its tunnel
    /// watches ([`Via::until_down`]).
    pub async fn connect_for(
        &self,
        client: &str,
        target: &Target,
    ) -> Result<(TcpStream, Via), EgressError> {
        self.identities.touch(client);
        // Nothing is connected for a client removed meanwhile.
        let Some((held, known)) = self.identities.open_known(&self.directory, client).await else {
            return Err(EgressError::NoRoute(format!("client {client} was removed")));
        };
        let policy = known.record.egress.clone();
        let routes = self.egress.routes.clone();
        if routes.upstreams().is_empty() {
            // A node without upstreams: direct, as before there were any.
            return match policy {
                EgressPolicy::Any | EgressPolicy::Direct => self
                    .connect_direct(&known, &held, target)
                    .await
                    .map(|stream| (stream, Via::Direct)),
                EgressPolicy::Upstream(_) | EgressPolicy::Tags(_) => {
                    Err(EgressError::NoRoute(policy.to_string()))
                }
            };
        }
        let current = self.identities.window(client);
        let window = routes.window(&policy, &current);
        if window.is_empty() {
            return Err(EgressError::NoRoute(policy.to_string()));
        }
        if window != current {
            self.identities.set_window(&held, window.clone()).await;
        }
        let session = held.identity.session.clone().unwrap_or_default();
        // Members that are up first, in window order; then the others, in
        // case their last probe is stale.
        let (up, down): (Vec<&String>, Vec<&String>) = window
            .iter()
            .partition(|name| routes.get(name).is_some_and(|r| r.is_up()));
        let mut last_error = EgressError::NoRoute(policy.to_string());
        for name in up.into_iter().chain(down) {
            let Some(route) = routes.get(name) else {
                continue;
            };
            if route.name == DIRECT {
                return self
                    .connect_direct(&known, &held, target)
                    .await
                    .map(|stream| (stream, Via::Direct));
            }
            match self
                .egress
                .connect_via(route, None, target, client, &session)
                .await
            {
                Ok(stream) => return Ok((stream, Via::Route(route.clone()))),
                // An IPv6-only destination through a WireGuard exit: the
                // next member may carry it.
                Err(error @ EgressError::FamilyUnsupported(_)) => {
                    tracing::debug!(client, route = %route.name, %error, "trying the next in the window");
                    last_error = error;
                }
                Err(EgressError::Upstream {
                    route: failed,
                    error,
                }) if crate::egress::via::is_upstream_fault(&error) => {
                    tracing::info!(client, route = %failed, %error, "upstream failed; trying the next in the window");
                    last_error = EgressError::Upstream {
                        route: failed,
                        error,
                    };
                }
                Err(other) => return Err(other),
            }
        }
        // Every member failed: the next connection finds the window refilled
        // from what is up.
        let refilled = routes.window(&policy, &window);
        if refilled != window {
            self.identities.set_window(&held, refilled).await;
        }
        Err(last_error)
    }

    /// Direct egress from the client's source address.
    async fn connect_direct(
        &self,
        known: &crate::clients::Client,
        held: &crate::identity::ClientIdentity,
        target: &Target,
    ) -> Result<TcpStream, EgressError> {
        let client = known.record.name.as_str();
        let rotates = known.limiter.source_policy() == Some(blipless_store::SourcePolicy::Rotate);
        if rotates {
            // A new source for this connection; its identity keeps the
            // sticky one for when the policy changes back.
            return self
                .egress
                .connect(client, self.identities.rotating_source(), target)
                .await;
        }
        match self
            .egress
            .connect(client, held.identity.source, target)
            .await
        {
            Err(EgressError::SourceUnusable(source, error)) => {
                tracing::warn!(client, %source, %error, "egress identity unusable; evicting it");
                self.identities.source_unusable(client, source).await;
                let held = self.identities.open(client).await;
                self.egress
                    .connect(client, held.identity.source, target)
                    .await
            }
            other => other,
        }
    }

    /// The token that cuts every connection at the end of a drain's grace.
    pub fn cut_token(&self) -> CancellationToken {
        self.cut_all
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Cuts every connection (the drain grace is over).
    pub fn cut_everything(&self) {
        self.cut_token().cancel();
    }

    /// Back to serving: a later drain gets a grace of its own. The cut is
    /// replaced only once it has been used: a connection takes the token
    /// once for its whole relay, so a fresh one after a handover that ended
    /// early (its successor died) left every connection still waiting for
    /// its turn out of every later cut, past `drain.grace`.
    pub fn serve_again(&self) {
        {
            let mut cut = self
                .cut_all
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if cut.is_cancelled() {
                *cut = CancellationToken::new();
            }
        }
        self.mode.send_replace(Mode::Serving);
        self.connections.reopen();
    }

    /// Sets (or clears) the channel handovers go through. Clearing it
    /// releases every handover still waiting for a confirmation.
    pub fn set_channel(&self, channel: Option<Arc<UnixSeqpacket>>) {
        if channel.is_none() {
            self.awaiting_map().clear();
        }
        *self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = channel;
    }

    pub(super) fn channel(&self) -> Option<Arc<UnixSeqpacket>> {
        self.channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The plane's mode now.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Completes when the plane stops handing over (serving again, or
    /// finishing).
    pub fn handover_ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.mode_left(Mode::Handover)
    }

    /// Completes when the plane stops serving (handover or finish).
    pub fn serving_ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.mode_left(Mode::Serving)
    }

    /// Completes once the plane's mode is not `left` (at once if it is not
    /// now); never if the mode can no longer change.
    fn mode_left(&self, left: Mode) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut mode = self.mode.subscribe();
        async move {
            if mode.wait_for(|m| *m != left).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
