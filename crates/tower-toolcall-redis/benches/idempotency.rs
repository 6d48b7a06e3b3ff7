//! Run with: `cargo bench -p tower-toolcall-redis --bench idempotency`
//! (then `python3 ../tower-toolcall/benches/medians.py idempotency_redis raw_set_nx_px`).
//!
//! The cost of `IdempotencyLayer` for a 200-byte params object and a derived key, on
//! `RedisDedupeStore` (`idempotency_redis`): a fresh key and a cache hit against one raw
//! `SET key value NX PX` round trip to the same server, on a connection of the same kind.
//! The server is a `redis-server` the bench starts on a free loopback port. The memory
//! store's run is the core's `idempotency` bench.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tower::Layer;
use tower_toolcall::idempotency::IdempotencyLayer;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall_test::dedupe_calls::*;

fn redis(c: &mut Criterion) {
    use tower::ServiceExt;
    use tower_toolcall_redis::RedisDedupeStore;
    use tower_toolcall_test::redis_server::RedisServer;

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisDedupeStore::open(server.url()).unwrap();
    runtime.block_on(store.ping()).unwrap();
    let raw = runtime
        .block_on(
            redis::Client::open(server.url())
                .unwrap()
                .get_connection_manager(),
        )
        .unwrap();
    // A value the size of an in-flight record.
    let value = "x".repeat(400);

    let mut group = c.benchmark_group("idempotency_redis");
    let mut n = 0u64;
    group.bench_function("raw_set_nx_px", |b| {
        b.iter_batched(
            || {
                n += 1;
                format!("raw:{{k{n}}}")
            },
            |key| {
                let mut conn = raw.clone();
                let set: Option<String> = runtime
                    .block_on(
                        redis::cmd("SET")
                            .arg(key)
                            .arg(&value)
                            .arg("NX")
                            .arg("PX")
                            .arg(120_000)
                            .query_async(&mut conn),
                    )
                    .unwrap();
                black_box(set)
            },
            BatchSize::NumIterations(64),
        )
    });

    let layer = IdempotencyLayer::new(ToolRegistry::open(), Arc::new(store));
    let svc = layer.layer(bare_tool());
    let mut next = fresh_calls();
    group.bench_function("fresh", |b| {
        b.iter_batched(
            &mut next,
            |call| black_box(runtime.block_on(svc.clone().oneshot(call)).unwrap()),
            BatchSize::NumIterations(64),
        )
    });

    let repeated = call(7);
    for _ in 0..2 {
        runtime
            .block_on(svc.clone().oneshot(repeated.clone()))
            .unwrap();
    }
    assert_eq!(layer.stats().completed_hits, 1);
    // A duplicate arrives as a call of its own: its params are canonicalized afresh.
    group.bench_function("hit", |b| {
        b.iter_batched(
            || call(7),
            |call| {
                let out = runtime.block_on(svc.clone().oneshot(call)).unwrap();
                debug_assert!(out.record().from_cache);
                black_box(out)
            },
            BatchSize::NumIterations(64),
        )
    });
    group.finish();
    drop(server);
}

criterion_group!(benches, redis);
criterion_main!(benches);
