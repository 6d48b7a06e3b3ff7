//! The safety benchmark: agents played against the same flaky upstream directly and through
//! the gateway, counting per 1 000 turns what
//! a user of tools pays for: duplicate side effects, stale reads, wasted upstream calls,
//! loops stopped and calls that failed the agent.
//!
//! ```text
//! cargo bench -p toolcall-gateway --bench safety            # TURNS=1000 by default
//! ```
//!
//! The upstream (in this process, over streamable HTTP) has two tools:
//! - `pay`, a payment: not idempotent; it acts, then for 10 % of the calls its answer is
//!   lost (the server holds it past every timeout), as a transport that drops answers does;
//! - `balance`, a read: fails transiently for 20 % of the calls; answers the number of
//!   payments made so far.
//!
//! Each turn an agent pays once (a fresh payment id) and reads the balance; on an error or
//! a timeout (600 ms) it waits 500 ms and sends the same call again, up to 4 tries in all:
//! half of the agents put an idempotency key in `_meta`, the others do not. The gateway's
//! per-call timeout (5 s) outlasts a lost answer (1.5 s), so that the call goes on after its
//! client gave up and its record answers the re-send. Every 50th turn the agent loops: it asks
//! for the balance 8 times in a row with the same arguments.

#[path = "../tests/support/flaky.rs"]
mod flaky;

use std::sync::atomic::Ordering;
use std::time::Duration;

use flaky::{upstream, Upstream, LOST};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

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

/// Plays `turns` turns of two agents (one with keys, one without) against `url`, whose
/// tools are named with `prefix`.
async fn play(url: &str, prefix: &str, upstream: &Upstream, turns: u64) -> Tally {
    let mut tally = Tally::default();
    for (agent, keyed) in [("keyed", true), ("plain", false)] {
        let mut info = rmcp::model::ClientConfig::default();
        info.client_info = rmcp::model::Implementation::new(format!("agent-{agent}"), "1.0");
        let client = info
            .serve(StreamableHttpClientTransport::from_uri(url.to_owned()))
            .await
            .expect("the agent connects");
        let peer = client.peer().clone();
        for turn in 0..turns / 2 {
            let id = format!("{agent}-{turn}");
            let key = keyed.then(|| format!("pay-{id}"));
            tally.intended_calls += 2;
            if let Answer::Failed =
                call_with_tries(&peer, &format!("{prefix}pay"), json!({"id": id}), key).await
            {
                tally.failed_calls += 1;
            }
            let before = upstream.made.load(Ordering::SeqCst);
            match call_with_tries(
                &peer,
                &format!("{prefix}balance"),
                json!({"account": format!("a-{turn}")}),
                None,
            )
            .await
            {
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
            if turn % 50 == 49 {
                // The loop: the same read, 8 times.
                let mut stopped = false;
                for _ in 0..8 {
                    if let Answer::Done(result) = call_with_tries(
                        &peer,
                        &format!("{prefix}balance"),
                        json!({"account": "loop"}),
                        None,
                    )
                    .await
                    {
                        stopped |= is_loop(&result);
                    }
                    if stopped {
                        break;
                    }
                }
                tally.loops_stopped += u64::from(stopped);
            }
        }
        let _ = client.cancel().await;
    }
    // Let the lost answers' executions settle before counting.
    tokio::time::sleep(LOST + Duration::from_millis(200)).await;
    let payments = upstream.payments.lock().unwrap();
    tally.duplicate_side_effects = payments.values().map(|n| n.saturating_sub(1)).sum();
    let needed = payments.len() as u64 + (tally.intended_calls / 2);
    tally.wasted_upstream_calls = upstream.calls.load(Ordering::SeqCst).saturating_sub(needed);
    tally
}

/// The gateway in front of `url`, as a child process; its URL.
async fn gateway(url: &str) -> (tokio::process::Child, String) {
    let dir = std::env::temp_dir().join(format!("toolcall-safety-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!("[[upstreams]]\nname = \"bench\"\nurl = \"{url}\"\ntrust = \"trusted\"\ntimeout_ms = {GATEWAY_TIMEOUT_MS}\n"),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolcall-gateway"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .next_line()
        .await
        .unwrap()
        .expect("the gateway listens");
    let address = line.trim_start_matches("listening on ").to_owned();
    (child, format!("http://{address}/mcp"))
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

#[tokio::main]
async fn main() {
    let turns: u64 = std::env::var("TURNS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1000);
    println!("safety benchmark: {turns} turns per set-up (half with _meta keys)");
    println!("| set-up | answers lost | duplicate side effects | stale reads | wasted upstream calls | loops stopped | calls that failed the agent |");
    println!("|---|---|---|---|---|---|---|");

    let (direct, url) = upstream().await;
    let tally = play(&url, "", &direct, turns).await;
    row("direct", &tally, &direct, turns);

    let (behind, url) = upstream().await;
    let (_gateway, front) = gateway(&url).await;
    let tally = play(&front, "bench__", &behind, turns).await;
    row("toolcall-gateway", &tally, &behind, turns);
}
