//! The rate-limit cases of the core's tests, on Redis.
#![allow(dead_code, unused_imports)]

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;

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
            Store::Redis(server) => builder.store(Arc::new(
                tower_toolcall_redis::RedisRateLimitStore::open(server.url())
                    .expect("a valid store configuration"),
            )),
            #[cfg(feature = "cluster")]
            Store::Cluster(cluster) => builder.store(Arc::new(
                tower_toolcall_redis::RedisRateLimitStore::open(cluster.seeds())
                    .expect("a valid store configuration"),
            )),
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

/// A quota shared by replicas through a Redis Cluster.
#[cfg(feature = "cluster")]
mod on_cluster {
    use std::collections::BTreeSet;

    use super::*;
    use support::cluster::{key_slot, RedisCluster};
    use tower::ServiceExt;
    use tower_toolcall_redis::RedisRateLimitStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quota_of_ten_a_second_holds_at_ten_across_three_replicas_on_every_master() {
        let cluster = RedisCluster::start();
        let tool = ScriptedTool::always(Step::Ok);
        let stores: Vec<RedisRateLimitStore> = (0..3)
            .map(|_| RedisRateLimitStore::open(cluster.seeds()).unwrap())
            .collect();
        let services: Vec<_> = stores
            .iter()
            .map(|store| {
                RateLimitLayer::builder(registry_of([limited(
                    10,
                    RateLimitKey::ToolSession,
                    OnLimit::Reject,
                )]))
                .store(Arc::new(store.clone()))
                .build()
                .unwrap()
                .layer(tool.service())
            })
            .collect();
        // One session's quota on each master's slot range.
        let mut sessions: Vec<String> = Vec::new();
        let mut ranges = BTreeSet::new();
        for n in 0.. {
            let session = format!("session-{n}");
            let key = stores[0].quota_key(&format!("{WEB}::search\u{1f}{session}"));
            if ranges.insert(usize::from(key_slot(&key)) * 3 / 16384) {
                sessions.push(session);
            }
            if sessions.len() == 3 {
                break;
            }
        }

        // Each replica sends each session's call every 20 ms for 6 s: 150 a second per
        // session, against a quota of 10.
        let start = tokio::time::Instant::now();
        let run_for = Duration::from_secs(6);
        let mut senders = Vec::new();
        for session in &sessions {
            for svc in &services {
                let (svc, session) = (svc.clone(), session.clone());
                senders.push(tokio::spawn(async move {
                    let mut allowed = Vec::new();
                    let mut ticks = tokio::time::interval(Duration::from_millis(20));
                    while start.elapsed() < run_for {
                        ticks.tick().await;
                        match svc.clone().oneshot(in_session(&session)).await {
                            Ok(_) => allowed.push(start.elapsed()),
                            Err(error) => assert_eq!(error.code(), ErrorCode::RateLimited),
                        }
                    }
                    (session, allowed)
                }));
            }
        }
        let mut per_session: std::collections::BTreeMap<String, Vec<Duration>> = Default::default();
        for sender in senders {
            let (session, allowed) = sender.await.unwrap();
            per_session.entry(session).or_default().extend(allowed);
        }
        for (session, allowed) in &per_session {
            // Past the first second (the burst), 5 s of steady flow.
            let steady = allowed
                .iter()
                .filter(|at| **at >= Duration::from_secs(1) && **at < run_for)
                .count();
            println!("{session}: {steady} calls allowed in 5 s across 3 replicas");
            assert!(
                (45..=55).contains(&steady),
                "{session}: {steady} calls in 5 s, expected 50 ± 5 (10 ± 1 a second)"
            );
        }
        assert_eq!(
            tool.calls(),
            per_session.values().map(Vec::len).sum::<usize>()
        );
    }
}
