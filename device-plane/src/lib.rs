//! blipless-device: the deployable plane of a blipless node.
//!
//! It attaches to the ingress's device socket, receives customer
//! connections as file descriptors, speaks SOCKS5 and HTTP proxy to them,
//! and connects them out through the egress policy. When a successor takes
//! over, it hands every established tunnel and idle HTTP connection to it,
//! byte-exact, and exits the moment it holds nothing. Clients and usage
//! live in the store; `blipless-ctl` manages them.

pub mod background;
pub mod clients;
pub mod credentials;
pub mod devices;
pub mod egress;
pub mod endpoints;
pub mod http_proxy;
pub mod link;
pub mod net;
pub mod piped;
pub mod relay;
pub mod serve;
pub mod socks;
pub mod store;
pub mod tun;
pub mod tunnel;
pub mod wg_clients;
pub mod wireguard;

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::{
    Accepted, DeviceReport, DrainOrder, Drained, ListenerKind, Message, MAX_FRAME,
};
use tokio::time::Instant;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use crate::clients::Directory;
use crate::devices::Devices;
use crate::egress::Egress;
use crate::endpoints::{Assembler, Snapshots};
use crate::link::{HelloError, Incoming};
use crate::serve::{Context, Mode};
use crate::store::NodeId;
use crate::wireguard::{PacketPath, PeerSync};

/// How often the plane reports its figures to the ingress.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Ready goes out at least this long before the ingress's ready budget ends.
const READY_MARGIN: Duration = Duration::from_secs(5);
/// Fault injection for tests: stall the warm-up this many milliseconds, so
/// the plane does not say Ready within its budget.
pub const FAULT_STALL_WARMUP: &str = "BLIPLESS_FAULT_STALL_WARMUP_MS";
/// Fault injection for tests: wait this many milliseconds after Activate
/// before sending the WireGuard peer set, so the ingress has an active plane
/// but no peer set yet.
pub const FAULT_DELAY_PEERS: &str = "BLIPLESS_FAULT_DELAY_PEERS_MS";

/// What warm-up builds once and every attachment reuses.
struct Warm {
    context: Arc<Context>,
    packets: Arc<PacketPath>,
    directory: Arc<Directory>,
    devices: Arc<Devices>,
    background: CancellationToken,
    /// The WireGuard endpoint snapshots the ingress sends, kept in the store.
    endpoints: Snapshots,
}

/// How one attachment to the ingress ended.
enum SessionEnd {
    /// Drained: nothing is held; exit.
    Drained,
    /// The channel is gone; `draining` holds the drain deadline if a drain had started.
    Lost(Option<Instant>),
    /// The ingress is handing off to a successor: attach to it, and keep
    /// reading what the old one still sends until it closes the channel.
    Goaway,
}

/// Runs the device plane: attach (Standby), warm up, say Ready, serve; on
/// Drain hand over or finish, and return once nothing is held. SIGTERM
/// (`terminate`) asks the ingress for a drain without a successor.
pub async fn run(config: Config, terminate: CancellationToken) -> anyhow::Result<()> {
    if config.egress.tun.manage {
        net::setup(&config).await.context(
            "setting up the host for packet egress (egress.tun.manage = true; or set it false and run `blipless-ctl net setup` once)",
        )?;
    }
    let path = config.device_socket();
    let mut buffer = vec![0u8; MAX_FRAME];
    let mut warm: Option<Warm> = None;
    let mut offline_drain: Option<Instant> = None;
    while let Some(socket) = link::attach(&path, &terminate).await {
        let welcome = match link::hello(&socket, &mut buffer).await {
            Ok(welcome) => welcome,
            Err(HelloError::Refused(reason)) => {
                anyhow::bail!("the ingress refused this device plane: {reason}")
            }
            Err(HelloError::Failed(error)) => {
                tracing::warn!("attaching failed: {error:#}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let generation = welcome.generation;
        tracing::info!(generation, successor = welcome.successor, path = %path.display(), "attached to the ingress (standby)");
        let attached_at = Instant::now();
        if warm.is_none() {
            let warming = warm_up(&config, attached_at, welcome.successor);
            tokio::select! {
                ready = warming => warm = Some(ready?),
                () = terminate.cancelled() => {
                    tracing::info!("stop requested before ready: exiting");
                    return Ok(());
                }
                // A Standby plane is sent nothing but a Drain when its ready
                // budget is over; a closed channel means the same.
                incoming = link::receive(&socket, &mut buffer) => {
                    let what = match incoming {
                        Ok(Some(incoming)) => incoming.message.name().to_string(),
                        Ok(None) => "closed the channel".to_string(),
                        Err(error) => format!("{error:#}"),
                    };
                    anyhow::bail!("the ingress gave up on this device plane before it was ready ({what}): the deploy failed, the active plane keeps serving");
                }
            }
        }
        let Some(ready) = &warm else {
            continue;
        };
        let Warm {
            context, packets, ..
        } = ready;
        if let Err(error) = link::send(&socket, &Message::Ready).await {
            tracing::warn!(%error, "telling the ingress Ready failed; reattaching");
            continue;
        }
        tracing::info!(generation, "ready");
        // Under systemd (Type=notify), directly or through --supervise.
        let state = format!("READY=1\nSTATUS=ready (generation {generation})");
        if let Err(error) = blipless_supervise::notify::notify(&state) {
            tracing::warn!(%error, "telling the service manager READY=1 failed");
        }
        let socket = Arc::new(socket);
        context.set_channel(Some(socket.clone()));
        packets.set_channel(Some(socket.clone()));
        let end = session(
            &socket,
            ready,
            welcome.wants_endpoints,
            &config,
            &mut buffer,
            &terminate,
        )
        .await;
        context.set_channel(None);
        if !matches!(end, Ok(SessionEnd::Goaway)) {
            packets.set_channel(None);
        }
        match end {
            Ok(SessionEnd::Drained) => break,
            Ok(SessionEnd::Lost(Some(deadline))) => {
                tracing::warn!("device channel lost while draining; finishing here");
                offline_drain = Some(deadline);
                break;
            }
            Ok(SessionEnd::Lost(None)) => {
                tracing::warn!("the ingress closed the channel; reattaching")
            }
            Ok(SessionEnd::Goaway) => {
                tracing::info!("the ingress hands off: attaching to its successor");
                packets.counters.log();
                // Until the successor's channel is up, packets from the TUN
                // device still go to the old ingress (the channel stays set),
                // which still has the sessions; and what it decrypts
                // meanwhile is still read.
                tokio::spawn(linger(socket.clone(), context.clone(), packets.clone()));
            }
            Err(error) => tracing::warn!("device channel lost: {error:#}; reattaching"),
        }
    }
    let Some(Warm {
        context,
        packets,
        directory,
        devices,
        background,
        ..
    }) = warm
    else {
        return Ok(());
    };
    if context.mode() == Mode::Serving || offline_drain.is_some() {
        // SIGTERM while detached, or the ingress vanished mid-drain: no
        // successor can be reached, so finish here within the grace.
        context.mode.send_replace(Mode::Finish);
        context.connections.close();
        let deadline = offline_drain.unwrap_or_else(|| Instant::now() + config.drain.grace);
        if tokio::time::timeout_at(deadline, context.connections.wait())
            .await
            .is_err()
        {
            context.cut_everything();
            let _ = tokio::time::timeout(Duration::from_secs(5), context.connections.wait()).await;
        }
    }
    packets.hand_over().await;
    background.cancel();
    background::flush_usage(&directory, &devices).await;
    devices.keep_all().await;
    tracing::info!(
        migrated = context.migrated.load(Ordering::Relaxed),
        "device plane drained; exiting"
    );
    Ok(())
}

/// Opens the store and loads the clients (pre-warm will grow here).
async fn warm_up(config: &Config, attached_at: Instant, successor: bool) -> anyhow::Result<Warm> {
    if let Some(stall) = std::env::var(FAULT_STALL_WARMUP)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
    {
        tracing::warn!(stall_ms = stall, "fault injection: stalling warm-up");
        tokio::time::sleep(Duration::from_millis(stall)).await;
    }
    let store = store::open(&config.store.url).await.with_context(|| {
        format!(
            "opening the store {}",
            store::display_url(&config.store.url)
        )
    })?;
    let directory = Directory::load(store.clone())
        .await
        .context("loading clients from the store")?;
    tracing::info!(clients = directory.len(), store = %store::display_url(&config.store.url), "store opened");
    let node = NodeId {
        host: config.node.host.clone(),
        block: config.node.block.clone(),
    };
    let endpoints = Snapshots::new(store.clone(), node.clone());
    let devices = Arc::new(Devices::new(store, node, config.egress.sources.clone()));
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
    let report = devices
        .prewarm(
            config.prewarm.window,
            config.prewarm.concurrency,
            config.prewarm.device_timeout,
            budget,
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
    tokio::spawn(background::maintain(
        directory.clone(),
        devices.clone(),
        background.clone(),
    ));
    let egress = Egress::new(config.egress.allow.clone(), config.proxy.connect_timeout);
    // A successor inherits its predecessor's TUN queues at handover; the
    // first plane attaches its own now, before Ready.
    let packets = Arc::new(PacketPath::new(
        &config.egress.tun.name,
        config.egress.tun.queues,
        egress.clone(),
        successor,
    ));
    let context = Arc::new(Context::new(
        directory.clone(),
        devices.clone(),
        egress,
        config.proxy.handshake_timeout,
        config.proxy.idle_timeout,
    ));
    Ok(Warm {
        context,
        packets,
        directory,
        devices,
        background,
        endpoints,
    })
}

/// Serves one attachment until drained or the channel is lost.
/// `wants_endpoints`: the ingress started fresh (Welcome) and gets the last
/// WireGuard endpoint snapshot after the first peer set.
async fn session(
    socket: &Arc<UnixSeqpacket>,
    warm: &Warm,
    wants_endpoints: bool,
    config: &Config,
    buffer: &mut [u8],
    terminate: &CancellationToken,
) -> anyhow::Result<SessionEnd> {
    let Warm {
        context,
        packets,
        endpoints,
        ..
    } = warm;
    let mut report = tokio::time::interval(REPORT_EVERY);
    let mut asked_to_leave = false;
    let mut drain_deadline: Option<Instant> = None;
    let mut cut_count: Option<u64> = None;
    let mut open_at_drain = 0u64;
    let migrated_before = context.migrated.load(Ordering::Relaxed);
    let mut peers = PeerSync::new();
    let mut client_changes = context.directory.subscribe();
    let mut active = false;
    let mut endpoint_parts = Assembler::default();
    // Answered once per attachment; the task stops with the session.
    let mut answer_endpoints = wants_endpoints;
    let mut _endpoints_answer = None;
    loop {
        let draining = drain_deadline.is_some();
        let deadline = drain_deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            incoming = link::receive(socket, buffer) => {
                let incoming = match incoming {
                    Ok(Some(incoming)) => incoming,
                    Ok(None) => return Ok(SessionEnd::Lost(drain_deadline)),
                    Err(error) if draining => {
                        tracing::warn!("{error:#}");
                        return Ok(SessionEnd::Lost(drain_deadline));
                    }
                    Err(error) => return Err(error),
                };
                let Incoming { message, fds } = incoming;
                match message {
                    Message::Accepted(accepted) => take_connection(context, accepted, fds),
                    Message::Packets(batch) => packets.to_tun(&batch).await,
                    Message::TunQueues(_) => packets.adopt(fds),
                    Message::Endpoints(part) => {
                        if let Some(snapshot) = endpoint_parts.push(&part) {
                            endpoints.keep(snapshot);
                        }
                    }
                    Message::MigrateDone(id) => context.handover_confirmed(id),
                    Message::Migrate(migrate) => {
                        context.taken.fetch_add(1, Ordering::Relaxed);
                        context.connections.spawn(tunnel::adopt(context.clone(), migrate, fds));
                    }
                    Message::Activate => {
                        if draining {
                            tracing::warn!("re-activated: the successor is gone; serving again");
                            drain_deadline = None;
                            cut_count = None;
                            context.serve_again();
                            packets.resume();
                        } else {
                            tracing::info!("active: new connections come here");
                            if !packets.has_queues() {
                                packets.expect_inherited();
                            }
                        }
                        active = true;
                        client_changes.borrow_and_update();
                        if let Some(delay) = std::env::var(FAULT_DELAY_PEERS).ok().and_then(|ms| ms.parse::<u64>().ok()) {
                            tracing::warn!(delay_ms = delay, "fault injection: delaying the peer set");
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                        }
                        wireguard::send_peers(socket, peers.full(&context.directory))
                            .await
                            .context("sending the WireGuard peer set")?;
                        if std::mem::take(&mut answer_endpoints) {
                            _endpoints_answer = Some(endpoints.answer(socket.clone()));
                        }
                    }
                    Message::Drain(DrainOrder { handover }) => {
                        open_at_drain = context.connections.len() as u64;
                        tracing::info!(handover, open = open_at_drain, grace = ?config.drain.grace, "draining");
                        drain_deadline = Some(Instant::now() + config.drain.grace);
                        context.mode.send_replace(if handover { Mode::Handover } else { Mode::Finish });
                        context.connections.close();
                        active = false;
                        if handover {
                            // The successor is active: the TUN queues are its
                            // now (before Drained can end this session).
                            packets.hand_over().await;
                        }
                    }
                    Message::Goaway if draining => return Ok(SessionEnd::Lost(drain_deadline)),
                    Message::Goaway => return Ok(SessionEnd::Goaway),
                    other => anyhow::bail!("the ingress may not send {}", other.name()),
                }
            }
            changed = client_changes.changed(), if active => {
                if changed.is_ok() {
                    wireguard::send_peers(socket, peers.changes(&context.directory))
                        .await
                        .context("sending WireGuard peer changes")?;
                }
            }
            _ = report.tick() => {
                let figures = DeviceReport {
                    connections: context.connections.len() as u64,
                    connections_total: context.taken.load(Ordering::Relaxed),
                    clients: context.directory.len() as u64,
                    migrated: context.migrated.load(Ordering::Relaxed),
                    devices: context.devices.live(),
                    prewarmed: context.devices.prewarmed(),
                };
                // Figures are advisory: never let a full channel hold up the
                // loop that reads it (the ingress may be waiting on us).
                match tokio::time::timeout(REPORT_EVERY, link::send(socket, &Message::Report(figures))).await {
                    Ok(sent) => sent.context("reporting to the ingress")?,
                    Err(_) => tracing::debug!("channel busy; report skipped"),
                }
            }
            () = terminate.cancelled(), if !asked_to_leave => {
                // The ingress answers with Drain after the last connection it handed us.
                tracing::info!("stop requested (SIGTERM or SIGINT): asking the ingress to drain this plane");
                asked_to_leave = true;
                link::send(socket, &Message::Drain(DrainOrder { handover: false }))
                    .await
                    .context("asking to drain")?;
            }
            () = tokio::time::sleep_until(deadline), if draining && cut_count.is_none() => {
                let left = context.connections.len() as u64;
                tracing::warn!(left, "drain grace over; cutting what is left");
                cut_count = Some(left);
                context.cut_everything();
            }
            () = context.connections.wait(), if draining => {
                let migrated = context.migrated.load(Ordering::Relaxed) - migrated_before;
                let cut = cut_count.unwrap_or(0);
                let summary = Drained {
                    migrated,
                    finished: open_at_drain.saturating_sub(migrated + cut),
                    cut,
                };
                let _ = link::send(socket, &Message::Drained(summary)).await;
                return Ok(SessionEnd::Drained);
            }
        }
    }
}

/// Reads what an ingress that handed off still sends on its channel (inner
/// packets of the sessions it still decrypts, a connection it accepted just
/// before) until it exits and the channel closes.
async fn linger(socket: Arc<UnixSeqpacket>, context: Arc<Context>, packets: Arc<PacketPath>) {
    let mut buffer = vec![0u8; MAX_FRAME];
    loop {
        match link::receive(&socket, &mut buffer).await {
            Ok(Some(Incoming { message, fds })) => match message {
                Message::Packets(batch) => packets.to_tun(&batch).await,
                Message::Accepted(accepted) => take_connection(&context, accepted, fds),
                // The old ingress took everything back and this plane attached
                // to it again: this channel is the stale one.
                Message::Drain(_) => return,
                other => tracing::debug!("the old ingress sent {}: ignored", other.name()),
            },
            Ok(None) | Err(_) => {
                tracing::info!("the old ingress has closed its channel");
                return;
            }
        }
    }
}

fn take_connection(context: &Arc<Context>, accepted: Accepted, fds: Vec<OwnedFd>) {
    let Some(fd) = fds.into_iter().next() else {
        return;
    };
    let stream = match tunnel::stream_from_fd(fd) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, id = accepted.connection_id, "cannot use a handed connection");
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    context.taken.fetch_add(1, Ordering::Relaxed);
    let id = accepted.connection_id;
    match accepted.listener {
        ListenerKind::Socks => {
            context
                .connections
                .spawn(socks::serve(stream, context.clone(), id));
        }
        ListenerKind::Http => {
            context.connections.spawn(http_proxy::serve(
                stream,
                http_proxy::Adopted::fresh(),
                context.clone(),
                id,
            ));
        }
    }
}
