//! Per-call overhead of `LoopDetectLayer` over the bare tool, with 200-byte params.
//!
//! Run with `cargo bench -p tower-toolcall --bench loop_detect -- --warm-up-time 1 --measurement-time 3`.
//!
//! Each group measures the bare tool and the layered tool on the same calls, built outside
//! the timed part:
//!
//! - `pass/fresh`: every call has new params, so the layer pays for canonicalizing them;
//! - `pass/cached`: the params' canonical form was computed before (as when validation or
//!   an earlier layer asked for it);
//! - `block/fresh` and `block/cached`: the session is looping and every call is refused;
//! - `memory_store` beside `loop_detect` in each group: the same layer with
//!   `InMemoryLoopStore`, which judges through the `LoopStore` trait as a shared store does
//!   (what the layer's default would cost on that path);
//! - `with_idempotency`: `IdempotencyLayer` (in-memory store, derived keys) alone, and with
//!   `LoopDetectLayer` in front of it as in the full stack: the idempotency key is derived
//!   from the canonical form loop detection computed, so the pair canonicalizes once and the
//!   difference is what loop detection adds.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use futures::FutureExt;
use serde_json::{json, Value};
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::canonical::{canonical_json, CanonicalOptions};
use tower_toolcall::idempotency::IdempotencyLayer;
use tower_toolcall::loop_detect::{InMemoryLoopStore, LoopDetectLayer};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{tool_fn, Params, ToolCall, ToolError, ToolOutput};

/// Params whose canonical JSON is about 200 bytes; `n` makes them distinct.
fn params(n: u64) -> Value {
    json!({
        "query": "rust tower middleware retry budget",
        "filters": {"site": "docs.rs", "lang": "en", "year": 2024},
        "include": ["title", "url", "snippet"],
        "limit": 25,
        "offset": n,
        "safe": true,
        "clientTs": 1_734_372_720_000_u64,
    })
}

fn call(n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-bench")
        .actor("user-7")
        .params(params(n))
        .build()
        .expect("a valid call")
}

fn cached(call: ToolCall) -> ToolCall {
    call.params()
        .canonical(&CanonicalOptions::default())
        .expect("canonical params");
    call
}

/// A tool that answers at once.
fn bare_tool() -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    tool_fn(|_call: ToolCall| std::future::ready(Ok(ToolOutput::new(Value::Null))))
}

/// Drives one call of an always-ready service to its end.
fn run<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready()
        .now_or_never()
        .expect("always ready")
        .expect("ready");
    svc.call(call).now_or_never().expect("answers at once")
}

/// Benchmarks `svc` on calls made by `make`, one per iteration. The calls are made, and
/// dropped, outside the timed part; the timed part passes the service a clone (one reference
/// count).
fn bench<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut svc: S,
    make: impl Fn() -> ToolCall,
) where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    group.bench_function(name, |b| {
        b.iter_batched_ref(
            &make,
            |call| black_box(run(&mut svc, call.clone())),
            BatchSize::SmallInput,
        )
    });
}

fn pass(c: &mut Criterion) {
    let canonical_len = canonical_json(&params(1_000_000), &CanonicalOptions::default())
        .unwrap()
        .len();
    eprintln!("canonical params: {canonical_len} bytes");

    let next = AtomicU64::new(0);
    let fresh = || call(next.fetch_add(1, Ordering::Relaxed));
    let warmed = || cached(fresh());
    let layer = || LoopDetectLayer::new(ToolRegistry::open());

    let mut group = c.benchmark_group("pass/fresh");
    bench(&mut group, "bare", bare_tool(), fresh);
    bench(&mut group, "loop_detect", layer().layer(bare_tool()), fresh);
    bench(
        &mut group,
        "memory_store",
        stored().layer(bare_tool()),
        fresh,
    );
    group.finish();

    let mut group = c.benchmark_group("pass/cached");
    bench(&mut group, "bare", bare_tool(), warmed);
    bench(
        &mut group,
        "loop_detect",
        layer().layer(bare_tool()),
        warmed,
    );
    bench(
        &mut group,
        "memory_store",
        stored().layer(bare_tool()),
        warmed,
    );
    group.finish();

    let idempotency = || IdempotencyLayer::in_memory(ToolRegistry::open());
    let mut group = c.benchmark_group("with_idempotency/fresh");
    bench(
        &mut group,
        "idempotency",
        idempotency().layer(bare_tool()),
        fresh,
    );
    bench(
        &mut group,
        "loop_detect+idempotency",
        layer().layer(idempotency().layer(bare_tool())),
        fresh,
    );
    group.finish();
}

/// The layer with `InMemoryLoopStore`.
fn stored() -> LoopDetectLayer {
    LoopDetectLayer::builder(ToolRegistry::open())
        .store(Arc::new(InMemoryLoopStore::new()))
        .build()
        .expect("a valid configuration")
}

fn block(c: &mut Criterion) {
    let layer = || LoopDetectLayer::new(ToolRegistry::open());
    // A session that is looping: every further identical call is refused.
    let looping = |layer: LoopDetectLayer| {
        let mut svc = layer.layer(bare_tool());
        for _ in 0..3 {
            run(&mut svc, call(0)).expect("below the threshold");
        }
        assert!(run(&mut svc, call(0)).is_err(), "the session is looping");
        svc
    };
    let same = call(0);
    let fresh = || call(0);
    let warmed = || cached(same.clone());

    let mut group = c.benchmark_group("block/fresh");
    bench(&mut group, "bare", bare_tool(), fresh);
    bench(&mut group, "loop_detect", looping(layer()), fresh);
    bench(&mut group, "memory_store", looping(stored()), fresh);
    group.finish();

    let mut group = c.benchmark_group("block/cached");
    bench(&mut group, "bare", bare_tool(), warmed);
    bench(&mut group, "loop_detect", looping(layer()), warmed);
    bench(&mut group, "memory_store", looping(stored()), warmed);
    group.finish();
}

/// What canonicalizing the params costs by itself, for reference.
fn canonical(c: &mut Criterion) {
    let options = CanonicalOptions::default();
    let value = params(7);
    let mut group = c.benchmark_group("canonical");
    group.bench_function("canonical_json", |b| {
        b.iter(|| black_box(canonical_json(black_box(&value), &options)))
    });
    group.bench_function("params_first_use", |b| {
        b.iter_batched_ref(
            || Params::from_value(value.clone()).expect("an object"),
            |params| black_box(params.canonical(&options).map(|c| c.len())),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = canonical, pass, block
}
criterion_main!(benches);
