//! The rate-limit cases of the core's tests, on Redis.
#![allow(dead_code, unused_imports)]

#[path = "../support/mod.rs"]
mod support;

/// Where the quotas are kept: the core's cases run here on Redis.
enum Store {
    /// A `redis-server` of the case's own, on the server's clock: time passes for real.
    Redis(support::redis_server::RedisServer),
    /// A Redis Cluster of the case's own, on its masters' clocks.
    #[cfg(feature = "cluster")]
    Cluster(support::cluster::RedisCluster),
}

impl Store {
    fn builder(&self, registry: ToolRegistry) -> tower_toolcall::rate_limit::RateLimitLayerBuilder {
        let builder = RateLimitLayer::builder(registry)
            .on_store_failure(tower_toolcall::shared_store::FailurePolicy::Closed);
        match self {
            Store::Redis(server) => builder.store(
                tower_toolcall_redis::RedisRateLimitStore::open(&server.url())
                    .expect("a valid store configuration"),
            ),
            #[cfg(feature = "cluster")]
            Store::Cluster(cluster) => builder.store(
                tower_toolcall_redis::RedisRateLimitStore::open(cluster.seeds())
                    .expect("a valid store configuration"),
            ),
        }
    }

    /// Lets `duration` pass on the store's clock.
    async fn advance(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    /// Asserts that `actual` is `expected`: exactly on paused time, and within 50 ms on the
    /// server's clock, where the calls themselves take time.
    fn assert_about(&self, actual: Duration, expected: Duration, what: &str) {
        assert!(
            actual.abs_diff(expected) <= Duration::from_millis(50),
            "{what}: {actual:?}, expected about {expected:?}"
        );
    }

    /// Asserts how many keys the in-memory limiter holds; Redis keys expire by themselves.
    fn assert_tracked_keys(&self, layer: &RateLimitLayer, tool: (&str, &str), _expected: usize) {
        let tracked = layer.tracked_keys(tool.0, tool.1);
        assert_eq!(tracked, 0, "no in-memory keys beside the store");
    }
}

include!("../../../tower-toolcall/tests/rate_limit/cases.rs");
