//! This plane's end of the device channel: attach to the ingress, say Hello,
//! and read what the ingress sends (connections as fds, Activate, Drain).
//!
//! Before anything is sent, [`attach`] checks who answered on `device.sock`
//! (SO_PEERCRED), by the ingress's own rule turned around: the peer must run
//! as this plane's uid or as root ([`is_trusted`]). Another process that
//! listens there (a stale path taken over by another local user) is logged
//! with its uid and pid and retried like an ingress that is not up yet: it
//! never sees Hello, Ready or the WireGuard peer set.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use blipless_link::LinkError;
use blipless_protocol::channel::{DecodeError, Hello, Rejoin, ToDevice, ToIngress, Welcome};
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

/// Why the process that answered on the device socket is not taken for the
/// ingress.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// It runs as a uid other than this plane's and not as root.
    #[error("the process answering on the device socket (pid {pid}) runs as uid {uid}: only uid {own} (this device plane's) or root may be the ingress; sending it nothing")]
    Untrusted {
        /// The peer's uid.
        uid: u32,
        /// The peer's pid, as the kernel saw it when it listened (0: unknown).
        pid: i32,
        /// This plane's effective uid.
        own: u32,
    },
    /// Its credentials could not be read.
    #[error("cannot read the credentials of the process answering on the device socket: {0}")]
    Unreadable(#[source] std::io::Error),
}

/// True when a peer running as `peer_uid` may be the ingress of a plane
/// running as `own_uid`: the same uid, or root (the ingress's rule for its
/// own peers, ingress/src/peercred.rs).
pub fn is_trusted(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_uid
}

/// Checks the credentials of the process at the other end of `socket`
/// against [`is_trusted`] and this process's effective uid.
pub fn check_ingress(socket: &UnixSeqpacket) -> Result<(), PeerError> {
    let credentials = socket.peer_cred().map_err(PeerError::Unreadable)?;
    let own = nix::unistd::geteuid().as_raw();
    if is_trusted(credentials.uid(), own) {
        Ok(())
    } else {
        Err(PeerError::Untrusted {
            uid: credentials.uid(),
            pid: credentials.pid().unwrap_or(0),
            own,
        })
    }
}

/// Connects to the ingress's device socket, retrying with backoff (100 ms
/// doubling to 2 s) and saying so in the log, until a trusted ingress
/// answers ([`check_ingress`]) or `stop`. An untrusted peer is disconnected
/// before anything is sent to it, logged as an error (at once, then at most
/// every 10 s) and retried in the same way.
pub async fn attach(path: &Path, stop: &CancellationToken) -> Option<UnixSeqpacket> {
    let mut delay = Duration::from_millis(100);
    let mut last_log: Option<Instant> = None;
    let mut last_refusal: Option<Instant> = None;
    loop {
        match UnixSeqpacket::connect(path).await {
            Ok(socket) => match check_ingress(&socket) {
                Ok(()) => {
                    if let Err(error) = blipless_link::size_buffers(&socket) {
                        tracing::warn!(%error, "could not size the device channel's send buffer");
                    }
                    return Some(socket);
                }
                Err(error) => {
                    drop(socket);
                    if last_refusal.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::error!("not attaching to {}: {error}; retrying", path.display());
                        last_refusal = Some(Instant::now());
                    }
                }
            },
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
pub async fn hello(
    socket: &UnixSeqpacket,
    buffer: &mut [u8],
    rejoin: Rejoin,
) -> Result<Welcome, HelloError> {
    let hello = ToIngress::Hello(Hello {
        pid: std::process::id(),
        software: crate::fault::software(),
        rejoin,
        accepts_many: crate::fault::reads_accepted_many(),
        reads_not_taken: true,
        reads_udp_migrate: crate::fault::reads_udp_migrate(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_uid_or_root_is_trusted() {
        assert!(is_trusted(1000, 1000));
        assert!(is_trusted(0, 1000));
        assert!(is_trusted(0, 0));
        assert!(!is_trusted(65534, 1000));
        assert!(!is_trusted(65534, 0));
        assert!(!is_trusted(1001, 1000));
    }

    #[tokio::test]
    async fn a_peer_of_our_own_uid_passes_and_a_refusal_names_the_uid() {
        let (ours, theirs) = UnixSeqpacket::pair().expect("a socket pair");
        assert!(check_ingress(&ours).is_ok());
        drop(theirs);
        let refusal = PeerError::Untrusted {
            uid: 65534,
            pid: 42,
            own: 1000,
        }
        .to_string();
        assert!(refusal.contains("uid 65534"), "{refusal}");
        assert!(refusal.contains("pid 42"), "{refusal}");
        assert!(refusal.contains("uid 1000"), "{refusal}");
    }
}
