//! What every Redis store of the crate shares: where Redis is (a node or a cluster, see
//! [`RedisTarget`]), a lazily made connection that reconnects by itself (one multiplexed
//! connection to a node, or the cluster client of the module `cluster`), every operation
//! bounded by a timeout, an operation sent again once when it found its connection broken, a
//! short circuit that skips a node known to be down (see [`circuit`]), hash-tagged key names,
//! the checks of a store's settings, and the coalescing of concurrent checks of one key into
//! one script.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Waker};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, Cmd, FromRedisValue, Pipeline, ProtocolVersion, RedisFuture, RedisResult,
    ScriptInvocation, Value,
};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

mod circuit;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
mod coalesce;

#[cfg(feature = "cluster")]
use crate::target::host_of;
use crate::target::RedisTarget;
use circuit::Server;
pub(crate) use coalesce::{check as coalesced, Batch, Coalescer};

pub(crate) use tower_toolcall::time::{at_least_a_millisecond, millis, unix_now_ms};

/// Runs `work`, which its caller leaves behind, to its end: polled once here, so that a
/// command is on its way before any the caller's task sends next, then on the Tokio runtime.
/// `false` when there is no runtime (nothing is polled then).
pub(crate) fn finish_detached(work: impl Future<Output = ()> + Send + 'static) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let mut work = Box::pin(work);
    if work
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        runtime.spawn(work);
    }
    true
}

/// The default time one Redis operation may take.
pub(crate) const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs one Redis operation within `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    op: impl Future<Output = RedisResult<T>>,
) -> Result<T, StoreError> {
    bounded_telling(timeout, op)
        .await
        .map_err(|(error, _)| error)
}

/// Runs one Redis operation within `timeout`; a failure comes with whether it says that the
/// server cannot be reached.
async fn bounded_telling<T>(
    timeout: Duration,
    op: impl Future<Output = RedisResult<T>>,
) -> Result<T, (StoreError, bool)> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err((
            StoreError::Unavailable(if error.to_string().contains("syntax error") {
                format!("{error} (the store needs Redis 7.0 or later)")
            } else {
                error.to_string()
            }),
            circuit::speaks_of_the_server(&error),
        )),
        Err(_) => Err((StoreError::Timeout(timeout), true)),
    }
}

/// The connection in `cell`, made on first use.
pub(crate) fn connection(
    cell: &OnceLock<Result<ConnectionManager, String>>,
    client: &Client,
    config: &ConnectionManagerConfig,
) -> Result<ConnectionManager, StoreError> {
    cell.get_or_init(|| {
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(StoreError::Unavailable)
}

/// How a store's connection reconnects: each attempt bounded by `timeout`. Its operations
/// carry no timer of their own: [`bounded`] already bounds each one by the operation timeout,
/// and a second timer on every request only costs a wake-up of the runtime's timer.
pub(crate) fn connection_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

/// What every Redis store's builder takes: where the server is, the prefix of the store's
/// keys, and the time one operation may take.
#[derive(Debug)]
pub(crate) struct StoreSettings {
    pub(crate) target: RedisTarget,
    pub(crate) key_prefix: String,
    pub(crate) operation_timeout: Duration,
}

impl StoreSettings {
    pub(crate) fn new(target: RedisTarget, key_prefix: &str) -> Self {
        StoreSettings {
            target,
            key_prefix: key_prefix.to_owned(),
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// Checks the settings of the store configured under `section` (`rate_limit.redis`, …)
    /// and makes its connection, which connects on first use.
    pub(crate) fn connect(&self, section: &str) -> Result<Connection, ConfigError> {
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                format!("{section}.key_prefix"),
                format!(
                    "must be non-empty and free of `{{` and `}}`, got {:?}",
                    self.key_prefix
                ),
            ));
        }
        at_least_a_millisecond(
            &format!("{section}.operation_timeout"),
            self.operation_timeout,
        )?;
        let endpoint = match &self.target {
            RedisTarget::Node(url) => Endpoint::Node(node_client(section, url)?),
            RedisTarget::Cluster(seeds) => cluster_endpoint(section, seeds)?,
        };
        Ok(Connection::new(endpoint, self.operation_timeout))
    }
}

/// The client of the node at `url`, configured under `section`.
pub(crate) fn node_client(section: &str, url: &str) -> Result<Client, ConfigError> {
    Client::open(url).map_err(|e| {
        ConfigError::new(
            format!("{section}.url"),
            format!("is not a usable Redis URL: {e}; write it as redis://host:port/db"),
        )
    })
}

#[cfg(feature = "cluster")]
fn cluster_endpoint(section: &str, seeds: &[String]) -> Result<Endpoint, ConfigError> {
    Ok(Endpoint::Cluster(cluster::Seeds::new(section, seeds)?))
}

#[cfg(not(feature = "cluster"))]
fn cluster_endpoint(section: &str, _seeds: &[String]) -> Result<Endpoint, ConfigError> {
    Err(ConfigError::new(
        format!("{section}.url"),
        "is a list of Redis Cluster seeds: build tower-toolcall-redis with its `cluster` \
         feature, or give the URL of one node",
    ))
}

/// The `key_prefix` and `operation_timeout` setters of a Redis store's builder, whose
/// `settings` field is a [`StoreSettings`]; `$default` is the default prefix, for the docs.
macro_rules! store_settings_setters {
    ($default:expr) => {
        #[doc = concat!(
                    "The prefix of every key the store writes (default `", $default, "`); it must ",
                    "not hold `{` or `}`, which would break the hash tag."
                )]
        pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.settings.key_prefix = prefix.into();
            self
        }

        /// The time one Redis operation may take (default 1 s); an operation that takes
        /// longer fails.
        pub fn operation_timeout(mut self, timeout: Duration) -> Self {
            self.settings.operation_timeout = timeout;
            self
        }
    };
}

pub(crate) use store_settings_setters;

/// A client like `client`, that speaks RESP3, for subscriptions; `field` names the URL's
/// setting in the error.
pub(crate) fn resp3_client(field: &str, client: &Client) -> Result<Client, ConfigError> {
    let info = client.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(resp3))
        .map_err(|e| ConfigError::new(field, format!("cannot be used for subscriptions: {e}")))
}

/// `<prefix>{<tagged>}<suffix>`: the braces are a Redis Cluster hash tag, so every key of one
/// `tagged` name lives in one slot.
pub(crate) fn hash_tagged(prefix: &str, tagged: &str, suffix: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + tagged.len() + suffix.len() + 2);
    key.push_str(prefix);
    key.push('{');
    key.push_str(tagged);
    key.push('}');
    key.push_str(suffix);
    key
}

/// One shard of the store's keys: the node, or one master of the cluster.
#[derive(Clone, Debug)]
pub(crate) enum Shard {
    Node,
    #[cfg(feature = "cluster")]
    Master(cluster::Node),
}

/// Where a store's commands go: one node, or a cluster.
pub(crate) enum Endpoint {
    Node(Client),
    #[cfg(feature = "cluster")]
    Cluster(cluster::Seeds),
}

/// A connection to a node or a cluster: what the `redis` crate's commands and scripts run on.
#[derive(Clone)]
pub(crate) enum Link {
    Node(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The connection of a store, made on first use inside the Tokio runtime, that reconnects by
/// itself: one multiplexed connection to a node, or the `redis` crate's cluster connection
/// (one multiplexed connection per node, `MOVED` / `ASK` followed, the slots read again
/// after a failover). Every operation on it is bounded by the operation timeout; on a node,
/// it fails at once while the server is known to be down (see [`circuit`]).
pub(crate) struct Connection {
    endpoint: Endpoint,
    config: ConnectionManagerConfig,
    node: OnceLock<Result<ConnectionManager, String>>,
    #[cfg(feature = "cluster")]
    cluster: cluster::Current,
    timeout: Duration,
    /// What the process knows of the node's outages; none on a cluster, whose nodes fail
    /// one shard at a time (see [`cluster`](self::cluster)).
    server: Option<Arc<Server>>,
}

impl Connection {
    pub(crate) fn new(endpoint: Endpoint, timeout: Duration) -> Self {
        let server = match &endpoint {
            Endpoint::Node(client) => Some(Server::named(
                client.get_connection_info().addr().to_string(),
            )),
            #[cfg(feature = "cluster")]
            Endpoint::Cluster(_) => None,
        };
        Connection {
            endpoint,
            config: connection_config(timeout),
            node: OnceLock::new(),
            #[cfg(feature = "cluster")]
            cluster: cluster::Current::default(),
            timeout,
            server,
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn config(&self) -> &ConnectionManagerConfig {
        &self.config
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the store speaks to a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        !matches!(self.endpoint, Endpoint::Node(_))
    }

    /// A store's `Debug` output, begun with what every Redis store shows: its server (or the
    /// cluster's seeds), key prefix and operation timeout; the store adds its own fields.
    pub(crate) fn debug_store<'a, 'b>(
        &self,
        f: &'a mut std::fmt::Formatter<'b>,
        store: &str,
        key_prefix: &str,
    ) -> std::fmt::DebugStruct<'a, 'b> {
        let mut debug = f.debug_struct(store);
        match &self.endpoint {
            Endpoint::Node(client) => debug.field("server", &client.get_connection_info().addr()),
            #[cfg(feature = "cluster")]
            Endpoint::Cluster(seeds) => debug.field("cluster", &seeds.hosts()),
        };
        debug
            .field("key_prefix", &key_prefix)
            .field("operation_timeout", &self.timeout);
        debug
    }

    /// The connection, made on first use.
    async fn link(&self) -> RedisResult<Link> {
        match &self.endpoint {
            Endpoint::Node(client) => connection(&self.node, client, &self.config)
                .map(Link::Node)
                .map_err(|e| {
                    redis::RedisError::from((redis::ErrorKind::Io, "connect", e.to_string()))
                }),
            #[cfg(feature = "cluster")]
            Endpoint::Cluster(seeds) => self
                .cluster
                .get(|| seeds.connect(self.timeout, None))
                .await
                .map(Link::Cluster),
        }
    }

    /// The shards a walk of every key must visit (a `SCAN`): the node, or every master.
    pub(crate) async fn shards(&self) -> Result<Vec<Shard>, StoreError> {
        match &self.endpoint {
            Endpoint::Node(_) => Ok(vec![Shard::Node]),
            #[cfg(feature = "cluster")]
            Endpoint::Cluster(_) => {
                let Link::Cluster(mut conn) = bounded(self.timeout, self.link()).await? else {
                    unreachable!("a cluster's link is a cluster connection");
                };
                let (masters, _) = tokio::time::timeout(self.timeout, cluster::nodes(&mut conn))
                    .await
                    .map_err(|_| StoreError::Timeout(self.timeout))??;
                Ok(masters.into_iter().map(Shard::Master).collect())
            }
        }
    }

    /// Every node of the cluster, masters first, as the cluster sees itself now.
    #[cfg(feature = "cluster")]
    pub(crate) async fn cluster_nodes(&self) -> Result<Vec<cluster::Node>, StoreError> {
        let Link::Cluster(mut conn) = bounded(self.timeout, self.link()).await? else {
            return Ok(Vec::new());
        };
        let (mut masters, replicas) = tokio::time::timeout(self.timeout, cluster::nodes(&mut conn))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        masters.extend(replicas);
        Ok(masters)
    }

    /// Runs one command on `shard` within the operation timeout.
    pub(crate) async fn command_on<T: FromRedisValue>(
        &self,
        shard: &Shard,
        command: &Cmd,
    ) -> Result<T, StoreError> {
        match shard {
            Shard::Node => self.command(command).await,
            #[cfg(feature = "cluster")]
            Shard::Master(node) => {
                self.run(|conn| async move {
                    let Link::Cluster(mut conn) = conn else {
                        unreachable!("a master is a cluster's");
                    };
                    let value = conn.route_command(command.clone(), node.routing()).await?;
                    T::from_redis_value(value).map_err(redis::RedisError::from)
                })
                .await
            }
        }
    }

    /// Runs one command within the operation timeout.
    pub(crate) async fn command<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        self.run(|mut conn| async move { command.query_async(&mut conn).await })
            .await
    }

    /// Runs one command within the operation timeout even while the server is known to be
    /// down: for a command that must follow one already sent on this connection (the release
    /// of a claim whose answer never came), which a server that comes back runs in order.
    pub(crate) async fn command_behind<T: FromRedisValue>(
        &self,
        command: &Cmd,
    ) -> Result<T, StoreError> {
        bounded(self.timeout, async {
            let mut conn = self.link().await?;
            command.query_async(&mut conn).await
        })
        .await
    }

    /// Runs one script (`EVALSHA`, loading it once should the server not know it) within the
    /// operation timeout. On a cluster, the script runs on the master of its keys' slot.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// Runs `op` on the connection within the operation timeout, unless the server is known
    /// to be down. An operation that finds its connection broken (the server restarted since
    /// the connection's last use: the request never reached it) is sent once more, on the
    /// connection the manager makes anew, within the same timeout. A failure that says the
    /// server cannot be reached marks it down for every store.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if let Some(server) = &self.server {
            server.check()?;
        }
        let mut link = None;
        let attempts = async {
            let conn = self.link().await?;
            link = Some(conn.clone());
            match op(conn.clone()).await {
                Err(error) if error.is_connection_dropped() => op(conn).await,
                answered => answered,
            }
        };
        let outcome = bounded_telling(self.timeout, attempts).await;
        let Some(server) = &self.server else {
            #[cfg(feature = "cluster")]
            if let Endpoint::Cluster(_) = &self.endpoint {
                self.cluster.outcome(outcome.is_ok(), self.timeout);
            }
            return outcome.map_err(|(error, _)| error);
        };
        match outcome {
            Ok(value) => {
                server.answered();
                Ok(value)
            }
            Err((error, unreachable)) => {
                if let (true, Some(Link::Node(conn))) = (unreachable, &link) {
                    server.unreachable(&error, conn, self.timeout);
                }
                Err(error)
            }
        }
    }
}
