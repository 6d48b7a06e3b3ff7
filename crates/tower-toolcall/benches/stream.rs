//! Run with: `cargo bench -p tower-toolcall --bench stream`
//!
//! The cost of the stack per chunk of a streamed answer: a tool that sends 1 000 chunks (short
//! strings) and answers, read to its end through [`Streamed`], bare and behind the whole stack
//! in the same run. Each call has params of its own (so neither the idempotency cache nor
//! loop detection answers it) and is built outside the timed part.
//!
//! - `bare_stream`: the tool alone, its chunks read as they come;
//! - `stack_stream`: the same behind every layer of the stack;
//! - `bare_whole` and `stack_whole`: the same tool for a caller that asked for no chunks
//!   (the tool's sends are dropped), bare and behind the stack: what the stack costs a call
//!   whatever it streams.
//!
//! The bench prints each row's median, and the stack's cost per chunk: the difference of the
//! streamed rows less that of the whole rows, over 1 000.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use futures::{FutureExt, StreamExt};
use serde_json::json;
use tower::{Layer, Service};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::stream::{StreamPart, Streamed};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};

const CHUNKS: usize = 1_000;

fn call(n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.docs", "summarize")
        .session("sess-bench")
        .actor("user-7")
        .params(json!({"doc": "tower", "n": n}))
        .build()
        .unwrap()
}

fn streaming_tool() -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    tool_fn(|call: ToolCall| {
        let chunks = call.chunks();
        for _ in 0..CHUNKS {
            chunks.send(json!("a short part"));
        }
        std::future::ready(Ok(ToolOutput::new(json!("parts"))))
    })
}

fn bench<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    streamed: bool,
    mut svc: S,
) where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let mut n = 0;
    group.bench_function(name, |b| {
        b.iter_batched(
            || {
                n += 1;
                call(n)
            },
            |mut call| {
                if !streamed {
                    let out = svc.call(call).now_or_never().expect("ready at once");
                    return black_box(out.expect("success"));
                }
                let chunks = call.stream_chunks();
                let mut parts = std::pin::pin!(Streamed::new(svc.call(call), chunks));
                let mut read = 0;
                loop {
                    match parts.next().now_or_never().expect("ready at once") {
                        Some(StreamPart::Chunk(chunk)) => {
                            black_box(chunk);
                            read += 1;
                        }
                        Some(StreamPart::Done(out)) => {
                            assert_eq!(read, CHUNKS);
                            return black_box(out.expect("success"));
                        }
                        _ => unreachable!(),
                    }
                }
            },
            BatchSize::SmallInput,
        )
    });
}

fn stream(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.docs", "summarize", RiskLevel::ReadOnly)
                .with_streaming(true),
        )
        .build()
        .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let mut group = c.benchmark_group("stream");
    bench(&mut group, "bare_stream", true, streaming_tool());
    bench(
        &mut group,
        "stack_stream",
        true,
        stack.layer(streaming_tool()),
    );
    bench(&mut group, "bare_whole", false, streaming_tool());
    bench(
        &mut group,
        "stack_whole",
        false,
        stack.layer(streaming_tool()),
    );
    group.finish();
}

/// Prints each row's median and the stack's cost per chunk, from this run's estimates.
fn per_chunk(_: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|target| target.join("criterion/stream"));
    let Some(root) = root else { return };
    let median = |row: &str| -> Option<f64> {
        let text = std::fs::read_to_string(root.join(row).join("new/estimates.json")).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["median"]["point_estimate"].as_f64()
    };
    let rows = ["bare_stream", "stack_stream", "bare_whole", "stack_whole"].map(median);
    let [Some(bare_stream), Some(stack_stream), Some(bare_whole), Some(stack_whole)] = rows else {
        return;
    };
    for (row, ns) in [
        ("bare_stream", bare_stream),
        ("stack_stream", stack_stream),
        ("bare_whole", bare_whole),
        ("stack_whole", stack_whole),
    ] {
        println!("stream/{row}: {:.1} µs", ns / 1_000.0);
    }
    let per_chunk = ((stack_stream - bare_stream) - (stack_whole - bare_whole)) / CHUNKS as f64;
    println!(
        "stream: the stack costs {:.1} µs a call and {per_chunk:.1} ns a chunk \
         (a bare chunk: {:.1} ns)",
        (stack_whole - bare_whole) / 1_000.0,
        bare_stream / CHUNKS as f64
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = stream, per_chunk
}
criterion_main!(benches);
