//! The loop-detection cases of the core's tests, on `RedisLoopStore`.
#![allow(dead_code, unused_imports)]

#[path = "../support/mod.rs"]
mod support;

use support::store_suite;

/// Where the sessions' histories are kept: the core's cases run here on Redis.
enum Store {
    Redis(support::redis_server::RedisServer),
    #[cfg(feature = "cluster")]
    Cluster(support::cluster::RedisCluster),
}

impl Store {
    fn builder(
        &self,
        registry: ToolRegistry,
    ) -> tower_toolcall::loop_detect::LoopDetectLayerBuilder {
        let builder = LoopDetectLayer::builder(registry)
            .on_store_failure(tower_toolcall::shared_store::FailurePolicy::Closed);
        match self {
            Store::Redis(server) => builder.store(
                tower_toolcall_redis::RedisLoopStore::open(&server.url())
                    .expect("a valid store configuration"),
            ),
            #[cfg(feature = "cluster")]
            Store::Cluster(cluster) => builder.store(
                tower_toolcall_redis::RedisLoopStore::open(cluster.seeds())
                    .expect("a valid store configuration"),
            ),
        }
    }
}

include!("../../../tower-toolcall/tests/loop_detect/cases.rs");
