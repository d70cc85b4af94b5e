//! The read-only WireGuard UAPI socket: stock `wg show <interface>` (and every
//! exporter built on `wg`) reads the ingress's peers from
//! `<wireguard.uapi_dir>/<wireguard.interface>.sock`, by default
//! `/run/wireguard/blipless.sock` (docs/ARCHITECTURE.md, "wg show").
//!
//! The wire format is [`blipless_protocol::wg_uapi`]; this module is its
//! socket. `set` is refused with EPERM: peers come from the store
//! (`blipless-ctl client add`), never from `wg set`.
//!
//! The socket belongs to the serving ingress. A successor replaces the file
//! with its own when it starts; the old ingress leaves a file that is no
//! longer its own alone when it exits, and binds again if the successor dies
//! and it serves again.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_protocol::wg_uapi::{self, UapiRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::Wireguard;
use crate::peercred;

/// How long one client may take to send a request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The socket while this ingress serves it; dropping it stops the server and
/// removes the file if it is still this one's.
#[derive(Debug)]
pub struct UapiSocket {
    path: PathBuf,
    /// The socket file's device and inode, to tell it from a successor's.
    identity: (u64, u64),
    stop: CancellationToken,
}

impl Drop for UapiSocket {
    fn drop(&mut self) {
        self.stop.cancel();
        let still_ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity);
        if still_ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `path` and serves `wireguard`'s device on it until the returned
/// socket is dropped or `shutdown`. A failure is logged and costs only `wg
/// show`: WireGuard itself does not depend on it.
pub fn start(
    path: Option<PathBuf>,
    wireguard: Arc<Wireguard>,
    shutdown: &CancellationToken,
) -> Option<UapiSocket> {
    let path = path?;
    match bind(&path) {
        Ok((listener, identity)) => {
            let stop = shutdown.child_token();
            tokio::spawn(serve(listener, wireguard, stop.clone()));
            tracing::debug!(path = %path.display(), "serving the WireGuard UAPI socket (wg show)");
            Some(UapiSocket {
                path,
                identity,
                stop,
            })
        }
        Err(error) => {
            tracing::warn!("`wg show` will not see this node: {error:#}");
            None
        }
    }
}

/// Makes the directory if it is missing (0755, as wireguard-go does), takes
/// the name from any socket there (a predecessor's or a dead one's), binds,
/// and lets only the owner and its group connect.
fn bind(path: &Path) -> anyhow::Result<(UnixListener, (u64, u64))> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)
                .with_context(|| format!("removing the old socket {}", path.display()))?;
        }
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the WireGuard UAPI socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting permissions on {}", path.display()))?;
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("reading back {}", path.display()))?;
    Ok((listener, (meta.dev(), meta.ino())))
}

async fn serve(listener: UnixListener, wireguard: Arc<Wireguard>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "WireGuard UAPI accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let wireguard = wireguard.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, &wireguard).await {
                tracing::debug!(%error, "WireGuard UAPI connection ended");
            }
        });
    }
}

/// Answers one client's requests, one after another, until it closes (`wg`
/// also connects and closes at once to see whether the socket is alive).
async fn answer(mut stream: UnixStream, wireguard: &Wireguard) -> std::io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let mut buffer = Vec::with_capacity(512);
    loop {
        let request = match read_request(&mut stream, &mut buffer).await? {
            Some(request) => request,
            None => return Ok(()),
        };
        let reply = match request {
            Ok(_) if !peercred::is_allowed(uid) => {
                tracing::debug!(uid, "WireGuard UAPI request refused");
                wg_uapi::render_errno(wg_uapi::SET_REFUSED_ERRNO)
            }
            Ok(UapiRequest::Get) => wg_uapi::render_device(&wireguard.uapi_device()),
            Ok(UapiRequest::Set) => {
                tracing::info!(
                    "refused a WireGuard UAPI set: peers come from the store (blipless-ctl client add)"
                );
                wg_uapi::render_errno(wg_uapi::SET_REFUSED_ERRNO)
            }
            Err(error) => {
                stream
                    .write_all(wg_uapi::render_errno(wg_uapi::INVALID_ERRNO).as_bytes())
                    .await?;
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, error));
            }
        };
        stream.write_all(reply.as_bytes()).await?;
    }
}

/// Reads until `buffer` starts with a whole request, which it then drops from
/// `buffer`. `None`: the client closed (or timed out) between requests.
async fn read_request(
    stream: &mut UnixStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<Result<UapiRequest, wg_uapi::UapiError>>> {
    loop {
        match wg_uapi::parse_request(buffer) {
            Ok((request, consumed)) => {
                buffer.drain(..consumed);
                return Ok(Some(Ok(request)));
            }
            Err(error) if !error.is_incomplete() => return Ok(Some(Err(error))),
            Err(_) => {}
        }
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout(REQUEST_TIMEOUT, stream.read(&mut chunk)).await;
        match read {
            Ok(Ok(0)) | Err(_) => return Ok(None),
            Ok(Ok(n)) => buffer.extend_from_slice(&chunk[..n]),
            Ok(Err(error)) => return Err(error),
        }
    }
}
