//! What `mcp-proxy` 0.6 and the gateway do with one call of each kind, observed by running
//! both in front of the same upstream: how many times the upstream executed the call, and
//! what the agent got. The rows of the README's comparison that say "observed" come from
//! this run.
//!
//! ```text
//! crates/toolcall-gateway/benches/mcp-proxy.sh              # mcp-proxy 0.6.0 into .tools/
//! cargo bench -p toolcall-gateway --bench behaviour         # under a minute
//! ```
//!
//! The upstream (in this process, over streamable HTTP; a fresh one per cell) counts the
//! executions of its tools:
//! - `charge` (`idempotentHint: false`): acts, then fails with a JSON-RPC internal error;
//! - `pay` (`idempotentHint: false`): acts and answers; `slow_pay` the same in 500 ms;
//! - `slow_read` (`readOnlyHint: true`): answers in 500 ms the first time, in 20 ms after;
//! - `fetch` (`readOnlyHint: true`): fails with a JSON-RPC internal error on its first two
//!   calls, then answers;
//! - `report` (`readOnlyHint: true`): answers a result with `isError: true`;
//! - `deposit` (`idempotentHint: false`) adds 1 to a balance that `balance`
//!   (`readOnlyHint: true`) reads.
//!
//! `mcp-proxy` runs with one part of its README's per-backend middleware block at a time:
//! `[backends.retry]` (`max_retries = 3`, `initial_backoff_ms = 100`, `budget_percent = 20.0`),
//! `[backends.hedging]` (`delay_ms = 200`, `max_hedges = 1`) or `[backends.cache]`
//! (`tool_ttl_seconds = 60`), or with `[performance] coalesce_requests = true`, always with
//! `[backends.timeout] seconds = 5`. The gateway
//! fronts the upstream as `trusted` (its annotations are the policy), with its defaults, and
//! in the rows about slow calls also with hedging on: `[servers.u] policy = { retry = {
//! hedge_delay_ms = 200 } }`.

#[path = "../tests/support/http.rs"]
mod http;
mod peers;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleClient, RoleServer, ServerHandler};
use serde_json::{json, Value};

/// The upstream: the executions of each tool, and the balance.
#[derive(Clone, Debug, Default)]
struct Counting {
    executions: Arc<Mutex<HashMap<String, u64>>>,
    balance: Arc<AtomicU64>,
}

impl Counting {
    fn executions(&self, tool: &str) -> u64 {
        self.executions
            .lock()
            .unwrap()
            .get(tool)
            .copied()
            .unwrap_or(0)
    }
}

impl ServerHandler for Counting {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(
            json!({"type": "object", "properties": {"id": {"type": "string"}}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let acting = || ToolAnnotations::new().destructive(false).idempotent(false);
        let reading = || ToolAnnotations::new().read_only(true);
        let tool = |name: &'static str, annotations: ToolAnnotations| {
            Tool::new(name, name, schema.clone()).annotate(annotations)
        };
        Ok(ListToolsResult::with_all_items(vec![
            tool("charge", acting()),
            tool("pay", acting()),
            tool("slow_pay", acting()),
            tool("deposit", acting()),
            tool("fetch", reading()),
            tool("report", reading()),
            tool("balance", reading()),
            tool("slow_read", reading()),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let n = {
            let mut executions = self.executions.lock().unwrap();
            let n = executions.entry(name.clone()).or_default();
            *n += 1;
            *n
        };
        let ok = |text: String| Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into());
        match name.as_str() {
            "charge" => Err(ErrorData::internal_error("the card network failed", None)),
            "slow_pay" => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                ok("paid".into())
            }
            "fetch" if n <= 2 => Err(ErrorData::internal_error("busy; try again", None)),
            "report" => {
                Ok(CallToolResult::error(vec![ContentBlock::text("no such report")]).into())
            }
            "slow_read" => {
                let took = if n == 1 { 500 } else { 20 };
                tokio::time::sleep(Duration::from_millis(took)).await;
                ok(format!("read in {took} ms"))
            }
            "deposit" => ok(self.balance.fetch_add(1, Ordering::SeqCst).to_string()),
            "balance" => ok(self.balance.load(Ordering::SeqCst).to_string()),
            _ => ok("done".into()),
        }
    }
}

/// Serves a fresh [`Counting`] upstream; its state and URL.
async fn upstream() -> (Counting, String) {
    let state = Counting::default();
    let url = crate::http::serve(state.clone()).await;
    (state, url)
}

/// What stands between the agent and the upstream.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Front {
    Direct,
    /// `mcp-proxy` with one part of its README's middleware block.
    McpProxy(&'static str),
    Gateway,
    /// The gateway with the upstream's policy hedging its calls after 200 ms.
    GatewayHedging,
}

impl Front {
    fn label(self) -> String {
        match self {
            Front::Direct => "direct".into(),
            Front::McpProxy(part) => format!("mcp-proxy 0.6 ({part})"),
            Front::Gateway => "toolcall-gateway".into(),
            Front::GatewayHedging => "toolcall-gateway (hedge_delay_ms = 200)".into(),
        }
    }
}

/// The README's middleware of `mcp-proxy`, one part at a time.
fn mcp_proxy_middleware(part: &str) -> &'static str {
    match part {
        "retry" => {
            "[backends.retry]\nmax_retries = 3\ninitial_backoff_ms = 100\nmax_backoff_ms = 5000\nbudget_percent = 20.0\n"
        }
        "hedging" => "[backends.hedging]\ndelay_ms = 200\nmax_hedges = 1\n",
        "cache" => "[backends.cache]\ntool_ttl_seconds = 60\n",
        // A switch of the whole proxy (`[performance]`), not of the backend.
        "coalescing" => "",
        other => panic!("no such part of mcp-proxy's middleware: {other}"),
    }
}

/// One agent's call, with an optional `_meta.idempotencyKey`: the text it got, or the
/// error.
async fn call(peer: &Peer<RoleClient>, tool: &str, id: &str, key: Option<&str>) -> String {
    let mut params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(json!({"id": id}).as_object().cloned().unwrap_or_default());
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.insert("idempotencyKey".to_owned(), Value::from(key));
        params.meta = Some(meta);
    }
    match peer.call_tool(params).await {
        Ok(result) => {
            let text = result
                .content
                .first()
                .and_then(|b| b.as_text())
                .map(|t| t.text.clone())
                .unwrap_or_default();
            if result.is_error == Some(true) {
                format!("isError {text}")
            } else {
                text
            }
        }
        Err(err) => format!("error {err}"),
    }
}

/// A row's play, boxed so that the rows can sit in one table.
type Play = Pin<Box<dyn Future<Output = String> + Send>>;

/// What the agent does in one row (given its session, the prefix of the tools' names and
/// the upstream), and what is counted.
type Scenario = fn(Peer<RoleClient>, String, Counting) -> Play;

/// Runs `scenario` with a fresh upstream behind `front`.
async fn cell(front: Front, scenario: Scenario) -> String {
    let (upstream, url) = upstream().await;
    let backend = |part: &str| {
        format!(
            "[[backends]]\nname = \"u\"\ntransport = \"http\"\nurl = \"{url}\"\n\n[backends.timeout]\nseconds = 5\n\n{}",
            mcp_proxy_middleware(part)
        )
    };
    let (_process, url, prefix) = match front {
        Front::Direct => (None, url.clone(), String::new()),
        Front::McpProxy(part) => {
            let performance = if part == "coalescing" {
                "[performance]\ncoalesce_requests = true\n"
            } else {
                ""
            };
            let proxy = peers::mcp_proxy(&backend(part), performance).await;
            let url = proxy.url.clone();
            (Some(proxy), url, "u/".to_owned())
        }
        Front::Gateway | Front::GatewayHedging => {
            let hedging = if front == Front::GatewayHedging {
                "\n[servers.u]\npolicy = { retry = { hedge_delay_ms = 200 } }\n"
            } else {
                ""
            };
            let gateway = peers::gateway(&format!(
                "[[upstreams]]\nname = \"u\"\nurl = \"{url}\"\ntrust = \"trusted\"\n{hedging}"
            ))
            .await;
            let url = gateway.url.clone();
            (Some(gateway), url, "u__".to_owned())
        }
    };
    let client = peers::session(&url, "agent").await;
    let outcome = scenario(client.peer().clone(), prefix, upstream).await;
    let _ = client.cancel().await;
    outcome
}

fn times(n: u64) -> String {
    match n {
        1 => "1 execution".into(),
        n => format!("{n} executions"),
    }
}

#[tokio::main]
async fn main() {
    // Before anything runs: the peer must be there.
    peers::mcp_proxy_binary();
    let retry = Front::McpProxy("retry");
    let hedging = Front::McpProxy("hedging");
    let cache = Front::McpProxy("cache");
    let coalescing = Front::McpProxy("coalescing");
    let rows: Vec<(&str, Vec<Front>, Scenario)> = vec![
        (
            "a payment that fails (JSON-RPC internal error) after acting, sent once",
            vec![Front::Direct, retry, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    call(&peer, &format!("{prefix}charge"), "c-1", None).await;
                    times(upstream.executions("charge"))
                })
            },
        ),
        (
            "a read that fails twice (JSON-RPC internal error), then answers",
            vec![Front::Direct, retry, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    let got = call(&peer, &format!("{prefix}fetch"), "f-1", None).await;
                    let answered = if got == "done" { "answered" } else { "failed" };
                    format!("{}, {answered}", times(upstream.executions("fetch")))
                })
            },
        ),
        (
            "a tool that answers `isError: true`",
            vec![Front::Direct, retry, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    call(&peer, &format!("{prefix}report"), "r-1", None).await;
                    times(upstream.executions("report"))
                })
            },
        ),
        (
            "a payment that takes 500 ms, sent once",
            vec![
                Front::Direct,
                hedging,
                Front::Gateway,
                Front::GatewayHedging,
            ],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    call(&peer, &format!("{prefix}slow_pay"), "s-1", None).await;
                    times(upstream.executions("slow_pay"))
                })
            },
        ),
        (
            "a read that takes 500 ms the first time and 20 ms after, sent once",
            vec![
                Front::Direct,
                hedging,
                Front::Gateway,
                Front::GatewayHedging,
            ],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    let start = std::time::Instant::now();
                    let got = call(&peer, &format!("{prefix}slow_read"), "r-1", None).await;
                    let took = start.elapsed().as_millis();
                    let executions = times(upstream.executions("slow_read"));
                    format!("{executions}, answered in {took} ms ({got})")
                })
            },
        ),
        (
            "a payment sent twice with one `_meta.idempotencyKey`",
            vec![Front::Direct, retry, cache, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    for _ in 0..2 {
                        call(&peer, &format!("{prefix}pay"), "p-1", Some("key-1")).await;
                    }
                    times(upstream.executions("pay"))
                })
            },
        ),
        (
            "a 500 ms payment whose client gives up after 100 ms, sent again 1 s later",
            vec![Front::Direct, coalescing, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    let tool = format!("{prefix}slow_pay");
                    let wait = Duration::from_millis(100);
                    let _ = tokio::time::timeout(wait, call(&peer, &tool, "s-1", None)).await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let again = tokio::time::timeout(
                        Duration::from_secs(3),
                        call(&peer, &tool, "s-1", None),
                    )
                    .await;
                    let answered = match again {
                        Ok(got) if got == "paid" => "answered",
                        Ok(_) => "failed",
                        Err(_) => "no answer in 3 s",
                    };
                    format!("{}, {answered}", times(upstream.executions("slow_pay")))
                })
            },
        ),
        (
            "two payments, same arguments, two keys (2 meant)",
            vec![Front::Direct, cache, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    for key in ["key-1", "key-2"] {
                        call(&peer, &format!("{prefix}pay"), "p-1", Some(key)).await;
                    }
                    times(upstream.executions("pay"))
                })
            },
        ),
        (
            "balance, a deposit, the same balance read again",
            vec![Front::Direct, cache, Front::Gateway],
            |peer, prefix, _upstream| {
                Box::pin(async move {
                    let before = call(&peer, &format!("{prefix}balance"), "acct", None).await;
                    call(&peer, &format!("{prefix}deposit"), "d-1", None).await;
                    let after = call(&peer, &format!("{prefix}balance"), "acct", None).await;
                    let fresh = if after == before { "stale" } else { "fresh" };
                    format!("{before} then {after}: {fresh}")
                })
            },
        ),
        (
            "the same read 8 times in a row (a loop)",
            vec![Front::Direct, retry, cache, Front::Gateway],
            |peer, prefix, upstream| {
                Box::pin(async move {
                    let mut stopped = None;
                    for i in 1..=8 {
                        let got = call(&peer, &format!("{prefix}balance"), "acct", None).await;
                        if got.contains("LOOP_DETECTED") {
                            stopped = Some(i);
                            break;
                        }
                    }
                    let reached = times(upstream.executions("balance"));
                    match stopped {
                        Some(i) => format!("{reached}, stopped at call {i}"),
                        None => format!("{reached}, not stopped"),
                    }
                })
            },
        ),
    ];

    println!("| what the agent does | set-up | what the upstream did, what the agent got |");
    println!("|---|---|---|");
    for (what, fronts, scenario) in rows {
        for front in fronts {
            let outcome = cell(front, scenario).await;
            println!("| {what} | {} | {outcome} |", front.label());
        }
    }
    let help = std::process::Command::new(peers::mcp_proxy_binary())
        .arg("--help")
        .output()
        .expect("mcp-proxy --help runs");
    println!();
    println!("mcp-proxy --help:");
    println!("{}", String::from_utf8_lossy(&help.stdout));
}
