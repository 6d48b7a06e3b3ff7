//! A Redis Cluster as every store of the crate reaches it (feature `cluster`).
//!
//! The `redis` crate's cluster client keeps one multiplexed connection per node, routes each
//! command and script by the slot of its keys, follows `MOVED` and `ASK` while slots move,
//! and reads the slot map again when a node stops answering, so that a failover's new master
//! is found. Every operation stays bounded by the store's operation timeout: one that cannot
//! complete within it (its master died and no replica was promoted yet) fails, and the store's
//! failure policy decides.
//!
//! The short circuit of a node (see [`circuit`](super::circuit)) is not used on a cluster: a
//! dead master stops one shard, not the others, and skipping every shard for it would turn
//! one shard's failover into an outage of the whole store.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Client, Cmd, ConnectionInfo, FromRedisValue, IntoConnectionInfo, ProtocolVersion, RedisResult,
    Value,
};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

use super::{bounded, run_on, Backend, Pushes};
use crate::target::host_of;

/// A connection to the cluster: what the `redis` crate's commands and scripts run on.
pub(crate) type Link = ClusterConnection;

/// A store's cluster: its seeds, and its connection once made. Clones share the connection.
#[derive(Clone)]
pub(crate) struct Cluster {
    seeds: Seeds,
    current: Arc<Current>,
    timeout: Duration,
}

impl Cluster {
    /// The cluster reached through `seeds` of the store configured under `section`, each
    /// operation bounded by `timeout`; no connection is made yet.
    pub(crate) fn new(
        section: &str,
        seeds: &[String],
        timeout: Duration,
    ) -> Result<Cluster, ConfigError> {
        Ok(Cluster {
            seeds: Seeds::new(section, seeds)?,
            current: Arc::default(),
            timeout,
        })
    }

    /// The masters of the cluster, each a shard of the store's keys.
    pub(crate) async fn masters(&self) -> Result<Vec<Master<'_>>, StoreError> {
        let (masters, _) = self.slots().await?;
        Ok(masters
            .into_iter()
            .map(|node| Master {
                cluster: self,
                node,
            })
            .collect())
    }

    /// Every node of the cluster, masters first, as the cluster sees itself now.
    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        let (mut masters, replicas) = self.slots().await?;
        masters.extend(replicas);
        Ok(masters)
    }

    /// The masters of the cluster, then its replicas, from `CLUSTER SLOTS`.
    async fn slots(&self) -> Result<(Vec<Node>, Vec<Node>), StoreError> {
        let mut conn = bounded(self.timeout, self.link()).await?;
        tokio::time::timeout(self.timeout, nodes(&mut conn))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// Where the fleet's listener subscribes, starting with the first seed.
    pub(crate) fn listening(&self) -> Listening {
        Listening {
            cluster: self.clone(),
            turn: 0,
        }
    }

    /// The connection of a store's subscriptions, made on first use.
    pub(crate) fn subscriptions(&self) -> Subscriptions {
        Subscriptions {
            seeds: self.seeds.clone(),
            connection: tokio::sync::OnceCell::new(),
            timeout: self.timeout,
        }
    }
}

/// No short circuit: a dead master stops one shard, not the others. A connection that
/// answers nothing for long while operations fail is made anew (see [`Current`]).
impl Backend for Cluster {
    type Link = ClusterConnection;

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn describe(&self, debug: &mut std::fmt::DebugStruct<'_, '_>) {
        debug.field("cluster", &self.seeds.hosts());
    }

    fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn link(&self) -> RedisResult<ClusterConnection> {
        self.current
            .get(|| self.seeds.connect(self.timeout, None))
            .await
    }

    fn ended(&self, outcome: Result<(), (&StoreError, bool)>) {
        self.current.outcome(outcome.is_ok(), self.timeout);
    }
}

/// One master of a store's cluster: a shard of its keys, for a walk of every key.
pub(crate) struct Master<'a> {
    cluster: &'a Cluster,
    node: Node,
}

impl Master<'_> {
    /// Runs one command on this master within the operation timeout.
    pub(crate) async fn command<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        run_on(self.cluster, |mut conn| async move {
            let value = conn
                .route_command(command.clone(), self.node.routing())
                .await?;
            T::from_redis_value(value).map_err(redis::RedisError::from)
        })
        .await
    }
}

/// Where the fleet's listener subscribes on a cluster: any node, since a cluster sends a
/// classic `PUBLISH` to every node over its bus. It starts with the first seed; when that
/// node is lost (or refuses), it moves on to the next of the seeds and of the nodes the
/// cluster names at that moment (masters and replicas), so that a subscription outlives the
/// failure of any one node.
pub(crate) struct Listening {
    cluster: Cluster,
    turn: usize,
}

impl Listening {
    /// The client of the node to subscribe through now.
    pub(crate) async fn next(&mut self) -> RedisResult<Client> {
        let seeds = &self.cluster.seeds;
        let named = if self.turn < seeds.len() {
            Vec::new()
        } else {
            self.cluster.nodes().await.unwrap_or_default()
        };
        let candidates = seeds.len() + named.len();
        let pick = self.turn % candidates;
        if pick < seeds.len() {
            seeds.node_client(Either::Seed(pick))
        } else {
            seeds.node_client(Either::Node(&named[pick - seeds.len()]))
        }
    }

    /// The node subscribed through was lost, or refused: the next try goes to another.
    pub(crate) fn lost(&mut self) {
        self.turn = self.turn.wrapping_add(1);
    }
}

/// The connection of a store's subscriptions to sharded channels (`SSUBSCRIBE`): over
/// RESP3, made on first use, its subscriptions following their slots to whichever node owns
/// them.
pub(crate) struct Subscriptions {
    seeds: Seeds,
    connection: tokio::sync::OnceCell<ClusterConnection>,
    timeout: Duration,
}

impl Subscriptions {
    /// The connection, made on first use within the operation timeout; its pushes go to
    /// `pushes`.
    pub(crate) async fn connection(&self, pushes: Pushes) -> Result<Link, StoreError> {
        let conn = bounded(
            self.timeout,
            self.connection
                .get_or_try_init(|| self.seeds.connect(self.timeout, Some(pushes))),
        )
        .await?;
        Ok(conn.clone())
    }
}

/// How many times the cluster client sends a command again (after a redirection, a lost
/// connection, a slot map read anew) before it gives up; the operation timeout bounds them.
const RETRIES: u32 = 24;
/// The shortest and longest waits between two of those tries, in ms.
const RETRY_WAIT_MS: (u64, u64) = (10, 250);

/// How long a store's cluster connection may go without answering any operation, while
/// operations fail, before the store makes a new one (at least this, and four operation
/// timeouts).
const WEDGED_AFTER: Duration = Duration::from_secs(2);

/// A store's cluster connection, made on first use, and made anew when it has answered no
/// operation for a while as operations kept failing.
///
/// The `redis` crate's cluster client (1.8) pauses every request while it reads the slot map
/// again, and reads it again after each request that failed on a master that died: under
/// load, or on a busy machine, it can stay in that loop long after a replica took the dead
/// master's slots over, every shard failing meanwhile. A new connection reads the slot map
/// from the seeds once and serves again: the store makes one when nothing has succeeded for
/// [`WEDGED_AFTER`] (or four operation timeouts, if longer) while operations failed. During
/// an ordinary failover, the other shards keep answering, and nothing is replaced.
#[derive(Default)]
struct Current {
    connection: Mutex<Option<(ClusterConnection, tokio::time::Instant)>>,
    connecting: tokio::sync::Mutex<()>,
    /// When an operation last succeeded, or the connection was made.
    last_answer: Mutex<Option<tokio::time::Instant>>,
    replacing: AtomicBool,
}

impl Current {
    /// The connection, made by `connect` when there is none.
    async fn get<F, Fut>(&self, connect: F) -> RedisResult<ClusterConnection>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RedisResult<ClusterConnection>>,
    {
        if let Some((conn, _)) = &*lock(&self.connection) {
            return Ok(conn.clone());
        }
        let _connecting = self.connecting.lock().await;
        if let Some((conn, _)) = &*lock(&self.connection) {
            return Ok(conn.clone());
        }
        let conn = connect().await?;
        let now = tokio::time::Instant::now();
        *lock(&self.connection) = Some((conn.clone(), now));
        *lock(&self.last_answer) = Some(now);
        Ok(conn)
    }

    /// An operation on the connection ended: answered (`ok`), or failed. After a failure,
    /// a connection that has answered nothing for long enough is dropped: the next
    /// operation makes a new one.
    fn outcome(&self, ok: bool, timeout: Duration) {
        let now = tokio::time::Instant::now();
        if ok {
            *lock(&self.last_answer) = Some(now);
            return;
        }
        let wedged_after = WEDGED_AFTER.max(timeout * 4);
        let silent = lock(&self.last_answer)
            .is_some_and(|at| now.saturating_duration_since(at) >= wedged_after);
        if !silent || self.replacing.swap(true, Ordering::Relaxed) {
            return;
        }
        let dropped = lock(&self.connection).take();
        if dropped.is_some() {
            tracing::warn!(
                silent_ms = wedged_after.as_millis() as u64,
                "the Redis Cluster connection answered nothing while operations failed: \
                 making a new one from the seeds"
            );
        }
        *lock(&self.last_answer) = Some(now);
        self.replacing.store(false, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shortest time one attempt may take.
const ATTEMPT_FLOOR: Duration = Duration::from_millis(50);

/// The seeds of a cluster, checked.
#[derive(Clone)]
struct Seeds {
    infos: Vec<ConnectionInfo>,
    urls: Vec<String>,
}

impl Seeds {
    /// The seeds `urls` of the cluster configured under `section`.
    fn new(section: &str, urls: &[String]) -> Result<Seeds, ConfigError> {
        let field = format!("{section}.url");
        if urls.is_empty() {
            return Err(ConfigError::new(
                field,
                "is an empty list: give the URL of one node, or of some nodes of the cluster",
            ));
        }
        let infos = urls
            .iter()
            .enumerate()
            .map(|(index, url)| {
                url.as_str().into_connection_info().map_err(|e| {
                    ConfigError::new(
                        format!("{field}[{index}]"),
                        format!("is not a usable Redis URL: {e}; write it as redis://host:port/"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seeds = Seeds {
            infos,
            urls: urls.to_vec(),
        };
        seeds
            .builder(Duration::from_secs(1))
            .build()
            .map_err(|e| ConfigError::new(field, format!("does not describe one cluster: {e}")))?;
        Ok(seeds)
    }

    /// The seeds' `host:port`, for the logs.
    fn hosts(&self) -> Vec<String> {
        self.urls.iter().map(|url| host_of(url)).collect()
    }

    /// A RESP3 client of one node: a seed (by its index), or a node the cluster named, with
    /// the first seed's credentials and settings.
    fn node_client(&self, node: Either<'_>) -> RedisResult<redis::Client> {
        let info = match node {
            Either::Seed(index) => self.infos[index % self.infos.len()].clone(),
            Either::Node(node) => {
                let info = self.infos[0].clone();
                if !matches!(info.addr(), redis::ConnectionAddr::Tcp(..)) {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "only the seeds are used past plain TCP",
                    )));
                }
                info.set_addr(redis::ConnectionAddr::Tcp(node.host.clone(), node.port))
            }
        };
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        redis::Client::open(info.set_redis_settings(resp3))
    }

    /// How many seeds there are.
    fn len(&self) -> usize {
        self.infos.len()
    }

    /// A client whose every command is bounded by a quarter of the operation `timeout`, so
    /// that one stuck on a master that died fails in time for the client to read the slot
    /// map again and try the new master within the operation; a connection may take the
    /// whole operation timeout, so that a busy machine still connects to the new master.
    fn builder(&self, timeout: Duration) -> ClusterClientBuilder {
        let attempt = (timeout / 4).max(ATTEMPT_FLOOR);
        ClusterClientBuilder::new(self.infos.clone())
            .connection_timeout(timeout)
            .response_timeout(attempt)
            .overall_response_timeout(None)
            .retries(RETRIES)
            .min_retry_wait(RETRY_WAIT_MS.0)
            .max_retry_wait(RETRY_WAIT_MS.1)
    }

    /// A connection to the cluster, each node's connection bounded by `timeout`; with
    /// `pushes`, over RESP3, its pushes (messages of the channels it subscribes to, and each
    /// node's disconnection) go there, and its subscriptions follow their slots to whichever
    /// node owns them.
    async fn connect(
        &self,
        timeout: Duration,
        pushes: Option<Pushes>,
    ) -> RedisResult<ClusterConnection> {
        let mut builder = self.builder(timeout);
        if let Some(pushes) = pushes {
            builder = builder
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(move |info| {
                    pushes(info);
                    Ok::<(), std::convert::Infallible>(())
                });
        }
        let client: ClusterClient = builder.build()?;
        client.get_async_connection().await
    }
}

/// A seed by its index, or a node the cluster named.
#[derive(Clone, Copy, Debug)]
enum Either<'a> {
    Seed(usize),
    Node(&'a Node),
}

/// A node of the cluster, by its address.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    host: String,
    port: u16,
}

impl Node {
    /// The routing of a command to this node alone.
    fn routing(&self) -> RoutingInfo {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        })
    }
}

/// The masters of the cluster, then its replicas, from `CLUSTER SLOTS` (each once).
async fn nodes(conn: &mut ClusterConnection) -> Result<(Vec<Node>, Vec<Node>), StoreError> {
    let reply = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let malformed = || StoreError::Corrupt("CLUSTER SLOTS answered an odd shape".to_owned());
    let Value::Array(ranges) = reply else {
        return Err(malformed());
    };
    let (mut masters, mut replicas) = (Vec::new(), Vec::new());
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed());
        };
        for (index, node) in fields.into_iter().skip(2).enumerate() {
            let node = node_of(node).ok_or_else(malformed)?;
            let list = if index == 0 {
                &mut masters
            } else {
                &mut replicas
            };
            if !list.contains(&node) {
                list.push(node);
            }
        }
    }
    replicas.retain(|node| !masters.contains(node));
    Ok((masters, replicas))
}

/// `[host, port, id, …]` of `CLUSTER SLOTS`.
fn node_of(value: Value) -> Option<Node> {
    let Value::Array(fields) = value else {
        return None;
    };
    let mut fields = fields.into_iter();
    let host = match fields.next()? {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok()?,
        Value::SimpleString(text) => text,
        _ => return None,
    };
    let port = match fields.next()? {
        Value::Int(port) => u16::try_from(port).ok()?,
        _ => return None,
    };
    Some(Node { host, port })
}
