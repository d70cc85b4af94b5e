//! Whether an attached device plane's process is gone, from a pidfd opened
//! while it was attached (so the number cannot have been reused by then).
//! A plane whose channel reached its end and whose process exited provably
//! never took a connection it did not confirm: that is what lets the ingress
//! answer "not taken" to the plane that sent it (docs/ARCHITECTURE.md,
//! "Failures").

use std::os::fd::OwnedFd;
use std::time::Duration;

/// A plane's process, if a pidfd could be opened for it.
#[derive(Debug)]
pub struct PlaneProcess(Option<OwnedFd>);

impl PlaneProcess {
    /// Opens a pidfd for `pid` (the channel peer's, from SO_PEERCRED). None,
    /// or a failure (a kernel before 5.3, a process already gone), leaves no
    /// way to tell, and [`PlaneProcess::exited_within`] then says false.
    pub fn open(pid: Option<i32>) -> Self {
        let pidfd = pid
            .and_then(rustix::process::Pid::from_raw)
            .and_then(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
                    .map_err(|error| tracing::debug!(%error, "no pidfd for a device plane"))
                    .ok()
            });
        Self(pidfd)
    }

    /// None: no process to watch (for tests of the bookkeeping).
    pub fn unknown() -> Self {
        Self(None)
    }

    /// True if the process has exited, or does so within `wait`; false if it
    /// still runs then, or there is no way to tell.
    pub async fn exited_within(&self, wait: Duration) -> bool {
        let Some(pidfd) = &self.0 else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if has_exited(pidfd) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
}

/// How often [`PlaneProcess::exited_within`] looks.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// A pidfd polls readable once its process has exited (a zombie too).
fn has_exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&now)), Ok(1)) && fds[0].revents().contains(PollFlags::IN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_child_that_exits_is_seen_gone_and_one_that_runs_is_not() {
        let mut running = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let process = PlaneProcess::open(i32::try_from(running.id()).ok());
        assert!(!process.exited_within(Duration::from_millis(200)).await);
        running.kill().expect("kill");
        assert!(process.exited_within(Duration::from_secs(10)).await);
        running.wait().expect("reap");
        assert!(!PlaneProcess::unknown().exited_within(Duration::ZERO).await);
    }
}
