//! The safety benchmark: agents played against the same flaky upstream directly, through
//! `mcp-proxy` 0.6 and through the gateway, counting per 1 000 turns what a user of tools
//! pays for: duplicate side effects, stale reads, wasted upstream calls, loops stopped and
//! calls that failed the agent.
//!
//! ```text
//! crates/toolcall-gateway/benches/mcp-proxy.sh              # mcp-proxy 0.6.0 into .tools/
//! cargo bench -p toolcall-gateway --bench safety            # TURNS=1000 by default
//! ```
//!
//! Without `mcp-proxy` (`MCP_PROXY`, `.tools/bin/mcp-proxy` or the `PATH`), the benchmark
//! stops at once with the command that installs it.
//!
//! The upstream (in this process, over streamable HTTP; a fresh one per set-up) has two
//! tools:
//! - `pay`, a payment: not idempotent; it acts, then for 10 % of the calls its answer is
//!   lost (the server holds it past every timeout), as a transport that drops answers does;
//! - `balance`, a read: fails transiently for 20 % of the calls (a JSON-RPC internal
//!   error); answers the number of payments made so far.
//!
//! Each turn an agent pays once (a fresh payment id) and reads the balance of an account
//! of that turn; on an error or a timeout (600 ms) it waits 500 ms and sends the same call
//! again, up to 4 tries in all. Two agents play at once, in sessions of their own: one puts
//! an idempotency key in `_meta`, the other does not. Every 50th turn an agent loops: it
//! reads the balance of one account 8 times in a row with the same arguments. A read is
//! stale when it answers fewer payments than were made before it was sent.
//!
//! The set-ups, side by side in one run:
//! - `direct`: the agents speak to the upstream;
//! - `mcp-proxy 0.6, retries on`: its `[backends.retry]` as its README shows it
//!   (`max_retries = 3`, `initial_backoff_ms = 100`, `max_backoff_ms = 5000`,
//!   `budget_percent = 20.0`) and `[backends.timeout] seconds = 5`;
//! - `mcp-proxy 0.6, retries, coalescing and cache`: the same, with
//!   `[performance] coalesce_requests = true` and `[backends.cache] tool_ttl_seconds = 60`
//!   (the loaded configuration of its own overhead example);
//! - `toolcall-gateway`: the upstream `trusted`, with `timeout_ms = 5000`. The per-call
//!   timeout outlasts a lost answer (1.5 s), so that the call goes on after its client gave
//!   up and its record answers the re-send.

#[path = "../tests/support/flaky.rs"]
mod flaky;
#[path = "../tests/support/http.rs"]
mod http;
mod peers;

use std::sync::atomic::Ordering;
use std::time::Duration;

use flaky::{upstream, Upstream, LOST};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{json, Value};

/// How long an agent waits for an answer.
const AGENT_TIMEOUT: Duration = Duration::from_millis(600);
/// How long an agent waits before it sends a call again.
const AGENT_BACKOFF: Duration = Duration::from_millis(500);
/// The gateway's per-call timeout toward the upstream: longer than an answer takes to be
/// lost, so that a call whose client gave up still ends and its record answers the re-send.
const GATEWAY_TIMEOUT_MS: u64 = 5_000;
/// Tries per call, the first included.
const TRIES: usize = 4;

/// What one set-up cost, over all turns.
#[derive(Debug, Default)]
struct Tally {
    duplicate_side_effects: u64,
    stale_reads: u64,
    wasted_upstream_calls: u64,
    loops_stopped: u64,
    failed_calls: u64,
    intended_calls: u64,
}

/// An agent's view of one call: its final answer, after its tries.
enum Answer {
    Done(CallToolResult),
    Failed,
}

async fn call_with_tries(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    name: &str,
    args: Value,
    key: Option<String>,
) -> Answer {
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(AGENT_BACKOFF).await;
        }
        let mut params = CallToolRequestParams::new(name.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        if let Some(key) = &key {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.insert("idempotencyKey".to_owned(), Value::from(key.as_str()));
            params.meta = Some(meta);
        }
        match tokio::time::timeout(AGENT_TIMEOUT, peer.call_tool(params)).await {
            Ok(Ok(result)) if result.is_error != Some(true) => return Answer::Done(result),
            Ok(Ok(result)) if is_loop(&result) => return Answer::Done(result),
            _ => continue,
        }
    }
    Answer::Failed
}

fn is_loop(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
        && result.content.iter().any(|b| {
            b.as_text()
                .is_some_and(|t| t.text.starts_with("LOOP_DETECTED"))
        })
}

/// Plays `turns` turns of two agents at once (one with keys, one without) against `url`,
/// whose tools are named with `prefix`.
async fn play(url: &str, prefix: &str, upstream: &Upstream, turns: u64) -> Tally {
    let agents = [("keyed", true), ("plain", false)]
        .map(|(agent, keyed)| agent_turns(url, prefix, upstream, agent, keyed, turns / 2));
    let [keyed, plain] = agents;
    let (mut tally, plain) = tokio::join!(keyed, plain);
    tally.failed_calls += plain.failed_calls;
    tally.stale_reads += plain.stale_reads;
    tally.loops_stopped += plain.loops_stopped;
    tally.intended_calls += plain.intended_calls;
    // Let the lost answers' executions settle before counting.
    tokio::time::sleep(LOST + Duration::from_millis(200)).await;
    let payments = upstream.payments.lock().unwrap();
    tally.duplicate_side_effects = payments.values().map(|n| n.saturating_sub(1)).sum();
    let needed = payments.len() as u64 + (tally.intended_calls / 2);
    tally.wasted_upstream_calls = upstream.calls.load(Ordering::SeqCst).saturating_sub(needed);
    tally
}

/// A read of the balance, counted stale when it is lower than the payments made before it
/// was sent; whether it was a loop stopped.
async fn read(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    name: &str,
    account: &str,
    upstream: &Upstream,
    tally: &mut Tally,
) -> bool {
    let before = upstream.made.load(Ordering::SeqCst);
    match call_with_tries(peer, name, json!({ "account": account }), None).await {
        Answer::Done(result) if is_loop(&result) => return true,
        Answer::Done(result) => {
            let read: u64 = result
                .content
                .first()
                .and_then(|b| b.as_text())
                .and_then(|t| t.text.parse().ok())
                .unwrap_or(u64::MAX);
            if read < before {
                tally.stale_reads += 1;
            }
        }
        Answer::Failed => tally.failed_calls += 1,
    }
    false
}

/// One agent's `turns` turns.
async fn agent_turns(
    url: &str,
    prefix: &str,
    upstream: &Upstream,
    agent: &str,
    keyed: bool,
    turns: u64,
) -> Tally {
    let mut tally = Tally::default();
    let client = peers::session(url, &format!("agent-{agent}")).await;
    let peer = client.peer().clone();
    let balance = format!("{prefix}balance");
    for turn in 0..turns {
        let id = format!("{agent}-{turn}");
        let key = keyed.then(|| format!("pay-{id}"));
        tally.intended_calls += 2;
        if let Answer::Failed =
            call_with_tries(&peer, &format!("{prefix}pay"), json!({"id": id}), key).await
        {
            tally.failed_calls += 1;
        }
        let account = format!("{agent}-{turn}");
        read(&peer, &balance, &account, upstream, &mut tally).await;
        if turn % 50 == 49 {
            // The loop: the same read, 8 times.
            let account = format!("{agent}-loop");
            for _ in 0..8 {
                if read(&peer, &balance, &account, upstream, &mut tally).await {
                    tally.loops_stopped += 1;
                    break;
                }
            }
        }
    }
    let _ = client.cancel().await;
    tally
}

fn row(name: &str, t: &Tally, upstream: &Upstream, turns: u64) {
    let per = |n: u64| n as f64 * 1000.0 / turns as f64;
    println!(
        "| {name} | {} | {:.0} | {:.0} | {:.0} | {} of {} | {:.0} |",
        upstream.lost.load(Ordering::SeqCst),
        per(t.duplicate_side_effects),
        per(t.stale_reads),
        per(t.wasted_upstream_calls),
        t.loops_stopped,
        turns / 50,
        per(t.failed_calls),
    );
}

/// `mcp-proxy`'s retries for the upstream, as its README and `config.example.toml` show
/// them, under the gateway's per-call timeout.
const MCP_PROXY_RETRIES: &str = "[[backends]]
name = \"bench\"
transport = \"http\"
url = \"{url}\"

[backends.timeout]
seconds = 5

[backends.retry]
max_retries = 3
initial_backoff_ms = 100
max_backoff_ms = 5000
budget_percent = 20.0
";

/// What `mcp-proxy` adds against repeated calls: request coalescing and its response cache,
/// as its own overhead example's loaded configuration sets them.
const MCP_PROXY_CACHE: &str = "[backends.cache]
tool_ttl_seconds = 60
max_entries = 10000
";

/// One set-up: a fresh upstream, and what stands between it and the agents.
async fn setup(kind: &str, turns: u64) -> (Tally, Upstream) {
    let (upstream, url) = upstream().await;
    let backend = MCP_PROXY_RETRIES.replace("{url}", &url);
    let tally = match kind {
        "direct" => play(&url, "", &upstream, turns).await,
        "mcp-proxy" => {
            let proxy = peers::mcp_proxy(&backend, "").await;
            play(&proxy.url, "bench/", &upstream, turns).await
        }
        "mcp-proxy+cache" => {
            let proxy = peers::mcp_proxy(
                &format!("{backend}\n{MCP_PROXY_CACHE}"),
                "[performance]\ncoalesce_requests = true\n",
            )
            .await;
            play(&proxy.url, "bench/", &upstream, turns).await
        }
        _ => {
            let gateway = peers::gateway(&format!(
                "[[upstreams]]\nname = \"bench\"\nurl = \"{url}\"\ntrust = \"trusted\"\ntimeout_ms = {GATEWAY_TIMEOUT_MS}\n"
            ))
            .await;
            play(&gateway.url, "bench__", &upstream, turns).await
        }
    };
    (tally, upstream)
}

#[tokio::main]
async fn main() {
    let turns: u64 = std::env::var("TURNS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1000);
    // Before anything runs: the peer must be there.
    peers::mcp_proxy_binary();
    println!("safety benchmark: {turns} turns per set-up (half with _meta keys), the set-ups side by side");
    println!("| set-up | answers lost | duplicate side effects | stale reads | wasted upstream calls | loops stopped | calls that failed the agent |");
    println!("|---|---|---|---|---|---|---|");
    let (direct, proxy, cached, gateway) = tokio::join!(
        setup("direct", turns),
        setup("mcp-proxy", turns),
        setup("mcp-proxy+cache", turns),
        setup("gateway", turns),
    );
    row("direct", &direct.0, &direct.1, turns);
    row("mcp-proxy 0.6, retries on", &proxy.0, &proxy.1, turns);
    row(
        "mcp-proxy 0.6, retries, coalescing and cache",
        &cached.0,
        &cached.1,
        turns,
    );
    row("toolcall-gateway", &gateway.0, &gateway.1, turns);
}
