//! What the device plane writes back to the store about its clients: usage
//! flushed in numbered batches (kept and resent when an add fails, so none
//! is lost or counted twice), the quota count each flush adds to, and each
//! capped client's open tunnels shared with the fleet (docs/LIMITS.md).

use std::sync::atomic::Ordering;

use blipless_store::{StoreError, Usage};

use super::{unix_now, Client, Directory, FLUSH_CONCURRENCY};

impl Directory {
    /// Adds every client's unflushed usage to the store and returns the
    /// clients that had any (they were active). A failed add is kept with its
    /// batch number and sent again, unchanged, by the next flush, before what
    /// was metered meanwhile (a new batch), so that an add whose reply was
    /// lost, or that no replica had confirmed, is neither lost nor counted
    /// twice.
    ///
    /// Up to [`FLUSH_CONCURRENCY`] clients are flushed at once: on Sentinel and
    /// Cluster each add waits for a replica's confirmation, and a flush one
    /// client after the other would grow with the number of clients.
    pub async fn flush_usage(&self) -> Vec<String> {
        use futures_util::StreamExt as _;
        futures_util::stream::iter(self.all())
            .map(|client| async move {
                let flushed = self.flush_client(&client).await;
                self.count_quota(&client, flushed.unwrap_or(0)).await;
                flushed.map(|_| client.record.name.clone())
            })
            .buffer_unordered(FLUSH_CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await
    }

    /// Shares the open tunnels of every client with a connection cap with
    /// the fleet through the store (docs/LIMITS.md, "Connection caps"):
    /// records this plane's count under its process on `node`
    /// ([`tunnel_instance`]), for `ttl`, and reads the other nodes' entries.
    /// This node's other planes' entries are not read: at a deploy the
    /// predecessor's still lists the tunnels this plane adopted and counts
    /// itself, which refused a client using over half its cap until the
    /// next look. A client whose cap was lifted has its last entry cleared.
    /// Failures are logged at debug: the cap then holds on the counts last
    /// read.
    pub async fn share_tunnel_counts(
        &self,
        node: &blipless_store::NodeId,
        ttl: std::time::Duration,
    ) {
        use futures_util::StreamExt as _;
        let instance = tunnel_instance(node);
        let instance = &instance;
        futures_util::stream::iter(self.all())
            .for_each_concurrent(FLUSH_CONCURRENCY, |client| async move {
                let capped = client.limiter.max_connections().is_some();
                let live = if capped {
                    client.meter.live_tunnels.load(Ordering::Relaxed)
                } else {
                    0
                };
                let reported = client.limiter.swap_reported_live(live);
                let name = &client.record.name;
                if live > 0 || reported > 0 {
                    if let Err(error) = self.store.put_live_tunnels(instance, name, live, ttl).await
                    {
                        tracing::debug!(client = %name, %error, "recording live tunnels failed");
                        client.limiter.swap_reported_live(reported.max(live));
                    }
                }
                if capped {
                    match self.store.live_tunnels(name, node).await {
                        Ok(others) => client.limiter.set_fleet_others(others),
                        Err(error) => {
                            tracing::debug!(client = %name, %error, "reading live tunnels failed")
                        }
                    }
                } else {
                    client.limiter.set_fleet_others(0);
                }
            })
            .await;
    }

    /// Clears what this plane recorded of its clients' tunnels (at its exit:
    /// its successor records its own, and the others need not wait for the
    /// entries to expire).
    pub async fn clear_tunnel_counts(&self, instance: &blipless_store::NodeId) {
        use futures_util::StreamExt as _;
        futures_util::stream::iter(self.all())
            .for_each_concurrent(FLUSH_CONCURRENCY, |client| async move {
                let reported = client.limiter.swap_reported_live(0);
                if reported > 0 {
                    let name = &client.record.name;
                    let ttl = std::time::Duration::from_secs(1);
                    if let Err(error) = self.store.put_live_tunnels(instance, name, 0, ttl).await {
                        tracing::debug!(client = %name, %error, "clearing live tunnels failed");
                    }
                }
            })
            .await;
    }

    /// Adds `bytes` (just flushed) to the client's quota count in the store,
    /// when it has a quota, and judges it by the count the store returns:
    /// that count is fleet-wide. Also looks with nothing to add while the
    /// count is unknown or the client is over (a new period or a reset
    /// frees it). A failed add is logged and those bytes are not counted
    /// (docs/LIMITS.md, "Overshoot").
    async fn count_quota(&self, client: &Client, bytes: u64) {
        // Before the quota is read: a change in between makes the count
        // stale, never the other way round.
        let generation = client.limiter.quota_generation();
        let Some(quota) = client.limiter.quota() else {
            return;
        };
        if bytes == 0 && !client.limiter.quota_needs_look() {
            return;
        }
        let window = quota.period.window_at(unix_now());
        let name = &client.record.name;
        match self.store.add_quota_usage(name, &window.key, bytes).await {
            Ok(used) => {
                let was_over = client.limiter.is_over_quota();
                // What moved since the flush took the meter is in neither
                // count, nor is a batch whose add failed and waits.
                let since = client
                    .meter
                    .pending_bytes()
                    .saturating_add(client.meter.held_bytes());
                client.limiter.quota_counted_under(
                    generation,
                    used.saturating_add(since),
                    window.ends_at,
                );
                if client.limiter.is_over_quota() != was_over {
                    tracing::info!(client = %name, used, quota = %quota, over = !was_over, "client's quota state changed");
                }
            }
            Err(StoreError::NotFound(_)) => {}
            Err(error) => {
                tracing::warn!(client = %name, %error, "quota count failed; these bytes may not be counted")
            }
        }
    }

    /// Flushes one client's held batch, if any, then its new usage: the bytes
    /// (both ways) it added, or None when it had no usage.
    async fn flush_client(&self, client: &Client) -> Option<u64> {
        let _turn = client.meter.flushing.lock().await;
        let name = &client.record.name;
        let held = || {
            client
                .meter
                .unflushed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let mut flushed = None;
        loop {
            let retry = held().take();
            let is_retry = retry.is_some();
            let (batch, delta) = match retry {
                Some(held) => held,
                None => {
                    let delta = client.meter.take();
                    if delta == Usage::default() {
                        return flushed;
                    }
                    (self.next_batch.fetch_add(1, Ordering::Relaxed), delta)
                }
            };
            let bytes = delta.bytes_up.saturating_add(delta.bytes_down);
            let added = flushed.unwrap_or(0u64);
            match self.store.add_usage(name, delta, batch).await {
                // Removed meanwhile: its usage went with it.
                Ok(()) | Err(StoreError::NotFound(_)) if is_retry => {
                    flushed = Some(added.saturating_add(bytes));
                    continue;
                }
                Ok(()) | Err(StoreError::NotFound(_)) => return Some(added.saturating_add(bytes)),
                Err(error) => {
                    tracing::warn!(client = %name, %error, "usage flush failed; will retry");
                    *held() = Some((batch, delta));
                    return Some(added);
                }
            }
        }
    }
}

/// How this plane names itself in the fleet's tunnel counts: its node, and
/// its process, so that the two planes of a deploy keep separate entries
/// (each counts the other's as elsewhere).
pub fn tunnel_instance(node: &blipless_store::NodeId) -> blipless_store::NodeId {
    blipless_store::NodeId {
        host: node.host.clone(),
        block: format!("{}.p{}", node.block, std::process::id()),
    }
}
