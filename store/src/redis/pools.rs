//! Connection pools for the three Redis topologies a store URL can name: one
//! server, a master found through Sentinel, and a Cluster.
//!
//! Each pool hands out connections that one call uses at a time (a blocking
//! feed read holds one, not the others). The Sentinel pool asks the sentinels
//! for the master whenever it opens a connection, and checks with `ROLE` before
//! reusing one that the node is still the master, so after a failover old
//! connections are dropped and new ones go to the promoted replica. The
//! Cluster pool's connections are the `redis` crate's cluster connections:
//! they follow `MOVED`/`ASK` and reload the slot map when a master fails.

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

use super::{CONNECT_TIMEOUT, POOL_SIZE, RESPONSE_TIMEOUT};

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

/// Opens cluster connections (each keeps its own connection to every node).
pub(super) struct ClusterManager {
    client: ClusterClient,
}

impl ClusterManager {
    pub(super) fn new(url: &ClusterUrl) -> Result<Self, RedisError> {
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
        Ok(Self {
            client: builder.build()?,
        })
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
    /// A Redis Cluster.
    Cluster(managed::Pool<ClusterManager>),
}

/// A connection taken from [`Pools`].
pub(super) enum Conn {
    Single(deadpool_redis::Connection),
    Sentinel(managed::Object<SentinelManager>),
    Cluster(managed::Object<ClusterManager>),
}

impl Pools {
    /// A connection: a pooled one that still checks out, or a new one.
    pub(super) async fn get(&self) -> Result<Conn, PoolError> {
        Ok(match self {
            Self::Single(pool) => Conn::Single(pool.get().await?),
            Self::Sentinel(pool) => Conn::Sentinel(pool.get().await?),
            Self::Cluster(pool) => Conn::Cluster(pool.get().await?),
        })
    }

    /// How many connections the pool holds now.
    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        match self {
            Self::Single(pool) => pool.status().size,
            Self::Sentinel(pool) => pool.status().size,
            Self::Cluster(pool) => pool.status().size,
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
        if matches!(self, Self::Cluster(_)) {
            self.discard();
        }
    }

    /// Takes the connection out of its pool for good (it reached a node that is no
    /// longer the master, or broke).
    pub(super) fn discard(self) {
        match self {
            Self::Single(conn) => drop(deadpool_redis::Connection::take(conn)),
            Self::Sentinel(conn) => drop(managed::Object::take(conn)),
            Self::Cluster(conn) => drop(managed::Object::take(conn)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}
