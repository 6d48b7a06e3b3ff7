//! Run with: `cargo bench -p tower-toolcall --bench idempotency`
//! (then `python3 crates/tower-toolcall/benches/medians.py idempotency_memory`; `idempotency_redis` is a bench of
//! `tower-toolcall-redis`).
//!
//! The cost of `IdempotencyLayer` for a 200-byte params object and a derived key:
//!
//! - `idempotency_memory`: a fresh key (claim, run, finalize) and a cache hit on
//!   `InMemoryDedupeStore`, each against the bare tool call measured in the same run;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tower::Layer;
use tower_toolcall::canonical::{canonical_json, CanonicalOptions};
use tower_toolcall::idempotency::IdempotencyLayer;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall_test::dedupe_calls::*;

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
criterion_group!(benches, memory);
criterion_main!(benches);
