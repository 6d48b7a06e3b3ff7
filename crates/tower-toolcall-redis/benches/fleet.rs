//! The shared stores' checks against a raw `EVALSHA` of an empty script, in the same run, on a
//! `redis-server` the bench starts on a free loopback port:
//! `cargo bench -p tower-toolcall-redis --bench fleet -- --warm-up-time 1 --measurement-time 3`,
//! then `python3 ../tower-toolcall/benches/medians.py fleet_latency raw_evalsha` and
//! `python3 ../tower-toolcall/benches/medians.py fleet_throughput raw_evalsha`.
//!
//! - `fleet_latency`: one call at a time — a raw `EVALSHA` of `return 0`, a call through
//!   `RateLimitLayer` over `RedisRateLimitStore` (the quota never runs out), and a call
//!   through `LoopDetectLayer` over `RedisLoopStore` (fresh params, never a loop), both over
//!   a bare tool. Every row makes the three calls in turn and times its own, so that the
//!   three see the same machine.
//! - `fleet_throughput`: 10,000 calls at once on a 2-worker runtime, every one over the same
//!   multiplexed connection; the time for the batch.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

fn fleet(c: &mut Criterion) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use serde_json::json;
    use tower::util::BoxCloneService;
    use tower::{Layer, ServiceExt};
    use tower_toolcall::loop_detect::LoopDetectLayer;
    use tower_toolcall::registry::ToolRegistry;
    use tower_toolcall::shared_store::FailurePolicy;
    use tower_toolcall::{tool_fn, RateLimitLayer, ToolCall, ToolError, ToolOutput};
    use tower_toolcall_redis::RedisLoopStore;
    use tower_toolcall_redis::RedisRateLimitStore;
    use tower_toolcall_test::redis_server::RedisServer;

    const BATCH: usize = 10_000;
    type Svc = BoxCloneService<ToolCall, ToolOutput, ToolError>;

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let raw = runtime
        .block_on(
            redis::Client::open(server.url())
                .unwrap()
                .get_connection_manager(),
        )
        .unwrap();
    let empty = Arc::new(redis::Script::new("return 0"));
    let bare = || tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!(null))) });
    // Closed: a store that fails shows up as errors, not as fast figures.
    let rate_limited: Svc = BoxCloneService::new(
        RateLimitLayer::builder(ToolRegistry::open())
            .settings(
                tower_toolcall::registry::RateLimitSettings::default()
                    .with_per_second(1_000_000_000)
                    .with_burst(1_000_000_000),
            )
            .on_store_failure(FailurePolicy::Closed)
            .store(Arc::new(RedisRateLimitStore::open(server.url()).unwrap()))
            .build()
            .unwrap()
            .layer(bare()),
    );
    let loop_checked: Svc = BoxCloneService::new(
        LoopDetectLayer::builder(ToolRegistry::open())
            .on_store_failure(FailurePolicy::Closed)
            .store(Arc::new(RedisLoopStore::open(server.url()).unwrap()))
            .build()
            .unwrap()
            .layer(bare()),
    );
    let calls = AtomicU64::new(0);
    let next_call = || {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        ToolCall::builder("agents.tools.web", "search")
            .session(format!("sess-{}", n % 64))
            .actor("u")
            .params(json!({"n": n}))
            .build()
            .unwrap()
    };
    let raw_evalsha = {
        let raw = raw.clone();
        let empty = empty.clone();
        move || {
            let mut conn = raw.clone();
            let empty = empty.clone();
            async move {
                let zero: i64 = empty.invoke_async(&mut conn).await.unwrap();
                zero
            }
        }
    };
    runtime.block_on(raw_evalsha());

    /// How long `run` took.
    fn timed(run: impl FnOnce()) -> Duration {
        let started = Instant::now();
        run();
        started.elapsed()
    }

    // Each row makes the same three calls in turn, a rate-limit check, a loop check and a raw
    // `EVALSHA`, and counts the time of its own: every row sees the machine in the same state,
    // which on a virtual machine moves within seconds between a fast and a slow round trip.
    let mut group = c.benchmark_group("fleet_latency");
    for row in ["raw_evalsha", "rate_limit", "loop_detect"] {
        group.bench_function(row, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (rate_call, loop_call) = (next_call(), next_call());
                    let rate = timed(|| {
                        black_box(runtime.block_on(rate_limited.clone().oneshot(rate_call)))
                            .unwrap();
                    });
                    let looped = timed(|| {
                        black_box(runtime.block_on(loop_checked.clone().oneshot(loop_call)))
                            .unwrap();
                    });
                    let raw = timed(|| {
                        black_box(runtime.block_on(raw_evalsha()));
                    });
                    total += match row {
                        "raw_evalsha" => raw,
                        "rate_limit" => rate,
                        _ => looped,
                    };
                }
                total
            })
        });
    }
    group.finish();

    /// Runs `BATCH` futures at once on the runtime; the time they took together.
    fn batch<F>(runtime: &tokio::runtime::Runtime, make: impl Fn() -> F, iters: u64) -> Duration
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let futures: Vec<F> = (0..BATCH).map(|_| make()).collect();
            let started = Instant::now();
            runtime.block_on(async move {
                let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
                for task in tasks {
                    task.await.unwrap();
                }
            });
            total += started.elapsed();
        }
        total
    }

    let mut group = c.benchmark_group("fleet_throughput");
    group.sample_size(10);
    group.throughput(criterion::Throughput::Elements(BATCH as u64));
    group.bench_function("raw_evalsha", |b| {
        b.iter_custom(|iters| {
            batch(
                &runtime,
                || {
                    let eval = raw_evalsha();
                    async move {
                        black_box(eval.await);
                    }
                },
                iters,
            )
        })
    });
    for (name, svc) in [
        ("rate_limit", &rate_limited),
        ("loop_detect", &loop_checked),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                batch(
                    &runtime,
                    || {
                        let call = svc.clone().oneshot(next_call());
                        async move {
                            black_box(call.await.unwrap());
                        }
                    },
                    iters,
                )
            })
        });
    }
    group.finish();
    drop(server);
}

criterion_group!(benches, fleet);
criterion_main!(benches);
