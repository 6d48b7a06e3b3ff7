//! What every Redis store of the crate shares: where Redis is (a node or a cluster, see
//! [`RedisTarget`]), chosen once into an [`Endpoint`], a lazily made connection that
//! reconnects by itself (the module `node`'s, or the module `cluster`'s), every operation
//! bounded by a timeout, an operation sent again once when it found its connection broken, a
//! short circuit that skips a node known to be down (see [`circuit`]), hash-tagged key names,
//! the checks of a store's settings, and the coalescing of concurrent checks of one key into
//! one script.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{
    Cmd, FromRedisValue, Pipeline, PushInfo, RedisFuture, RedisResult, ScriptInvocation, Value,
};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

mod circuit;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
#[cfg(not(feature = "cluster"))]
#[path = "support/no_cluster.rs"]
pub(crate) mod cluster;
mod coalesce;
pub(crate) mod node;

use crate::target::RedisTarget;
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
        let timeout = self.operation_timeout;
        let endpoint = match &self.target {
            RedisTarget::Node(url) => Endpoint::Node(node::Node::new(section, url, timeout)?),
            RedisTarget::Cluster(seeds) => {
                Endpoint::Cluster(cluster::Cluster::new(section, seeds, timeout)?)
            }
        };
        Ok(Connection { endpoint })
    }
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

/// Where the pushes of a connection go (the messages of the channels it subscribes to, and
/// its disconnection); called on the connection's task, it never blocks.
pub(crate) type Pushes = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// Where a store's commands go, chosen once from its [`RedisTarget`]: one node, or a
/// cluster. Built without the feature `cluster`, a [`cluster::Cluster`] cannot be made (the
/// type has no value), and the cluster's arm of a match is never taken. One per store, made
/// once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Endpoint {
    Node(node::Node),
    Cluster(cluster::Cluster),
}

/// What a store's [`Connection`] needs of where its commands go, which the node
/// ([`node::Node`]) and the cluster ([`cluster::Cluster`]) each give in their own way.
pub(crate) trait Backend {
    /// The connection the commands go on, cheap to clone.
    type Link: Clone + Send + Into<Link>;

    /// The time one operation may take.
    fn timeout(&self) -> Duration;

    /// Adds where the store is (its server, or the cluster's seeds) to its `Debug` output.
    fn describe(&self, debug: &mut std::fmt::DebugStruct<'_, '_>);

    /// `Err` at once, without touching the network, while Redis is known to be down.
    fn ready(&self) -> Result<(), StoreError>;

    /// The connection, made on first use.
    fn link(&self) -> impl Future<Output = RedisResult<Self::Link>> + Send;

    /// An operation ended: answered (`Ok`), or failed with an error and whether it says that
    /// the server cannot be reached.
    fn ended(&self, outcome: Result<(), (&StoreError, bool)>);
}

/// Runs `op` on `backend`'s connection within the operation timeout, unless Redis is known
/// to be down. An operation that finds its connection broken (the server restarted since
/// the connection's last use: the request never reached it) is sent once more, on the
/// connection made anew, within the same timeout. The backend learns how it ended.
pub(crate) async fn run_on<B, T, F, Fut>(backend: &B, op: F) -> Result<T, StoreError>
where
    B: Backend,
    F: Fn(B::Link) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    backend.ready()?;
    let attempts = async {
        let conn = backend.link().await?;
        match op(conn.clone()).await {
            Err(error) if error.is_connection_dropped() => op(conn).await,
            answered => answered,
        }
    };
    let outcome = bounded_telling(backend.timeout(), attempts).await;
    backend.ended(match &outcome {
        Ok(_) => Ok(()),
        Err((error, unreachable)) => Err((error, *unreachable)),
    });
    outcome.map_err(|(error, _)| error)
}

/// `command`'s answer on `conn`.
pub(crate) async fn query<T: FromRedisValue>(
    command: &Cmd,
    mut conn: impl ConnectionLike,
) -> RedisResult<T> {
    command.query_async(&mut conn).await
}

/// One shard of the store's keys, with the way to it: the node, or one master of the
/// cluster.
pub(crate) enum Shard<'a> {
    Node(&'a node::Node),
    Master(cluster::Master<'a>),
}

impl Shard<'_> {
    /// Runs one command on the shard within the operation timeout.
    pub(crate) async fn command<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        match self {
            Shard::Node(node) => run_on(*node, |conn| query(command, conn)).await,
            Shard::Master(master) => master.command(command).await,
        }
    }
}

/// A connection to a node or a cluster: what the `redis` crate's commands and scripts run on.
#[derive(Clone)]
pub(crate) enum Link {
    Node(ConnectionManager),
    Cluster(cluster::Link),
}

impl From<ConnectionManager> for Link {
    fn from(conn: ConnectionManager) -> Self {
        Link::Node(conn)
    }
}

impl From<cluster::Link> for Link {
    fn from(conn: cluster::Link) -> Self {
        Link::Cluster(conn)
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(conn) => conn.req_packed_command(cmd),
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
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(conn) => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The connection of a store, made on first use inside the Tokio runtime, that reconnects by
/// itself: one multiplexed connection to a node (see [`node`]), or the `redis` crate's
/// cluster connection (see [`cluster`]: one multiplexed connection per node, `MOVED` / `ASK`
/// followed, the slots read again after a failover). Every operation on it is bounded by the
/// operation timeout; on a node, it fails at once while the server is known to be down (see
/// [`circuit`]).
pub(crate) struct Connection {
    endpoint: Endpoint,
}

impl Connection {
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn timeout(&self) -> Duration {
        match &self.endpoint {
            Endpoint::Node(node) => node.timeout(),
            Endpoint::Cluster(cluster) => cluster.timeout(),
        }
    }

    /// Whether the store speaks to a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.endpoint, Endpoint::Cluster(_))
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
            Endpoint::Node(node) => node.describe(&mut debug),
            Endpoint::Cluster(cluster) => cluster.describe(&mut debug),
        }
        debug
            .field("key_prefix", &key_prefix)
            .field("operation_timeout", &self.timeout());
        debug
    }

    /// The shards a walk of every key must visit (a `SCAN`): the node, or every master.
    pub(crate) async fn shards(&self) -> Result<Vec<Shard<'_>>, StoreError> {
        match &self.endpoint {
            Endpoint::Node(node) => Ok(vec![Shard::Node(node)]),
            Endpoint::Cluster(cluster) => Ok(cluster
                .masters()
                .await?
                .into_iter()
                .map(Shard::Master)
                .collect()),
        }
    }

    /// Runs one command within the operation timeout.
    pub(crate) async fn command<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        self.run(|conn| query(command, conn)).await
    }

    /// Runs one command within the operation timeout even while the server is known to be
    /// down: for a command that must follow one already sent on this connection (the release
    /// of a claim whose answer never came), which a server that comes back runs in order.
    pub(crate) async fn command_behind<T: FromRedisValue>(
        &self,
        command: &Cmd,
    ) -> Result<T, StoreError> {
        let link = async {
            match &self.endpoint {
                Endpoint::Node(node) => node.link().await.map(Link::from),
                Endpoint::Cluster(cluster) => cluster.link().await.map(Link::from),
            }
        };
        bounded(self.timeout(), async { query(command, link.await?).await }).await
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

    /// Runs `op` on the connection (see [`run_on`]). A failure that says a node cannot be
    /// reached marks it down for every store.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        match &self.endpoint {
            Endpoint::Node(node) => run_on(node, |conn| op(conn.into())).await,
            Endpoint::Cluster(cluster) => run_on(cluster, |conn| op(conn.into())).await,
        }
    }
}
