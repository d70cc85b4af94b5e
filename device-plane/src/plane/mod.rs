//! The device plane's life: attach to the ingress (Standby), warm up once
//! (store, clients, pre-warm, TUN queues), say Ready, serve each attachment
//! ([`attachment`], driving the [`session`] state machine), follow the
//! ingress through its handoffs, and on a drain hand everything over or
//! finish within the grace; then flush usage, keep identities and return.
//! docs/ARCHITECTURE.md, "Device-plane lifecycle".

mod attachment;
pub mod session;
mod warm;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::{Rejoin, ToDevice, ToIngress, MAX_FRAME};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::background;
use crate::conn::Mode;
use crate::link::{self, HelloError};
use session::{Draining, SessionEnd};
use warm::Warm;

/// How long an exiting plane waits for a usage flush under way before its
/// last one.
const MAINTENANCE_STOP: Duration = Duration::from_secs(10);

/// SIGHUP would end the process by default, and every tunnel with it
/// (`kill -HUP`, or the `--supervise` stand-in passing one on). A device
/// plane has nothing to reload: it says so and carries on.
fn ignore_hangups() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hangups) => {
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    tracing::info!("SIGHUP: a device plane has nothing to reload; a new configuration takes a deploy (docs/OPERATIONS.md, \"Deploying a new device plane\")");
                }
            });
        }
        Err(error) => {
            tracing::warn!(%error, "cannot handle SIGHUP: one would stop this device plane")
        }
    }
}

/// Runs the device plane: attach (Standby), warm up, say Ready, serve; on
/// Drain hand over or finish, and return once nothing is held. SIGTERM
/// (`terminate`) asks the ingress for a drain without a successor.
pub async fn run(config: Config, terminate: CancellationToken) -> anyhow::Result<()> {
    ignore_hangups();
    if config.egress.tun.manage {
        blipless_ctl::net::setup(&config).await.context(
            "setting up the host for packet egress (egress.tun.manage = true; or set it false and run `blipless-ctl net setup` once)",
        )?;
    }
    let path = config.device_socket();
    let mut buffer = vec![0u8; MAX_FRAME];
    let mut warm: Option<Warm> = None;
    let mut offline_drain: Option<Instant> = None;
    // A drain under way when the ingress handed off: carried to its successor.
    let mut resume: Option<Draining> = None;
    // Whether an ingress activated this plane (then it rejoins a successor
    // as the plane that was serving). Ready alone is not enough: a plane
    // that said Ready during a deploy and saw the ingress hand off before
    // its Activate was never serving; it rejoins as new (`No`), so the
    // successor activates it and the plane that was serving hands over to
    // it, whichever of the two reattaches first: the deploy completes.
    let mut was_active = false;
    while let Some(socket) = link::attach(&path, &terminate).await {
        let rejoin = match (&resume, was_active) {
            (Some(_), _) => Rejoin::Draining,
            (None, true) => Rejoin::Serving,
            (None, false) => Rejoin::No,
        };
        let welcome = match link::hello(&socket, &mut buffer, rejoin).await {
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
        tracing::info!(generation, successor = welcome.successor, ?rejoin, path = %path.display(), "attached to the ingress (standby)");
        let attached_at = Instant::now();
        if warm.is_none() {
            match warm_beside(
                &config,
                &socket,
                &mut buffer,
                attached_at,
                welcome.successor,
                &terminate,
            )
            .await?
            {
                Warming::Done(ready) => warm = Some(ready),
                Warming::Stopped => return Ok(()),
                Warming::DoneElsewhere(ready) => {
                    // The ingress handed off while this plane warmed up:
                    // say Ready to its successor instead.
                    tracing::info!(
                        "the ingress handed off during warm-up: attaching to its successor"
                    );
                    warm = Some(ready);
                    continue;
                }
            }
        }
        let Some(ready) = &warm else {
            continue;
        };
        if resume.is_none() {
            if let Err(error) = link::send(&socket, &ToIngress::Ready).await {
                tracing::warn!(%error, "telling the ingress Ready failed; reattaching");
                continue;
            }
            tracing::info!(generation, "ready");
            // Under systemd (Type=notify), directly or through --supervise.
            let state = format!("READY=1\nSTATUS=ready (generation {generation})");
            if let Err(error) = blipless_supervise::notify::notify(&state) {
                tracing::warn!(%error, "telling the service manager READY=1 failed");
            }
        }
        let socket = Arc::new(socket);
        ready.context.channel_passes_udp.store(
            welcome.udp_associations,
            std::sync::atomic::Ordering::Relaxed,
        );
        ready.context.accepted_nodelay.store(
            welcome.accepted_nodelay,
            std::sync::atomic::Ordering::Relaxed,
        );
        ready.context.set_channel(Some(socket.clone()));
        ready.packets.set_channel(Some(socket.clone()));
        let end = attachment::serve(
            &socket,
            ready,
            welcome.wants_endpoints,
            resume.take(),
            &config,
            &mut buffer,
            &terminate,
            &mut was_active,
        )
        .await;
        ready.context.set_channel(None);
        if !matches!(end, Ok(SessionEnd::Goaway(_))) {
            ready.packets.set_channel(None);
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
            Ok(SessionEnd::Goaway(draining)) => {
                tracing::info!(
                    draining = draining.is_some(),
                    "the ingress hands off: attaching to its successor"
                );
                ready.packets.counters.log();
                resume = draining;
                // Until the successor's channel is up, packets from the TUN
                // device still go to the old ingress (the channel stays set),
                // which still has the sessions; and what it decrypts or
                // passes on meanwhile is still read.
                tokio::spawn(attachment::linger(
                    socket.clone(),
                    ready.context.clone(),
                    ready.tun_writer.clone(),
                    ready.packets.clone(),
                ));
            }
            Err(error) => {
                tracing::warn!("device channel lost: {error:#}; reattaching");
                // Our end is given up: shut it, so that the ingress sees the
                // channel end now and detaches this attachment, whatever
                // still holds a copy of the socket.
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }
    if let Some(drain) = resume {
        // SIGTERM before the successor ingress answered: finish here.
        offline_drain = Some(drain.deadline);
    }
    let Some(warm) = warm else {
        return Ok(());
    };
    finish(warm, offline_drain, &config).await;
    Ok(())
}

/// How warming up beside a Standby attachment ended.
enum Warming {
    /// Warm; say Ready on this attachment.
    Done(Warm),
    /// Warm, but this ingress handed off meanwhile (Goaway, or its channel
    /// closed): attach to its successor and say Ready there.
    DoneElsewhere(Warm),
    /// SIGTERM or SIGINT before Ready.
    Stopped,
}

/// Warms up while reading the Standby attachment: a Drain means the ingress
/// gave up on this plane (its ready budget is over: the deploy failed); a
/// Goaway or a closed channel means the ingress is handing off, and warming
/// goes on for its successor (an ingress restart during a deploy does not
/// fail the deploy).
async fn warm_beside(
    config: &Config,
    socket: &tokio_seqpacket::UnixSeqpacket,
    buffer: &mut [u8],
    attached_at: Instant,
    successor: bool,
    terminate: &CancellationToken,
) -> anyhow::Result<Warming> {
    let warming = warm::warm_up(config, attached_at, successor);
    tokio::pin!(warming);
    let handing_off = tokio::select! {
        ready = &mut warming => return Ok(Warming::Done(ready?)),
        () = terminate.cancelled() => {
            tracing::info!("stop requested before ready: exiting");
            return Ok(Warming::Stopped);
        }
        incoming = link::receive(socket, buffer) => match incoming {
            Ok(Some(incoming)) if matches!(incoming.message, ToDevice::Goaway) => true,
            Ok(None) => true,
            Ok(Some(incoming)) => {
                let what = incoming.message.name();
                anyhow::bail!("the ingress gave up on this device plane before it was ready ({what}): the deploy failed, the active plane keeps serving");
            }
            Err(error) => anyhow::bail!("the ingress gave up on this device plane before it was ready ({error:#}): the deploy failed, the active plane keeps serving"),
        },
    };
    debug_assert!(handing_off);
    tokio::select! {
        ready = &mut warming => Ok(Warming::DoneElsewhere(ready?)),
        () = terminate.cancelled() => {
            tracing::info!("stop requested before ready: exiting");
            Ok(Warming::Stopped)
        }
    }
}

/// After the last attachment: finish what is still open if no successor
/// could take it (SIGTERM while detached, or the ingress vanished mid-drain),
/// hand the TUN queues on, flush usage and keep every identity.
async fn finish(warm: Warm, offline_drain: Option<Instant>, config: &Config) {
    let Warm {
        context,
        packets,
        directory,
        identities,
        background,
        maintaining,
        ..
    } = warm;
    if context.mode() == Mode::Serving || offline_drain.is_some() {
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
    packets.finish_dns().await;
    background.cancel();
    // A flush or tunnel count under way when the stop came ends first: run
    // beside the last flush, it could record tunnels after they were
    // cleared (a client's usage flushes take turns: `Meter::flushing`).
    if tokio::time::timeout(MAINTENANCE_STOP, maintaining)
        .await
        .is_err()
    {
        tracing::warn!(waited = ?MAINTENANCE_STOP, "usage or activity flush still running at exit; flushing beside it");
    }
    background::flush_usage(&directory, &identities).await;
    directory
        .clear_tunnel_counts(&crate::clients::tunnel_instance(identities.node()))
        .await;
    identities.keep_all().await;
    tracing::info!(
        migrated = context.migrated.load(Ordering::Relaxed),
        "device plane drained; exiting"
    );
}
