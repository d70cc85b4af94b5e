//! blipless-device: the deployable plane of a blipless node.
//!
//! It attaches to the ingress's device socket, receives customer
//! connections as file descriptors, speaks SOCKS5 and HTTP proxy to them,
//! and connects them out through the egress policy. Clients and usage live
//! in the store; `blipless-ctl` manages them.

pub mod clients;
pub mod credentials;
pub mod egress;
pub mod http_proxy;
pub mod link;
pub mod relay;
pub mod serve;
pub mod socks;
pub mod store;

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::{
    Accepted, DeviceReport, Drained, ListenerKind, Message, MAX_FRAME,
};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clients::Directory;
use crate::egress::Egress;
use crate::link::{HelloError, Incoming};
use crate::serve::Context;

/// How often the change feed is polled.
const FEED_POLL: Duration = Duration::from_millis(500);
/// How often usage is flushed to the store (a SIGKILL loses at most this much).
pub const USAGE_FLUSH: Duration = Duration::from_secs(10);
/// How often the plane reports its figures to the ingress.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Runs the device plane: attach, serve, and on Drain from the ingress or on
/// `terminate` (SIGTERM), drain: take no new work, let what is open finish
/// within the grace, cut the rest, flush usage, say Drained, return.
pub async fn run(config: Config, terminate: CancellationToken) -> anyhow::Result<()> {
    let store = store::open(&config.store.url)
        .await
        .with_context(|| format!("opening the store {}", config.store.url))?;
    let directory = Directory::load(store)
        .await
        .context("loading clients from the store")?;
    tracing::info!(clients = directory.len(), store = %config.store.url, "store opened");
    let background = CancellationToken::new();
    tokio::spawn(directory.clone().follow(FEED_POLL, background.clone()));
    tokio::spawn(flush_usage_periodically(
        directory.clone(),
        background.clone(),
    ));

    let context = Arc::new(Context {
        directory: directory.clone(),
        egress: Egress::new(
            config.egress.allow.clone(),
            config.egress.sources.clone(),
            config.proxy.connect_timeout,
        ),
        handshake_timeout: config.proxy.handshake_timeout,
        idle_timeout: config.proxy.idle_timeout,
        connections: TaskTracker::new(),
        draining: CancellationToken::new(),
        cut_all: CancellationToken::new(),
        taken: Default::default(),
    });

    let path = config.device_socket();
    let mut buffer = vec![0u8; MAX_FRAME];
    let mut channel: Option<UnixSeqpacket> = None;
    while let Some(socket) = link::attach(&path, &terminate).await {
        let generation = match link::hello(&socket, &mut buffer).await {
            Ok(generation) => generation,
            Err(HelloError::Refused(reason)) => {
                anyhow::bail!("the ingress refused this device plane: {reason}")
            }
            Err(HelloError::Failed(error)) => {
                tracing::warn!("attaching failed: {error:#}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // Warm-up today is what already happened: store opened, clients loaded.
        if let Err(error) = link::send(&socket, &Message::Ready).await {
            tracing::warn!(%error, "telling the ingress Ready failed; reattaching");
            continue;
        }
        tracing::info!(generation, path = %path.display(), "attached to the ingress; ready");
        match session(&socket, &context, &mut buffer, &terminate).await {
            Ok(()) => {
                channel = Some(socket);
                break;
            }
            Err(error) => {
                // The ingress went away: keep serving what we hold, attach again.
                tracing::warn!("device channel lost: {error:#}; reattaching");
            }
        }
    }

    let summary = drain(&context, config.drain.grace).await;
    background.cancel();
    directory.flush_usage().await;
    if let Some(socket) = channel {
        let _ = link::send(&socket, &Message::Drained(summary.clone())).await;
    }
    tracing::info!(?summary, "device plane drained; exiting");
    Ok(())
}

/// Serves one attachment. Ok when the ingress said Drain (this plane must
/// drain); Err when the channel is lost.
async fn session(
    socket: &UnixSeqpacket,
    context: &Arc<Context>,
    buffer: &mut [u8],
    terminate: &CancellationToken,
) -> anyhow::Result<()> {
    let mut report = tokio::time::interval(REPORT_EVERY);
    let mut leaving = false;
    loop {
        tokio::select! {
            incoming = link::receive(socket, buffer) => {
                let Some(Incoming { message, fds }) = incoming? else {
                    anyhow::bail!("the ingress closed the channel");
                };
                match message {
                    Message::Accepted(accepted) => take_connection(context, accepted, fds),
                    Message::Activate => tracing::info!("active: new connections come here"),
                    // Nothing the ingress sent before Drain is left unread.
                    Message::Drain => return Ok(()),
                    Message::Goaway => anyhow::bail!("the ingress is handing off"),
                    other => anyhow::bail!("the ingress may not send {}", other.name()),
                }
            }
            _ = report.tick() => {
                let figures = DeviceReport {
                    connections: context.connections.len() as u64,
                    connections_total: context.taken.load(Ordering::Relaxed),
                    clients: context.directory.len() as u64,
                };
                link::send(socket, &Message::Report(figures)).await.context("reporting to the ingress")?;
            }
            () = terminate.cancelled(), if !leaving => {
                // Ask the ingress to stop sending; it answers Drain after the
                // last connection it handed us.
                tracing::info!("SIGTERM: asking the ingress to drain this plane");
                link::send(socket, &Message::Drain).await.context("asking to drain")?;
                leaving = true;
            }
        }
    }
}

fn take_connection(context: &Arc<Context>, accepted: Accepted, fds: Vec<OwnedFd>) {
    let Some(fd) = fds.into_iter().next() else {
        return;
    };
    let stream = std::net::TcpStream::from(fd);
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
    {
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
            context
                .connections
                .spawn(http_proxy::serve(stream, context.clone(), id));
        }
    }
}

/// Lets open connections finish within `grace`, then cuts the rest.
async fn drain(context: &Context, grace: Duration) -> Drained {
    context.draining.cancel();
    context.connections.close();
    let open = context.connections.len() as u64;
    tracing::info!(open, ?grace, "draining");
    let mut summary = Drained::default();
    if tokio::time::timeout(grace, context.connections.wait())
        .await
        .is_err()
    {
        summary.cut = context.connections.len() as u64;
        tracing::warn!(cut = summary.cut, "drain grace over; cutting what is left");
        context.cut_all.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), context.connections.wait()).await;
    }
    summary.finished = open.saturating_sub(summary.cut);
    summary
}

async fn flush_usage_periodically(directory: Arc<Directory>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(USAGE_FLUSH);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => directory.flush_usage().await,
            () = stop.cancelled() => return,
        }
    }
}
