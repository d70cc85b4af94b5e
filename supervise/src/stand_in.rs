//! The `--supervise` stand-in (docs/ARCHITECTURE.md, "The systemd stand-in"): the unit's main process under
//! systemd, so that `systemctl restart` can start a new daemon beside the
//! running one instead of killing it first.
//!
//! It runs its child (the same binary without `--supervise`) in its own
//! process group, with `NOTIFY_SOCKET` pointing at a datagram socket of the
//! stand-in's own and `BLIPLESS_SUPERVISED=1`, and relays the child's
//! notifications (READY, STATUS, STOPPING, FDSTORE with its descriptors) to
//! the service manager as its own: with `NotifyAccess=main` only the main
//! process may notify. Descriptors systemd passes (`LISTEN_FDS`) are
//! inherited by the child unchanged (see [`crate::listen_fds`]).
//!
//! Signals, with `KillMode=process` and `RestartKillSignal=SIGUSR2` (the
//! handoff drop-in):
//! - SIGTERM, SIGINT: passed to the child; the stand-in waits for it and
//!   exits with its status (a stop drains as it would without the stand-in).
//! - SIGHUP (`systemctl reload`): passed to the child (the ingress reloads
//!   its TLS certificate); the stand-in carries on.
//! - SIGUSR2 (a restart): once the child has said READY=1, the stand-in
//!   passes SIGUSR2 to it and exits 0 at once, leaving it running outside
//!   the restarted unit's main process; the child waits for its successor to
//!   take over, or drains after `drain.grace`. Before READY=1 the child is
//!   stopped instead (SIGTERM) and the stand-in exits with its status.
//! - SIGABRT (the service manager's watchdog: `WatchdogSec=` passed with no
//!   `WATCHDOG=1` from the child, so the child is wedged and cannot drain):
//!   the stand-in SIGKILLs the child's process group, reaps the child and
//!   exits 134 (128 + SIGABRT). With `KillMode=process` systemd signals only
//!   the stand-in; without this a wedged child would outlive its unit and
//!   hold the node's sockets against the restarted one.
//! - The child exiting by itself: the stand-in exits with its code (128 +
//!   the signal if a signal ended it), so `Restart=on-failure` sees it.

/// Writes one line to stderr in one `write`: the daemon the stand-in
/// started writes to the same file, and `eprintln!` writes a line in
/// pieces, between which the daemon's own lines could land (a reader of
/// "started ... as pid N" found the pid on another line).
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::MsgFlags;
use nix::unistd::Pid;
use tokio::io::Interest;
use tokio::signal::unix::{signal, SignalKind};

use crate::notify::{receive, Listener, Notification, Notifier, NotifyError, MAX_MESSAGE};

/// The command-line flag that asks for the stand-in.
pub const SUPERVISE_FLAG: &str = "--supervise";
/// The environment variable that asks for it (removed from the child's
/// environment, or the child would supervise too).
pub const SUPERVISE_ENV: &str = "BLIPLESS_SUPERVISE";

/// Why the stand-in could not run its child.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// Not under a service manager.
    #[error("NOTIFY_SOCKET is not set: --supervise is for a systemd unit with Type=notify (it relays the daemon's readiness to systemd); run without --supervise otherwise")]
    NoNotifySocket,
    /// `NOTIFY_SOCKET` is unusable.
    #[error(transparent)]
    Notify(#[from] NotifyError),
    /// Setting up the stand-in failed.
    #[error("{what}: {source}")]
    Setup {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The child could not be started.
    #[error("starting {program}: {source}", program = program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn setup(what: impl Into<String>) -> impl FnOnce(io::Error) -> SuperviseError {
    let what = what.into();
    move |source| SuperviseError::Setup { what, source }
}

/// The child's arguments: `args` (without the program name) minus every
/// `--supervise`.
pub fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter().filter(|a| a != SUPERVISE_FLAG).collect()
}

/// Runs `program` with `args` under the stand-in until it exits, or until a
/// restart (SIGUSR2) leaves it running; returns the exit code for this
/// process. Errors are printed on stderr and give 1; without
/// `NOTIFY_SOCKET` it refuses to start.
pub fn run(program: &Path, args: &[OsString]) -> i32 {
    let name = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "blipless".to_string());
    let prefix = format!("{name} --supervise");
    let result = Notifier::from_env()
        .map_err(SuperviseError::from)
        .and_then(|upstream| upstream.ok_or(SuperviseError::NoNotifySocket))
        .and_then(|upstream| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(setup("starting the async runtime"))
                .map(|runtime| (runtime, upstream))
        })
        .and_then(|(runtime, upstream)| {
            runtime.block_on(supervise(program, args, &upstream, &prefix))
        });
    match result {
        Ok(code) => code,
        Err(error) => {
            tell!("{prefix}: {error}");
            1
        }
    }
}

async fn supervise(
    program: &Path,
    args: &[OsString],
    upstream: &Notifier,
    prefix: &str,
) -> Result<i32, SuperviseError> {
    // Handlers first: a signal that arrives while the child starts waits.
    let mut sigterm = signal(SignalKind::terminate()).map_err(setup("handling SIGTERM"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(setup("handling SIGINT"))?;
    let mut sigusr2 = signal(SignalKind::user_defined2()).map_err(setup("handling SIGUSR2"))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(setup("handling SIGHUP"))?;
    let mut sigabrt =
        signal(SignalKind::from_raw(Signal::SIGABRT as i32)).map_err(setup("handling SIGABRT"))?;

    let dir = private_dir()?;
    let path = dir.path().join("notify.sock");
    let socket = Listener::bind(&path)
        .map_err(setup(format!("binding {}", path.display())))?
        .into_socket();
    socket
        .set_nonblocking(true)
        .map_err(setup("setting the notification socket non-blocking"))?;
    let socket = tokio::net::UnixDatagram::from_std(socket)
        .map_err(setup("registering the notification socket"))?;

    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env(crate::notify::NOTIFY_SOCKET, &path)
        .env(crate::listen_fds::SUPERVISED, "1")
        .env_remove(SUPERVISE_ENV)
        // systemd's WATCHDOG_PID names the stand-in; without it the child
        // takes WATCHDOG_USEC as its own, and its WATCHDOG=1 is relayed.
        .env_remove(crate::notify::WATCHDOG_PID)
        .process_group(0)
        .spawn()
        .map_err(|source| SuperviseError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    let raw_pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| setup("reading the child's pid")(io::ErrorKind::NotFound.into()))?;
    // Until `child.wait()` reaps it, this pid stays the child's.
    let pid = Pid::from_raw(raw_pid);
    tell!("{prefix}: started {} as pid {pid}", program.display());

    let relay = Relay {
        upstream,
        child: raw_pid,
        prefix,
    };
    let mut ready = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                // What the child sent before it exited is still queued.
                while let Ok(notification) = socket.try_io(Interest::READABLE, || receive_now(&socket)) {
                    relay.forward(notification);
                }
                let status = status.map_err(setup("waiting for the child"))?;
                let code = exit_code(status);
                tell!("{prefix}: pid {pid} exited ({status}); exiting {code}");
                return Ok(code);
            }
            received = socket.async_io(Interest::READABLE, || receive_now(&socket)) => match received {
                Ok(notification) => ready |= relay.forward(notification),
                Err(error) => tell!("{prefix}: receiving a notification: {error}"),
            },
            _ = sigterm.recv() => pass(prefix, pid, Signal::SIGTERM),
            _ = sigint.recv() => pass(prefix, pid, Signal::SIGINT),
            _ = sighup.recv() => pass(prefix, pid, Signal::SIGHUP),
            _ = sigabrt.recv() => {
                tell!(
                    "{prefix}: SIGABRT (the service manager's watchdog: pid {pid} stopped \
                     answering): killing it and its process group"
                );
                // The child leads its own process group (process_group(0)).
                if let Err(error) = kill(Pid::from_raw(-raw_pid), Signal::SIGKILL) {
                    tell!("{prefix}: killing process group {pid}: {error}");
                }
                let status = child.wait().await.map_err(setup("waiting for the child"))?;
                tell!("{prefix}: pid {pid} exited ({status}); exiting 134");
                return Ok(128 + Signal::SIGABRT as i32);
            }
            _ = sigusr2.recv() => {
                if ready {
                    pass(prefix, pid, Signal::SIGUSR2);
                    tell!(
                        "{prefix}: restart: leaving pid {pid} to hand over to its successor \
                         (or to drain after drain.grace); exiting 0"
                    );
                    return Ok(0);
                }
                tell!("{prefix}: restart before pid {pid} was ready: stopping it");
                pass(prefix, pid, Signal::SIGTERM);
            }
        }
    }
}

/// One queued notification, without waiting (WouldBlock when none is).
fn receive_now(socket: &tokio::net::UnixDatagram) -> io::Result<Notification> {
    receive(socket, MsgFlags::MSG_DONTWAIT)
}

/// A private folder (mode 0700) for the notification socket: in the unit's
/// `RuntimeDirectory` when systemd gives one, else the temporary folder.
fn private_dir() -> Result<tempfile::TempDir, SuperviseError> {
    let base = std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|dirs| dirs.to_string_lossy().split(':').next().map(PathBuf::from))
        .filter(|dir| dir.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("blipless-supervise.")
        .tempdir_in(&base)
        .map_err(setup(format!("creating a folder in {}", base.display())))
}

fn pass(prefix: &str, pid: Pid, signal: Signal) {
    tell!("{prefix}: passing {signal} to pid {pid}");
    if let Err(error) = kill(pid, signal) {
        tell!("{prefix}: passing {signal} to pid {pid}: {error}");
    }
}

/// The code a shell would report: the exit code, or 128 + the signal.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Where and for whom notifications are relayed.
struct Relay<'a> {
    upstream: &'a Notifier,
    child: i32,
    prefix: &'a str,
}

impl Relay<'_> {
    /// Forwards one notification from the child; true if it said READY=1.
    fn forward(&self, notification: Notification) -> bool {
        let Notification {
            state: text,
            fds,
            sender,
            truncated,
        } = notification;
        if sender != Some(self.child) {
            tell!(
                "{}: ignoring a notification from pid {} (only the child's, pid {}, are relayed)",
                self.prefix,
                sender.map_or_else(|| "?".to_string(), |p| p.to_string()),
                self.child
            );
            return false;
        }
        if truncated {
            tell!(
                "{}: dropping a notification longer than {MAX_MESSAGE} bytes",
                self.prefix
            );
            return false;
        }
        let (state, ready) = relayed(&text);
        if state.is_empty() {
            return false;
        }
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        if let Err(error) = self.upstream.send(&state, &raw) {
            tell!("{}: relaying to the service manager: {error}", self.prefix);
        }
        // Our copies of the descriptors close here; systemd holds its own.
        ready
    }
}

/// What the stand-in relays of one notification: its state lines minus
/// `MAINPID=` (the stand-in stays the unit's main process), and whether it
/// says `READY=1`.
pub(crate) fn relayed(text: &str) -> (String, bool) {
    let lines: Vec<&str> = text
        .split('\n')
        .filter(|line| !line.is_empty() && !line.starts_with("MAINPID="))
        .collect();
    let ready = lines.contains(&"READY=1");
    (lines.join("\n"), ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_state_drops_mainpid_and_spots_ready() {
        assert_eq!(relayed("READY=1"), ("READY=1".to_string(), true));
        assert_eq!(
            relayed("READY=1\nSTATUS=serving\nMAINPID=77\n"),
            ("READY=1\nSTATUS=serving".to_string(), true)
        );
        assert_eq!(
            relayed("STATUS=READY=1 soon"),
            ("STATUS=READY=1 soon".to_string(), false)
        );
        assert_eq!(
            relayed("FDSTORE=1\nFDNAME=socks"),
            ("FDSTORE=1\nFDNAME=socks".to_string(), false)
        );
        assert_eq!(relayed("MAINPID=1"), (String::new(), false));
    }

    #[test]
    fn the_child_gets_every_argument_but_supervise() {
        let args = ["--supervise", "--config", "/etc/b.toml", "--supervise"].map(OsString::from);
        assert_eq!(
            child_args(args),
            ["--config", "/etc/b.toml"].map(OsString::from).to_vec()
        );
    }

    #[test]
    fn exit_codes_as_a_shell_reports_them() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
