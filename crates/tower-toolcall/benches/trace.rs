//! Run with: `cargo bench -p tower-toolcall --features metrics --bench trace`
//!
//! The cost of `TraceLayer` over the bare tool: with no subscriber, with a JSON subscriber
//! writing to a sink, with metrics recorded; and the whole stack of layers with tracing,
//! 200-byte params and the in-memory store, against the bare tool. Calls are built outside the
//! timed part; each has params of its own.
//!
//! The whole stack is measured four ways. In `stack`, calls are built in batches of 64 just before
//! they are made, as a gateway makes a call it has just parsed (as the idempotency bench
//! does). In `stack_batched`, criterion's `SmallInput` builds thousands of calls ahead of a
//! batch, so each call is cold in the cache when it is made; the bare tool never reads the
//! call, so that figure also counts the cache misses of reading it. In `stack_small_store`, the
//! store holds 64 records instead of 25 000, so the record each fresh key evicts is still in
//! the cache: the difference is what evicting a cold record costs. In `stack_registered`, the
//! tool is registered in a closed registry of 21 tools instead of called through an open one.
//! `stack_parts` takes the stack apart in one run: the stack less each layer in turn, over a
//! small store, and what SPEC §4 makes every fresh call compute (the canonical params, their
//! digest and the derived key) on the bare tool.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use futures::FutureExt;
use serde_json::{json, Value};
use tower::{Layer, Service};
use tower_toolcall::canonical::{canonical_json, derive_key, params_digest, CanonicalOptions};
use tower_toolcall::idempotency::InMemoryDedupeStore;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::stack::StackLayer;
use tower_toolcall::trace::{ToolMetrics, TraceLayer};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};

fn call(n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-bench")
        .actor("user-7")
        .params(json!({
            "query": "tower middleware retry with exponential backoff",
            "limit": 10,
            "offset": n,
            "safe": true,
            "region": "eu-west-1",
            "filters": {"lang": "en", "site": "docs.rs", "after": "2024-01-01", "kind": "article"}
        }))
        .build()
        .unwrap()
}

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

fn bench<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    batches: BatchSize,
    mut svc: S,
) where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let mut n = 0;
    group.bench_function(name, |b| {
        b.iter_batched_ref(
            || {
                n += 1;
                call(n)
            },
            |call| {
                let out = svc
                    .call(call.clone())
                    .now_or_never()
                    .expect("ready at once");
                black_box(out.expect("success"))
            },
            batches,
        )
    });
}

/// Calls built in small batches just before they are made: warm in the cache.
const FRESH: BatchSize = BatchSize::NumIterations(64);

fn trace(c: &mut Criterion) {
    let registry = ToolRegistry::open();
    let mut group = c.benchmark_group("trace");
    bench(&mut group, "bare", BatchSize::SmallInput, bare_tool());
    bench(
        &mut group,
        "no_subscriber",
        BatchSize::SmallInput,
        TraceLayer::new().layer(bare_tool()),
    );

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        bench(
            &mut group,
            "metrics",
            BatchSize::SmallInput,
            TraceLayer::new()
                .on_event(ToolMetrics::new(&registry))
                .layer(bare_tool()),
        );
    });

    let json = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(json, || {
        bench(
            &mut group,
            "json_subscriber",
            BatchSize::SmallInput,
            TraceLayer::new().layer(bare_tool()),
        );
    });
    group.finish();
}

/// The whole stack, in the recommended order, as a gateway would run it. It runs before the
/// groups that install subscribers: a subscriber that has been installed leaves the interest
/// it registered in the call sites it saw, and the stack would pay for it afterwards.
fn whole_stack(c: &mut Criterion) {
    let registry = ToolRegistry::open();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let stack = |registry: &ToolRegistry, store: InMemoryDedupeStore| {
        ToolStack::builder(registry.clone())
            .store(Arc::new(store))
            .build()
            .unwrap()
            .layer(bare_tool())
    };
    // The default store holds 25 000 records: each fresh key evicts the least recently used
    // one, whose memory is cold. A store of 64 records evicts records still in the cache.
    let small_store = InMemoryDedupeStore::builder().capacity(64).build().unwrap();
    let mut group = c.benchmark_group("stack_small_store");
    bench(&mut group, "bare", FRESH, bare_tool());
    bench(
        &mut group,
        "whole_stack",
        FRESH,
        stack(&registry, small_store),
    );
    group.finish();
    for (group, batches) in [("stack", FRESH), ("stack_batched", BatchSize::SmallInput)] {
        let mut group = c.benchmark_group(group);
        bench(&mut group, "bare", batches, bare_tool());
        bench(
            &mut group,
            "whole_stack",
            batches,
            stack(&registry, InMemoryDedupeStore::new()),
        );
        group.finish();
    }
    stack_parts(c, &registry, &stack);
    // A closed registry in which the tool is one of 21: each layer finds the tool's policy.
    let mut group = c.benchmark_group("stack_registered");
    bench(&mut group, "bare", FRESH, bare_tool());
    let registered = (0..20)
        .fold(ToolRegistry::builder(), |builder, i| {
            builder.tool(ToolDescriptor::new(
                "agents.tools.web",
                format!("tool{i}"),
                RiskLevel::ReadOnly,
            ))
        })
        .tool(ToolDescriptor::new(
            "agents.tools.web",
            "search",
            RiskLevel::ReadOnly,
        ))
        .build()
        .unwrap();
    bench(
        &mut group,
        "whole_stack",
        FRESH,
        stack(&registered, InMemoryDedupeStore::new()),
    );
    group.finish();
}

/// Where the whole stack's cost lies, in one run: the stack less each layer in turn, the stack
/// over a small store (no cold record to evict), and, on the bare tool, what SPEC §4 makes
/// every fresh call compute whatever the code around it (the canonical params alone, then
/// with the params digest and the derived key).
fn stack_parts<S>(
    c: &mut Criterion,
    registry: &ToolRegistry,
    stack: &impl Fn(&ToolRegistry, InMemoryDedupeStore) -> S,
) where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let mut group = c.benchmark_group("stack_parts");
    bench(&mut group, "bare", FRESH, bare_tool());
    bench(
        &mut group,
        "whole_stack",
        FRESH,
        stack(registry, InMemoryDedupeStore::new()),
    );
    let small_store = InMemoryDedupeStore::builder().capacity(64).build().unwrap();
    bench(
        &mut group,
        "small_store",
        FRESH,
        stack(registry, small_store),
    );
    for (name, layer) in [
        ("without_trace", StackLayer::Trace),
        ("without_validate", StackLayer::Validate),
        ("without_loop_detect", StackLayer::LoopDetect),
        ("without_rate_limit", StackLayer::RateLimit),
        ("without_idempotency", StackLayer::Idempotency),
        ("without_retry", StackLayer::Retry),
        ("without_circuit_breaker", StackLayer::CircuitBreaker),
        ("without_timeout", StackLayer::Timeout),
    ] {
        let without = ToolStack::builder(registry.clone())
            .without(layer)
            .build()
            .unwrap()
            .layer(bare_tool());
        bench(&mut group, name, FRESH, without);
    }
    bench(&mut group, "canonical_params", FRESH, spec_keys_tool(false));
    bench(&mut group, "spec_keys", FRESH, spec_keys_tool(true));
    group.finish();
}

/// The bare tool that first writes the params' canonical JSON and, with `digests`, the params
/// digest `hex(sha256(canonical))` and the derived key
/// `hex(sha256(namespace::name::canonical::session::actor))`: what SPEC §4 requires of a
/// fresh call.
fn spec_keys_tool(
    digests: bool,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> {
    let options = CanonicalOptions::default();
    tool_fn(move |call: ToolCall| {
        let canonical = canonical_json(call.params().as_value(), &options).expect("canonical");
        if digests {
            black_box(params_digest(&canonical));
            black_box(derive_key(
                call.tool_namespace(),
                call.tool_name(),
                &canonical,
                call.session_key(),
                call.actor_id(),
            ));
        }
        black_box(canonical);
        std::future::ready(Ok(ToolOutput::new(Value::Null)))
    })
}

criterion_group!(benches, whole_stack, trace);
criterion_main!(benches);
