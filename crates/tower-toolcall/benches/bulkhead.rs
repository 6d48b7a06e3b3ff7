//! Run with: `cargo bench -p tower-toolcall --bench bulkhead`
//! (then `python3 crates/tower-toolcall/benches/medians.py bulkhead`).
//!
//! The cost per call of `BulkheadLayer` when it is on and a place is free, against the bare
//! tool call and tower's `ConcurrencyLimit` in the same run:
//!
//! - `bare`: the tool alone;
//! - `bulkhead`: the tool limited to 64 calls at once, none running: the call takes a place
//!   and gives it back;
//! - `bulkhead_and_namespace`: the same tool, its namespace limited to 64 calls too: the call
//!   takes its tool's place, then its namespace's;
//! - `bulkhead_unlimited`: the layer over a tool whose policy sets no limit;
//! - `tower_concurrency_limit`: tower's `ConcurrencyLimit` of 64, a semaphore without
//!   priorities, per service rather than per tool.
//!
//! Every row waits for readiness and polls its future once with `now_or_never`: each is
//! ready at its first poll. The bench prints each row's median as a ratio to `bare`'s.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use futures::FutureExt;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::registry::{
    BulkheadSettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{BulkheadLayer, ToolCall, ToolError, ToolOutput};
use tower_toolcall_test::dedupe_calls::{bare_tool, call};

/// Waits for `svc` to be ready and makes `call`; every future here is ready at once.
fn ready_call<S>(svc: &mut S, call: ToolCall) -> ToolOutput
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let ready = svc.ready().now_or_never().expect("ready at once").unwrap();
    ready
        .call(call)
        .now_or_never()
        .expect("answered at once")
        .unwrap()
}

fn registry(limited: bool) -> ToolRegistry {
    let mut search = ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly);
    if limited {
        search = search.with_policy(
            ToolPolicy::default().with_bulkhead(
                BulkheadSettings::default()
                    .with_max_concurrent(64)
                    .with_max_queued(64),
            ),
        );
    }
    ToolRegistry::builder().tool(search).build().unwrap()
}

fn bulkhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let request = call(1);

    let mut group = c.benchmark_group("bulkhead");
    let mut bare = bare_tool();
    group.bench_function("bare", |b| {
        b.iter(|| black_box(ready_call(&mut bare, request.clone())))
    });

    let layer = BulkheadLayer::new(registry(true));
    let mut limited = layer.layer(bare_tool());
    group.bench_function("bulkhead", |b| {
        b.iter(|| black_box(ready_call(&mut limited, request.clone())))
    });
    assert_eq!(layer.in_use("agents.tools.web", "search"), 0);
    assert_eq!(layer.refused("agents.tools.web", "search"), 0);

    let both = BulkheadLayer::builder(registry(true))
        .namespace(
            "agents.tools.web",
            BulkheadSettings::default().with_max_concurrent(64),
        )
        .build()
        .unwrap();
    let mut two_places = both.layer(bare_tool());
    group.bench_function("bulkhead_and_namespace", |b| {
        b.iter(|| black_box(ready_call(&mut two_places, request.clone())))
    });
    assert_eq!(both.namespace_in_use("agents.tools.web"), 0);

    let mut unlimited = BulkheadLayer::new(registry(false)).layer(bare_tool());
    group.bench_function("bulkhead_unlimited", |b| {
        b.iter(|| black_box(ready_call(&mut unlimited, request.clone())))
    });

    let mut tower_limit = ConcurrencyLimitLayer::new(64).layer(bare_tool());
    group.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| black_box(ready_call(&mut tower_limit, request.clone())))
    });
    group.finish();
}

/// Prints each row's median as a ratio to the bare call's, from this run's estimates.
fn ratios(_: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|target| target.join("criterion/bulkhead"));
    let Some(root) = root else { return };
    let median = |row: &str| -> Option<f64> {
        let text = std::fs::read_to_string(root.join(row).join("new/estimates.json")).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["median"]["point_estimate"].as_f64()
    };
    let Some(bare) = median("bare") else { return };
    for row in [
        "bulkhead",
        "bulkhead_and_namespace",
        "bulkhead_unlimited",
        "tower_concurrency_limit",
    ] {
        if let Some(ns) = median(row) {
            println!(
                "bulkhead/{row}: {ns:.0} ns, {:.2} × bare ({bare:.0} ns), {:+.0} ns",
                ns / bare,
                ns - bare
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bulkhead, ratios
}
criterion_main!(benches);
