//! The gateway's memory: its peak resident set (`VmHWM` in `/proc/<pid>/status`) in front
//! of 10 upstreams, with 1 000 MCP sessions open, then after 100 000 calls through it;
//! `mcp-proxy` 0.6 in the same run, for scale.
//!
//! ```text
//! crates/toolcall-gateway/benches/mcp-proxy.sh              # mcp-proxy 0.6.0 into .tools/
//! cargo bench -p toolcall-gateway --bench memory            # SESSIONS=1000 CALLS=100000
//! ```
//!
//! The 10 upstreams are echo MCP servers over streamable HTTP in this process, each on a
//! port of its own. The gateway (the binary of this package, built in the bench profile,
//! that is `--release`) has one `[[upstreams]]` entry for each, and its whole stack with its
//! defaults; `mcp-proxy` has one `[[backends]]` entry for each, with the loaded
//! configuration of its own overhead example (timeout, retry, breaker, cache, coalescing).
//!
//! Steps, for each front: started (its upstreams connected); `SESSIONS` sessions opened
//! (50 at a time), each calling one echo tool once, all of them kept open; those sessions
//! closed and `CALLS` calls sent over 32 sessions, spread over the 10 upstreams, each with
//! distinct arguments (so that every call leaves its dedupe record, or cache entry). After
//! each step, the front's peak and current resident set.

#[path = "../tests/support/http.rs"]
mod http;
mod peers;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use peers::{Front, Memory};
use serde_json::json;

/// The upstreams behind each front.
const UPSTREAMS: usize = 10;
/// Sessions opened at once.
const BATCH: usize = 50;
/// The sessions that send the calls.
const WORKERS: usize = 32;

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn report(front: &str, step: &str, memory: Memory) {
    println!(
        "{front:>18} {step:<32} peak (VmHWM) {:>7.1} MiB   now (VmRSS) {:>7.1} MiB",
        mib(memory.peak_kb),
        mib(memory.now_kb)
    );
}

/// Runs the steps against `front`, whose tool of upstream `i` is `tool(i)`; the memory
/// after each step.
async fn steps(
    name: &str,
    front: &Front,
    tool: impl Fn(usize) -> String,
    sessions: usize,
    calls: usize,
) -> [Memory; 3] {
    let started = Memory::of(front.pid());
    report(name, "started", started);

    let mut open = Vec::with_capacity(sessions);
    for batch in 0..sessions.div_ceil(BATCH) {
        let mut opening = tokio::task::JoinSet::new();
        for n in batch * BATCH..((batch + 1) * BATCH).min(sessions) {
            let (url, tool) = (front.url.clone(), tool(n % UPSTREAMS));
            opening.spawn(async move {
                let client = peers::session(&url, &format!("session-{n}")).await;
                peers::call(client.peer(), &tool, json!({"text": format!("hello-{n}")}))
                    .await
                    .unwrap_or_else(|err| panic!("session {n}'s call fails: {err}"));
                client
            });
        }
        while let Some(client) = opening.join_next().await {
            open.push(client.expect("a session opens"));
        }
    }
    let with_sessions = Memory::of(front.pid());
    report(name, &format!("{sessions} sessions open"), with_sessions);
    for client in open {
        let _ = client.cancel().await;
    }

    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let (url, next, failed) = (front.url.clone(), next.clone(), failed.clone());
        let tools: Vec<String> = (0..UPSTREAMS).map(&tool).collect();
        workers.spawn(async move {
            let client = peers::session(&url, &format!("worker-{worker}")).await;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= calls {
                    break;
                }
                let args = json!({"text": format!("call-{n}")});
                if peers::call(client.peer(), &tools[n % UPSTREAMS], args)
                    .await
                    .is_err()
                {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = client.cancel().await;
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("a worker ends");
    }
    let after_calls = Memory::of(front.pid());
    report(
        name,
        &format!(
            "after {calls} calls ({} failed)",
            failed.load(Ordering::Relaxed)
        ),
        after_calls,
    );
    [started, with_sessions, after_calls]
}

#[tokio::main]
async fn main() {
    let env = peers::env_or::<usize>;
    let sessions = env("SESSIONS", 1000);
    let calls = env("CALLS", 100_000);
    // Before anything runs: the peer must be there.
    peers::mcp_proxy_binary();

    let mut echoes = Vec::with_capacity(UPSTREAMS);
    for _ in 0..UPSTREAMS {
        echoes.push(peers::echo_server().await);
    }

    let config: String = echoes
        .iter()
        .enumerate()
        .map(|(i, url)| {
            format!("[[upstreams]]\nname = \"up{i}\"\nurl = \"{url}\"\ntrust = \"trusted\"\n\n")
        })
        .collect();
    let gateway = peers::gateway(&config).await;
    let ours = steps(
        "toolcall-gateway",
        &gateway,
        |i| format!("up{i}__echo"),
        sessions,
        calls,
    )
    .await;
    drop(gateway);

    let backends: String = echoes
        .iter()
        .enumerate()
        .map(|(i, url)| {
            peers::MCP_PROXY_LOADED
                .replace("{name}", &format!("up{i}"))
                .replace("{url}", url)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let proxy = peers::mcp_proxy(&backends, "[performance]\ncoalesce_requests = true\n").await;
    let theirs = steps(
        "mcp-proxy 0.6",
        &proxy,
        |i| format!("up{i}/echo"),
        sessions,
        calls,
    )
    .await;

    println!();
    println!("| peak resident set (VmHWM) | toolcall-gateway | mcp-proxy 0.6 |");
    println!("|---|---|---|");
    let steps = [
        format!("started, {UPSTREAMS} upstreams"),
        format!("{sessions} sessions open"),
        format!("after {calls} calls"),
    ];
    for (i, step) in steps.iter().enumerate() {
        println!(
            "| {step} | {:.1} MiB | {:.1} MiB |",
            mib(ours[i].peak_kb),
            mib(theirs[i].peak_kb)
        );
    }
}
