//! This plane's end of the device channel: attach to the ingress, say Hello,
//! and read what the ingress sends (connections as fds, Activate, Drain).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use blipless_link::LinkError;
use blipless_protocol::channel::{DecodeError, Hello, ToDevice, ToIngress, Welcome};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

/// One frame from the ingress and the fds that came with it; a batch of
/// packets borrows the receive buffer.
#[derive(Debug)]
pub struct Incoming<'b> {
    /// The message.
    pub message: ToDevice<'b>,
    /// Its fds, exactly as many as the message type carries.
    pub fds: Vec<OwnedFd>,
}

/// Connects to the ingress's device socket, retrying with backoff (100 ms
/// doubling to 2 s) and saying so in the log, until it answers or `stop`.
pub async fn attach(path: &Path, stop: &CancellationToken) -> Option<UnixSeqpacket> {
    let mut delay = Duration::from_millis(100);
    let mut last_log: Option<Instant> = None;
    loop {
        match UnixSeqpacket::connect(path).await {
            Ok(socket) => {
                if let Err(error) = blipless_link::size_buffers(&socket) {
                    tracing::warn!(%error, "could not size the device channel's send buffer");
                }
                return Some(socket);
            }
            Err(error) => {
                if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(
                        "waiting for the ingress at {} ({error}); retrying",
                        path.display()
                    );
                    last_log = Some(Instant::now());
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Sends one frame without fds.
pub async fn send(socket: &UnixSeqpacket, message: &ToIngress<'_>) -> Result<(), LinkError> {
    blipless_link::send(socket, message, &[]).await
}

/// Reads one frame. Ok(None) when the ingress closed the channel.
pub async fn receive<'b>(
    socket: &UnixSeqpacket,
    buffer: &'b mut [u8],
) -> anyhow::Result<Option<Incoming<'b>>> {
    match blipless_link::receive(socket, buffer).await {
        Ok(Some((message, fds))) => Ok(Some(Incoming { message, fds })),
        Ok(None) => Ok(None),
        Err(LinkError::Decode(DecodeError::VersionMismatch { ours, theirs })) => Err(anyhow::anyhow!(
            "the ingress speaks device-channel protocol v{theirs}, this device plane v{ours}: deploy matching versions"
        )),
        Err(error) => Err(anyhow::Error::new(error).context("reading from the ingress")),
    }
}

/// Why a Hello did not end in Welcome.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    /// The ingress said no (another uid, another protocol version): retrying
    /// will not help, so the plane exits.
    #[error("the ingress refused this device plane: {0}")]
    Refused(String),
    /// The channel failed; attach again.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Says Hello and waits for Welcome, which it returns (the generation the
/// ingress gave us, and whether another plane is active).
pub async fn hello(socket: &UnixSeqpacket, buffer: &mut [u8]) -> Result<Welcome, HelloError> {
    let hello = ToIngress::Hello(Hello {
        pid: std::process::id(),
        software: env!("CARGO_PKG_VERSION").to_string(),
    });
    let sent = send(socket, &hello).await;
    // Even if the send failed, a refusal may be waiting to be read.
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        blipless_link::receive::<ToDevice>(socket, buffer),
    )
    .await;
    let reply = match reply {
        Err(_) => return Err(anyhow::anyhow!("the ingress did not answer Hello within 10 s").into()),
        Ok(Err(LinkError::Decode(DecodeError::VersionMismatch { ours, theirs }))) => {
            return Err(HelloError::Refused(format!(
                "the ingress speaks device-channel protocol v{theirs}, this device plane v{ours}: deploy matching versions"
            )))
        }
        Ok(Err(error)) => {
            let error = anyhow::Error::new(error);
            return Err(match sent {
                Err(send_error) => error.context(format!("saying Hello failed: {send_error}")),
                Ok(()) => error.context("reading the answer to Hello"),
            }
            .into());
        }
        Ok(Ok(reply)) => reply,
    };
    match reply.map(|(message, _)| message) {
        Some(ToDevice::Welcome(welcome)) => Ok(welcome),
        Some(ToDevice::Refused(refused)) => Err(HelloError::Refused(refused.reason)),
        Some(other) => {
            Err(anyhow::anyhow!("the ingress answered Hello with {}", other.name()).into())
        }
        None => Err(anyhow::anyhow!("the ingress closed the channel after Hello").into()),
    }
}
