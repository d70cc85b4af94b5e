//! The [`Store`] operations of the Redis store, on the keys and scripts that the module
//! doc describes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use deadpool_redis::redis;

use super::{
    activity_key, address_key, batch_key, client_key, endpoints_key, has_replicas, identity_key,
    receipt_key, scripts, usage_key, Confirm, RedisStore, Req, CALL_RECEIPT_MEMORY, CONFIRM_WAIT,
    FEED_KEY, FEED_SEQ_KEY, INDEX_KEY, READ_CHUNK, USAGE_BATCH_MEMORY,
};
use crate::{
    decode_endpoints, decode_identity, encode_endpoints, encode_identity, is_valid_name,
    ttl_millis, unix_now, validate_name, Change, ChangeKind, ClientLimits, ClientList,
    ClientRecord, EgressIdentity, EndpointSnapshot, NodeId, Store, StoreError, Usage,
    ACTIVITY_EXPIRY_SECS, ACTIVITY_RETENTION_SECS, ENDPOINTS_EXPIRY_SECS,
};

/// Usage hash fields, in [`Usage`] order.
const USAGE_FIELDS: [&str; 3] = ["up", "down", "conns"];

/// Longest single blocking read of the change feed: well inside the
/// per-reply timeout ([`super::RESPONSE_TIMEOUT`]).
const FEED_BLOCK: Duration = Duration::from_millis(1000);

/// A stream entry as XRANGE returns it: its ID (Redis makes it, always
/// ASCII) and its fields, as bytes: a field that is not UTF-8 (a hand, a
/// newer version) is that one entry's problem, not a failed read of the
/// whole feed.
type FeedEntry = (String, HashMap<Vec<u8>, Vec<u8>>);

impl RedisStore {
    /// Updates the index and appends a change. Retried like an idempotent call: a
    /// repeat may append the change twice, which followers apply harmlessly (each
    /// reads the client's current record). Returns the seq appended, or 0.
    async fn append_change(
        &self,
        name: &str,
        kind: ChangeKind,
        force: bool,
    ) -> Result<u64, StoreError> {
        let kind = match kind {
            ChangeKind::Upsert => "upsert",
            ChangeKind::Remove => "remove",
        };
        let mut script = scripts::FEED_APPEND.prepare_invoke();
        script
            .key(INDEX_KEY)
            .key(FEED_SEQ_KEY)
            .key(FEED_KEY)
            .arg(name)
            .arg(kind)
            .arg(if force { "1" } else { "0" });
        self.run_confirmed("appending to the change feed", script, FEED_KEY)
            .await
    }

    /// Runs a script and, on Sentinel or Cluster, waits up to [`CONFIRM_WAIT`] for
    /// a replica to have it: `EVAL`, `WAIT 1` and `ROLE` in one pipeline, so on a
    /// Cluster all three reach the node of the script's slot. A master with replicas
    /// none of which confirmed is `StoreError::Unconfirmed` (the script's result is
    /// lost with it: callers treat it as applied, or repeat what is safe to repeat);
    /// a master without replicas has nothing to wait for.
    async fn run_confirmed<T: redis::FromRedisValue>(
        &self,
        what: &str,
        script: redis::ScriptInvocation<'_>,
        key: &str,
    ) -> Result<T, StoreError> {
        if !self.replicated() {
            return self.run(what, &Req::Script(script)).await;
        }
        let confirm = Confirm {
            script,
            key: key.to_owned(),
            wait_ms: u64::try_from(CONFIRM_WAIT.as_millis()).unwrap_or(u64::MAX),
            expect_replicas: self.replicas_seen.load(Ordering::Relaxed),
        };
        let wait_ms = confirm.wait_ms;
        let (value, confirmed, role): (T, i64, redis::Value) =
            self.run(what, &Req::Confirmed(confirm)).await?;
        self.replicas_seen
            .store(has_replicas(&role), Ordering::Relaxed);
        if confirmed == 0 && has_replicas(&role) {
            return Err(StoreError::Unconfirmed(format!(
                "Redis at {}: {what}: applied on the master, but no replica confirmed it \
                 within {wait_ms} ms; a failover now could lose it",
                self.url()
            )));
        }
        Ok(value)
    }

    /// Claims `address` for client `name`: `Ok(true)` if claimed now, `Ok(false)` if
    /// that name held it already, `StoreError::AddressTaken` if another client does.
    pub(super) async fn claim_address(
        &self,
        address: IpAddr,
        name: &str,
    ) -> Result<bool, StoreError> {
        let claimed: i64 = self
            .run(
                "claiming a WireGuard address",
                &self.address_claim(address, name),
            )
            .await?;
        match claimed {
            1 => Ok(true),
            2 => Ok(false),
            _ => Err(StoreError::AddressTaken(address)),
        }
    }

    /// Frees `address` if client `name` holds it.
    async fn release_address(&self, address: IpAddr, name: &str) -> Result<(), StoreError> {
        let mut script = scripts::RELEASE_ADDRESS.prepare_invoke();
        script.key(address_key(address)).arg(name);
        let _: i64 = self
            .run("freeing a WireGuard address", &Req::Script(script))
            .await?;
        Ok(())
    }

    /// A client's record as stored (its JSON, as bytes), if any. Read with
    /// MGET, which answers a key of another type (a hash someone wrote
    /// there) with nil where GET fails the call: such a key reads as no
    /// record, as one being removed does, and can still be removed.
    pub(super) async fn stored_record(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(client_key(name));
        let mut values: Vec<Option<Vec<u8>>> = self.run(what, &Req::Cmd(cmd)).await?;
        Ok(values.pop().flatten())
    }

    /// A client's WireGuard address as its record says, leniently: a corrupt record
    /// has none (so that it can still be removed).
    async fn stored_address(&self, name: &str) -> Result<Option<IpAddr>, StoreError> {
        let json = self.stored_record(name, "reading a client").await?;
        Ok(json.and_then(|json| match self.decode_client(name, &json) {
            Ok(record) => record.wg_address,
            Err(error) => {
                tracing::warn!(%error, "reading a client's WireGuard address");
                None
            }
        }))
    }

    /// A client's record from its JSON; anything else (bytes that are not
    /// UTF-8 included, or a record under `name`'s key that names another
    /// client) is that client's corrupt record. The error names the client,
    /// the key and where in the JSON, never a value from it (serde's own
    /// message may quote one, and the record holds the secret's hash).
    pub(super) fn decode_client(
        &self,
        name: &str,
        json: &[u8],
    ) -> Result<ClientRecord, StoreError> {
        let record: ClientRecord = serde_json::from_slice(json).map_err(|err| {
            let what = match err.classify() {
                serde_json::error::Category::Io => "unreadable",
                serde_json::error::Category::Syntax => "not valid JSON",
                serde_json::error::Category::Data => "JSON of another shape than a client record",
                serde_json::error::Category::Eof => "cut short",
            };
            StoreError::CorruptRecord {
                name: name.to_owned(),
                detail: format!(
                    "Redis at {}: key {}: {what} (line {}, column {})",
                    self.shown_url,
                    client_key(name),
                    err.line(),
                    err.column()
                ),
            }
        })?;
        if record.name != name {
            return Err(StoreError::CorruptRecord {
                name: name.to_owned(),
                detail: format!(
                    "Redis at {}: key {}: the record names another client",
                    self.shown_url,
                    client_key(name)
                ),
            });
        }
        Ok(record)
    }

    /// A feed entry as a [`Change`], leniently: one entry that is not ours
    /// (another version's kind, no name) must not stop every plane from
    /// following the feed. An unknown kind reads as an upsert (a reader
    /// reads the named record afresh either way); an entry without a name
    /// keeps its position and names no client; one whose ID is not
    /// `<seq>-0` has no position and is skipped (logged).
    fn decode_change(&self, (id, fields): FeedEntry) -> Option<Change> {
        let Some(seq) = id
            .strip_suffix("-0")
            .and_then(|seq| seq.parse::<u64>().ok())
        else {
            tracing::warn!(store = %self.shown_url, key = FEED_KEY, %id, "a change feed entry with a foreign ID: skipped");
            return None;
        };
        let kind = match fields.get(&b"kind"[..]).map(Vec::as_slice) {
            Some(b"remove") => ChangeKind::Remove,
            Some(b"upsert") => ChangeKind::Upsert,
            other => {
                let kind = other.map(String::from_utf8_lossy);
                tracing::debug!(key = FEED_KEY, %id, ?kind, "a change feed entry of an unknown kind: read as an upsert");
                ChangeKind::Upsert
            }
        };
        let name = fields
            .get(&b"name"[..])
            .and_then(|name| String::from_utf8(name.clone()).ok())
            .unwrap_or_else(|| {
                tracing::warn!(store = %self.shown_url, key = FEED_KEY, %id, "a change feed entry without a readable client name: only its position is used");
                String::new()
            });
        Some(Change { seq, name, kind })
    }

    /// Every client name in the index, sorted: one `SMEMBERS`, which reads
    /// the set at one moment (an `SSCAN` cursor means nothing on another
    /// server: continued on a master a failover promoted, it would skip
    /// names and say nothing). A name is some 20 bytes: 100,000 of them
    /// are a reply of 2 MB.
    async fn client_names(&self) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(INDEX_KEY);
        let members: Vec<Vec<u8>> = self.run("listing clients", &Req::Cmd(cmd)).await?;
        // A member that is not a client name (a hand's) names no record.
        let mut names: Vec<String> = members
            .into_iter()
            .filter_map(|member| match String::from_utf8(member) {
                Ok(name) if is_valid_name(&name) => Some(name),
                _ => {
                    tracing::warn!(store = %self.shown_url, key = INDEX_KEY, "a client index member that is not a client name: skipped");
                    None
                }
            })
            .collect();
        names.sort_unstable();
        Ok(names)
    }

    /// A name for one call with a receipt ([`super::receipt_key`]): this
    /// handle's writer id and a number, unique to the call.
    pub(super) fn next_call(&self) -> String {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        format!("{}_{call}", self.writer)
    }

    /// One claim call of `address` for client `name`, with a receipt of its
    /// own: sent again, it answers what it did the first time.
    pub(super) fn address_claim(&self, address: IpAddr, name: &str) -> Req<'static> {
        let key = address_key(address);
        let receipt = receipt_key(&key, &self.next_call());
        let mut script = scripts::CLAIM_ADDRESS.prepare_invoke();
        script
            .key(key)
            .key(receipt)
            .arg(name)
            .arg(u64::try_from(CALL_RECEIPT_MEMORY.as_millis()).unwrap_or(u64::MAX));
        Req::Script(script)
    }

    /// One take call of `client`'s identity on `node`, with a receipt of its
    /// own: sent again, it answers what it took the first time.
    pub(super) fn identity_take(&self, node: &NodeId, client: &str) -> Req<'static> {
        let key = identity_key(node, client);
        let receipt = receipt_key(&key, &self.next_call());
        let mut script = scripts::TAKE_IDENTITY.prepare_invoke();
        script
            .key(key)
            .key(receipt)
            .arg(u64::try_from(CALL_RECEIPT_MEMORY.as_millis()).unwrap_or(u64::MAX));
        Req::Script(script)
    }
}

/// The ID of the first entry in an `XREAD` reply (`[[stream, [[id,
/// fields], ...]]]`), if it has that shape.
fn first_entry_id(reply: &redis::Value) -> Option<String> {
    let redis::Value::Array(streams) = reply else {
        return None;
    };
    let redis::Value::Array(stream) = streams.first()? else {
        return None;
    };
    let redis::Value::Array(entries) = stream.get(1)? else {
        return None;
    };
    let redis::Value::Array(entry) = entries.first()? else {
        return None;
    };
    match entry.first()? {
        redis::Value::BulkString(id) => String::from_utf8(id.clone()).ok(),
        redis::Value::SimpleString(id) => Some(id.clone()),
        _ => None,
    }
}

/// A u64 delta as a Redis integer, saturating at i64::MAX.
fn redis_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn add_client(&self, record: ClientRecord) -> Result<(), StoreError> {
        validate_name(&record.name)?;
        let json = serde_json::to_string(&record)
            .map_err(|err| StoreError::Backend(format!("encoding client: {err}")))?;
        // The address first (its own slot): a record never holds an unclaimed address.
        let mut claimed_now = None;
        if let Some(address) = record.wg_address {
            // A taken name is reported before a taken address (but this very record,
            // from an earlier attempt of this add, is finished).
            if self
                .stored_record(&record.name, "checking a client name")
                .await?
                .is_some_and(|stored| stored != json.as_bytes())
            {
                return Err(StoreError::AlreadyExists(record.name));
            }
            claimed_now = Some((address, self.claim_address(address, &record.name).await?));
        }
        let mut script = scripts::ADD_CLIENT.prepare_invoke();
        script
            .key(client_key(&record.name))
            .key(usage_key(&record.name))
            .arg(json);
        // Idempotent: a repeat finds this very record and goes on.
        let created: i64 = self.run("adding a client", &Req::Script(script)).await?;
        // 2: this very record is there (an earlier attempt landed); finish it.
        if created == 0 {
            if let Some((address, true)) = claimed_now {
                // Free what this add claimed, unless the client that won holds it.
                if self.stored_address(&record.name).await? != Some(address) {
                    self.release_address(address, &record.name).await?;
                }
            }
            return Err(StoreError::AlreadyExists(record.name));
        }
        self.append_change(&record.name, ChangeKind::Upsert, false)
            .await?;
        Ok(())
    }

    async fn get_client(&self, name: &str) -> Result<Option<ClientRecord>, StoreError> {
        if !is_valid_name(name) {
            return Ok(None);
        }
        let json = self.stored_record(name, "reading a client").await?;
        json.map(|json| self.decode_client(name, &json)).transpose()
    }

    async fn read_clients(&self) -> Result<ClientList, StoreError> {
        let names = self.client_names().await?;
        // MGET in chunks: on a Cluster the client splits each by slot (the
        // records are in different slots) and puts the replies back in order.
        let mut records = Vec::with_capacity(names.len());
        for chunk in names.chunks(READ_CHUNK) {
            let mut cmd = redis::cmd("MGET");
            for name in chunk {
                cmd.arg(client_key(name));
            }
            let read: Vec<Option<Vec<u8>>> = self.run("reading clients", &Req::Cmd(cmd)).await?;
            records.extend(read);
        }
        Ok(ClientList::from_results(
            names
                .iter()
                .zip(records)
                // A listed name without a record is being added or removed: skip it.
                .filter_map(|(name, json)| json.map(|json| self.decode_client(name, &json))),
        ))
    }

    async fn remove_client(&self, name: &str) -> Result<bool, StoreError> {
        if !is_valid_name(name) {
            return Ok(false);
        }
        // A record's address never changes (only its limits do): the address
        // read now is the one deleted below.
        let address = self.stored_address(name).await?;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(client_key(name))
            .cmd("DEL")
            .arg(usage_key(name))
            .cmd("DEL")
            .arg(super::quota_key(name))
            .cmd("DEL")
            .arg(super::live_key(name));
        let (records, _usage, _quota, _live): (i64, i64, i64, i64) =
            self.run("removing a client", &Req::Pipe(pipe)).await?;
        // The record is gone: its address may go to another client now.
        if let Some(address) = address {
            self.release_address(address, name).await?;
        }
        let appended = self
            .append_change(name, ChangeKind::Remove, records > 0)
            .await?;
        Ok(appended > 0)
    }

    async fn feed_head(&self) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(FEED_SEQ_KEY);
        let head: Option<u64> = self.run("reading the feed head", &Req::Cmd(cmd)).await?;
        Ok(head.unwrap_or(0))
    }

    async fn wait_for_change(&self, after: u64, wait: Duration) -> Result<bool, StoreError> {
        if i64::try_from(after).is_err() {
            return Ok(false);
        }
        // Each blocking read holds a connection of its own, not the shared one;
        // it must end well inside the per-reply timeout.
        let until = tokio::time::Instant::now() + wait.min(FEED_BLOCK);
        // Past every entry at `after`: ours is `<after>-0`, and one of
        // another's making there (`<after>-5`) is no change to wait for.
        let mut from = format!("{after}-{}", u64::MAX);
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let block = left.as_millis().max(1);
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(u64::try_from(block).unwrap_or(1))
                .arg("STREAMS")
                .arg(FEED_KEY)
                .arg(&from);
            let reply: redis::Value = self
                .run("waiting on the change feed", &Req::Blocking(cmd))
                .await?;
            if matches!(reply, redis::Value::Nil) {
                return Ok(false);
            }
            match first_entry_id(&reply) {
                // An entry with a foreign ID is skipped by the reader
                // (`decode_change`): waiting on past it, not returning at
                // once every time, keeps a follower from spinning on it.
                Some(id) if !id.ends_with("-0") => {
                    if left.is_zero() {
                        return Ok(false);
                    }
                    from = id;
                }
                _ => return Ok(true),
            }
        }
    }

    async fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        // Seqs come from INCR: nothing lies beyond i64::MAX.
        if limit == 0 || i64::try_from(after).is_err() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(FEED_KEY)
            .arg(format!("({after}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(i64::try_from(limit).unwrap_or(i64::MAX));
        let entries: Vec<FeedEntry> = self.run("reading the change feed", &Req::Cmd(cmd)).await?;
        Ok(entries
            .into_iter()
            .filter_map(|entry| self.decode_change(entry))
            .collect())
    }

    async fn add_usage(&self, name: &str, delta: Usage, batch: u64) -> Result<(), StoreError> {
        if !is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let mut script = scripts::ADD_USAGE.prepare_invoke();
        script
            .key(client_key(name))
            .key(usage_key(name))
            .key(batch_key(name, &self.writer))
            .arg(redis_int(delta.bytes_up))
            .arg(redis_int(delta.bytes_down))
            .arg(redis_int(delta.connections))
            .arg(batch)
            .arg(USAGE_BATCH_MEMORY.as_secs());
        // The batch makes a repeat harmless: retried like any idempotent call.
        let found: i64 = self
            .run_confirmed("adding usage", script, &usage_key(name))
            .await?;
        if found == 0 {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        Ok(())
    }

    async fn usage(&self, name: &str) -> Result<Usage, StoreError> {
        if !is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let key = usage_key(name);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&key);
        for field in USAGE_FIELDS {
            cmd.arg(field);
        }
        let values: Vec<Option<i64>> = self.run("reading usage", &Req::Cmd(cmd)).await?;
        if values.iter().all(Option::is_none) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let mut counters = [0u64; 3];
        for ((counter, value), field) in counters.iter_mut().zip(values).zip(USAGE_FIELDS) {
            let value = value.unwrap_or(0);
            *counter = u64::try_from(value)
                .map_err(|_| self.corrupt(&key, format!("negative {field} {value}")))?;
        }
        let [bytes_up, bytes_down, connections] = counters;
        Ok(Usage {
            bytes_up,
            bytes_down,
            connections,
        })
    }

    async fn touch_activity(
        &self,
        node: &NodeId,
        clients: &[(String, i64)],
    ) -> Result<(), StoreError> {
        if clients.is_empty() {
            return Ok(());
        }
        let key = activity_key(node);
        let cutoff = unix_now().saturating_sub(ACTIVITY_RETENTION_SECS);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&key).arg("GT");
        for (client, at) in clients {
            zadd.arg(*at).arg(client);
        }
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(zadd)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(format!("({cutoff}"))
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(ACTIVITY_EXPIRY_SECS)
            .ignore();
        self.run("recording activity", &Req::Pipe(pipe)).await
    }

    async fn active_clients(&self, node: &NodeId, since: i64) -> Result<Vec<String>, StoreError> {
        let since = since.max(unix_now().saturating_sub(ACTIVITY_RETENTION_SECS));
        let mut cmd = redis::cmd("ZREVRANGEBYSCORE");
        cmd.arg(activity_key(node)).arg("+inf").arg(since);
        self.run("reading activity", &Req::Cmd(cmd)).await
    }

    async fn put_identity(
        &self,
        node: &NodeId,
        client: &str,
        identity: &EgressIdentity,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        validate_name(client)?;
        let key = identity_key(node, client);
        let ttl_ms = ttl_millis(ttl);
        let mut cmd;
        if ttl_ms == 0 {
            // Expired as soon as written: the same as absent.
            cmd = redis::cmd("DEL");
            cmd.arg(&key);
        } else {
            cmd = redis::cmd("SET");
            cmd.arg(&key)
                .arg(encode_identity(identity)?)
                .arg("PX")
                .arg(ttl_ms);
        }
        let _: redis::Value = self.run("saving an identity", &Req::Cmd(cmd)).await?;
        Ok(())
    }

    async fn take_identity(
        &self,
        node: &NodeId,
        client: &str,
    ) -> Result<Option<EgressIdentity>, StoreError> {
        if !is_valid_name(client) {
            return Ok(None);
        }
        // A repeat finds the call's receipt: retried like any idempotent call.
        let json: Option<String> = self
            .run("taking an identity", &self.identity_take(node, client))
            .await?;
        json.map(|json| decode_identity(client, &json)).transpose()
    }

    async fn drop_identity(&self, node: &NodeId, client: &str) -> Result<(), StoreError> {
        if !is_valid_name(client) {
            return Ok(());
        }
        let mut cmd = redis::cmd("DEL");
        cmd.arg(identity_key(node, client));
        let _: i64 = self.run("dropping an identity", &Req::Cmd(cmd)).await?;
        Ok(())
    }

    async fn put_endpoints(
        &self,
        node: &NodeId,
        snapshot: &EndpointSnapshot,
    ) -> Result<(), StoreError> {
        // A plain SET with an expiry: a node gone for a day has no peers worth calling
        // back, and one that stops writing leaves nothing behind for good.
        let mut cmd = redis::cmd("SET");
        cmd.arg(endpoints_key(node))
            .arg(encode_endpoints(snapshot)?)
            .arg("EX")
            .arg(ENDPOINTS_EXPIRY_SECS);
        let _: redis::Value = self
            .run("saving the endpoint snapshot", &Req::Cmd(cmd))
            .await?;
        Ok(())
    }

    async fn get_endpoints(&self, node: &NodeId) -> Result<Option<EndpointSnapshot>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(endpoints_key(node));
        let json: Option<String> = self
            .run("reading the endpoint snapshot", &Req::Cmd(cmd))
            .await?;
        json.map(|json| decode_endpoints(node, &json)).transpose()
    }

    async fn update_limits(
        &self,
        name: &str,
        change: crate::LimitsChange,
    ) -> Result<ClientLimits, StoreError> {
        if !is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        let limits = self.replace_limits(name, &*change).await?;
        self.append_change(name, ChangeKind::Upsert, false).await?;
        Ok(limits)
    }

    async fn add_quota_usage(
        &self,
        name: &str,
        window: &str,
        bytes: u64,
    ) -> Result<u64, StoreError> {
        if !is_valid_name(name) {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        self.add_quota_count(name, window, bytes).await
    }

    async fn reset_quota_usage(&self, name: &str) -> Result<(), StoreError> {
        if !is_valid_name(name) {
            return Ok(());
        }
        self.reset_quota_count(name).await
    }

    async fn put_live_tunnels(
        &self,
        node: &NodeId,
        client: &str,
        count: u64,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if !is_valid_name(client) {
            return Ok(());
        }
        self.put_live_count(node, client, count, ttl).await
    }

    async fn live_tunnels(&self, client: &str, except: &NodeId) -> Result<u64, StoreError> {
        if !is_valid_name(client) {
            return Ok(0);
        }
        self.live_count(client, except).await
    }
}
