//! Process supervision for the blipless daemons under systemd.
//!
//! - [`notify`]: an sd_notify client (`READY=1`, `STATUS=`, `STOPPING=1`,
//!   `FDSTORE=1` with descriptors); a no-op without `NOTIFY_SOCKET`.
//! - [`listen_fds`]: the descriptors systemd passes at start
//!   (`LISTEN_FDS`/`LISTEN_FDNAMES`/`LISTEN_PID`), by name.
//! - [`run`]: the `--supervise` stand-in (DESIGN §5.6), the unit's main
//!   process, which lets `systemctl restart` start a new daemon beside the
//!   running one (`KillMode=process`, `RestartKillSignal=SIGUSR2`).
//!
//! Linux only.

mod fd;
pub mod lifecycle;
pub mod listen_fds;
pub mod notify;
mod stand_in;

pub use stand_in::{child_args, run, SuperviseError, SUPERVISE_ENV, SUPERVISE_FLAG};
