//! Run with: `cargo run --example quickstart`
//!
//! Two tools behind one stack: a read-only web search and a file write that needs a schema-valid
//! path and content and the user's confirmation. Valid and invalid calls go through the stack,
//! and each answer is printed as the `ToolResult` envelope the agent would get back.

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{
    tool_fn, EnvelopeValidateLayer, ErrorCode, ResultEnvelopeLayer, ToolCall, ToolError, ToolOutput,
};

/// The web search tool: read-only, answers from a tiny in-memory index.
async fn search(call: ToolCall) -> Result<ToolOutput, ToolError> {
    let query = call.params().as_map()["query"].as_str().unwrap_or_default();
    let hits: Vec<_> = [
        "tower: a library of modular components",
        "tokio: an async runtime",
    ]
    .into_iter()
    .filter(|doc| doc.contains(query))
    .collect();
    Ok(ToolOutput::new(json!({ "query": query, "hits": hits })))
}

/// The file tool: mutating; pretends to write and returns the new etag.
async fn create_file(call: ToolCall) -> Result<ToolOutput, ToolError> {
    let params = call.params().as_map();
    let path = params["path"].as_str().unwrap_or_default();
    if path.contains("..") {
        return Err(ToolError::new(
            ErrorCode::PolicyDenied,
            "paths may not leave the vault; use a path inside it",
        ));
    }
    let content = params["content"].as_str().unwrap_or_default();
    Ok(
        ToolOutput::new(json!({ "path": path, "etag": format!("{:08x}", content.len()) }))
            .with_metadata("bytes", json!(content.len())),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .idempotent(true)
                .input_schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string", "minLength": 1}}
                })),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                .confirmation_required(true)
                .input_schema(json!({
                    "type": "object",
                    "required": ["path", "content"],
                    "properties": {
                        "path": {"type": "string", "pattern": "\\.md$"},
                        "content": {"type": "string"}
                    },
                    "additionalProperties": false
                })),
        )
        .deny("agents.tools.shell::*")
        .build()?;

    // One service for every tool: it dispatches on the tool's name.
    let tools = tool_fn(|call: ToolCall| async move {
        match (call.tool_namespace(), call.tool_name()) {
            ("agents.tools.web", "search") => search(call).await,
            ("vault", "createFile") => create_file(call).await,
            (ns, name) => Err(ToolError::new(
                ErrorCode::NotFound,
                format!("no implementation for {ns}::{name}"),
            )),
        }
    });

    let mut stack = ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(EnvelopeValidateLayer::new(registry))
        .service(tools);

    let calls = [
        (
            "a valid search",
            ToolCall::builder("agents.tools.web", "search")
                .session("sess-42")
                .actor("user-7")
                .params(json!({"query": "tower"})),
        ),
        (
            "a confirmed file write",
            ToolCall::builder("vault", "createFile")
                .session("sess-42")
                .actor("user-7")
                .confirmation_id("confirm-1")
                .params(json!({"path": "notes/today.md", "content": "hello"})),
        ),
        (
            "a file write without confirmation",
            ToolCall::builder("vault", "createFile")
                .session("sess-42")
                .actor("user-7")
                .params(json!({"path": "notes/today.md", "content": "hello"})),
        ),
        (
            "a file write whose params break the schema",
            ToolCall::builder("vault", "createFile")
                .session("sess-42")
                .actor("user-7")
                .confirmation_id("confirm-2")
                .params(json!({"path": "notes/today.txt", "content": 42, "force": true})),
        ),
        (
            "a denied tool",
            ToolCall::builder("agents.tools.shell", "exec")
                .session("sess-42")
                .actor("user-7")
                .params(json!({"cmd": "rm -rf /"})),
        ),
        (
            "an unknown tool",
            ToolCall::builder("agents.tools.mail", "send")
                .session("sess-42")
                .actor("user-7"),
        ),
    ];

    for (what, builder) in calls {
        let call = builder.build()?;
        let result = stack.ready().await?.call(call).await?;
        println!("# {what}\n{}\n", serde_json::to_string_pretty(&result)?);
    }

    // Envelopes that arrive as JSON are checked as they are parsed.
    let malformed = br#"{"contractVersion": "1.1", "requestId": "r-1", "toolName": "search",
        "toolNamespace": "agents.tools.web", "target": {"actorId": "user-7"},
        "payload": {"version": "1.0", "params": {"query": "tower"}}}"#;
    match ToolCall::from_json(malformed) {
        Ok(_) => unreachable!("the session key is missing"),
        Err(err) => println!("# a malformed envelope\n{}: {}", err.code(), err.message()),
    }
    Ok(())
}
