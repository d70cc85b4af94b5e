//! Warm-up, once per process: open the store, load the clients, pre-warm
//! the egress identities of recently active clients within the ready budget,
//! start the background duties, and attach the TUN queues (unless they are
//! to be inherited from a predecessor).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use blipless_store::{self as store, NodeId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::background;
use crate::clients::Directory;
use crate::conn::auth_guard::{self, AuthGuard};
use crate::conn::Context;
use crate::egress::Egress;
use crate::fault;
use crate::identity::Identities;
use crate::wg::endpoints::Snapshots;
use crate::wg::{PacketPath, TunWriter};

/// Ready goes out at least this long before the ingress's ready budget ends.
const READY_MARGIN: Duration = Duration::from_secs(5);

/// What warm-up builds once and every attachment reuses.
pub(super) struct Warm {
    pub(super) context: Arc<Context>,
    pub(super) packets: Arc<PacketPath>,
    /// Writes inner packets to the TUN device, apart from the channel reader.
    pub(super) tun_writer: TunWriter,
    pub(super) directory: Arc<Directory>,
    pub(super) identities: Arc<Identities>,
    pub(super) background: CancellationToken,
    /// The usage flushes and the feed follower ([`background::maintain`]),
    /// which stop at `background`; awaited at exit before the last flush.
    pub(super) maintaining: tokio::task::JoinHandle<()>,
    /// The WireGuard endpoint snapshots the ingress sends, kept in the store.
    pub(super) endpoints: Snapshots,
}

/// Opens the store and loads the clients (pre-warm will grow here).
pub(super) async fn warm_up(
    config: &Config,
    attached_at: Instant,
    successor: bool,
) -> anyhow::Result<Warm> {
    fault::stall_warmup().await;
    let store = store::open(&config.store.url).await.with_context(|| {
        format!(
            "opening the store {}",
            store::display_url(&config.store.url)
        )
    })?;
    let directory = Directory::load_with_defaults(store.clone(), config.limits.client_defaults)
        .await
        .context("loading clients from the store")?;
    if let Some(pools) = config
        .wireguard
        .pool6
        .and_then(|pool6| blipless_config::pool6::TunnelPools::new(config.wireguard.pool, pool6))
    {
        directory.set_pools6(pools);
    }
    tracing::info!(clients = directory.len(), store = %store::display_url(&config.store.url), "store opened");
    let node = NodeId {
        host: config.node.host.clone(),
        block: config.node.block.clone(),
    };
    let endpoints = Snapshots::new(store.clone(), node.clone());
    let identities = Arc::new(Identities::new(store, node, config.egress.sources.clone()));
    // Pre-warm, but say Ready in time: the ingress gives up deploy.ready_budget
    // after our Hello, and opening the store took some of that already.
    let left = config
        .deploy
        .ready_budget
        .saturating_sub(READY_MARGIN)
        .saturating_sub(attached_at.elapsed());
    let budget = config
        .prewarm
        .budget
        .min(left)
        .max(Duration::from_millis(100));
    let started = Instant::now();
    let report = identities
        .prewarm(
            config.prewarm.window,
            config.prewarm.concurrency,
            config.prewarm.device_timeout,
            budget,
            |client| directory.get(client).is_some(),
        )
        .await;
    tracing::info!(
        candidates = report.candidates,
        opened = report.opened,
        skipped = report.skipped,
        took = ?started.elapsed(),
        "pre-warm done"
    );
    let background = CancellationToken::new();
    let maintaining = tokio::spawn(background::maintain(
        directory.clone(),
        identities.clone(),
        config.store.usage_flush,
        background.clone(),
    ));
    let routes = Arc::new(crate::egress::routes::Routes::new(
        &config.egress.upstreams,
        config.egress.window.size,
        config.egress.probe.failures,
    ));
    let host = crate::egress::host_addresses::HostAddresses::watch();
    crate::egress::host_addresses::configured_public(config, &host);
    let egress = Egress::with_host_addresses(
        config.egress.allow.clone(),
        config.proxy.connect_timeout,
        host,
    )
    .with_routes(routes.clone());
    // Upstreams are probed from now on, the first time at once, so a plane
    // knows which are down before it says Ready.
    tokio::spawn(crate::egress::via::probe_forever(
        routes.clone(),
        egress.upstream_lookups.clone(),
        config.egress.probe.interval,
        config.egress.probe.timeout,
        background.clone(),
    ));
    // A successor inherits its predecessor's TUN queues at handover; the
    // first plane attaches its own now, before Ready.
    let packets = PacketPath::new(
        &config.egress.tun.name,
        config.egress.tun.queues,
        config.egress.tun.offload,
        egress.clone(),
        directory.clone(),
        successor,
    );
    let dns = dns_gateway(config);
    let packets = Arc::new(packets.with_dns(dns.clone()));
    // One descriptor budget for customer connections and for what else
    // clients can make the plane hold (DNS over TCP); made after the TUN
    // queues are open, which its baseline counts.
    let fds = Arc::new(crate::conn::fd_budget::FdBudget::from_rlimit());
    if let Some(dns) = &dns {
        dns.count_in(fds.clone());
        dns.serve_tcp();
    }
    // Failed logins are logged from one task, at most once a second per source.
    let auth = Arc::new(AuthGuard::new());
    tokio::spawn(auth_guard::log_every_second(
        auth.clone(),
        background.clone(),
    ));
    let context = Arc::new(
        Context::new(
            directory.clone(),
            identities.clone(),
            egress,
            config.proxy.handshake_timeout,
            config.proxy.idle_timeout,
            auth,
        )
        .with_http_limits(crate::conn::http::Limits::from_config(config))
        .with_udp_idle_timeout(config.proxy.udp_idle_timeout)
        .with_udp_public_address(config.proxy.udp_public_address)
        .with_fds(fds)
        .with_dns_counters(dns.as_ref().map(|gateway| gateway.counters.clone()))
        .with_packet_counters(packets.counters.clone())
        .with_caps(
            crate::conn::caps::Caps::new(
                config.limits.connections,
                config.limits.tunnels_per_client,
            )
            .with_udp_associations_per_client(config.limits.udp_associations_per_client),
        ),
    );
    let exits = Arc::new(crate::wg::exits::Exits::new(
        routes,
        directory.clone(),
        identities.clone(),
        crate::wg::exit::ExitProbe {
            interval: config.egress.probe.interval,
            timeout: config.egress.probe.timeout,
            failures: config.egress.probe.failures,
        },
        successor,
    ));
    // Before the plane serves: the packet path lets steered clients through
    // only once the map is known to hold them.
    exits.read_steering().await;
    packets.set_exits(exits);
    let tun_writer = TunWriter::spawn(packets.clone());
    Ok(Warm {
        context,
        packets,
        tun_writer,
        directory,
        identities,
        background,
        maintaining,
        endpoints,
    })
}

/// The DNS gateway on the node's tunnel address, when `wireguard.dns` is on
/// and the pool is IPv4 (the only kind client addresses come from yet).
fn dns_gateway(config: &Config) -> Option<Arc<crate::wg::dns::DnsGateway>> {
    if !config.wireguard.dns {
        return None;
    }
    match blipless_ctl::wg_clients::node_address(&config.wireguard.pool) {
        Ok(std::net::IpAddr::V4(address)) => {
            // The node's IPv6 tunnel address: its IPv4 one's twin.
            let address6 = config.wireguard.pool6.and_then(|pool6| {
                blipless_config::pool6::TunnelPools::new(config.wireguard.pool, pool6)?
                    .v6_of(address)
            });
            // It serves TCP once it counts in the descriptor budget (below).
            Some(Arc::new(
                crate::wg::dns::DnsGateway::new(address, &config.wireguard.dns_upstreams)
                    .with_address6(address6),
            ))
        }
        Ok(std::net::IpAddr::V6(_)) | Err(_) => None,
    }
}
