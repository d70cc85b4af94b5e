//! Connection pools for the three Redis topologies a store URL can name: one
//! server, a master found through Sentinel, and a Cluster.
//!
//! Each pool hands out connections that one call uses at a time (a blocking
//! feed read holds one, not the others). The Sentinel pool asks the sentinels
//! for the master whenever it opens a connection, and checks with `ROLE` before
//! reusing one that the node is still the master, so after a failover old
//! connections are dropped and new ones go to the promoted replica.
//!
//! A Cluster is different: the `redis` crate's cluster connection keeps a
//! connection to every node, follows `MOVED`/`ASK` and multiplexes calls, so
//! one of them ([`SharedCluster`]) carries every call but the blocking feed
//! reads, which take pooled ones of their own (a blocking read would hold up
//! the replies queued behind it on its node). Making a cluster connection
//! connects to every node, so while a master hangs it takes longer than a
//! call may wait: the shared one is replaced in the background, never on a
//! call's path (docs/ARCHITECTURE.md, "State and the store").

use blipless_config::store_url::{Auth, ClusterUrl, HostPort, SentinelUrl};
use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ConnectionAddr, RedisError, RedisFuture, TlsMode, Value,
};
use deadpool_redis::PoolError;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{CONNECT_TIMEOUT, POOL_SIZE, RESPONSE_TIMEOUT};

/// The longest a cluster connection may take to make: one round of connecting
/// to the seeds, reading the slot map and connecting to every node in it, each
/// [`CONNECT_TIMEOUT`] (checking a node's connection, [`RESPONSE_TIMEOUT`], at most).
pub(super) const CLUSTER_CONNECT_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(CONNECT_TIMEOUT.as_secs() * 2 + RESPONSE_TIMEOUT.as_secs() * 2);

/// A pool of `manager`'s connections, [`POOL_SIZE`] at most, with the store's
/// timeouts; `create` bounds opening one (for Sentinel and Cluster, more than
/// one connection's worth).
pub(super) fn pool<M, W>(
    manager: M,
    create: std::time::Duration,
) -> Result<managed::Pool<M, W>, managed::BuildError>
where
    M: managed::Manager,
    W: From<managed::Object<M>>,
{
    managed::Pool::<M, W>::builder(manager)
        .max_size(POOL_SIZE)
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(CONNECT_TIMEOUT + RESPONSE_TIMEOUT))
        .create_timeout(Some(create))
        .recycle_timeout(Some(RESPONSE_TIMEOUT))
        .build()
}

/// Opens connections to the master that the sentinels name.
pub(super) struct SentinelManager {
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
}

impl SentinelManager {
    pub(super) fn new(url: &SentinelUrl) -> Result<Self, RedisError> {
        let tls = url.tls.then_some(TlsMode::Secure);
        let sentinels = url.sentinels.iter().map(|node| address(node, url.tls));
        let mut builder =
            SentinelClientBuilder::new(sentinels, &url.service, SentinelServerType::Master)?
                .set_client_to_redis_db(url.db);
        if let Some(tls) = tls {
            builder = builder
                .set_client_to_redis_tls_mode(tls)
                .set_client_to_sentinel_tls_mode(tls);
        }
        let Auth { user, password } = &url.auth;
        if let Some(user) = user {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_redis_password(password);
        }
        Ok(Self {
            client: tokio::sync::Mutex::new(builder.build()?),
            config: connection_config(),
        })
    }
}

impl managed::Manager for SentinelManager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        // Each new connection asks the sentinels afresh: after a failover it
        // reaches the new master (the crate checks its ROLE before answering).
        let mut client = self.client.lock().await;
        client.get_async_connection_with_config(&self.config).await
    }

    async fn recycle(
        &self,
        conn: &mut MultiplexedConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        let role: Value = redis::cmd("ROLE").query_async(conn).await?;
        if is_master(&role) {
            Ok(())
        } else {
            Err(RecycleError::message("the node is no longer the master"))
        }
    }
}

/// Whether a `ROLE` reply says master.
fn is_master(role: &Value) -> bool {
    let Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(bytes)) => bytes.as_slice() == b"master",
        Some(Value::SimpleString(text)) => text == "master",
        _ => false,
    }
}

/// Opens cluster connections (each keeps its own connection to every node)
/// for the blocking feed reads.
pub(super) struct ClusterManager {
    client: ClusterClient,
}

/// The client for a Cluster's connections, with the store's timeouts.
pub(super) fn cluster_client(url: &ClusterUrl) -> Result<ClusterClient, RedisError> {
    let seeds: Vec<ConnectionAddr> = url
        .seeds
        .iter()
        .map(|node| address(node, url.tls))
        .collect();
    let mut builder = ClusterClientBuilder::new(seeds)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT);
    if url.tls {
        builder = builder.tls(TlsMode::Secure);
    }
    if let Some(user) = &url.auth.user {
        builder = builder.username(user);
    }
    if let Some(password) = &url.auth.password {
        builder = builder.password(password);
    }
    builder.build()
}

impl ClusterManager {
    pub(super) fn new(client: ClusterClient) -> Self {
        Self { client }
    }
}

impl managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    /// Nothing to check: a cluster connection is one connection per node,
    /// each repaired by itself, and a PING on it goes to every master, so
    /// one hung master failed every connection handed out, for calls on
    /// every slot. A call that finds a connection broken discards it
    /// (`RedisStore::run`).
    async fn recycle(
        &self,
        _conn: &mut ClusterConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        Ok(())
    }
}

fn address(node: &HostPort, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    }
}

fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
}

/// One of the three pools.
pub(super) enum Pools {
    /// One Redis.
    Single(deadpool_redis::Pool),
    /// The master that Sentinel names.
    Sentinel(managed::Pool<SentinelManager>),
    /// A Redis Cluster: one shared connection, and a pool for blocking reads.
    Cluster {
        shared: Arc<SharedCluster>,
        blocking: managed::Pool<ClusterManager>,
    },
}

/// A connection taken from [`Pools`].
pub(super) enum Conn {
    Single(deadpool_redis::Connection),
    Sentinel(managed::Object<SentinelManager>),
    /// A Cluster's pooled connection, for a blocking read.
    Cluster(managed::Object<ClusterManager>),
    /// The Cluster's shared connection as it was when taken.
    SharedCluster {
        conn: ClusterConnection,
        generation: u64,
        from: Arc<SharedCluster>,
    },
}

impl Pools {
    /// A connection: a pooled one that still checks out, or a new one; on a
    /// Cluster, the shared one, unless the call `blocks` on the server.
    pub(super) async fn get(&self, blocks: bool) -> Result<Conn, PoolError> {
        Ok(match self {
            Self::Single(pool) => Conn::Single(pool.get().await?),
            Self::Sentinel(pool) => Conn::Sentinel(pool.get().await?),
            Self::Cluster { blocking, .. } if blocks => Conn::Cluster(blocking.get().await?),
            Self::Cluster { shared, .. } => shared.get(),
        })
    }

    /// How many connections the pool holds now (on a Cluster, for blocking reads).
    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        match self {
            Self::Single(pool) => pool.status().size,
            Self::Sentinel(pool) => pool.status().size,
            Self::Cluster { blocking, .. } => blocking.status().size,
        }
    }

    /// Whether writes are copied to replicas that a failover may promote (and so
    /// are worth confirming with `WAIT`).
    pub(super) fn replicated(&self) -> bool {
        !matches!(self, Self::Single(_))
    }
}

impl Conn {
    /// [`Conn::discard`] for a cluster connection; any other goes back to
    /// its pool.
    pub(super) fn discard_if_cluster(self) {
        if matches!(self, Self::Cluster(_) | Self::SharedCluster { .. }) {
            self.discard();
        }
    }

    /// Takes the connection out of its pool for good (it reached a node that is no
    /// longer the master, or broke); the shared cluster connection is replaced
    /// in the background.
    pub(super) fn discard(self) {
        match self {
            Self::Single(conn) => drop(deadpool_redis::Connection::take(conn)),
            Self::Sentinel(conn) => drop(managed::Object::take(conn)),
            Self::Cluster(conn) => drop(managed::Object::take(conn)),
            Self::SharedCluster {
                generation, from, ..
            } => from.replace(generation),
        }
    }
}

/// How long after a failed replacement of the shared cluster connection the
/// next may begin (a Cluster that refuses every connection is not hammered).
const REPLACE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The cluster connection that every call but the blocking ones shares.
///
/// A call on a hung master's slots times out and asks for a new one (which
/// reads the slot map afresh, so once the master is failed over its slots
/// are reached again): that one is made in the background while calls go on
/// on the current one, whose connections to the other masters still answer.
/// One is made at a time; it replaces the current one only when it is ready.
pub(super) struct SharedCluster {
    client: ClusterClient,
    /// The connection and its generation.
    current: std::sync::Mutex<(u64, ClusterConnection)>,
    /// Whether a replacement is being made.
    replacing: AtomicBool,
}

impl SharedCluster {
    /// Makes the first connection (the seeds, the slot map, every node),
    /// with [`CLUSTER_CONNECT_TIMEOUT`] for a node that hangs.
    pub(super) async fn connect(client: ClusterClient) -> Result<Arc<Self>, PoolError> {
        let first = tokio::time::timeout(CLUSTER_CONNECT_TIMEOUT, client.get_async_connection())
            .await
            .map_err(|_| PoolError::Timeout(managed::TimeoutType::Create))?
            .map_err(PoolError::Backend)?;
        Ok(Arc::new(Self {
            client,
            current: std::sync::Mutex::new((0, first)),
            replacing: AtomicBool::new(false),
        }))
    }

    /// The current connection.
    pub(super) fn get(self: &Arc<Self>) -> Conn {
        let (generation, conn) = self.lock_current().clone();
        Conn::SharedCluster {
            conn,
            generation,
            from: self.clone(),
        }
    }

    /// The connection and its generation (held for a clone or a swap only,
    /// never across an await).
    fn lock_current(&self) -> std::sync::MutexGuard<'_, (u64, ClusterConnection)> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes a connection to replace generation `failed`, in the background,
    /// unless it was replaced already or a replacement is being made.
    fn replace(self: Arc<Self>, failed: u64) {
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            // Cleared however the task ends, so a replacement is never
            // refused for good.
            let _replacing = ClearOnDrop(&self.replacing);
            let is_current = |current: &(u64, ClusterConnection)| current.0 == failed;
            if is_current(&self.lock_current()) {
                let made = tokio::time::timeout(
                    CLUSTER_CONNECT_TIMEOUT,
                    self.client.get_async_connection(),
                )
                .await;
                match made {
                    Ok(Ok(conn)) => {
                        let mut current = self.lock_current();
                        if is_current(&current) {
                            *current = (failed + 1, conn);
                        }
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "could not replace the Redis Cluster connection: a failed call tries again in a second");
                        tokio::time::sleep(REPLACE_AGAIN_AFTER).await;
                    }
                    Err(_) => {
                        tracing::debug!("replacing the Redis Cluster connection timed out: a failed call tries again in a second");
                        tokio::time::sleep(REPLACE_AGAIN_AFTER).await;
                    }
                }
            }
        });
    }
}

/// Clears its flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::SharedCluster { conn, .. } => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Sentinel(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::SharedCluster { conn, .. } => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            Self::SharedCluster { conn, .. } => conn.get_db(),
        }
    }
}
