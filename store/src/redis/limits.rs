//! The Redis store's client limits and quota counts: a client's limits are
//! part of its record (`{pc_<name>}`, replaced by compare and set so a
//! concurrent change is never overwritten), its quota count is the hash
//! `{pc_<name>}:quota` (`window`, `bytes`), in the client's slot; its open
//! tunnels per node the hash `{pc_<name>}:live` (field `<host>_<block>`,
//! value `<count>:<expires unix ms>`), whose key expires with its newest
//! entry.

use deadpool_redis::redis;

use super::{
    client_key, live_key, quota_key, receipt_key, scripts, RedisStore, Req, CALL_RECEIPT_MEMORY,
};
use crate::{ClientLimits, NodeId, StoreError};

fn node_field(node: &NodeId) -> String {
    format!("{}_{}", node.host, node.block)
}

/// Attempts of a compare-and-set before giving up on a record that keeps
/// changing under it; after a conflict the next waits a little longer
/// (1 ms more each time), so that writers racing on one record take turns.
const REPLACE_ATTEMPTS: u64 = 32;

impl RedisStore {
    /// [`crate::Store::update_limits`]: the record with its limits changed
    /// by `change`, replaced if unchanged since read (read and changed again
    /// if not); the caller appends the feed entry. The new limits.
    pub(super) async fn replace_limits(
        &self,
        name: &str,
        change: &crate::LimitsFn,
    ) -> Result<ClientLimits, StoreError> {
        let key = client_key(name);
        for attempt in 0..REPLACE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(attempt)).await;
            }
            let Some(json) = self.stored_record(name, "reading a client").await? else {
                return Err(StoreError::NotFound(name.to_owned()));
            };
            let mut record = self.decode_client(name, &json)?;
            record.limits = change(record.limits);
            let limits = record.limits;
            let new = serde_json::to_string(&record)
                .map_err(|err| StoreError::Backend(format!("encoding client: {err}")))?;
            if new.as_bytes() == json {
                return Ok(limits);
            }
            let mut script = scripts::REPLACE_CLIENT.prepare_invoke();
            script.key(&key).arg(&json).arg(&new);
            // A repeat after a lost reply finds `new` stored and stops above.
            let replaced: i64 = self.run("setting limits", &Req::Script(script)).await?;
            match replaced {
                1 => return Ok(limits),
                -1 => return Err(StoreError::NotFound(name.to_owned())),
                _ => continue,
            }
        }
        Err(StoreError::Backend(format!(
            "client {name:?} kept changing while its limits were set; try again"
        )))
    }

    /// [`crate::Store::add_quota_usage`].
    pub(super) async fn add_quota_count(
        &self,
        name: &str,
        window: &str,
        bytes: u64,
    ) -> Result<u64, StoreError> {
        let count: i64 = self
            .run("adding quota usage", &self.quota_add(name, window, bytes))
            .await?;
        u64::try_from(count).map_err(|_| StoreError::NotFound(name.to_owned()))
    }

    /// One quota add call, with a receipt of its own: sent again, it
    /// answers the count the first got and adds nothing.
    pub(super) fn quota_add(&self, name: &str, window: &str, bytes: u64) -> Req<'static> {
        let quota = quota_key(name);
        let receipt = receipt_key(&quota, &self.next_call());
        let mut script = scripts::ADD_QUOTA_USAGE.prepare_invoke();
        script
            .key(client_key(name))
            .key(quota)
            .key(receipt)
            .arg(window)
            .arg(i64::try_from(bytes).unwrap_or(i64::MAX))
            .arg(u64::try_from(CALL_RECEIPT_MEMORY.as_millis()).unwrap_or(u64::MAX));
        Req::Script(script)
    }

    /// [`crate::Store::reset_quota_usage`].
    pub(super) async fn reset_quota_count(&self, name: &str) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(quota_key(name));
        let _: i64 = self.run("resetting quota usage", &Req::Cmd(cmd)).await?;
        Ok(())
    }

    /// [`crate::Store::put_live_tunnels`]. The client's entries that expired
    /// more than [`crate::LIVE_TUNNELS_PRUNE_AFTER_MS`] ago go too (dead planes' entries), judged
    /// by this node's clock: the margin keeps a node whose clock runs ahead
    /// from deleting entries the others still count.
    pub(super) async fn put_live_count(
        &self,
        node: &NodeId,
        client: &str,
        count: u64,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        let key = live_key(client);
        let field = node_field(node);
        if count == 0 {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(&key).arg(&field);
            let _: i64 = self.run("forgetting live tunnels", &Req::Cmd(cmd)).await?;
            return Ok(());
        }
        let ttl_ms = crate::ttl_millis(ttl).max(1);
        let now = crate::unix_now_ms();
        let expires_at = now.saturating_add(ttl_ms);
        let mut script = scripts::PUT_LIVE_TUNNELS.prepare_invoke();
        script
            .key(&key)
            .arg(&field)
            .arg(format!("{count}:{expires_at}"))
            .arg(ttl_ms)
            .arg(now.saturating_sub(crate::LIVE_TUNNELS_PRUNE_AFTER_MS));
        let _: i64 = self
            .run("recording live tunnels", &Req::Script(script))
            .await?;
        Ok(())
    }

    /// [`crate::Store::live_tunnels`]: a malformed entry counts nothing.
    pub(super) async fn live_count(
        &self,
        client: &str,
        except: &NodeId,
    ) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(live_key(client));
        let entries: std::collections::HashMap<String, String> =
            self.run("reading live tunnels", &Req::Cmd(cmd)).await?;
        let now = crate::unix_now_ms();
        let skip = node_field(except);
        let skip_processes = format!("{skip}.p");
        Ok(entries
            .iter()
            .filter(|(field, _)| **field != skip && !field.starts_with(&skip_processes))
            .filter_map(|(_, value)| {
                let (count, expires_at) = value.split_once(':')?;
                let expires_at: i64 = expires_at.parse().ok()?;
                (expires_at > now).then(|| count.parse::<u64>().ok())?
            })
            .fold(0u64, u64::saturating_add))
    }
}
