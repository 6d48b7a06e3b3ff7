//! Run with: `cargo bench -p tower-toolcall-executor --bench executor -- --warm-up-time 1 --measurement-time 3 --noplot`
//! (then `python3 crates/tower-toolcall/benches/medians.py executor stack_alone`).
//!
//! - `executor`: a plan of 1,000 independent steps run by the executor over the whole stack,
//!   against the same 1,000 calls built and sent through the same stack by hand (64 at a
//!   time in both), so that the difference is the executor's own cost: checking the plan,
//!   resolving args, scheduling, linking each call to its run, and the turn result.
//! - Before the groups, the peak memory of a `foreach` over 100,000 items at a concurrency
//!   of 64, with the events streamed to a reader that drops them: `VmHWM` and `VmRSS` from
//!   `/proc/self/status`, before and after, printed as one line; over the bare tool, then
//!   through the stack (whose in-memory dedupe store keeps a record per call).

use std::hint::black_box;

use criterion::{criterion_group, BatchSize, Criterion};
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
use tower_toolcall_executor::{Executor, Plan, Step, Turn, TurnStatus};

const STEPS: usize = 1_000;
const CONCURRENCY: usize = 64;

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new("bench", "echo", RiskLevel::ReadOnly).with_idempotent(true))
        .build()
        .unwrap()
}

fn stack(
    registry: &ToolRegistry,
) -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = tower_toolcall::ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, tower_toolcall::ToolError>>
                 + Send
                 + 'static,
> + Clone {
    let stack = ToolStack::builder(registry.clone()).build().unwrap();
    ServiceBuilder::new()
        .layer(stack)
        .service(tool_fn(|_call: ToolCall| async {
            Ok(ToolOutput::new(json!({"ok": true})))
        }))
}

fn args(n: usize) -> Value {
    json!({"query": "tower middleware retry", "page": n, "filters": {"lang": "en"}})
}

fn plan() -> Plan {
    (0..STEPS).fold(Plan::new(), |plan, n| {
        plan.with_step(Step::new(format!("s{n}"), "bench::echo", args(n)))
    })
}

fn bench_executor(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let registry = registry();
    let plan = plan();
    let executor = Executor::builder(registry.clone())
        .max_concurrency(CONCURRENCY)
        .build()
        .unwrap();
    let mut group = c.benchmark_group("executor");
    group.sample_size(20);
    group.bench_function("stack_alone", |b| {
        b.iter_batched(
            || stack(&registry),
            |mut service| {
                rt.block_on(async {
                    let mut running = FuturesUnordered::new();
                    let mut next = 0;
                    while next < STEPS || !running.is_empty() {
                        while next < STEPS && running.len() < CONCURRENCY {
                            let call = ToolCall::builder("bench", "echo")
                                .session("sess-1")
                                .actor("user-1")
                                .params(args(next))
                                .build()
                                .unwrap();
                            let ready = service.ready().await.unwrap();
                            running.push(ready.call(call));
                            next += 1;
                        }
                        black_box(running.next().await.unwrap().unwrap());
                    }
                })
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("executor_1000_steps", |b| {
        b.iter_batched(
            || stack(&registry),
            |service| {
                let result = rt.block_on(
                    executor
                        .start(service, &plan, Turn::new("sess-1", "user-1"))
                        .unwrap()
                        .finish(),
                );
                assert_eq!(result.status, TurnStatus::Completed);
                black_box(result)
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// `VmHWM` (peak) and `VmRSS` of this process, in KiB.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn foreach_memory(through_stack: bool) {
    const ITEMS: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let registry = registry();
    let executor = Executor::builder(registry.clone())
        .max_concurrency(CONCURRENCY)
        .build()
        .unwrap();
    let (_, before) = memory();
    let plan = Plan::new().with_step(
        Step::new(
            "each",
            "bench::echo",
            json!({"n": "{index}", "item": "{item}"}),
        )
        .with_foreach(tower_toolcall_executor::Foreach::new(Value::from(
            (0..ITEMS).map(|i| json!(i)).collect::<Vec<_>>(),
        ))),
    );
    let tool = tool_fn(|call: ToolCall| async move {
        Ok(ToolOutput::new(call.params().as_map()["n"].clone()))
    });
    // The stack's in-memory dedupe store keeps a record per call: its growth is the stack's.
    let service = ServiceBuilder::new()
        .option_layer(through_stack.then(|| ToolStack::builder(registry).build().unwrap()))
        .service(tool);
    let (result, events) = rt.block_on(async {
        let mut run = executor
            .start(service, &plan, Turn::new("sess-1", "user-1"))
            .unwrap();
        let events = run.events().unwrap();
        let reader = events.fold(0u64, |n, _| async move { n + 1 });
        futures::join!(run.finish(), reader)
    });
    let (peak, after) = memory();
    assert_eq!(result.status, TurnStatus::Completed);
    println!(
        "foreach of {ITEMS} items at concurrency {CONCURRENCY}, {}: peak RSS {} KiB over {} KiB \
         before (+{} KiB), {} KiB after; {events} events read, {} dropped",
        if through_stack {
            "through the stack"
        } else {
            "bare tool"
        },
        peak,
        before,
        peak.saturating_sub(before),
        after,
        result.events_dropped
    );
}

criterion_group!(benches, bench_executor);

fn main() {
    // The bare tool first: the peak is the process's, and only grows.
    foreach_memory(false);
    foreach_memory(true);
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
