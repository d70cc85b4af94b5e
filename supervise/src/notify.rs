//! A small sd_notify client: state lines (`READY=1`, `STATUS=...`,
//! `STOPPING=1`, `FDSTORE=1`) sent as one datagram to the Unix datagram
//! socket named by `NOTIFY_SOCKET`, a path (`/run/systemd/notify`) or an
//! abstract name (`@name`), with file descriptors attached as SCM_RIGHTS for
//! `FDSTORE=1`.
//!
//! Every function is a no-op returning `Ok(())` when `NOTIFY_SOCKET` is not
//! set, so the daemons call them unconditionally. `NOTIFY_SOCKET` is left in
//! the environment: a daemon notifies more than once. The receiver (systemd,
//! or the `--supervise` stand-in) learns the sender's pid from the kernel
//! (SO_PASSCRED), which is what `NotifyAccess=main` checks.

use std::ffi::{OsStr, OsString};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, UnixCredentials,
};

/// The environment variable naming the service manager's notification socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The watchdog period systemd asks for, in microseconds (`WatchdogSec=`).
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";

/// The process the watchdog period is meant for (unset: this one).
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// How often to send `WATCHDOG=1`: half the period in `WATCHDOG_USEC`, when
/// it is set and meant for this process (`WATCHDOG_PID` unset or our pid, as
/// sd_watchdog_enabled decides); `None` otherwise.
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(
        std::env::var(WATCHDOG_USEC).ok().as_deref(),
        std::env::var(WATCHDOG_PID).ok().as_deref(),
        std::process::id(),
    )
}

/// [`watchdog_interval`] from the two variables' values and our pid.
pub fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(own) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

/// The most file descriptors one SCM_RIGHTS message may carry (the kernel's
/// SCM_MAX_FD).
pub const MAX_FDS: usize = 253;

/// A notification longer than this is dropped (systemd reads 4096 bytes).
pub const MAX_MESSAGE: usize = 4096;

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor `@abstract-name`.
    #[error("NOTIFY_SOCKET={address:?} is not usable: {reason}")]
    Address {
        /// The value as found.
        address: OsString,
        /// What is wrong with it.
        reason: String,
    },
    /// A file-descriptor store name systemd would refuse.
    #[error("FDNAME {name:?} is not usable: {reason}")]
    FdName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// More file descriptors than one message can carry.
    #[error("{0} file descriptors do not fit one notification (at most {MAX_FDS})")]
    TooManyFds(usize),
    /// The datagram socket could not be created.
    #[error("creating a notification socket: {0}")]
    Socket(#[source] Errno),
    /// Sending failed (the receiver is gone, or refuses).
    #[error("sending {state:?} to NOTIFY_SOCKET={address:?}: {source}")]
    Send {
        /// The first line of what was sent.
        state: String,
        /// Where to.
        address: OsString,
        /// Why it failed.
        #[source]
        source: Errno,
    },
}

/// A resolved notification socket address.
#[derive(Debug, Clone)]
pub struct Notifier {
    display: OsString,
    address: UnixAddr,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, or `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, NotifyError> {
        match std::env::var_os(NOTIFY_SOCKET) {
            Some(value) if !value.is_empty() => Self::new(&value).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier for an address in `NOTIFY_SOCKET`'s syntax: an absolute
    /// path, or `@name` for an abstract socket.
    pub fn new(value: &OsStr) -> Result<Self, NotifyError> {
        let bytes = value.as_bytes();
        let invalid = |reason: &str| NotifyError::Address {
            address: value.to_owned(),
            reason: reason.to_string(),
        };
        let address = match bytes.first() {
            Some(b'/') => UnixAddr::new(bytes).map_err(|e| invalid(&e.to_string()))?,
            Some(b'@') if bytes.len() > 1 => {
                UnixAddr::new_abstract(&bytes[1..]).map_err(|e| invalid(&e.to_string()))?
            }
            _ => {
                return Err(invalid(
                    "expected an absolute path or @abstract-name (vsock is not supported)",
                ))
            }
        };
        Ok(Self {
            display: value.to_owned(),
            address,
        })
    }

    /// The address as given.
    pub fn address(&self) -> &OsStr {
        &self.display
    }

    /// Sends `state` (newline-separated assignments) with `fds` attached.
    pub fn send(&self, state: &str, fds: &[RawFd]) -> Result<(), NotifyError> {
        if fds.len() > MAX_FDS {
            return Err(NotifyError::TooManyFds(fds.len()));
        }
        let socket: OwnedFd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(NotifyError::Socket)?;
        let iov = [IoSlice::new(state.as_bytes())];
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        // A blocking send: a full receiver queue delays the sender a moment
        // instead of losing READY=1; a receiver that is gone fails at once.
        sendmsg(
            socket.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::empty(),
            Some(&self.address),
        )
        .map(drop)
        .map_err(|source| NotifyError::Send {
            state: state.lines().next().unwrap_or_default().to_string(),
            address: self.display.clone(),
            source,
        })
    }
}

/// Sends `state` to `NOTIFY_SOCKET`; `Ok(())` without one.
pub fn notify(state: &str) -> Result<(), NotifyError> {
    match Notifier::from_env()? {
        Some(notifier) => notifier.send(state, &[]),
        None => Ok(()),
    }
}

/// `READY=1`: startup is finished (for `Type=notify`, the unit is active).
pub fn ready() -> Result<(), NotifyError> {
    notify("READY=1")
}

/// `STATUS=...`: a one-line status `systemctl status` shows.
pub fn status(text: &str) -> Result<(), NotifyError> {
    notify(&status_message(text))
}

/// `STOPPING=1`: the service is shutting down.
pub fn stopping() -> Result<(), NotifyError> {
    notify("STOPPING=1")
}

/// `FDSTORE=1` with `FDNAME=name`: parks `fds` in the service's file
/// descriptor store (needs `FileDescriptorStoreMax=`); they come back as
/// `LISTEN_FDS` with that name on the next start.
pub fn store_fds(name: &str, fds: &[BorrowedFd<'_>]) -> Result<(), NotifyError> {
    let message = fdstore_message(name)?;
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    match Notifier::from_env()? {
        Some(notifier) => notifier.send(&message, &raw),
        None => Ok(()),
    }
}

/// The `STATUS=` line for `text`, newlines folded into spaces (one
/// assignment per line).
pub fn status_message(text: &str) -> String {
    format!("STATUS={}", text.replace(['\n', '\r'], " "))
}

/// The `FDSTORE=1\nFDNAME=name` message, or why systemd would refuse the
/// name (empty, over 255 bytes, a `:`, or a control character).
pub fn fdstore_message(name: &str) -> Result<String, NotifyError> {
    let refuse = |reason| NotifyError::FdName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(refuse("empty"));
    }
    if name.len() > 255 {
        return Err(refuse("longer than 255 bytes"));
    }
    if name.contains(':') {
        return Err(refuse(
            "contains ':' (LISTEN_FDNAMES separates names with it)",
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(refuse("contains a control character"));
    }
    Ok(format!("FDSTORE=1\nFDNAME={name}"))
}

/// One notification as the service manager receives it.
#[derive(Debug)]
pub struct Notification {
    /// The state lines.
    pub state: String,
    /// Descriptors attached as SCM_RIGHTS (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// The sending process, as the kernel reports it (SO_PASSCRED).
    pub sender: Option<i32>,
    /// The datagram or its descriptors did not fit and were cut.
    pub truncated: bool,
}

/// The service manager's side: a bound datagram socket with SO_PASSCRED
/// that receives notifications, their descriptors and their senders' pids.
/// The stand-in uses the same receiving code; tests use this to play
/// systemd.
#[derive(Debug)]
pub struct Listener {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Listener {
    /// Binds `path` (which must not exist) and asks for senders' credentials.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let socket = UnixDatagram::bind(path)?;
        setsockopt(&socket, sockopt::PassCred, &true)?;
        Ok(Self {
            socket,
            path: path.to_owned(),
        })
    }

    /// The bound path: what `NOTIFY_SOCKET` should say.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bound socket itself (it stays bound; dropping it does not remove
    /// the path).
    pub(crate) fn into_socket(self) -> UnixDatagram {
        self.socket
    }

    /// The next notification, or `None` if none arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> io::Result<Option<Notification>> {
        self.socket
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        match receive(&self.socket, MsgFlags::empty()) {
            Ok(notification) => Ok(Some(notification)),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// Receives one notification from `socket` (which has SO_PASSCRED set),
/// with `flags` added to MSG_CMSG_CLOEXEC.
pub(crate) fn receive(socket: &impl AsRawFd, flags: MsgFlags) -> io::Result<Notification> {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!(UnixCredentials, [RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut buffer)];
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | flags,
    )?;
    let mut fds = Vec::new();
    let mut sender = None;
    for control in message.cmsgs()? {
        match control {
            ControlMessageOwned::ScmRights(raw) => fds.extend(crate::fd::adopt_received(raw)),
            ControlMessageOwned::ScmCredentials(credentials) => sender = Some(credentials.pid()),
            _ => {}
        }
    }
    let truncated = message
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    let bytes = message.bytes;
    Ok(Notification {
        state: String::from_utf8_lossy(&buffer[..bytes]).into_owned(),
        fds,
        sender,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_is_ours_only_when_its_pid_is_unset_or_ours() {
        let half = Some(Duration::from_millis(15_000));
        assert_eq!(watchdog_interval_from(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("x"), 7), None);
        assert_eq!(watchdog_interval_from(None, None, 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("soon"), None, 7), None);
    }

    #[test]
    fn message_formats() {
        assert_eq!(status_message("serving"), "STATUS=serving");
        assert_eq!(status_message("a\nb\r"), "STATUS=a b ");
        assert_eq!(
            fdstore_message("socks").ok().as_deref(),
            Some("FDSTORE=1\nFDNAME=socks")
        );
        assert!(fdstore_message("").is_err());
        assert!(fdstore_message("a:b").is_err());
        assert!(fdstore_message("a\nREADY=1").is_err());
        assert!(fdstore_message(&"x".repeat(256)).is_err());
        assert!(fdstore_message(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn addresses() {
        assert!(Notifier::new(OsStr::new("/run/systemd/notify")).is_ok());
        assert!(Notifier::new(OsStr::new("@blipless/notify")).is_ok());
        for bad in ["", "@", "relative/path", "vsock:2:1"] {
            assert!(Notifier::new(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        let long = format!("/{}", "x".repeat(200));
        assert!(Notifier::new(OsStr::new(&long)).is_err());
    }

    #[test]
    fn sends_state_and_fds_to_a_datagram_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = Listener::bind(&dir.path().join("notify.sock")).expect("bind");
        let notifier = Notifier::new(listener.path().as_os_str()).expect("notifier");
        let wait = Duration::from_secs(5);
        assert!(listener
            .recv_timeout(Duration::from_millis(10))
            .expect("recv")
            .is_none());

        notifier.send("READY=1", &[]).expect("send");
        let received = listener
            .recv_timeout(wait)
            .expect("recv")
            .expect("a message");
        assert_eq!(received.state, "READY=1");
        assert!(received.fds.is_empty());
        assert_eq!(received.sender, i32::try_from(std::process::id()).ok());

        let (read, write) = nix::unistd::pipe().expect("pipe");
        nix::unistd::write(&write, b"x").expect("write");
        let message = fdstore_message("pipe").expect("name");
        notifier
            .send(&message, &[read.as_raw_fd()])
            .expect("send with fds");
        let received = listener
            .recv_timeout(wait)
            .expect("recv")
            .expect("a message");
        assert_eq!(received.state, "FDSTORE=1\nFDNAME=pipe");
        assert_eq!(received.fds.len(), 1);
        let mut byte = [0u8; 1];
        assert_eq!(nix::unistd::read(&received.fds[0], &mut byte), Ok(1));
        assert_eq!(&byte, b"x");
    }
}
