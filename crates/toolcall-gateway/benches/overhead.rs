//! The cost of a hop: the latency a front adds over a direct connection, and its
//! throughput, for `mcp-proxy` 0.6 and the gateway in front of the same echo MCP server.
//!
//! ```text
//! crates/toolcall-gateway/benches/mcp-proxy.sh              # mcp-proxy 0.6.0 into .tools/
//! cargo bench -p toolcall-gateway --bench overhead          # CALLS=1000 ROUNDS=2 by default
//! ```
//!
//! The echo server (`echo`, which answers its arguments) runs in this process over
//! streamable HTTP. Three targets, measured in turn at 1, 8 and 32 concurrent MCP sessions
//! (rmcp's streamable HTTP client, one session per worker):
//! - `direct`: the echo server itself;
//! - `mcp-proxy 0.6`: a child process (`.tools/bin/mcp-proxy`) with the resilience of its own
//!   overhead example's loaded configuration on: `[backends.timeout] seconds = 5`,
//!   `[backends.retry] max_retries = 2`, `[backends.circuit_breaker]`,
//!   `[backends.cache] tool_ttl_seconds = 60`, `[performance] coalesce_requests = true`;
//! - `toolcall-gateway`: the binary of this package (built in the bench profile, that is
//!   `--release`) as a child process, one `[[upstreams]]` entry with the echo server's URL
//!   and `trust = "trusted"` (so that `echo`'s `readOnlyHint` is its policy), everything else
//!   by default: the whole stack runs on every call (validation, loop detection, quotas, the
//!   dedupe layer under a key derived from the arguments, retries, the breakers per tool and
//!   per server, the per-call timeout, metrics).
//!
//! Every call carries distinct arguments, so that no cache, coalescing or dedupe record
//! answers in the upstream's place. Sessions are opened and warmed up (20 calls each)
//! before a barrier; `CALLS` calls are then shared among the workers, each timed on the
//! client's side. Every cell is measured `ROUNDS` times, the targets taking turns; the
//! percentiles are over all rounds. Added latency is the target's percentile less the
//! direct one at the same concurrency.

#[path = "../tests/support/http.rs"]
mod http;
mod peers;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Barrier;
use tokio::time::Instant;

/// The concurrent sessions of each cell.
const LEVELS: [usize; 3] = [1, 8, 32];
/// Calls of each session before the measure.
const WARM_UP: usize = 20;

/// What one target answered in one cell, over its rounds.
#[derive(Debug, Default)]
struct Cell {
    latencies: Vec<Duration>,
    elapsed: Duration,
    calls: usize,
    failed: usize,
    /// The CPU time (user and system) of the front's process, for a child process.
    cpu: Duration,
    /// The CPU time of this process: the clients and the echo server.
    bench_cpu: Duration,
}

impl Cell {
    fn percentile(&mut self, p: f64) -> Duration {
        self.latencies.sort_unstable();
        let idx = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[idx]
    }

    fn per_second(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    /// The front process's CPU time per call, in µs; `None` for the direct target.
    fn cpu_per_call(&self) -> Option<f64> {
        (!self.cpu.is_zero()).then(|| micros(self.cpu) / self.calls as f64)
    }
}

/// `calls` calls of `tool` at `url` over `sessions` sessions at once, added to `cell`.
async fn measure(url: &str, tool: &str, sessions: usize, calls: usize, cell: &mut Cell) {
    let barrier = Arc::new(Barrier::new(sessions + 1));
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..sessions {
        let (url, tool, barrier, next) = (
            url.to_owned(),
            tool.to_owned(),
            barrier.clone(),
            next.clone(),
        );
        workers.spawn(async move {
            let client = peers::session(&url, &format!("bench-{worker}")).await;
            let peer = client.peer().clone();
            for i in 0..WARM_UP {
                let args = json!({"text": format!("warm-{worker}-{i}")});
                peers::call(&peer, &tool, args)
                    .await
                    .unwrap_or_else(|err| panic!("a warm-up call to {url} fails: {err}"));
            }
            barrier.wait().await;
            let mut latencies = Vec::with_capacity(calls / sessions + 1);
            let mut failed = 0;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= calls {
                    break;
                }
                let args = json!({"text": format!("call-{n}")});
                let start = Instant::now();
                match peers::call(&peer, &tool, args).await {
                    Ok(_) => latencies.push(start.elapsed()),
                    Err(_) => failed += 1,
                }
            }
            let _ = client.cancel().await;
            (latencies, failed)
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    while let Some(done) = workers.join_next().await {
        let (latencies, failed) = done.expect("a worker ends");
        cell.latencies.extend(latencies);
        cell.failed += failed;
    }
    cell.elapsed += start.elapsed();
    cell.calls += calls;
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    let env = peers::env_or::<usize>;
    let calls = env("CALLS", 1000);
    let rounds = env("ROUNDS", 2);
    // Before anything runs: the peer must be there.
    peers::mcp_proxy_binary();

    let echo = peers::echo_server().await;
    let proxy = peers::mcp_proxy(
        &peers::MCP_PROXY_LOADED
            .replace("{name}", "b")
            .replace("{url}", &echo),
        "[performance]\ncoalesce_requests = true\n",
    )
    .await;
    let gateway = peers::gateway(&format!(
        "[[upstreams]]\nname = \"echo\"\nurl = \"{echo}\"\ntrust = \"trusted\"\n"
    ))
    .await;
    let targets = [
        ("direct", echo.as_str(), "echo", None),
        (
            "mcp-proxy 0.6",
            proxy.url.as_str(),
            "b/echo",
            Some(proxy.pid()),
        ),
        (
            "toolcall-gateway",
            gateway.url.as_str(),
            "echo__echo",
            Some(gateway.pid()),
        ),
    ];

    println!(
        "overhead: {calls} calls per cell and round, {rounds} rounds, echo over streamable HTTP"
    );
    let mut table = Vec::new();
    for sessions in LEVELS {
        let mut cells: [Cell; 3] = Default::default();
        for _ in 0..rounds {
            for (cell, (_, url, tool, pid)) in cells.iter_mut().zip(targets) {
                let before = pid.map(peers::cpu_time);
                let bench_before = peers::cpu_time(std::process::id());
                measure(url, tool, sessions, calls, cell).await;
                cell.bench_cpu += peers::cpu_time(std::process::id()) - bench_before;
                if let (Some(pid), Some(before)) = (pid, before) {
                    cell.cpu += peers::cpu_time(pid) - before;
                }
            }
        }
        for (cell, (name, ..)) in cells.iter_mut().zip(targets) {
            let cpu = cell
                .cpu_per_call()
                .map(|cpu| format!("  front CPU {cpu:>4.0} µs/call"))
                .unwrap_or_default();
            let bench_cpu = micros(cell.bench_cpu) / cell.calls as f64;
            println!(
                "{name:>18} {sessions:>3} sessions: p50 {:>8.0} µs  p99 {:>8.0} µs  {:>7.0} calls/s  {} failed  clients and echo CPU {bench_cpu:>4.0} µs/call{cpu}",
                micros(cell.percentile(0.50)),
                micros(cell.percentile(0.99)),
                cell.per_second(),
                cell.failed,
            );
        }
        table.push((sessions, cells));
    }

    println!();
    println!("| concurrent sessions | direct p50 / p99 | mcp-proxy 0.6 added p50 / p99 | toolcall-gateway added p50 / p99 |");
    println!("|---|---|---|---|");
    for (sessions, cells) in &mut table {
        let (d50, d99) = (
            micros(cells[0].percentile(0.50)),
            micros(cells[0].percentile(0.99)),
        );
        let added = |cell: &mut Cell| {
            format!(
                "{:+.0} µs / {:+.0} µs",
                micros(cell.percentile(0.50)) - d50,
                micros(cell.percentile(0.99)) - d99
            )
        };
        let proxy = added(&mut cells[1]);
        let gateway = added(&mut cells[2]);
        println!("| {sessions} | {d50:.0} µs / {d99:.0} µs | {proxy} | {gateway} |");
    }
    let at_32 = &table.last().expect("three levels").1;
    println!(
        "| calls/s at 32 | {:.0} | {:.0} | {:.0} |",
        at_32[0].per_second(),
        at_32[1].per_second(),
        at_32[2].per_second()
    );
}
