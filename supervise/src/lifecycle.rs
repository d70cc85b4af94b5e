//! What both daemons do around a restart under the stand-in: wait for a
//! successor after SIGUSR2, and tell the service manager when a drain starts.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// SIGUSR2 (`systemctl restart` through the `--supervise` stand-in): a
/// successor is starting beside this process and takes over (an ingress by
/// handoff, a device plane by a deploy), which ends this one. If it is still
/// running `grace` later, no successor came, and `drain` is cancelled: the
/// process drains as on SIGTERM.
pub async fn wait_for_successor(
    mut restart: tokio::signal::unix::Signal,
    grace: Duration,
    drain: CancellationToken,
) {
    if restart.recv().await.is_none() {
        return;
    }
    tracing::info!(?grace, "SIGUSR2: waiting for a successor");
    tokio::select! {
        () = tokio::time::sleep(grace) => {
            tracing::warn!(?grace, "no successor took over within drain.grace: draining");
            drain.cancel();
        }
        () = drain.cancelled() => {}
    }
}

/// Tells the service manager STOPPING=1 once `drain` is cancelled, however
/// the drain was asked for (a stand-in already gone makes this fail: logged
/// only).
pub async fn tell_stopping(drain: CancellationToken) {
    drain.cancelled().await;
    if let Err(error) = crate::notify::stopping() {
        tracing::debug!(%error, "telling the service manager STOPPING=1 failed");
    }
}
