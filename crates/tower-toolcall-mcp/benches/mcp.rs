//! Run with: `cargo bench -p tower-toolcall-mcp --bench mcp`, then
//! `python3 crates/tower-toolcall/benches/medians.py mcp bare_rmcp`.
//!
//! What the MCP adapter costs per `tools/call`, over rmcp's in-process transport (a duplex
//! pipe, JSON-RPC lines, both ends on one current-thread runtime), measured in one run:
//!
//! - `bare_rmcp`: an rmcp client calls an rmcp server whose handler echoes its arguments
//!   (the baseline);
//! - `adapter_server`: the same handler wrapped by `McpServer` with no layer (the adapter's
//!   own cost: the envelope built from the request, the result built from the outcome);
//! - `stacked_server`: the same handler wrapped by `McpServer` with the whole `ToolStack`
//!   (every layer, policy from the tool's annotations);
//! - `mcp_client`: the bare server called through `McpClient` (the `ToolCall` ↔
//!   `tools/call` conversion, no stack);
//! - `stacked_client`: the bare server called through `McpClient` behind the whole stack;
//! - `tool_alone`, `stack_alone`: the calls the stacked server's stack sees (its session,
//!   its request ids, the client's name as actor, the same arguments), made on a tool that
//!   answers at once with the output the server's innermost service makes of the echo (its
//!   structured content), bare and behind the same stack, without MCP: the stack's own cost
//!   in this run.
//!
//! Every call carries fresh params (a counter), so that the idempotency layer stores a new
//! record and loop detection sees a new call each time.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::{RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{json, Map, Value};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};
use tower_toolcall_mcp::{registry_for, McpClient, McpServer, Trust};

/// A server whose one tool echoes its arguments as structured content.
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        Ok(CallToolResult::structured(Value::Object(args)).into())
    }
}

/// What the stacked server's innermost service answers for `Echo`'s result: the structured
/// content as the output (its one text block is the structured content's JSON, which the
/// server renders again rather than keep), so that the stack alone stores the same records.
fn echoed(call: &ToolCall) -> ToolOutput {
    ToolOutput::new(Value::Object(call.params().as_map().clone()))
}

fn tools() -> Vec<Tool> {
    vec![Tool::new("search", "Echoes", Arc::new(Map::new()))
        .annotate(ToolAnnotations::new().read_only(true))]
}

fn stack() -> ToolStack {
    let registry = registry_for("bench", &tools(), Trust::Trusted, None).unwrap();
    ToolStack::builder(registry).build().unwrap()
}

fn args(n: u64) -> Map<String, Value> {
    let value =
        json!({"query": "tower middleware retry with exponential backoff", "limit": 10, "n": n});
    value.as_object().unwrap().clone()
}

async fn connect<S: rmcp::Service<RoleServer>>(server: S) -> RunningService<RoleClient, ()> {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_end).await.unwrap()
}

fn mcp(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let bare = runtime.block_on(connect(Echo));
    let adapter = runtime.block_on(connect(McpServer::new(
        Echo,
        "bench",
        tower::layer::util::Identity::new(),
    )));
    let stacked_server = McpServer::new(Echo, "bench", stack());
    // The stack-alone rows make the calls the stacked server makes: its session (a ULID),
    // request ids after it, and the name rmcp's client gives (the actor).
    let session = stacked_server.session_key().to_owned();
    let stacked = runtime.block_on(connect(stacked_server));
    let actor = rmcp::ClientHandler::get_info(&()).client_info.name;
    let for_client = runtime.block_on(connect(Echo));
    let client = McpClient::new(for_client.peer().clone());
    let echo = tool_fn(|call: ToolCall| async move { Ok(echoed(&call)) });
    let clients: [(&str, BoxCloneSyncService<ToolCall, ToolOutput, ToolError>); 4] = [
        ("mcp_client", BoxCloneSyncService::new(client.clone())),
        (
            "stacked_client",
            BoxCloneSyncService::new(stack().layer(client)),
        ),
        ("tool_alone", BoxCloneSyncService::new(echo)),
        ("stack_alone", BoxCloneSyncService::new(stack().layer(echo))),
    ];

    let mut group = c.benchmark_group("mcp");
    let mut n = 0;
    for (name, running) in [
        ("bare_rmcp", &bare),
        ("adapter_server", &adapter),
        ("stacked_server", &stacked),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        n += 1;
                        let params = CallToolRequestParams::new("search").with_arguments(args(n));
                        let result = running.call_tool(params).await.unwrap();
                        assert_ne!(result.is_error, Some(true), "{result:?}");
                        black_box(result);
                    }
                    start.elapsed()
                })
            })
        });
    }
    for (name, service) in clients {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        n += 1;
                        let call = ToolCall::builder("bench", "search")
                            .session(&session)
                            .request_id(format!("{session}-{n}"))
                            .actor(&actor)
                            .params(Value::Object(args(n)))
                            .build()
                            .unwrap();
                        black_box(service.clone().oneshot(call).await.unwrap());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, mcp);
criterion_main!(benches);
