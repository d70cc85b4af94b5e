//! Binding the ingress's sockets: the customer listeners and the Unix
//! sockets under the runtime directory.
//!
//! A Unix socket path that is left over from a dead ingress is removed and
//! bound afresh; one that another live ingress still answers on is an error
//! (two ingresses must hand off, never fight over a path).
//!
//! The runtime directory ([`prepare_runtime_dir`]) is created with mode
//! 0700; an existing one must belong to this ingress's uid and be writable
//! by no one else (0700 or 0750 pass, a group- or world-writable one does
//! not), or whoever can write there could put their own `device.sock` or
//! `handoff.sock` in the node's path.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::net::{TcpListener, UnixListener};
use tokio_seqpacket::UnixSeqpacketListener;

/// Listen backlog for the customer listeners: it is what holds new
/// connections while no device plane is attached.
pub const CUSTOMER_BACKLOG: u32 = 4096;

/// Binds a TCP listener with SO_REUSEADDR and a deep backlog. With
/// `share_port`, SO_REUSEPORT too: a successor moving a listener to another
/// address on the same port (127.0.0.1:1080 to 0.0.0.0:1080) binds beside the
/// predecessor's, which is still open (see [`share_port`]). A first start does
/// not share: a second node on the same port is an error, not a silent split
/// of its customers.
pub fn bind_tcp(name: &str, address: SocketAddr, share_port: bool) -> anyhow::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .with_context(|| format!("creating the {name} socket"))?;
    socket.set_reuseaddr(true)?;
    if share_port {
        socket.set_reuseport(true)?;
    }
    socket
        .bind(address)
        .with_context(|| format!("binding the {name} listener to {address}"))?;
    socket
        .listen(CUSTOMER_BACKLOG)
        .with_context(|| format!("listening on {address} ({name})"))
}

/// Lets a new listener share the port of `listener` (SO_REUSEPORT on it):
/// Linux lets a socket bind beside a listening one on the same port only when
/// both ask for it and belong to the same user. Used on a predecessor's
/// listener that the successor does not take over (its address changed, its
/// port the same), so the successor can bind the new address while the
/// predecessor's copy is still open.
pub fn share_port(listener: std::os::fd::BorrowedFd<'_>) -> anyhow::Result<()> {
    nix::sys::socket::setsockopt(&listener, nix::sys::socket::sockopt::ReusePort, &true)
        .context("setting SO_REUSEPORT on the predecessor's listener")
}

/// Binds the WireGuard UDP socket.
pub fn bind_udp(name: &str, address: SocketAddr) -> anyhow::Result<std::net::UdpSocket> {
    std::net::UdpSocket::bind(address)
        .with_context(|| format!("binding the {name} socket to {address} (UDP)"))
}

/// The mode of a runtime directory the ingress creates.
pub const RUNTIME_DIR_MODE: u32 = 0o700;

/// Why the runtime directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    /// It could not be created, or not be examined.
    #[error("the runtime directory {}: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Something other than a directory is in its place.
    #[error("the runtime directory {} exists but is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// It belongs to another user.
    #[error("the runtime directory {} is owned by uid {owner}, not by this ingress (uid {own}): refusing to serve the node's sockets there (remove it, chown it to uid {own}, or set node.runtime_dir to a directory of this user's)", path.display())]
    ForeignOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        own: u32,
    },
    /// Its group or everyone may write in it.
    #[error("the runtime directory {} has mode {mode:04o}: writable by its group or by others, who could replace the node's sockets; refusing it (chmod 0700 it)", path.display())]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Creates `dir` (and missing parents) with mode 0700 if it does not
/// exist, then checks it: a directory, owned by this process's effective
/// uid, not writable by its group or others. Called at start, before any
/// socket under it is used, and before each bind.
pub fn prepare_runtime_dir(dir: &Path) -> Result<(), RuntimeDirError> {
    let io = |source| RuntimeDirError::Io {
        path: dir.to_owned(),
        source,
    };
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(RUNTIME_DIR_MODE)
        .create(dir)
    {
        Ok(()) => {}
        // `recursive` reports an existing non-directory as AlreadyExists.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(io(error)),
    }
    let metadata = std::fs::metadata(dir).map_err(io)?;
    check_runtime_dir(dir, &metadata, nix::unistd::geteuid().as_raw())
}

/// The checks of [`prepare_runtime_dir`] on what `stat` said.
fn check_runtime_dir(
    dir: &Path,
    metadata: &std::fs::Metadata,
    own: u32,
) -> Result<(), RuntimeDirError> {
    if !metadata.is_dir() {
        return Err(RuntimeDirError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    if metadata.uid() != own {
        return Err(RuntimeDirError::ForeignOwner {
            path: dir.to_owned(),
            owner: metadata.uid(),
            own,
        });
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(RuntimeDirError::Writable {
            path: dir.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Makes sure `path`'s directory exists (and may be trusted: see
/// [`prepare_runtime_dir`]) and no live process answers on `path`.
fn clear_path(path: &Path, is_live: impl Fn(&Path) -> bool) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        prepare_runtime_dir(dir)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path)
            .map(|m| m.mode() & 0o7777)
            .unwrap_or(0)
    }

    /// A fresh directory under the temporary directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "blipless-runtime-dir-test-{}-{n}",
                std::process::id()
            ));
            std::fs::create_dir(&path).expect("scratch dir");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            Scratch(path)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_missing_runtime_dir_is_created_0700_and_accepted_again() {
        let base = Scratch::new();
        let dir = base.path().join("a/run");
        prepare_runtime_dir(&dir).expect("created");
        assert_eq!(mode_of(&dir), 0o700);
        prepare_runtime_dir(&dir).expect("accepted when it exists");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        prepare_runtime_dir(&dir).expect("0750 is accepted");
    }

    #[test]
    fn a_writable_runtime_dir_is_refused() {
        let base = Scratch::new();
        let dir = base.path().join("run");
        for mode in [0o777, 0o770, 0o1777, 0o702] {
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let error = prepare_runtime_dir(&dir).expect_err("refused");
            assert!(
                matches!(error, RuntimeDirError::Writable { .. }),
                "{mode:o}: {error}"
            );
            assert!(error.to_string().contains("writable"), "{error}");
        }
    }

    #[test]
    fn a_runtime_dir_of_another_user_is_refused_naming_its_owner() {
        let base = Scratch::new();
        let metadata = std::fs::metadata(base.path()).expect("stat");
        let other = metadata.uid() + 1;
        let error = check_runtime_dir(base.path(), &metadata, other).expect_err("refused");
        let text = error.to_string();
        assert!(
            matches!(error, RuntimeDirError::ForeignOwner { .. }),
            "{text}"
        );
        assert!(
            text.contains(&format!("owned by uid {}", metadata.uid())),
            "{text}"
        );
    }

    #[test]
    fn a_file_in_its_place_is_refused() {
        let base = Scratch::new();
        let file = base.path().join("run");
        std::fs::write(&file, b"").expect("file");
        assert!(matches!(
            prepare_runtime_dir(&file),
            Err(RuntimeDirError::NotADirectory { .. })
        ));
    }
}
