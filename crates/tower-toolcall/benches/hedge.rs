//! Run with: `cargo bench -p tower-toolcall --bench hedge`.
//!
//! What hedging buys and costs on a read whose latency has a slow tail: each attempt takes
//! 2 ms, or 20 ms for 5 % of them (drawn from a seeded generator, for each attempt alone),
//! in real time on a multi-threaded runtime. 8 callers make 4 000 calls in all through
//! `RetryLayer`, with and without hedging; the table gives the latency percentiles the
//! callers saw and the upstream calls it took (the extra ones are the hedges).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::registry::{
    RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{tool_fn, RetryLayer, ToolCall, ToolOutput};

const CALLS: usize = 4_000;
const CALLERS: usize = 8;
const FAST: Duration = Duration::from_millis(2);
const SLOW: Duration = Duration::from_millis(20);
/// One attempt in this many is slow.
const SLOW_ONE_IN: u32 = 20;

fn call() -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(json!({"query": "tower middleware hedging"}))
        .build()
        .unwrap()
}

/// The latencies the callers saw, sorted, the upstream calls made and the hedges sent.
async fn run(retry: Option<RetrySettings>) -> (Vec<Duration>, u64, u64) {
    let policy = ToolPolicy::default().with_retry(retry.unwrap_or_default());
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_policy(policy),
        )
        .build()
        .unwrap();
    let layer = RetryLayer::new(registry);
    let upstream = Arc::new(AtomicU64::new(0));
    let rng = Arc::new(Mutex::new(SmallRng::seed_from_u64(44)));
    let tool = {
        let upstream = upstream.clone();
        tool_fn(move |_call: ToolCall| {
            upstream.fetch_add(1, Ordering::Relaxed);
            let slow = rng.lock().unwrap().random_range(0..SLOW_ONE_IN) == 0;
            async move {
                tokio::time::sleep(if slow { SLOW } else { FAST }).await;
                Ok(ToolOutput::new(json!({"hits": 3})))
            }
        })
    };
    let svc = layer.layer(tool);
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let mut svc = svc.clone();
            tokio::spawn(async move {
                let mut seen = Vec::with_capacity(CALLS / CALLERS);
                for _ in 0..CALLS / CALLERS {
                    let start = Instant::now();
                    svc.ready().await.unwrap().call(call()).await.unwrap();
                    seen.push(start.elapsed());
                }
                seen
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(CALLS);
    for caller in callers {
        latencies.extend(caller.await.unwrap());
    }
    latencies.sort_unstable();
    let hedges = layer.hedges("agents.tools.web", "search");
    (latencies, upstream.load(Ordering::Relaxed), hedges)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p / 100.0).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let variants = [
        ("no hedging", None),
        (
            "hedge_delay_ms = 5",
            Some(RetrySettings::default().with_hedge_delay_ms(5)),
        ),
        (
            "hedge_percentile = 90",
            Some(RetrySettings::default().with_hedge_percentile(90)),
        ),
    ];
    println!(
        "{CALLS} reads by {CALLERS} callers; an attempt takes {} ms, 1 in {SLOW_ONE_IN} {} ms",
        FAST.as_millis(),
        SLOW.as_millis()
    );
    println!();
    println!("| set-up | p50 | p95 | p99 | max | upstream calls | extra |");
    println!("|---|---|---|---|---|---|---|");
    for (name, settings) in variants {
        let (latencies, upstream, hedges) = run(settings).await;
        println!(
            "| {name} | {} | {} | {} | {} | {upstream} | +{:.1} % ({hedges} hedges) |",
            ms(percentile(&latencies, 50.0)),
            ms(percentile(&latencies, 95.0)),
            ms(percentile(&latencies, 99.0)),
            ms(*latencies.last().unwrap()),
            (upstream as f64 / CALLS as f64 - 1.0) * 100.0,
        );
    }
}
