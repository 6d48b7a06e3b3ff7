//! The MCP example server as a child process: an `McpClient` behind the stack over its
//! stdio, and its bound on the length of an incoming line. The adapter's own tests, in
//! process, are `tower-toolcall-mcp`'s.

use rmcp::ServiceExt as _;
use serde_json::{json, Value};
use tower::{Layer, ServiceExt};
use tower_toolcall::{ErrorCode, ToolCall, ToolStack};
use tower_toolcall_mcp::{McpClient, Trust};

fn call(name: &str, args: Value) -> tower_toolcall::envelope::ToolCallBuilder {
    ToolCall::builder("notes", name)
        .session("agent-session")
        .actor("agent")
        .params(args)
}

// ---- over stdio, with the example server as a child process ----

#[tokio::test]
async fn end_to_end_over_stdio_with_the_example_server() {
    let binary = env!("CARGO_BIN_EXE_mcp-example-server");
    let command = tokio::process::Command::new(binary);
    let transport = rmcp::transport::TokioChildProcess::new(command)
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}; build it with `cargo build -p tower-toolcall-examples --features mcp --bin mcp-example-server`"));
    let running = ().serve(transport).await.expect("the MCP handshake over stdio");
    let client = McpClient::new(running.peer().clone());
    let registry = client
        .registry("notes", Trust::Trusted, None)
        .await
        .unwrap();
    assert_eq!(registry.len(), 3);
    assert!(
        registry
            .get("notes", "delete")
            .unwrap()
            .descriptor()
            .confirmation_required
    );
    let tools = ToolStack::builder(registry).build().unwrap().layer(client);

    let put = tools
        .clone()
        .oneshot(
            call("put", json!({"id": "n1", "text": "stdio works"}))
                .idempotency_key("s-1")
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(put.content, json!({"notes": 1}));
    // The server's stack retries its flaky backend; the client sees one clean answer.
    let found = tools
        .clone()
        .oneshot(call("search", json!({"query": "flaky"})).build().unwrap())
        .await
        .unwrap();
    assert_eq!(found.content, json!({"hits": []}));
    let found = tools
        .clone()
        .oneshot(call("search", json!({"query": "stdio"})).build().unwrap())
        .await
        .unwrap();
    assert_eq!(found.content, json!({"hits": ["stdio works"]}));
    let refused = tools
        .clone()
        .oneshot(call("delete", json!({"id": "n1"})).build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PolicyDenied);
    running.cancel().await.unwrap();
}

// ---- the line limit of a stdio server ----

/// The peak resident memory of process `pid`, in bytes (Linux's `VmHWM`).
#[cfg(target_os = "linux")]
fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: usize = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

// Linux only: the memory is read from /proc. Real time: a child process.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_over_long_line_is_dropped_unread_and_the_stdio_server_serves_the_next() {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    const LINE_BYTES: usize = 12 << 20;
    let binary = env!("CARGO_BIN_EXE_mcp-example-server");
    let mut child = tokio::process::Command::new(binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_answer = async move || -> Value {
        let line = tokio::time::timeout(std::time::Duration::from_secs(60), stdout.next_line())
            .await
            .expect("an answer within a minute")
            .unwrap()
            .expect("the server is still there");
        serde_json::from_str(&line).unwrap()
    };

    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    stdin
        .write_all(format!("{initialize}\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(next_answer().await["id"], 1);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin
        .write_all(format!("{initialized}\n").as_bytes())
        .await
        .unwrap();
    let before = peak_rss(pid);

    // A well-formed call 12 MiB long (under rmcp's own bound of 16 MiB, over the server's 4),
    // then a small one.
    let long = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "put", "arguments": {"id": "n1", "text": "x".repeat(LINE_BYTES)}}});
    let short = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "put", "arguments": {"id": "n2", "text": "short"}}});
    let writer = tokio::spawn(async move {
        stdin
            .write_all(format!("{long}\n{short}\n").as_bytes())
            .await
            .unwrap();
        stdin
    });
    let answer = next_answer().await;
    assert_eq!(answer["id"], 3, "the long line got no answer: {answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(answer["result"]["structuredContent"], json!({"notes": 1}));
    let growth = peak_rss(pid).saturating_sub(before);
    assert!(
        growth < 8 << 20,
        "the 12 MiB line was not kept: the peak memory grew by {growth} bytes"
    );

    // The connection still serves.
    let mut stdin = writer.await.unwrap();
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    stdin
        .write_all(format!("{list}\n").as_bytes())
        .await
        .unwrap();
    let answer = next_answer().await;
    assert_eq!(answer["id"], 4);
    assert_eq!(answer["result"]["tools"].as_array().unwrap().len(), 3);
    drop(stdin);
    assert!(child.wait().await.unwrap().success());
}

#[tokio::test]
async fn the_example_server_obeys_the_operators_switches_from_the_environment() {
    let binary = env!("CARGO_BIN_EXE_mcp-example-server");
    // The same write sent twice without a key: a re-send under the key derived from its
    // params, answered from the record, unless derivation is switched off.
    for (derive, answered_from_cache) in [(None, true), (Some("off"), false)] {
        let mut command = tokio::process::Command::new(binary);
        if let Some(value) = derive {
            command.env("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY", value);
        }
        let transport = rmcp::transport::TokioChildProcess::new(command).unwrap();
        let running = ().serve(transport).await.expect("the MCP handshake over stdio");
        let put = || {
            rmcp::model::CallToolRequestParams::new("put").with_arguments(
                json!({"id": "n1", "text": "once"})
                    .as_object()
                    .unwrap()
                    .clone(),
            )
        };
        running.call_tool(put()).await.unwrap();
        let again = running.call_tool(put()).await.unwrap();
        let cached = again.meta.as_ref().is_some_and(|meta| {
            meta.get(tower_toolcall_mcp::FROM_CACHE_META) == Some(&json!(true))
        });
        assert_eq!(
            cached, answered_from_cache,
            "derivation {derive:?}: {again:?}"
        );
        running.cancel().await.unwrap();
    }
}
