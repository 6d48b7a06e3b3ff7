//! [`RedisTarget`]: where every store of the crate finds Redis, one node or a cluster.

use std::fmt;

use serde::Deserialize;

/// Where a store finds Redis: one node by its URL, or a Redis Cluster by the URLs of some of
/// its nodes (seeds: the client learns the rest of the cluster from them).
///
/// Every store's `open` and `builder` take anything that converts into one, so a fleet
/// switches from a node to a cluster by configuration only: a string is a node, a list of
/// strings is a cluster (feature `cluster`). It deserializes the same way, so a
/// configuration file may hold either (`redis = "redis://…"` or `redis = ["redis://…", …]`).
///
/// ```
/// use tower_toolcall_redis::RedisTarget;
///
/// let node = RedisTarget::from("redis://127.0.0.1:6379/");
/// assert!(!node.is_cluster());
/// let cluster = RedisTarget::from(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]);
/// assert!(cluster.is_cluster());
/// assert_eq!(cluster.urls(), ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]);
/// let read: RedisTarget = serde_json::from_str(r#"["redis://10.0.0.1:7000/"]"#).unwrap();
/// assert_eq!(read, RedisTarget::cluster(["redis://10.0.0.1:7000/"]));
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(
    untagged,
    expecting = "a Redis URL, or a list of the URLs of a cluster's nodes"
)]
#[non_exhaustive]
pub enum RedisTarget {
    /// One Redis node (`redis://host:port/db`).
    Node(String),
    /// A Redis Cluster, by the URLs of some of its nodes (`redis://host:port/`); needs the
    /// crate's `cluster` feature.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// One node at `url`.
    pub fn node(url: impl Into<String>) -> RedisTarget {
        RedisTarget::Node(url.into())
    }

    /// A cluster reached through `seeds`, the URLs of some of its nodes.
    pub fn cluster<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> RedisTarget {
        RedisTarget::Cluster(seeds.into_iter().map(Into::into).collect())
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// The URLs: the node's, or the seeds, as given (passwords included: a log line takes
    /// the target's `Debug`, which shows the hosts only).
    pub fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Node(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }
}

impl From<&str> for RedisTarget {
    fn from(url: &str) -> Self {
        RedisTarget::node(url)
    }
}

impl From<String> for RedisTarget {
    fn from(url: String) -> Self {
        RedisTarget::Node(url)
    }
}

impl From<&String> for RedisTarget {
    fn from(url: &String) -> Self {
        RedisTarget::node(url.as_str())
    }
}

impl From<Vec<String>> for RedisTarget {
    fn from(seeds: Vec<String>) -> Self {
        RedisTarget::Cluster(seeds)
    }
}

impl From<&[&str]> for RedisTarget {
    fn from(seeds: &[&str]) -> Self {
        RedisTarget::cluster(seeds.iter().copied())
    }
}

impl<const N: usize> From<[&str; N]> for RedisTarget {
    fn from(seeds: [&str; N]) -> Self {
        RedisTarget::cluster(seeds)
    }
}

impl<const N: usize> From<[String; N]> for RedisTarget {
    fn from(seeds: [String; N]) -> Self {
        RedisTarget::cluster(seeds)
    }
}

/// The hosts and ports only: a URL's password never reaches a log line.
impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self.urls().iter().map(|url| host_of(url)).collect();
        match self {
            RedisTarget::Node(_) => f.debug_tuple("Node").field(&hosts[0]).finish(),
            RedisTarget::Cluster(_) => f.debug_tuple("Cluster").field(&hosts).finish(),
        }
    }
}

/// `host:port` of a Redis URL, without its scheme, credentials, database or query.
pub(crate) fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    rest.split(['/', '?']).next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_shows_hosts_never_passwords() {
        let target = RedisTarget::cluster(["redis://:hunter2@10.0.0.1:7000/0", "redis://h:7001"]);
        assert_eq!(
            format!("{target:?}"),
            r#"Cluster(["10.0.0.1:7000", "h:7001"])"#
        );
        let node = RedisTarget::from("rediss://user:pw@host:6380/2?protocol=3");
        assert_eq!(format!("{node:?}"), r#"Node("host:6380")"#);
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_cluster_needs_seeds_that_are_urls() {
        use crate::{FleetControl, RedisDedupeStore, RedisLoopStore, RedisRateLimitStore};

        let err = RedisDedupeStore::open(RedisTarget::cluster(Vec::<String>::new())).unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.url");
        let err = RedisRateLimitStore::open(["redis://127.0.0.1:7000/", "nope"]).unwrap_err();
        assert_eq!(err.field(), "rate_limit.redis.url[1]");
        assert!(RedisLoopStore::open(["redis://127.0.0.1:7000/"]).is_ok());
        let store = RedisDedupeStore::open(["redis://:pw@127.0.0.1:7000/"]).unwrap();
        let shown = format!("{store:?}");
        assert!(shown.contains(r#"cluster: ["127.0.0.1:7000"]"#), "{shown}");
        assert!(!shown.contains("pw"), "{shown}");
        let _ = FleetControl::builder(["redis://127.0.0.1:7000/"]);
    }

    #[cfg(not(feature = "cluster"))]
    #[test]
    fn a_cluster_needs_the_cluster_feature() {
        let err = crate::RedisDedupeStore::open(["redis://127.0.0.1:7000/"]).unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.url");
        assert!(err.to_string().contains("`cluster` feature"), "{err}");
    }
}
