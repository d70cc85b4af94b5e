//! The device socket: device planes connect here, say Hello, and then
//! receive customer connections as file descriptors.
//!
//! Each connected plane gets a reader task that handles what the plane says
//! (Ready, Report, Drained). A plane that sends a frame this ingress cannot
//! read, or the wrong message, is disconnected; the others are untouched.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use blipless_protocol::channel::{self, DecodeError, Message, Refused, Welcome, MAX_FRAME};
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};
use tokio_util::sync::CancellationToken;

use crate::peercred;
use crate::planes::{send_frame, PlaneLink, Planes};

/// How long a new plane has to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts device planes until `shutdown`.
pub async fn serve(
    mut listener: UnixSeqpacketListener,
    planes: Arc<Planes>,
    shutdown: CancellationToken,
) {
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        match socket {
            Ok(socket) => {
                let planes = planes.clone();
                tokio::spawn(async move {
                    if let Err(error) = serve_plane(socket, planes).await {
                        tracing::warn!("device plane connection ended: {error:#}");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting on the device socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// What a plane's next frame turned out to be.
enum Received {
    Message(Message),
    Closed,
}

async fn receive(socket: &UnixSeqpacket, buffer: &mut [u8]) -> anyhow::Result<Received> {
    let mut ancillary = [0u8; 256];
    let (info, fds) = socket
        .recv_with_ancillary(buffer, &mut ancillary)
        .await
        .context("reading from the device plane")?;
    // Dropping the reader closes any fd the plane sent: none is expected.
    let fd_count: usize = fds
        .into_messages()
        .map(|m| match m {
            tokio_seqpacket::ancillary::OwnedAncillaryMessage::FileDescriptors(fds) => fds.count(),
            _ => 0,
        })
        .sum();
    if info.bytes_read() == 0 && !info.truncated() {
        return Ok(Received::Closed);
    }
    if info.truncated() {
        anyhow::bail!("the device plane sent a frame over {MAX_FRAME} bytes");
    }
    let frame = &buffer[..info.bytes_read()];
    let (message, used) = channel::decode(frame).map_err(|error| match error {
        DecodeError::Incomplete { .. } => {
            anyhow::anyhow!("the device plane sent a truncated frame")
        }
        other => anyhow::anyhow!("the device plane sent a bad frame: {other}"),
    })?;
    if used != frame.len() {
        anyhow::bail!("the device plane sent bytes after its frame");
    }
    if fd_count != message.fd_count() {
        anyhow::bail!(
            "the device plane sent {} with {fd_count} fds (expected {})",
            message.name(),
            message.fd_count()
        );
    }
    Ok(Received::Message(message))
}

async fn refuse(socket: &UnixSeqpacket, reason: String) {
    tracing::error!("refusing a device plane: {reason}");
    let _ = send_frame(socket, &Message::Refused(Refused { reason }), &[]).await;
}

async fn serve_plane(socket: UnixSeqpacket, planes: Arc<Planes>) -> anyhow::Result<()> {
    let credentials = socket
        .peer_cred()
        .context("reading the device plane's credentials")?;
    if !peercred::is_allowed(credentials.uid()) {
        refuse(
            &socket,
            format!(
                "uid {} may not attach: only uid {} or root",
                credentials.uid(),
                peercred::own_uid()
            ),
        )
        .await;
        return Ok(());
    }
    let mut buffer = vec![0u8; MAX_FRAME];
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, receive(&socket, &mut buffer)).await {
        Err(_) => anyhow::bail!("no Hello within {HELLO_TIMEOUT:?}"),
        Ok(Ok(Received::Message(Message::Hello(hello)))) => hello,
        Ok(Ok(Received::Message(other))) => {
            refuse(&socket, format!("expected Hello, got {}", other.name())).await;
            return Ok(());
        }
        Ok(Ok(Received::Closed)) => return Ok(()),
        Ok(Err(error)) => {
            let text = format!("{error:#}");
            if text.contains("version mismatch") {
                refuse(
                    &socket,
                    format!(
                        "{text}: deploy a device plane built for protocol v{}",
                        channel::PROTOCOL_VERSION
                    ),
                )
                .await;
                return Ok(());
            }
            return Err(error);
        }
    };
    let generation = planes.next_generation();
    send_frame(
        &socket,
        &Message::Welcome(Welcome {
            generation,
            ingress_pid: std::process::id(),
        }),
        &[],
    )
    .await
    .context("welcoming the device plane")?;
    let link = Arc::new(PlaneLink::new(
        generation,
        hello.pid,
        hello.software,
        socket,
    ));
    planes.attach(link.clone());
    tracing::info!(generation, pid = link.pid, software = %link.software, "device plane attached (standby)");

    let outcome = read_loop(&link, &planes, &mut buffer).await;
    let orders = planes.detach(generation);
    link.closed.cancel();
    match &outcome {
        Ok(()) => tracing::info!(generation, "device plane detached"),
        Err(error) => tracing::warn!(generation, "device plane disconnected: {error:#}"),
    }
    Planes::send_orders(orders).await;
    outcome
}

async fn read_loop(
    link: &Arc<PlaneLink>,
    planes: &Planes,
    buffer: &mut [u8],
) -> anyhow::Result<()> {
    loop {
        match receive(link.socket(), buffer).await? {
            Received::Closed => return Ok(()),
            Received::Message(Message::Ready) => {
                tracing::info!(generation = link.generation, "device plane ready");
                Planes::send_orders(planes.on_ready(link.generation)).await;
            }
            Received::Message(Message::Report(report)) => link.set_report(report),
            Received::Message(Message::Drain) => {
                tracing::info!(generation = link.generation, "device plane asked to drain");
                Planes::send_orders(planes.on_leaving(link.generation)).await;
            }
            Received::Message(Message::Drained(summary)) => {
                tracing::info!(
                    generation = link.generation,
                    ?summary,
                    "device plane drained"
                );
            }
            Received::Message(other) => {
                anyhow::bail!("a device plane may not send {}", other.name());
            }
        }
    }
}
