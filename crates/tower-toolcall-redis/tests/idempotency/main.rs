//! The idempotency cases of the core's tests (`cases.rs`, `derived.rs`), written once, on
//! `RedisDedupeStore` over a real `redis-server` that each test starts on a free loopback
//! port (real time, short TTLs); and what only the Redis store does.
#![allow(dead_code, unused_imports)]

#[path = "../support/mod.rs"]
mod support;

mod redis_backend {
    use super::*;
    use support::redis_server::RedisServer;
    use tower_toolcall_redis::RedisDedupeStore;

    pub(crate) struct Redis {
        pub(crate) server: Mutex<RedisServer>,
        url: String,
    }

    impl Redis {
        pub(crate) fn start() -> Redis {
            let server = RedisServer::start();
            let url = server.url();
            Redis {
                server: Mutex::new(server),
                url,
            }
        }

        pub(crate) fn replica(&self, operation_timeout: Duration) -> RedisDedupeStore {
            RedisDedupeStore::builder(self.url.as_str())
                .operation_timeout(operation_timeout)
                .build()
                .expect("a valid store configuration")
        }
    }

    impl Backend for Redis {
        type Store = RedisDedupeStore;

        fn store(&self) -> RedisDedupeStore {
            self.replica(Duration::from_secs(2))
        }

        fn elapse(&self, by: Duration) -> impl Future<Output = ()> + Send {
            tokio::time::sleep(by)
        }

        fn time(&self, nominal: Duration) -> Duration {
            nominal.min(Duration::from_millis(400))
        }

        fn exact_time(&self) -> bool {
            false
        }
    }
}

/// The same cases on a Redis Cluster of the test's own.
#[cfg(feature = "cluster")]
mod cluster_backend {
    use super::*;
    use support::cluster::RedisCluster;
    use tower_toolcall_redis::RedisDedupeStore;

    pub(crate) struct Cluster {
        pub(crate) cluster: Arc<Mutex<RedisCluster>>,
        seeds: Vec<String>,
    }

    impl Cluster {
        pub(crate) fn start() -> Cluster {
            let cluster = RedisCluster::start();
            let seeds = cluster.seeds();
            Cluster {
                cluster: Arc::new(Mutex::new(cluster)),
                seeds,
            }
        }

        pub(crate) fn replica(&self, operation_timeout: Duration) -> RedisDedupeStore {
            RedisDedupeStore::builder(self.seeds.clone())
                .operation_timeout(operation_timeout)
                .build()
                .expect("a valid store configuration")
        }
    }

    impl Backend for Cluster {
        type Store = RedisDedupeStore;

        fn store(&self) -> RedisDedupeStore {
            self.replica(Duration::from_secs(2))
        }

        fn elapse(&self, by: Duration) -> impl Future<Output = ()> + Send {
            tokio::time::sleep(by)
        }

        fn time(&self, nominal: Duration) -> Duration {
            nominal.min(Duration::from_millis(400))
        }

        fn exact_time(&self) -> bool {
            false
        }
    }
}

/// Runs each case of the core's suite on Redis, and on a Redis Cluster.
macro_rules! store_suite {
    ($($case:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::redis_backend::Redis::start()).await;
                }
            )*
        }

        #[cfg(feature = "cluster")]
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::cluster_backend::Cluster::start()).await;
                }
            )*
        }
    };
}

// ---------------------------------------------------------------------------------------------
// The Redis store only

mod redis_only {
    use super::redis_backend::Redis;
    use super::*;
    use tower_toolcall::idempotency::StoreError;
    use tower_toolcall_redis::RedisDedupeStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_replicas_run_the_tool_once_and_wake_waiters_by_pubsub() {
        let redis = Redis::start();
        let tool = MockTool::echo(Duration::from_millis(400));
        let replicas = [redis.store(), redis.store()];
        let layers = replicas
            .clone()
            .map(|store| layer(store, ToolPolicy::default()));
        let services = layers.clone().map(|l| over(&l, &tool));
        let params = json!({"path": "XYZ/Foo.md"});
        let calls: Vec<_> = (0..50)
            .map(|i| {
                let svc = services[i % 2].clone();
                let call = call("sess-42", params.clone()).build().unwrap();
                tokio::spawn(async move { svc.oneshot(call).await })
            })
            .collect();
        let mut outputs = Vec::new();
        for handle in calls {
            outputs.push(handle.await.unwrap().unwrap());
        }
        assert_eq!(tool.runs(), 1, "one execution across both replicas");
        assert!(outputs.iter().all(|o| o.content == outputs[0].content));
        assert_eq!(outputs.iter().filter(|o| o.record().from_cache).count(), 49);

        let joins: u64 = layers.iter().map(|l| l.stats().inflight_joins).sum();
        let hits: u64 = layers.iter().map(|l| l.stats().completed_hits).sum();
        assert_eq!(joins + hits, 49);
        assert!(joins > 0);
        for (replica, layer) in replicas.iter().zip(&layers) {
            let stats = replica.stats();
            assert!(
                stats.fallback_polls <= layer.stats().inflight_joins,
                "at most one fallback poll per waiter: {stats:?}"
            );
        }
        let wakeups: u64 = replicas.iter().map(|r| r.stats().pubsub_wakeups).sum();
        assert!(wakeups >= 1, "waiters were woken by pub/sub");
        let polls: u64 = replicas.iter().map(|r| r.stats().fallback_polls).sum();
        assert_eq!(polls, 0, "nothing was lost, so nobody polled");

        // Every waiter unsubscribed again.
        let mut left = usize::MAX;
        for _ in 0..100 {
            left = replicas.iter().map(|r| r.stats().subscribed_channels).sum();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_server_fails_closed_or_open_and_recovers_after_restart() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::ZERO);
        let closed = over(&layer(store.clone(), ToolPolicy::default()), &tool);
        let open = over(
            &layer(
                store.clone(),
                policy(IdempotencySettings::default().with_on_store_error(OnStoreError::FailOpen)),
            ),
            &tool,
        );
        let deadline = Duration::from_secs(3);
        let make = |path: &str| call("sess-42", json!({"path": path})).build().unwrap();

        run(&closed, make("before.md")).await.unwrap();
        assert_eq!(tool.runs(), 1);

        redis.server.lock().unwrap().kill();
        let err = tokio::time::timeout(deadline, run(&closed, make("down.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);
        assert!(err.is_retriable() && err.is_not_processed());
        assert_eq!(tool.runs(), 1, "fail closed: the tool did not run");
        // A cached answer is not available either: no stale read, an honest refusal.
        let err = tokio::time::timeout(deadline, run(&closed, make("before.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);

        let out = tokio::time::timeout(deadline, run(&open, make("down.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap();
        assert!(!out.record().from_cache);
        assert_eq!(tool.runs(), 2, "fail open: the tool ran");

        redis.server.lock().unwrap().restart();
        let mut recovered = None;
        for _ in 0..100 {
            match tokio::time::timeout(deadline, run(&closed, make("after.md")))
                .await
                .expect("no hang past the deadline")
            {
                Ok(out) => {
                    recovered = Some(out);
                    break;
                }
                Err(err) => {
                    assert_eq!(err.code(), ErrorCode::StoreUnavailable);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let recovered = recovered.expect("calls work again after the restart");
        assert!(!recovered.record().from_cache);
        let cached = run(&closed, make("after.md")).await.unwrap();
        assert!(cached.record().from_cache, "the store keeps results again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_killed_while_the_tool_runs_returns_its_result_without_a_hang() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::from_millis(300));
        let idem = layer(store, ToolPolicy::default());
        let svc = over(&idem, &tool);
        let running = tokio::spawn(run_owned(
            svc.clone(),
            call("sess-42", json!({"path": "a.md"})).build().unwrap(),
        ));
        tool.started.notified().await;
        redis.server.lock().unwrap().kill();
        let out = tokio::time::timeout(Duration::from_secs(3), running)
            .await
            .expect("no hang past the deadline")
            .unwrap()
            .unwrap();
        assert_eq!(
            out.content["run"], 1,
            "the tool's result reaches its caller"
        );
        assert_eq!(
            idem.stats().store_errors,
            1,
            "the result could not be stored"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_share_a_cluster_slot_with_their_channel() {
        let store = RedisDedupeStore::open("redis://127.0.0.1:1/").unwrap();
        let key = store.record_key("acme/vault::createFile/g/k%7B1%7D");
        assert_eq!(key, "toolcall:idem:{acme/vault::createFile/g/k%7B1%7D}");
        let err = RedisDedupeStore::builder("redis://127.0.0.1:1/")
            .key_prefix("bad{prefix")
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.key_prefix");
        let err = RedisDedupeStore::open("http://nope").unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.url");
        // A server nobody listens on: an error within the timeout, never a hang.
        let store = RedisDedupeStore::builder("redis://127.0.0.1:1/")
            .operation_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(2), store.ping())
            .await
            .expect("bounded by the operation timeout")
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The Redis store: claims whose answer never came, and the commands a call costs

mod redis_unanswered_claims_and_round_trips {
    use super::redis_backend::Redis;
    use super::*;
    use tower_toolcall::idempotency::StoreError;
    use tower_toolcall_redis::RedisDedupeStore;

    /// How long a test lets a call run before it counts its claim as sent to a frozen server.
    const CLAIM_ON_ITS_WAY: Duration = Duration::from_millis(100);

    /// A call of the tool whose key is `name`'s own.
    fn make(name: &str) -> ToolCall {
        call("sess-42", json!({"path": name})).build().unwrap()
    }

    /// Connects the store and loads its scripts: a fresh key and a hit of another key.
    async fn warm_up(svc: &impl ToolStack) {
        for _ in 0..2 {
            run(svc, make("warm-up.md")).await.unwrap();
        }
    }

    /// Asserts that the record of `key` soon leaves the key free: gone, or cancelled; never
    /// in flight with nobody to hold it.
    async fn assert_key_freed(store: &impl DedupeStore, key: &str) {
        let mut record = None;
        for _ in 0..50 {
            record = store.get(key).await.unwrap();
            if record
                .as_ref()
                .is_none_or(|r| r.state == RecordState::Cancelled)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the key is still held by a claim nobody owns: {record:?}");
    }

    /// Waits (at most 3 s) until `store` answers again: after an operation timed out, the
    /// store skips its server until a probe finds it back.
    async fn until_answers(store: &RedisDedupeStore) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while store.ping().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the store did not come back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `call`'s result within half a second: a free key, not one that waits for a lease.
    async fn promptly(
        call: impl Future<Output = Result<ToolOutput, ToolError>>,
    ) -> Result<ToolOutput, ToolError> {
        tokio::time::timeout(Duration::from_millis(500), call)
            .await
            .expect("the duplicate was answered at once, not after the lease")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caller_dropped_while_its_claim_is_unanswered_frees_the_key() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_secs(1));
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(store.clone(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        let key = idem.store_key(&make("a.md")).unwrap().unwrap();
        warm_up(&svc).await;

        redis.server.lock().unwrap().freeze();
        let first = tokio::spawn(run_owned(svc.clone(), make("a.md")));
        tokio::time::sleep(CLAIM_ON_ITS_WAY).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        redis.server.lock().unwrap().resume();

        assert_key_freed(&store, &key).await;
        let out = promptly(run(&svc, make("a.md"))).await.unwrap();
        assert_eq!(tool.runs(), 2, "the duplicate ran the tool");
        assert!(!out.record().from_cache);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_that_timed_out_is_released_and_the_retry_runs_at_once() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(store.clone(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        let key = idem.store_key(&make("a.md")).unwrap().unwrap();
        warm_up(&svc).await;

        redis.server.lock().unwrap().freeze();
        let err = run(&svc, make("a.md")).await.unwrap_err();
        redis.server.lock().unwrap().resume();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);
        assert!(err.is_retriable() && err.is_not_processed());
        assert_eq!(tool.runs(), 1, "the tool did not run");

        until_answers(&store).await;
        assert_key_freed(&store, &key).await;
        let out = promptly(run(&svc, make("a.md"))).await.unwrap();
        assert_eq!(tool.runs(), 2, "the retry ran the tool");
        assert!(!out.record().from_cache);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_that_timed_out_against_a_held_key_leaves_its_holder_alone() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let request = claim_request("/vault::createFile/g/k", "d1", Duration::from_secs(120));
        let ClaimOutcome::Claimed(holder) = store.claim(&request).await.unwrap() else {
            panic!("a fresh key is claimed");
        };

        redis.server.lock().unwrap().freeze();
        let err = store.claim(&request).await.unwrap_err();
        redis.server.lock().unwrap().resume();
        assert!(
            matches!(err, StoreError::Timeout(_) | StoreError::Unavailable(_)),
            "{err}"
        );

        // The claim that timed out was never applied: its release leaves the holder's record.
        until_answers(&store).await;
        let record = store.get(&request.key).await.unwrap().unwrap();
        assert_eq!(
            (record.state, record.version),
            (RecordState::Inflight, holder.version)
        );
        let finalized = store
            .finalize(&holder, done(json!({"ok": true}), Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(
            finalized,
            Finalized::Written,
            "the holder still holds the key"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fresh_key_costs_two_commands_and_a_hit_one() {
        let redis = Redis::start();
        let mut monitor = redis.server.lock().unwrap().monitor();
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(redis.store(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        warm_up(&svc).await;
        monitor.take_commands();

        let names = ["a.md", "b.md", "c.md", "d.md", "e.md"];
        for name in names {
            assert!(!run(&svc, make(name)).await.unwrap().record().from_cache);
        }
        assert_eq!(
            monitor.take_commands(),
            ["SET", "EVALSHA"].repeat(names.len()),
            "a fresh key: the claim, then the finalize"
        );
        for name in names {
            assert!(run(&svc, make(name)).await.unwrap().record().from_cache);
        }
        assert_eq!(
            monitor.take_commands(),
            ["SET"].repeat(names.len()),
            "a hit: the claim alone"
        );
        assert_eq!(tool.runs(), 1 + names.len());
    }
}

include!("../../../tower-toolcall/tests/idempotency/cases.rs");

#[cfg(feature = "cluster")]
mod on_cluster;

#[path = "../../../tower-toolcall/tests/idempotency/derived.rs"]
mod derived;
