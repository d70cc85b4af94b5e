//! The device plane's background duties: follow the change feed, flush
//! usage, flush activity, evict removed clients' identities.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clients::Directory;
use crate::identity::{Identities, ACTIVITY_FLUSH};

/// How often the change feed is polled.
pub const FEED_POLL: Duration = Duration::from_millis(500);
/// How often usage is flushed to the store (a SIGKILL loses at most this much).
pub const USAGE_FLUSH: Duration = Duration::from_secs(10);

/// Runs until `stop`.
pub async fn maintain(
    directory: Arc<Directory>,
    identities: Arc<Identities>,
    stop: CancellationToken,
) {
    let mut feed = tokio::time::interval(FEED_POLL);
    let mut usage = tokio::time::interval(USAGE_FLUSH);
    let mut activity = tokio::time::interval(ACTIVITY_FLUSH);
    usage.tick().await;
    activity.tick().await;
    let mut feed_failing = false;
    loop {
        tokio::select! {
            _ = feed.tick() => {
                match directory.catch_up().await {
                    Ok(_) if feed_failing => {
                        tracing::info!("store reachable again; change feed resumed");
                        feed_failing = false;
                    }
                    Ok(_) => {}
                    Err(error) if !feed_failing => {
                        tracing::warn!(%error, "reading the change feed failed; serving the clients already loaded");
                        feed_failing = true;
                    }
                    Err(_) => {}
                }
                for name in directory.take_removed() {
                    identities.evict(&name).await;
                }
            }
            _ = usage.tick() => flush_usage(&directory, &identities).await,
            _ = activity.tick() => identities.flush().await,
            () = stop.cancelled() => return,
        }
    }
}

/// Flushes usage; every client that had traffic counts as active.
pub async fn flush_usage(directory: &Directory, identities: &Identities) {
    for name in directory.flush_usage().await {
        identities.touch(&name);
    }
}
