//! The Redis [`Store`](super::Store): state shared by a fleet of nodes, through a
//! deadpool-redis pool of multiplexed connections.
//!
//! # Keys
//! Every key carries a hash tag (the part in braces), so that one client's keys, one
//! node's keys and the global keys each share one Redis Cluster slot:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `{pc_<name>}` | string | the client record, as JSON |
//! | `{pc_<name>}:usage` | hash | `up`, `down`, `conns`: the client's counters |
//! | `{pc_<name>}:live` | hash | `<host>_<block>` → `<count>:<expires unix ms>`: the client's open tunnels per node |
//! | `{pc_<name>}:quota` | hash | `window`, `bytes`: the client's quota count in its current window |
//! | `{pc_<name>}:batch:<writer>` | string | the last usage batch one store handle added for the client, for [`USAGE_BATCH_MEMORY`] |
//! | `{blipless}:clients` | set | the names of all clients (the index) |
//! | `{blipless}:feed` | stream | the change feed: entry `<seq>-0` with `name` and `kind` |
//! | `{blipless}:feed:seq` | string | the last seq handed out (`INCR`) |
//! | `{pca_<host>_<block>}` | sorted set | a node's activity: client to unix seconds |
//! | `{pwi_<client>}_<host>_<block>` | string | a client's egress identity on one node, as JSON, with a TTL |
//! | `{pwi_<client>}_<host>_<block>:receipt:<writer>_<n>` | string | the identity one take call got, kept [`CALL_RECEIPT_MEMORY`] so that a repeat of the call gets it again |
//! | `{pc_<name>}:quota:receipt:<writer>_<n>` | string | the count one quota add of bytes returned, kept [`CALL_RECEIPT_MEMORY`] so that a repeat of the call counts nothing |
//! | `{pwg_<address>}` | string | the name of the client holding a WireGuard address |
//! | `{pwg_<address>}:receipt:<writer>_<n>` | string | that one claim call claimed the address, kept [`CALL_RECEIPT_MEMORY`] so that a repeat of the call says so again |
//! | `{pwh_<host>_<block>}` | string | a node's WireGuard endpoint snapshot, as JSON, expiring a day after its last write |
//!
//! # What is atomic
//! Within one slot, every write is one Lua script or one `MULTI`/`EXEC`:
//! - creating a client sets its record (`SET NX`, which decides who wins a contested
//!   name) and its zeroed usage together; removing it deletes both together;
//! - a usage add checks that the record exists and adds all three counters, saturating
//!   at `i64::MAX` (`HINCRBY` fails on overflow: the script catches that with
//!   `redis.pcall` and sets the maximum);
//! - a feed append takes the next seq (`INCR`) and adds the stream entry `<seq>-0`,
//!   and updates the index (`SADD`/`SREM`) in the same script, so seqs are strictly
//!   increasing and never reused, and the index and the feed always agree;
//! - an activity touch raises the entries (`ZADD GT`), trims those older than 1 h and
//!   resets the set's 2 h expiry in one `MULTI`;
//! - an identity is taken with `GETDEL`: only one taker gets it; the script
//!   keeps what it took under the call's receipt key, so a repeated call
//!   (ours, or the Cluster client's after a broken connection) gets it again
//!   (a quota add of bytes keeps its count the same way);
//! - an endpoint snapshot is replaced whole, with its expiry, by one `SET ... EX`;
//! - a WireGuard address is claimed with `SET NX` of its key to the client's name
//!   (which decides who wins a contested address; a claim made now is noted under
//!   the call's receipt) and freed by deleting the key only if that client still
//!   holds it.
//!
//! Not atomic: `add_client` and `remove_client` each touch two slots (the client's, then
//! `{blipless}`), which no Redis Cluster operation spans. The client's slot is written
//! first and decides the outcome; the index and feed follow. So between the two steps,
//! or forever if the process dies between them, a reader can see a client that is not
//! yet listed or in the feed (after an add), or a listed name whose record is gone
//! (after a remove). That is acceptable because every reader already copes with it:
//! [`list_clients`](super::Store::list_clients) skips listed names without a record, a
//! feed follower reads each changed client with `get_client` and treats `None` as
//! removed, and an add interrupted before its feed entry is repaired by removing the
//! client (its record is found, so the Remove is appended) and adding it again.
//! `remove_client` also appends its Remove when the name is still in the index even if
//! the record was already gone, so a remove retried after a lost reply still reaches
//! the feed. Racing an add and a remove of one name can leave the feed's last entry
//! for it an Upsert of a client that is gone; followers read `None` and drop it.
//!
//! A client with a WireGuard address touches a third slot, the address's: `add_client`
//! claims the address first, and only then writes the record, so no record ever holds
//! an address that another client's record holds; `remove_client` frees the address
//! only after deleting the record. An add that loses the name (`AlreadyExists`) frees
//! the address it claimed, unless the record that won holds that same address. A
//! claim whose holder has no record (the process died between the steps, or a remove
//! failed after deleting the record) keeps the address out of use: adding a client
//! fails with [`StoreError::AddressTaken`] and `blipless-ctl` moves on to the next
//! address, and adding a client of the holder's name with that address takes it over
//! (a claim by the same name counts as the adder's own).
//!
//! # Topologies
//! The store URL names one Redis (`redis://`), a master found through Sentinel
//! (`redis+sentinel://`) or a Redis Cluster (`redis+cluster://`), each with a
//! `rediss` twin for TLS (the `pools` module holds the three connection pools). Every
//! operation above stays within one slot, so it runs unchanged on a Cluster; the
//! one multi-key read, the `MGET`s of [`read_clients`](super::Store::read_clients)
//! ([`READ_CHUNK`] records each), is split by slot by the Cluster client. `<host>_<block>` is unambiguous because
//! node names may not contain `_` (the configuration refuses it).
//!
//! # Replication
//! On Sentinel and Cluster, Redis copies writes to replicas asynchronously: a
//! master that dies right after answering can take the last writes with it. So
//! the writes that must survive a failover (a usage add, and the feed entry that
//! ends a client add or remove) are followed, in the same pipeline, by `WAIT 1`
//! of [`CONFIRM_WAIT`] and `ROLE`: a master that has replicas and got no
//! confirmation makes the call fail with [`StoreError::Unconfirmed`]. A usage
//! add is then repeated by its caller with the same batch number, which the
//! store remembers per handle and client ([`USAGE_BATCH_MEMORY`]), so it counts
//! once whichever of the two landed; `blipless-ctl` says a client add is
//! unconfirmed and exits 75. A master with no replica left has nothing to wait
//! for. On a Cluster, `WAIT` confirms the slot of the call it follows: a client
//! add's record (its own slot) is not confirmed separately from its feed entry.
//!
//! After a failover that lost feed entries, their seqs are handed out again;
//! a follower notices because the entry at its position changed, and reloads
//! (the device plane's directory does).
//!
//! # Failures
//! Connections time out after [`CONNECT_TIMEOUT`], replies after [`RESPONSE_TIMEOUT`],
//! and a whole attempt (getting a connection and sending) after [`ATTEMPT_TIMEOUT`], so
//! a dead or hung Redis gives [`StoreError::Unavailable`] within seconds, naming the URL
//! without its password. Failures that come fast (refused or broken connections, Redis
//! loading its data or failing over) are retried after each of [`RETRY_BACKOFF`]:
//! every call repeats harmlessly, whether or not it was applied, since the
//! Cluster client re-sends by itself a call whose node connection broke or
//! timed out, whatever we do. A repeated `take_identity`, quota add or address
//! claim finds its call's receipt ([`CALL_RECEIPT_MEMORY`]) and answers what the
//! first got; a repeated `add_client` finds its own record and goes on; a
//! repeated feed append adds a second entry for the same change, which
//! followers apply harmlessly, though a remove's repeat whose first try
//! appended may find nothing left to do and report the client absent; a
//! repeated usage add counts nothing (its batch number). A call added here
//! must be made so too. Timeouts are not
//! retried: a Redis that did not answer in 2 s is not likely to in the next 50 ms.
//! A write refused with `READONLY` (a master demoted by a failover, still
//! reachable) was not applied: its connection is dropped and the call retried,
//! and the Sentinel pool checks `ROLE` before reusing a connection.
//! The pool checks each connection (`PING`) before reuse and replaces broken ones, so
//! the store works again by itself once Redis is back. A Cluster's calls share one
//! cluster connection: a call that times out or breaks has a new one made in the
//! background, which reads the slot map afresh (`pools::SharedCluster`).

mod limits;
mod ops;
mod pools;
mod scripts;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod topology_tests;

use std::time::Duration;

use blipless_config::store_url::{self, StoreUrl};
use deadpool_redis::redis::{self, AsyncConnectionConfig, FromRedisValue, RedisError, RetryMethod};
use deadpool_redis::{Manager, PoolError};

use self::pools::{
    ClusterManager, Conn, Pools, SentinelManager, SharedCluster, CLUSTER_CONNECT_TIMEOUT,
};
use super::{NodeId, StoreError};

/// How long opening a connection to Redis may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long Redis may take to answer a request (or a pooled connection's check).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one attempt of a call may take: getting a connection (checking pooled ones,
/// or opening one) and sending the request.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);
/// Connections in the pool (each multiplexes concurrent requests).
pub const POOL_SIZE: usize = 16;
/// The waits before each retry of a call that failed to reach Redis.
pub const RETRY_BACKOFF: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
];

/// How long a write on Sentinel or Cluster waits for a replica to confirm it
/// (`WAIT 1`) before the store says it is unconfirmed.
pub const CONFIRM_WAIT: Duration = Duration::from_millis(250);
/// How long the Redis store remembers a handle's last usage batch per client
/// (so that repeating it counts nothing): a repeat later than this counts again.
pub const USAGE_BATCH_MEMORY: Duration = Duration::from_secs(3600);

/// How many records one `MGET` reads when every client is read: each call
/// stays short. One `MGET` of 100,000 records (some 30 MB) held up every
/// other caller of that Redis while it ran (every node at once reloads after
/// a failover), and over enough clients would outlast [`ATTEMPT_TIMEOUT`], so
/// the list could never be read.
pub const READ_CHUNK: usize = 1000;

/// How long what a call that must not apply twice (an identity take, a
/// quota add, an address claim) got is kept under its receipt key, for a
/// repeat of that call:
/// longer than a call with its retries may take ([`ATTEMPT_TIMEOUT`] each).
pub const CALL_RECEIPT_MEMORY: Duration = Duration::from_secs(30);

/// The set of all client names.
const INDEX_KEY: &str = "{blipless}:clients";
/// The change feed stream.
const FEED_KEY: &str = "{blipless}:feed";
/// The feed's seq counter.
const FEED_SEQ_KEY: &str = "{blipless}:feed:seq";

fn client_key(name: &str) -> String {
    format!("{{pc_{name}}}")
}

fn usage_key(name: &str) -> String {
    format!("{{pc_{name}}}:usage")
}

fn quota_key(name: &str) -> String {
    format!("{{pc_{name}}}:quota")
}

fn live_key(name: &str) -> String {
    format!("{{pc_{name}}}:live")
}

/// The last usage batch that one store handle (`writer`) added for a client.
fn batch_key(name: &str, writer: &str) -> String {
    format!("{{pc_{name}}}:batch:{writer}")
}

fn activity_key(node: &NodeId) -> String {
    format!("{{pca_{}_{}}}", node.host, node.block)
}

/// Per (client, node): the tag keeps it in the client's slot, the suffix
/// keeps one node's choice from another's (before schema 5 this key was one
/// per client for the whole fleet, and a node adopted what another wrote).
fn identity_key(node: &NodeId, client: &str) -> String {
    format!("{{pwi_{client}}}_{}_{}", node.host, node.block)
}

/// Where one call (`call`: [`RedisStore::next_call`]) on `key` keeps what
/// it got, in `key`'s slot: [`scripts::TAKE_IDENTITY`],
/// [`scripts::ADD_QUOTA_USAGE`], [`scripts::CLAIM_ADDRESS`].
fn receipt_key(key: &str, call: &str) -> String {
    format!("{key}:receipt:{call}")
}

fn endpoints_key(node: &NodeId) -> String {
    format!("{{pwh_{}_{}}}", node.host, node.block)
}

fn address_key(address: std::net::IpAddr) -> String {
    format!("{{pwg_{address}}}")
}

/// The Redis store. Open it with [`super::open`] or [`RedisStore::open`]; clone the
/// `Arc<dyn Store>` to share it (the pool is shared).
pub struct RedisStore {
    /// The URL without its password, for messages.
    shown_url: String,
    pools: Pools,
    /// Whether the master answered the last confirmed write with replicas
    /// (see [`Confirm`]).
    replicas_seen: std::sync::atomic::AtomicBool,
    /// This handle's own name among the writers of usage (16 hex digits, random):
    /// with a batch number, it makes a repeated usage add count once.
    writer: String,
    /// The calls with a receipt this handle made: with `writer`, each one's
    /// name ([`RedisStore::next_call`]).
    calls: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shown_url)
            .finish_non_exhaustive()
    }
}

/// One request to Redis, repeatable for retries.
enum Req<'a> {
    Cmd(redis::Cmd),
    /// A command that blocks on the server (`XREAD BLOCK`): on a Cluster it
    /// takes a connection of its own, not the shared one (as a
    /// [`Req::Confirmed`] does, whose `WAIT` blocks too).
    Blocking(redis::Cmd),
    Pipe(redis::Pipeline),
    Script(redis::ScriptInvocation<'a>),
    /// A script, then `WAIT 1` and `ROLE` on the same connection: see [`Confirm`].
    Confirmed(Confirm<'a>),
}

/// A script to be confirmed by a replica. When the master is expected to have
/// replicas, one pipeline: the script, `WAIT 1 <wait_ms>`, `ROLE`. Otherwise the
/// script and `ROLE` first, and `WAIT` only if `ROLE` lists a replica after all (a
/// `WAIT` on a master without replicas would block for its whole timeout). The
/// `WAIT` rides with an `EXISTS` of `key` (a key of the script's slot), so that
/// on a Cluster it reaches the script's node. Replies `(result, replicas, role)`;
/// a script Redis does not know is loaded, and the request sent again.
struct Confirm<'a> {
    script: redis::ScriptInvocation<'a>,
    key: String,
    wait_ms: u64,
    expect_replicas: bool,
}

impl Confirm<'_> {
    async fn send<T: FromRedisValue>(&self, conn: &mut Conn) -> redis::RedisResult<T> {
        let reply: redis::Value = match self.attempt(conn).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // A pipeline does not load its scripts (after a restart, or a
                // failover to a replica that never ran one): load, then again.
                self.script.load_async(conn).await?;
                self.attempt(conn).await?
            }
            other => other?,
        };
        Ok(T::from_redis_value(reply)?)
    }

    async fn attempt(&self, conn: &mut Conn) -> redis::RedisResult<redis::Value> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(&self.script);
        if self.expect_replicas {
            pipe.cmd("WAIT").arg(1).arg(self.wait_ms).cmd("ROLE");
            return pipe.query_async(conn).await;
        }
        pipe.cmd("ROLE");
        let (result, role): (redis::Value, redis::Value) = pipe.query_async(conn).await?;
        let replicas = if has_replicas(&role) {
            let mut wait = redis::pipe();
            wait.cmd("EXISTS")
                .arg(&self.key)
                .ignore()
                .cmd("WAIT")
                .arg(1)
                .arg(self.wait_ms);
            let (replicas,): (i64,) = wait.query_async(conn).await?;
            replicas
        } else {
            0
        };
        Ok(redis::Value::Array(vec![
            result,
            redis::Value::Int(replicas),
            role,
        ]))
    }
}

/// Whether a `ROLE` reply is a master's with at least one replica connected
/// (`["master", offset, [[ip, port, offset], ...]]`).
fn has_replicas(role: &redis::Value) -> bool {
    match role {
        redis::Value::Array(items) => {
            matches!(items.get(2), Some(redis::Value::Array(replicas)) if !replicas.is_empty())
        }
        _ => false,
    }
}

impl Req<'_> {
    /// Whether the request blocks on the server (`XREAD BLOCK`, or a `WAIT`
    /// up to [`CONFIRM_WAIT`] when no replica confirms): on the shared
    /// cluster connection it would hold up the replies queued behind it on
    /// its node.
    fn blocks(&self) -> bool {
        matches!(self, Req::Blocking(_) | Req::Confirmed(_))
    }

    async fn send<T: FromRedisValue>(&self, conn: &mut Conn) -> redis::RedisResult<T> {
        match self {
            Req::Cmd(cmd) | Req::Blocking(cmd) => cmd.query_async(conn).await,
            Req::Pipe(pipe) => pipe.query_async(conn).await,
            Req::Script(script) => script.invoke_async(conn).await,
            Req::Confirmed(confirm) => confirm.send(conn).await,
        }
    }
}

/// Why an attempt failed.
enum Failure {
    /// No connection could be had: nothing was sent.
    Connect(PoolError),
    /// The request was sent (or being sent) and failed.
    Request(RedisError),
    /// The attempt took longer than [`ATTEMPT_TIMEOUT`].
    TimedOut,
}

/// A request that Redis rejected without running it, as it is loading its data, busy
/// or failing over: worth retrying, whatever the request.
fn rejected_for_now(err: &RedisError) -> bool {
    matches!(
        err.retry_method(),
        RetryMethod::WaitAndRetry | RetryMethod::RefreshSlotsAndRetry
    )
}

/// A write refused by a node that is a replica now (`READONLY`): the connection
/// reached a master that a failover demoted, and must not be used again.
fn reached_a_replica(err: &RedisError) -> bool {
    matches!(err.retry_method(), RetryMethod::RefreshSlotsAndRetry)
}

/// A connection that was refused, broke or timed out.
fn connection_failed(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_timeout()
}

impl Failure {
    /// Whether another attempt may soon succeed (every call is safe to
    /// repeat: see "Failures" above).
    fn retryable(&self) -> bool {
        match self {
            Failure::Connect(PoolError::Backend(err)) => {
                !err.is_timeout() && (connection_failed(err) || rejected_for_now(err))
            }
            Failure::Connect(_) | Failure::TimedOut => false,
            Failure::Request(err) if err.is_timeout() => false,
            Failure::Request(err) => rejected_for_now(err) || connection_failed(err),
        }
    }
}

/// A random name for one store handle among the writers of usage.
fn writer_id() -> Result<String, StoreError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes)
        .map_err(|err| StoreError::Backend(format!("no randomness for a writer id: {err}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `url` with any password replaced by `***` (and a lone user part too, which Redis
/// URLs sometimes use for the password).
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The last `@` ends the credentials, even if the password holds a `/`.
    match rest.rsplit_once('@') {
        None => url.to_owned(),
        Some((userinfo, host)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_owned(),
            };
            format!("{scheme}://{user}@{host}")
        }
    }
}

impl RedisStore {
    /// Opens a pool on the Redis that `url` names and checks that it answers:
    /// - `redis://[[user]:password@]host[:port][/db]` (or `rediss://` for TLS): one
    ///   Redis;
    /// - `redis+sentinel://[[user]:password@]host[:port],.../<service>[/<db>]`: the
    ///   master that those sentinels name for `<service>`, found again after a
    ///   failover;
    /// - `redis+cluster://[[user]:password@]host[:port],...`: a Redis Cluster,
    ///   through any of those seed nodes;
    ///
    /// with `rediss+sentinel` and `rediss+cluster` for TLS (the grammar is
    /// [`blipless_config::store_url`]). An unreachable Redis is
    /// `StoreError::Unavailable`, a malformed URL `StoreError::InvalidUrl`.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let shown_url = redact_url(url);
        let invalid = |detail: &dyn std::fmt::Display| {
            StoreError::InvalidUrl(format!("{shown_url}: {detail}"))
        };
        let parsed = store_url::parse(url).map_err(|err| invalid(&err))?;
        let tls = match &parsed {
            StoreUrl::Redis(_) => url
                .get(..9)
                .is_some_and(|s| s.eq_ignore_ascii_case("rediss://")),
            StoreUrl::Sentinel(sentinel) => sentinel.tls,
            StoreUrl::Cluster(cluster) => cluster.tls,
            StoreUrl::Sqlite(_) => return Err(invalid(&"not a Redis URL")),
        };
        if tls {
            // rustls needs a process-wide crypto provider; an earlier install is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let pool_error = |err: &dyn std::fmt::Display| {
            StoreError::Backend(format!("redis at {shown_url}: pool: {err}"))
        };
        let pools = match &parsed {
            StoreUrl::Redis(_) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                let manager = Manager::new_with_config(url, config).map_err(|err| invalid(&err))?;
                Pools::Single(pools::pool(manager, CONNECT_TIMEOUT).map_err(|e| pool_error(&e))?)
            }
            StoreUrl::Sentinel(sentinel) => {
                let manager = SentinelManager::new(sentinel).map_err(|err| invalid(&err))?;
                // Asking a sentinel, then connecting to the master.
                let pool = pools::pool(manager, CONNECT_TIMEOUT * 2).map_err(|e| pool_error(&e))?;
                Pools::Sentinel(pool)
            }
            StoreUrl::Cluster(cluster) => {
                let client = pools::cluster_client(cluster).map_err(|err| invalid(&err))?;
                // Connecting to the seeds, reading the slot map, connecting to
                // every node: made now, with time for a node that hangs, not
                // within the first call's attempt.
                let shared = SharedCluster::connect(client.clone())
                    .await
                    .map_err(|error| {
                        StoreError::Unavailable(format!(
                            "Redis at {shown_url}: connecting to the Cluster: {error}"
                        ))
                    })?;
                let blocking = pools::pool(ClusterManager::new(client), CLUSTER_CONNECT_TIMEOUT)
                    .map_err(|e| pool_error(&e))?;
                Pools::Cluster { shared, blocking }
            }
            StoreUrl::Sqlite(_) => return Err(invalid(&"not a Redis URL")),
        };
        let store = Self {
            shown_url,
            pools,
            replicas_seen: std::sync::atomic::AtomicBool::new(true),
            writer: writer_id()?,
            calls: std::sync::atomic::AtomicU64::new(0),
        };
        let pong: String = store
            .run("checking that Redis answers", &Req::Cmd(redis::cmd("PING")))
            .await?;
        if pong != "PONG" {
            return Err(store.backend("checking that Redis answers", &format!("got {pong:?}")));
        }
        store.load_scripts().await;
        tracing::debug!(url = %store.shown_url, "opened Redis store");
        Ok(store)
    }

    /// Loads every script now, best effort (a failure is logged at debug:
    /// a call loads what is missing). On a Cluster, `SCRIPT LOAD` goes to
    /// every node, replicas included, and waits for all of them: left to
    /// a script's first use, it would wait on a hung master whatever slot
    /// the call was for.
    async fn load_scripts(&self) {
        let load = async {
            let mut conn = self.pools.get(false).await.map_err(|err| err.to_string())?;
            let mut failed = Vec::new();
            for script in scripts::all() {
                if let Err(error) = script.load_async(&mut conn).await {
                    failed.push(error.to_string());
                }
            }
            match failed.first() {
                None => Ok(()),
                Some(error) => Err(format!(
                    "{} of {}: {error}",
                    failed.len(),
                    scripts::all().len()
                )),
            }
        };
        match tokio::time::timeout(ATTEMPT_TIMEOUT, load).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::info!(url = %self.shown_url, %error, "could not load the scripts at open: each is loaded at its first use")
            }
            Err(_) => {
                tracing::info!(url = %self.shown_url, "loading the scripts at open timed out: each is loaded at its first use")
            }
        }
    }

    /// The store's URL, without its password.
    pub fn url(&self) -> &str {
        &self.shown_url
    }

    /// Sends `req`, retrying a failure that came fast (every call repeats
    /// harmlessly: see "Failures" above); `what` names the call in errors.
    async fn run<T: FromRedisValue>(&self, what: &str, req: &Req<'_>) -> Result<T, StoreError> {
        let mut backoff = RETRY_BACKOFF.iter();
        let mut attempts = 1;
        loop {
            let deadline = tokio::time::Instant::now() + ATTEMPT_TIMEOUT;
            let attempt = async {
                let mut conn = self
                    .pools
                    .get(req.blocks())
                    .await
                    .map_err(Failure::Connect)?;
                match tokio::time::timeout_at(deadline, req.send(&mut conn)).await {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(err)) => {
                        if reached_a_replica(&err) || connection_failed(&err) {
                            conn.discard();
                        }
                        Err(Failure::Request(err))
                    }
                    // A cluster connection keeps its map of slots to nodes
                    // and retries a node that does not answer (a master
                    // hung, then failed over) on it: a new one reads the
                    // map afresh.
                    Err(_) => {
                        conn.discard_if_cluster();
                        Err(Failure::TimedOut)
                    }
                }
            };
            let failure = match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(failure)) => failure,
                Err(_) => Failure::TimedOut,
            };
            match backoff.next() {
                Some(wait) if failure.retryable() => {
                    tracing::debug!(url = %self.shown_url, what, attempts, "retrying Redis call");
                    tokio::time::sleep(*wait).await;
                    attempts += 1;
                }
                _ => return Err(self.failed(what, failure, attempts)),
            }
        }
    }

    /// The error for a call that failed for good.
    fn failed(&self, what: &str, failure: Failure, attempts: usize) -> StoreError {
        let url = &self.shown_url;
        let tries = if attempts == 1 {
            String::new()
        } else {
            format!(" ({attempts} attempts)")
        };
        match failure {
            Failure::Connect(PoolError::Timeout(_)) => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: no connection in time{tries}"
            )),
            Failure::TimedOut => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: no answer within {} s{tries}",
                ATTEMPT_TIMEOUT.as_secs()
            )),
            Failure::Connect(PoolError::Backend(err)) if connection_failed(&err) => {
                StoreError::Unavailable(format!(
                    "Redis at {url}: {what}: cannot connect: {err}{tries}"
                ))
            }
            Failure::Connect(err) => self.backend(what, &err.to_string()),
            Failure::Request(err) if connection_failed(&err) => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: connection failed: {err}{tries}"
            )),
            Failure::Request(err) if rejected_for_now(&err) => {
                StoreError::Unavailable(format!("Redis at {url}: {what}: {err}{tries}"))
            }
            Failure::Request(err) => self.backend(what, &err.to_string()),
        }
    }

    /// Whether writes are copied to replicas (Sentinel, Cluster).
    fn replicated(&self) -> bool {
        self.pools.replicated()
    }

    fn backend(&self, what: &str, detail: &str) -> StoreError {
        StoreError::Backend(format!("Redis at {}: {what}: {detail}", self.shown_url))
    }

    /// Corrupt or unexpected data under `key`.
    fn corrupt(&self, key: &str, detail: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!(
            "corrupt store: Redis at {}: key {key}: {detail}",
            self.shown_url
        ))
    }
}
