//! Run with: `cargo bench --all-features --bench idempotency`
//! (then `python3 benches/medians.py idempotency_memory` and
//! `python3 benches/medians.py idempotency_redis raw_set_nx_px`).
//!
//! The cost of `IdempotencyLayer` for a 200-byte params object and a derived key:
//!
//! - `idempotency_memory`: a fresh key (claim, run, finalize) and a cache hit on
//!   `InMemoryDedupeStore`, each against the bare tool call measured in the same run;
//! - `idempotency_redis` (feature `redis`): a fresh key and a cache hit on `RedisDedupeStore`
//!   against one raw `SET key value NX PX` round trip to the same server, on a connection
//!   of the same kind. The server is a `redis-server` the bench starts on a free loopback port.

use std::future::Future;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use futures::FutureExt;
use serde_json::{json, Value};
use tower::{Layer, Service};
use tower_toolcall::canonical::{canonical_json, CanonicalOptions};
use tower_toolcall::idempotency::IdempotencyLayer;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};

/// A typical search call: 200 bytes of canonical params; `n` makes its key fresh.
fn params(n: u64) -> Value {
    json!({
        "query": "tower middleware retry with exponential backoff",
        "limit": 10,
        "offset": n,
        "safe": true,
        "region": "eu-west-1",
        "filters": {"lang": "en", "site": "docs.rs", "after": "2024-01-01", "kind": "article"}
    })
}

fn call(n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(params(n))
        .build()
        .unwrap()
}

/// Calls with fresh keys, one per iteration.
fn fresh_calls() -> impl FnMut() -> ToolCall {
    let mut n = 1_000_000_000;
    move || {
        n += 1;
        call(n)
    }
}

fn bare_tool() -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send,
> + Clone
       + Send
       + 'static {
    tool_fn(|call: ToolCall| async move {
        Ok(ToolOutput::new(Value::Bool(
            call.params().as_map().is_empty(),
        )))
    })
}

/// Calls `svc` once; every future on the memory path is ready at its first poll.
fn call_once<S>(svc: &mut S, call: ToolCall) -> ToolOutput
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.call(call)
        .now_or_never()
        .expect("ready at once")
        .unwrap()
}

fn memory(c: &mut Criterion) {
    let canonical_len = canonical_json(&params(1_000_000_000), &CanonicalOptions::default())
        .unwrap()
        .len();
    assert!(
        (190..=210).contains(&canonical_len),
        "params are {canonical_len} bytes"
    );
    // The store starts its sweeper on the runtime it finds.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();

    let mut group = c.benchmark_group("idempotency_memory");
    let mut bare = bare_tool();
    let mut next = fresh_calls();
    group.bench_function("bare", |b| {
        b.iter_batched(
            &mut next,
            |call| black_box(call_once(&mut bare, call)),
            BatchSize::NumIterations(64),
        )
    });

    let layer = IdempotencyLayer::in_memory(ToolRegistry::open());
    let mut svc = layer.layer(bare_tool());
    group.bench_function("fresh", |b| {
        b.iter_batched(
            &mut next,
            |call| black_box(call_once(&mut svc, call)),
            BatchSize::NumIterations(64),
        )
    });

    let repeated = call(7);
    call_once(&mut svc, repeated.clone());
    assert!(call_once(&mut svc, repeated.clone()).record().from_cache);
    // A duplicate arrives as a call of its own: its params are canonicalized afresh.
    group.bench_function("hit", |b| {
        b.iter_batched(
            || call(7),
            |call| {
                let out = call_once(&mut svc, call);
                debug_assert!(out.record().from_cache);
                black_box(out)
            },
            BatchSize::NumIterations(64),
        )
    });
    group.finish();
}

#[cfg(feature = "redis")]
#[path = "../tests/support/redis_server.rs"]
#[allow(dead_code, unreachable_pub)]
mod redis_server;

#[cfg(feature = "redis")]
fn redis(c: &mut Criterion) {
    use redis_server::RedisServer;
    use tower::ServiceExt;
    use tower_toolcall::idempotency::RedisDedupeStore;

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisDedupeStore::open(&server.url()).unwrap();
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

    let layer = IdempotencyLayer::new(ToolRegistry::open(), store);
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

#[cfg(not(feature = "redis"))]
fn redis(_: &mut Criterion) {
    eprintln!("the Redis benchmarks need `--features redis`");
}

criterion_group!(benches, memory, redis);
criterion_main!(benches);
