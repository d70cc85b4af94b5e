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
//! | `{blipless}:clients` | set | the names of all clients (the index) |
//! | `{blipless}:feed` | stream | the change feed: entry `<seq>-0` with `name` and `kind` |
//! | `{blipless}:feed:seq` | string | the last seq handed out (`INCR`) |
//! | `{pca_<host>_<block>}` | sorted set | a node's activity: client to unix seconds |
//! | `{pwi_<client>}_<host>_<block>` | string | a client's egress identity on one node, as JSON, with a TTL |
//! | `{pwg_<address>}` | string | the name of the client holding a WireGuard address |
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
//! - an identity is taken with `GETDEL`: only one taker gets it;
//! - an endpoint snapshot is replaced whole, with its expiry, by one `SET ... EX`;
//! - a WireGuard address is claimed with `SET NX` of its key to the client's name
//!   (which decides who wins a contested address) and freed by deleting the key only
//!   if that client still holds it.
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
//! # Limits
//! The keys are ready for Redis Cluster, but this store connects to one Redis (a
//! primary, or a proxy in front of a cluster): no Cluster or Sentinel client yet.
//! `<host>_<block>` is unambiguous because node names may not contain `_`
//! (the configuration refuses it).
//!
//! # Failures
//! Connections time out after [`CONNECT_TIMEOUT`], replies after [`RESPONSE_TIMEOUT`],
//! and a whole attempt (getting a connection and sending) after [`ATTEMPT_TIMEOUT`], so
//! a dead or hung Redis gives [`StoreError::Unavailable`] within seconds, naming the URL
//! without its password. Failures that come fast (refused or broken connections, Redis
//! loading its data or failing over) are retried after each of [`RETRY_BACKOFF`] when
//! that is safe: always if the request was surely not applied (no connection could be
//! had, or Redis refused to run it), and otherwise only if repeating it is harmless:
//! not for `add_usage` (it would count twice), `take_identity` (it would find nothing),
//! `add_client` (it would find its own record) nor the feed appends. Timeouts are not
//! retried: a Redis that did not answer in 2 s is not likely to in the next 50 ms.
//! The pool checks each connection (`PING`) before reuse and replaces broken ones,
//! so the store works again by itself once Redis is back.

mod ops;
mod scripts;
#[cfg(test)]
mod tests;

use std::time::Duration;

use deadpool_redis::redis::{self, AsyncConnectionConfig, FromRedisValue, RedisError, RetryMethod};
use deadpool_redis::{Manager, Pool, PoolError, Runtime};

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

fn activity_key(node: &NodeId) -> String {
    format!("{{pca_{}_{}}}", node.host, node.block)
}

/// Per (client, node): the tag keeps it in the client's slot, the suffix
/// keeps one node's choice from another's (before schema 5 this key was one
/// per client for the whole fleet, and a node adopted what another wrote).
fn identity_key(node: &NodeId, client: &str) -> String {
    format!("{{pwi_{client}}}_{}_{}", node.host, node.block)
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
    pool: Pool,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shown_url)
            .finish_non_exhaustive()
    }
}

/// Whether a call may be repeated after its connection broke mid-request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Repeating it is harmless: retry on any connection failure.
    Idempotent,
    /// It may have been applied: retry only when it surely was not.
    Once,
}

/// One request to Redis, repeatable for retries.
enum Req<'a> {
    Cmd(redis::Cmd),
    Pipe(redis::Pipeline),
    Script(redis::ScriptInvocation<'a>),
}

impl Req<'_> {
    async fn send<T: FromRedisValue>(
        &self,
        conn: &mut deadpool_redis::Connection,
    ) -> redis::RedisResult<T> {
        match self {
            Req::Cmd(cmd) => cmd.query_async(conn).await,
            Req::Pipe(pipe) => pipe.query_async(conn).await,
            Req::Script(script) => script.invoke_async(conn).await,
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
    matches!(err.retry_method(), RetryMethod::WaitAndRetry)
}

/// A connection that was refused, broke or timed out.
fn connection_failed(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_timeout()
}

impl Failure {
    /// Whether another attempt may soon succeed and is safe under `retry`.
    fn retryable(&self, retry: Retry) -> bool {
        match self {
            Failure::Connect(PoolError::Backend(err)) => {
                !err.is_timeout() && (connection_failed(err) || rejected_for_now(err))
            }
            Failure::Connect(_) | Failure::TimedOut => false,
            Failure::Request(err) if err.is_timeout() => false,
            Failure::Request(err) => {
                rejected_for_now(err) || (retry == Retry::Idempotent && connection_failed(err))
            }
        }
    }
}

/// `url` with any password replaced by `***` (and a lone user part too, which Redis
/// URLs sometimes use for the password).
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        None => url.to_owned(),
        Some((userinfo, host)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_owned(),
            };
            format!("{scheme}://{user}@{host}{path}")
        }
    }
}

impl RedisStore {
    /// Opens a pool on the Redis that `url` names (`redis://` or `rediss://` for TLS,
    /// `[[user]:password@]host[:port][/db]`) and checks that it answers: an unreachable
    /// Redis is `StoreError::Unavailable`, a malformed URL `StoreError::InvalidUrl`.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let shown_url = redact_url(url);
        if url
            .get(..9)
            .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
        {
            // rustls needs a process-wide crypto provider; an earlier install is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let manager = Manager::new_with_config(url, config)
            .map_err(|_| StoreError::InvalidUrl(shown_url.clone()))?;
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT + RESPONSE_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(RESPONSE_TIMEOUT))
            .build()
            .map_err(|err| StoreError::Backend(format!("redis at {shown_url}: pool: {err}")))?;
        let store = Self { shown_url, pool };
        let pong: String = store
            .run(
                "checking that Redis answers",
                Retry::Idempotent,
                &Req::Cmd(redis::cmd("PING")),
            )
            .await?;
        if pong != "PONG" {
            return Err(store.backend("checking that Redis answers", &format!("got {pong:?}")));
        }
        tracing::debug!(url = %store.shown_url, "opened Redis store");
        Ok(store)
    }

    /// The store's URL, without its password.
    pub fn url(&self) -> &str {
        &self.shown_url
    }

    /// Sends `req`, retrying as `retry` allows; `what` names the call in errors.
    async fn run<T: FromRedisValue>(
        &self,
        what: &str,
        retry: Retry,
        req: &Req<'_>,
    ) -> Result<T, StoreError> {
        let mut backoff = RETRY_BACKOFF.iter();
        let mut attempts = 1;
        loop {
            let attempt = async {
                let mut conn = self.pool.get().await.map_err(Failure::Connect)?;
                req.send(&mut conn).await.map_err(Failure::Request)
            };
            let failure = match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(failure)) => failure,
                Err(_) => Failure::TimedOut,
            };
            match backoff.next() {
                Some(wait) if failure.retryable(retry) => {
                    tracing::debug!(url = %self.shown_url, what, attempts, "retrying Redis call");
                    tokio::time::sleep(*wait).await;
                    attempts += 1;
                }
                _ => return Err(self.failed(what, failure, attempts, retry)),
            }
        }
    }

    /// The error for a call that failed for good.
    fn failed(&self, what: &str, failure: Failure, attempts: usize, retry: Retry) -> StoreError {
        let url = &self.shown_url;
        let tries = if attempts == 1 {
            String::new()
        } else {
            format!(" ({attempts} attempts)")
        };
        let unknown = if retry == Retry::Once {
            ", so whether it was applied is unknown"
        } else {
            ""
        };
        match failure {
            Failure::Connect(PoolError::Timeout(_)) => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: no connection in time{tries}"
            )),
            Failure::TimedOut => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: no answer within {} s{unknown}{tries}",
                ATTEMPT_TIMEOUT.as_secs()
            )),
            Failure::Connect(PoolError::Backend(err)) if connection_failed(&err) => {
                StoreError::Unavailable(format!(
                    "Redis at {url}: {what}: cannot connect: {err}{tries}"
                ))
            }
            Failure::Connect(err) => self.backend(what, &err.to_string()),
            Failure::Request(err) if connection_failed(&err) => StoreError::Unavailable(format!(
                "Redis at {url}: {what}: connection failed{unknown}: {err}{tries}"
            )),
            Failure::Request(err) if rejected_for_now(&err) => {
                StoreError::Unavailable(format!("Redis at {url}: {what}: {err}{tries}"))
            }
            Failure::Request(err) => self.backend(what, &err.to_string()),
        }
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
