//! The device plane's background duties: follow the change feed (a blocking
//! wait on it, so a change made anywhere in the fleet applies at once),
//! flush usage (and share capped clients' tunnel counts with the fleet),
//! flush activity, evict removed clients' egress identities.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clients::Directory;
use crate::identity::{Identities, ACTIVITY_FLUSH};

/// How long a node's record of a client's open tunnels counts: three usage
/// flushes, at least 30 s (a node that died stops counting after it).
fn live_ttl(usage_flush: Duration) -> Duration {
    (usage_flush * 3).max(Duration::from_secs(30))
}

/// Longest single wait on the change feed (then it is waited on again).
pub const FEED_WAIT: Duration = Duration::from_secs(1);
/// Runs until `stop`, flushing usage every `usage_flush` (`store.usage_flush`: a
/// SIGKILL loses at most that much).
pub async fn maintain(
    directory: Arc<Directory>,
    identities: Arc<Identities>,
    usage_flush: Duration,
    stop: CancellationToken,
) {
    let follower = tokio::spawn(follow_feed(
        directory.clone(),
        identities.clone(),
        stop.clone(),
    ));
    // The first usage tick is at once: a new plane (a deploy, a restart)
    // knows no quota count and no fleet tunnel count, so until its first
    // look an over-quota client would be served and a capped one could
    // open its whole cap again here. That first look adds nothing; the
    // deploy's warm-up usually covers it.
    // The activity flush writes one identity per client active in the last
    // minute: thousands of writes on a busy node, in a task of its own so
    // that the usage flush (quotas, the fleet's tunnel counts, what a
    // SIGKILL may lose) never waits behind it.
    let activity = tokio::spawn(flush_activity(identities.clone(), stop.clone()));
    let mut usage = tokio::time::interval(usage_flush);
    loop {
        tokio::select! {
            _ = usage.tick() => {
                flush_usage(&directory, &identities).await;
                directory.share_tunnel_counts(identities.node(), live_ttl(usage_flush)).await;
            }
            () = stop.cancelled() => break,
        }
    }
    let _ = follower.await;
    let _ = activity.await;
}

/// Flushes the egress identities' activity every [`ACTIVITY_FLUSH`] until
/// `stop`.
async fn flush_activity(identities: Arc<Identities>, stop: CancellationToken) {
    let mut activity = tokio::time::interval(ACTIVITY_FLUSH);
    activity.tick().await;
    loop {
        tokio::select! {
            _ = activity.tick() => identities.flush().await,
            () = stop.cancelled() => return,
        }
    }
}

/// Follows the change feed until `stop`: waits on it, applies what arrives,
/// and evicts the identities of removed clients.
async fn follow_feed(
    directory: Arc<Directory>,
    identities: Arc<Identities>,
    stop: CancellationToken,
) {
    let mut feed_failing = false;
    loop {
        let waited = tokio::select! {
            waited = directory.wait_for_change(FEED_WAIT) => waited,
            () = stop.cancelled() => return,
        };
        // A wait that timed out catches up too: that also checks the entry at this
        // plane's position (a failover can hand seqs out again, which no wait
        // past the position would see).
        let applied = match waited {
            Ok(_) => directory.catch_up().await.map(|_| ()),
            Err(error) => Err(error),
        };
        match applied {
            Ok(()) if feed_failing => {
                tracing::info!("store reachable again; change feed resumed");
                feed_failing = false;
            }
            Ok(()) => {}
            Err(error) => {
                if !feed_failing {
                    tracing::warn!(%error, "reading the change feed failed; serving the clients already loaded");
                    feed_failing = true;
                }
                // Do not spin on a store that fails at once.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
        evict_removed(&directory, &identities).await;
    }
}

/// Evicts the egress identities of clients removed since the last call.
pub async fn evict_removed(directory: &Directory, identities: &Identities) {
    for name in directory.take_removed() {
        identities.evict(&name).await;
    }
}

/// Flushes usage; every client that had traffic counts as active.
pub async fn flush_usage(directory: &Directory, identities: &Identities) {
    for name in directory.flush_usage().await {
        identities.touch(&name);
    }
}
