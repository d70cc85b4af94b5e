//! Binding the ingress's sockets: the customer listeners and the Unix
//! sockets under the runtime directory.
//!
//! A Unix socket path that is left over from a dead ingress is removed and
//! bound afresh; one that another live ingress still answers on is an error
//! (two ingresses must hand off, never fight over a path).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use tokio::net::{TcpListener, UnixListener};
use tokio_seqpacket::UnixSeqpacketListener;

/// Listen backlog for the customer listeners: it is what holds new
/// connections while no device plane is attached.
pub const CUSTOMER_BACKLOG: u32 = 4096;

/// Binds a TCP listener with SO_REUSEADDR and a deep backlog.
pub fn bind_tcp(name: &str, address: SocketAddr) -> anyhow::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .with_context(|| format!("creating the {name} socket"))?;
    socket.set_reuseaddr(true)?;
    socket
        .bind(address)
        .with_context(|| format!("binding the {name} listener to {address}"))?;
    socket
        .listen(CUSTOMER_BACKLOG)
        .with_context(|| format!("listening on {address} ({name})"))
}

/// Binds the WireGuard UDP socket.
pub fn bind_udp(name: &str, address: SocketAddr) -> anyhow::Result<std::net::UdpSocket> {
    std::net::UdpSocket::bind(address)
        .with_context(|| format!("binding the {name} socket to {address} (UDP)"))
}

/// Makes sure `path`'s directory exists and no live process answers on it.
fn clear_path(path: &Path, is_live: impl Fn(&Path) -> bool) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the runtime directory {}", dir.display()))?;
    }
    if path.exists() {
        if is_live(path) {
            anyhow::bail!(
                "another process is serving {} (is another blipless-ingress running with the same node.runtime_dir?)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    Ok(())
}

fn restrict(path: &Path) -> anyhow::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting permissions on {}", path.display()))
}

/// Binds the device socket (SOCK_SEQPACKET).
pub fn bind_device_socket(path: &Path) -> anyhow::Result<UnixSeqpacketListener> {
    clear_path(path, |p| {
        tokio_seqpacket::UnixSeqpacket::connect_blocking(p).is_ok()
    })?;
    let listener = UnixSeqpacketListener::bind_with_backlog(path, 128)
        .with_context(|| format!("binding the device socket {}", path.display()))?;
    restrict(path)?;
    Ok(listener)
}

/// Binds the handoff socket (SOCK_SEQPACKET): a successor ingress connects
/// here. A live one is left alone: the caller connects to it instead.
pub fn bind_handoff_socket(path: &Path) -> anyhow::Result<UnixSeqpacketListener> {
    clear_path(path, |p| {
        tokio_seqpacket::UnixSeqpacket::connect_blocking(p).is_ok()
    })?;
    let listener = UnixSeqpacketListener::bind_with_backlog(path, 8)
        .with_context(|| format!("binding the handoff socket {}", path.display()))?;
    restrict(path)?;
    Ok(listener)
}

/// Binds the control socket (stream).
pub fn bind_control_socket(path: &Path) -> anyhow::Result<UnixListener> {
    clear_path(path, |p| std::os::unix::net::UnixStream::connect(p).is_ok())?;
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the control socket {}", path.display()))?;
    restrict(path)?;
    Ok(listener)
}

/// Accepts on a channel socket (device or handoff) until `stop`, each
/// connection handled by `handle` in a task of its own; `what` names the
/// socket in logs, `ended` what a handler's error means.
pub async fn accept_each<H, F>(
    mut listener: UnixSeqpacketListener,
    stop: tokio_util::sync::CancellationToken,
    what: &'static str,
    ended: &'static str,
    handle: H,
) where
    H: Fn(tokio_seqpacket::UnixSeqpacket) -> F,
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        match accepted {
            Ok(socket) => {
                let handled = handle(socket);
                tokio::spawn(async move {
                    if let Err(error) = handled.await {
                        tracing::warn!("{ended}: {error:#}");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting on the {what} socket failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}
