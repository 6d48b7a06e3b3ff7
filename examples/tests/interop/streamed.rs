//! A tool that streams its answer, served by `McpServer` over streamable HTTP: the official
//! SDKs' clients that ask for progress get each chunk as a progress notification, then the
//! whole result; a client that does not ask gets the result alone.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{json, Value};
use tower::Layer;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
use tower_toolcall_mcp::McpServer;

use crate::kit::Sdk;

/// The chunks the tool sends: multi-byte text, quotes and a new line.
const PARTS: [&str; 4] = ["Tower ", "layers «compose»\n", "\"quoted\" ", "😀"];

/// The server on a free loopback port; its `/mcp` URL.
async fn streaming_server() -> String {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new("docs", "summarize", RiskLevel::ReadOnly).with_streaming(true))
        .build()
        .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let tool = tool_fn(|call: ToolCall| async move {
        for part in PARTS {
            call.chunks().send(json!(part));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(ToolOutput::new(json!({"summary": PARTS.concat()})))
    });
    let schema = Arc::new(json!({"type": "object"}).as_object().cloned().unwrap());
    let tools = vec![Tool::new("summarize", "Summarizes a document", schema)
        .annotate(ToolAnnotations::new().read_only(true))];
    let server = McpServer::over("docs", stack.layer(tool), tools);
    let service = StreamableHttpService::new(
        move || Ok(server.connection()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}/mcp")
}

/// Calls `summarize` with `sdk`'s client, asking for progress, then without.
async fn streamed_as_progress(sdk: Sdk) {
    let url = streaming_server().await;
    let call = |progress: bool| json!({"op": "call", "name": "summarize", "arguments": {"doc": "tower"}, "progress": progress});
    let plan = json!({
        "transport": {"kind": "http", "url": url},
        "protocolVersion": "2025-11-25",
        "clientName": format!("interop-{}-streamed", sdk.name()),
        "steps": [call(true), call(false)],
    });
    let report = sdk.run(&plan).await;
    let steps = report["steps"].as_array().expect("the report's steps");

    let asked = &steps[0];
    let result = &asked["ok"];
    assert_eq!(
        result["structuredContent"],
        json!({"summary": PARTS.concat()}),
        "{asked}"
    );
    let progress = asked["progress"].as_array().expect("the progress it got");
    let messages: Vec<&str> = progress
        .iter()
        .map(|p| p["message"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(messages, PARTS, "each chunk once, in order: {asked}");
    let counts: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(counts, [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        messages.concat(),
        PARTS.concat(),
        "reassembled byte for byte"
    );

    let not_asked = &steps[1];
    assert_eq!(
        not_asked["ok"]["structuredContent"],
        json!({"summary": PARTS.concat()}),
        "{not_asked}"
    );
    assert_eq!(not_asked.get("progress"), None::<&Value>);
}

#[tokio::test]
async fn python_client_gets_chunks_as_progress_then_the_result() {
    streamed_as_progress(Sdk::Python).await;
}

#[tokio::test]
async fn typescript_client_gets_chunks_as_progress_then_the_result() {
    streamed_as_progress(Sdk::TypeScript).await;
}
