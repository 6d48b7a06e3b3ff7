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
            Store::Redis(server) => builder.store(Arc::new(
                tower_toolcall_redis::RedisLoopStore::open(server.url())
                    .expect("a valid store configuration"),
            )),
            #[cfg(feature = "cluster")]
            Store::Cluster(cluster) => builder.store(Arc::new(
                tower_toolcall_redis::RedisLoopStore::open(cluster.seeds())
                    .expect("a valid store configuration"),
            )),
        }
    }
}

include!("../../../tower-toolcall/tests/loop_detect/cases.rs");

/// A session whose calls are spread over replicas that share a Redis Cluster.
#[cfg(feature = "cluster")]
mod on_cluster {
    use super::*;
    use support::cluster::{key_slot, RedisCluster};
    use support::redis_server::RedisServer;
    use tower_toolcall_redis::RedisLoopStore;

    /// How many of `pattern`'s calls, repeated in `session` and sent in turn to each of
    /// `layers`, reach the tool before the first is refused as a loop.
    async fn calls_before_the_loop_is_stopped(
        layers: &[LoopDetectLayer],
        session: &str,
        pattern: &[Value],
    ) -> usize {
        let counter = Counter::default();
        let mut services: Vec<_> = layers.iter().map(|l| stack(l.clone(), &counter)).collect();
        let replicas = services.len();
        for n in 0..100 {
            let call = search(session, pattern[n % pattern.len()].clone());
            match send(&mut services[n % replicas], call).await {
                Ok(_) => {}
                Err(error) => {
                    assert_eq!(error.code(), ErrorCode::LoopDetected, "{error}");
                    assert_eq!(counter.get(), n);
                    return n;
                }
            }
        }
        panic!("the loop was never stopped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loop_spread_over_three_replicas_stops_where_it_stops_on_one_node() {
        let cluster = RedisCluster::start();
        let node = RedisServer::start();
        let on_cluster: Vec<LoopDetectLayer> = (0..3)
            .map(|_| {
                LoopDetectLayer::builder(ToolRegistry::open())
                    .store(Arc::new(RedisLoopStore::open(cluster.seeds()).unwrap()))
                    .build()
                    .unwrap()
            })
            .collect();
        let on_node = [LoopDetectLayer::builder(ToolRegistry::open())
            .store(Arc::new(RedisLoopStore::open(node.url()).unwrap()))
            .build()
            .unwrap()];
        let in_memory = [LoopDetectLayer::builder(ToolRegistry::open())
            .build()
            .unwrap()];
        let probe = RedisLoopStore::open(cluster.seeds()).unwrap();
        let patterns: [&[Value]; 3] = [
            &[json!({"query": "same"})],
            &[json!({"query": "a"}), json!({"query": "b"})],
            &[
                json!({"query": "a"}),
                json!({"query": "b"}),
                json!({"query": "c"}),
            ],
        ];
        let mut ranges = std::collections::BTreeSet::new();
        for (index, pattern) in patterns.iter().enumerate() {
            // Sessions on every third of the slots, so on every master.
            for third in 0..3 {
                let session = (0..)
                    .map(|n| format!("sess-{index}-{n}"))
                    .find(|s| usize::from(key_slot(&probe.session_key(s))) * 3 / 16384 == third)
                    .unwrap();
                ranges.insert(third);
                let spread = calls_before_the_loop_is_stopped(&on_cluster, &session, pattern).await;
                let one_node = calls_before_the_loop_is_stopped(&on_node, &session, pattern).await;
                let memory = calls_before_the_loop_is_stopped(&in_memory, &session, pattern).await;
                assert_eq!(
                    (spread, one_node),
                    (memory, memory),
                    "pattern {index} in {session}: the same count on a cluster, a node and in memory"
                );
            }
        }
        assert_eq!(ranges.len(), 3);
    }
}
