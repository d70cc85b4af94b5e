//! This plane's end of the device channel: attach to the ingress, say Hello,
//! and read what the ingress sends (connections as fds, Activate, Drain).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use blipless_protocol::channel::{self, DecodeError, Hello, Message, MAX_FRAME};
use tokio_seqpacket::ancillary::{AncillaryMessageWriter, OwnedAncillaryMessage};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

/// One frame from the ingress and the fds that came with it.
#[derive(Debug)]
pub struct Incoming {
    /// The message.
    pub message: Message,
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
                size_buffers(&socket);
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
pub async fn send(socket: &UnixSeqpacket, message: &Message) -> std::io::Result<()> {
    send_with_fds(socket, message, &[]).await
}

/// Sends one frame with `fds` beside it, refusing frames over the cap.
pub async fn send_with_fds(
    socket: &UnixSeqpacket,
    message: &Message,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    let frame = channel::encode(message);
    if frame.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} frame of {} bytes exceeds the cap",
                message.name(),
                frame.len()
            ),
        ));
    }
    let mut ancillary_buffer = [0u8; 64];
    let mut ancillary = AncillaryMessageWriter::new(&mut ancillary_buffer);
    if !fds.is_empty() {
        ancillary.add_fds(fds.iter().copied())?;
    }
    let sent = socket.send_with_ancillary(&frame, &mut ancillary).await?;
    if sent != frame.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short SOCK_SEQPACKET write",
        ));
    }
    Ok(())
}

/// Lets one frame of [`MAX_FRAME`] bytes fit the socket's send buffer (the
/// kernel doubles the value it is given, up to its own maximum).
pub fn size_buffers(socket: &UnixSeqpacket) {
    use nix::sys::socket::{setsockopt, sockopt};
    if let Err(error) = setsockopt(socket, sockopt::SndBuf, &MAX_FRAME) {
        tracing::warn!(%error, "could not size the device channel's send buffer");
    }
}

/// Reads one frame. Ok(None) when the ingress closed the channel.
pub async fn receive(
    socket: &UnixSeqpacket,
    buffer: &mut [u8],
) -> anyhow::Result<Option<Incoming>> {
    let mut ancillary = [0u8; 1024];
    let (info, reader) = socket
        .recv_with_ancillary(buffer, &mut ancillary)
        .await
        .context("reading from the ingress")?;
    let truncated_fds = reader.is_truncated();
    let mut fds = Vec::new();
    for message in reader.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(received) = message {
            fds.extend(received);
        }
    }
    if info.bytes_read() == 0 && fds.is_empty() {
        return Ok(None);
    }
    if info.truncated() {
        anyhow::bail!("the ingress sent a frame over {MAX_FRAME} bytes");
    }
    if truncated_fds {
        anyhow::bail!("the ingress sent more fds than fit the ancillary buffer");
    }
    let frame = &buffer[..info.bytes_read()];
    let (message, used) = channel::decode(frame).map_err(|error| match error {
        DecodeError::Incomplete { .. } => anyhow::anyhow!("the ingress sent a truncated frame"),
        DecodeError::VersionMismatch { ours, theirs } => anyhow::anyhow!(
            "the ingress speaks device-channel protocol v{theirs}, this device plane v{ours}: deploy matching versions"
        ),
        other => anyhow::anyhow!("the ingress sent a bad frame: {other}"),
    })?;
    if used != frame.len() {
        anyhow::bail!("the ingress sent bytes after its frame");
    }
    if fds.len() != message.fd_count() {
        anyhow::bail!(
            "the ingress sent {} with {} fds (expected {})",
            message.name(),
            fds.len(),
            message.fd_count()
        );
    }
    Ok(Some(Incoming { message, fds }))
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

/// Says Hello and waits for Welcome; returns the generation the ingress gave us.
pub async fn hello(socket: &UnixSeqpacket, buffer: &mut [u8]) -> Result<u64, HelloError> {
    send(
        socket,
        &Message::Hello(Hello {
            pid: std::process::id(),
            software: env!("CARGO_PKG_VERSION").to_string(),
        }),
    )
    .await
    .context("saying Hello to the ingress")?;
    let reply = tokio::time::timeout(Duration::from_secs(10), receive(socket, buffer))
        .await
        .context("the ingress did not answer Hello within 10 s")??;
    match reply.map(|r| r.message) {
        Some(Message::Welcome(welcome)) => Ok(welcome.generation),
        Some(Message::Refused(refused)) => Err(HelloError::Refused(refused.reason)),
        Some(other) => {
            Err(anyhow::anyhow!("the ingress answered Hello with {}", other.name()).into())
        }
        None => Err(anyhow::anyhow!("the ingress closed the channel after Hello").into()),
    }
}
