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

use std::time::Duration;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisResult, Value};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

use super::host_of;

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
pub(crate) struct Current {
    connection: Mutex<Option<(ClusterConnection, tokio::time::Instant)>>,
    connecting: tokio::sync::Mutex<()>,
    /// When an operation last succeeded, or the connection was made.
    last_answer: Mutex<Option<tokio::time::Instant>>,
    replacing: AtomicBool,
}

impl Current {
    /// The connection, made by `connect` when there is none.
    pub(crate) async fn get<F, Fut>(&self, connect: F) -> RedisResult<ClusterConnection>
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
    pub(crate) fn outcome(&self, ok: bool, timeout: Duration) {
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
pub(crate) struct Seeds {
    infos: Vec<ConnectionInfo>,
    urls: Vec<String>,
}

impl Seeds {
    /// The seeds `urls` of the cluster configured under `section`.
    pub(crate) fn new(section: &str, urls: &[String]) -> Result<Seeds, ConfigError> {
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
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.urls.iter().map(|url| host_of(url)).collect()
    }

    /// A RESP3 client of one node: a seed (by its index), or a node the cluster named, with
    /// the first seed's credentials and settings.
    pub(crate) fn node_client(&self, node: Either<'_>) -> RedisResult<redis::Client> {
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
    pub(crate) fn len(&self) -> usize {
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
    pub(crate) async fn connect(
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

/// Where the pushes of a cluster connection go; called on the connection's task, it never
/// blocks.
pub(crate) type Pushes = Arc<dyn Fn(redis::PushInfo) + Send + Sync>;

/// A seed by its index, or a node the cluster named.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Either<'a> {
    Seed(usize),
    Node(&'a Node),
}

/// A node of the cluster, by its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Node {
    /// The routing of a command to this node alone.
    pub(crate) fn routing(&self) -> RoutingInfo {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        })
    }
}

/// The masters of the cluster, then its replicas, from `CLUSTER SLOTS` (each once).
pub(crate) async fn nodes(
    conn: &mut ClusterConnection,
) -> Result<(Vec<Node>, Vec<Node>), StoreError> {
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
