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
use blipless_protocol::channel::{ToIngress, MAX_FRAME};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::background;
use crate::conn::Mode;
use crate::link::{self, HelloError};
use session::SessionEnd;
use warm::Warm;

/// Runs the device plane: attach (Standby), warm up, say Ready, serve; on
/// Drain hand over or finish, and return once nothing is held. SIGTERM
/// (`terminate`) asks the ingress for a drain without a successor.
pub async fn run(config: Config, terminate: CancellationToken) -> anyhow::Result<()> {
    if config.egress.tun.manage {
        blipless_ctl::net::setup(&config).await.context(
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
            let warming = warm::warm_up(&config, attached_at, welcome.successor);
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
        let socket = Arc::new(socket);
        ready.context.set_channel(Some(socket.clone()));
        ready.packets.set_channel(Some(socket.clone()));
        let end = attachment::serve(
            &socket,
            ready,
            welcome.wants_endpoints,
            &config,
            &mut buffer,
            &terminate,
        )
        .await;
        ready.context.set_channel(None);
        if !matches!(end, Ok(SessionEnd::Goaway)) {
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
            Ok(SessionEnd::Goaway) => {
                tracing::info!("the ingress hands off: attaching to its successor");
                ready.packets.counters.log();
                // Until the successor's channel is up, packets from the TUN
                // device still go to the old ingress (the channel stays set),
                // which still has the sessions; and what it decrypts
                // meanwhile is still read.
                tokio::spawn(attachment::linger(
                    socket.clone(),
                    ready.context.clone(),
                    ready.tun_writer.clone(),
                ));
            }
            Err(error) => tracing::warn!("device channel lost: {error:#}; reattaching"),
        }
    }
    let Some(warm) = warm else {
        return Ok(());
    };
    finish(warm, offline_drain, &config).await;
    Ok(())
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
    background.cancel();
    background::flush_usage(&directory, &identities).await;
    identities.keep_all().await;
    tracing::info!(
        migrated = context.migrated.load(Ordering::Relaxed),
        "device plane drained; exiting"
    );
}
