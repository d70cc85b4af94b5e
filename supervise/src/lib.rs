//! Process supervision for the blipless daemons under systemd.
//!
//! - [`notify`]: an sd_notify client (`READY=1`, `STATUS=`, `STOPPING=1`,
//!   `FDSTORE=1` with descriptors); a no-op without `NOTIFY_SOCKET`.
//! - [`listen_fds`]: the descriptors systemd passes at start
//!   (`LISTEN_FDS`/`LISTEN_FDNAMES`/`LISTEN_PID`), by name.
//! - [`run`]: the `--supervise` stand-in (docs/ARCHITECTURE.md, "The systemd stand-in"), the unit's main
//!   process, which lets `systemctl restart` start a new daemon beside the
//!   running one (`KillMode=process`, `RestartKillSignal=SIGUSR2`).
//! - [`daemon`]: what both daemons' `main` shares, from the command line to
//!   the exit status (the stand-in, the configuration, logging, the runtime,
//!   SIGTERM/SIGINT and SIGUSR2).
//! - [`docs`]: man pages and shell completions from a binary's command line.
//! - [`pace`]: how often a slow customer's writer is woken (`TCP_NOTSENT_LOWAT`).
//!
//! Linux only.

pub mod daemon;
pub mod docs;
mod fd;
pub mod listen_fds;
pub mod notify;
pub mod pace;
pub mod process;
mod stand_in;

pub use stand_in::{child_args, run, SuperviseError, SUPERVISE_ENV, SUPERVISE_FLAG};
