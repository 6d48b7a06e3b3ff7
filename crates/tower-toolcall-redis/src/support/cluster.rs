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

use std::sync::Arc;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisResult, Value};

use tower_toolcall::shared_store::SharedStoreError;
use tower_toolcall::ConfigError;

use super::host_of;

/// How many times the cluster client sends a command again (after a redirection, a lost
/// connection, a slot map read anew) before it gives up; the operation timeout bounds them.
const RETRIES: u32 = 24;
/// The shortest and longest waits between two of those tries, in ms.
const RETRY_WAIT_MS: (u64, u64) = (10, 250);

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

    /// A client whose every attempt (a connection, a command) is bounded by a quarter of
    /// the operation `timeout`: an attempt stuck on a master that died fails in time for the
    /// client to read the slot map again and try the new master within the operation.
    fn builder(&self, timeout: Duration) -> ClusterClientBuilder {
        let attempt = (timeout / 4).max(ATTEMPT_FLOOR);
        ClusterClientBuilder::new(self.infos.clone())
            .connection_timeout(attempt)
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
) -> Result<(Vec<Node>, Vec<Node>), SharedStoreError> {
    let reply = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| SharedStoreError::Unavailable(e.to_string()))?;
    let malformed = || SharedStoreError::Corrupt("CLUSTER SLOTS answered an odd shape".to_owned());
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
