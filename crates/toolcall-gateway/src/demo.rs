//! The demo the gateway serves when it is given no upstream: three tools of its own, so that
//! its first run shows the stack at work.
//!
//! - `web::search`: read-only; its upstream fails on every 5th request (the retry hides it);
//! - `vault::createFile`: mutating; needs the user's confirmation (`control.confirmationId`
//!   in the envelope, `_meta.confirmationId` over MCP);
//! - `reports::report`: slow; takes 2 seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::json;
use tower::util::BoxCloneSyncService;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolError, ToolOutput};

/// The demo tools as one service.
pub(crate) fn service() -> BoxCloneSyncService<ToolCall, ToolOutput, ToolError> {
    let searches = Arc::new(AtomicUsize::new(0));
    BoxCloneSyncService::new(tool_fn(move |call: ToolCall| {
        run_tool(call, searches.clone())
    }))
}

/// The MCP descriptions of the registered tools: their schemas, and their policy as
/// annotations.
pub(crate) fn mcp_tools(registry: &ToolRegistry) -> Vec<(String, Tool)> {
    registry
        .tools()
        .map(|registered| {
            let d = registered.descriptor();
            let schema = d
                .input_schema
                .as_ref()
                .and_then(|s| s.as_object().cloned())
                .unwrap_or_else(|| {
                    json!({"type": "object"})
                        .as_object()
                        .cloned()
                        .unwrap_or_default()
                });
            let tool = Tool::new(
                d.name.clone(),
                d.description.clone().unwrap_or_default(),
                Arc::new(schema),
            )
            .annotate(
                ToolAnnotations::new()
                    .read_only(d.risk == RiskLevel::ReadOnly)
                    .destructive(d.confirmation_required)
                    .idempotent(d.idempotent),
            );
            (d.namespace.clone(), tool)
        })
        .collect()
}

/// The demo tools, with their schemas and policies.
pub(crate) fn registry() -> Result<ToolRegistry, tower_toolcall::ConfigError> {
    ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("web", "search", RiskLevel::ReadOnly)
                .with_description("Searches the web.")
                .with_idempotent(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string", "minLength": 1}}
                })),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                .with_description("Creates a file in the vault.")
                .with_confirmation_required(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["path", "content"],
                    "properties": {
                        "path": {"type": "string"},
                        "content": {"type": "string"}
                    },
                    "additionalProperties": false
                })),
        )
        .tool(
            ToolDescriptor::new("reports", "report", RiskLevel::ReadOnly)
                .with_description("Builds a report; takes 2 seconds.")
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .build()
}

/// The search: read-only; its upstream fails on every 5th request.
fn search(call: &ToolCall, searches: &AtomicUsize) -> Result<ToolOutput, ToolError> {
    if searches.fetch_add(1, Ordering::SeqCst) % 5 == 4 {
        return Err(ToolError::from_http_status(
            503,
            "search upstream is overloaded",
        ));
    }
    let query = call
        .params()
        .as_map()
        .get("query")
        .and_then(|q| q.as_str())
        .unwrap_or_default();
    Ok(ToolOutput::new(json!({
        "query": query,
        "hits": [format!("{query}: the first hit"), format!("{query}: the second hit")],
    })))
}

/// The file write: mutating; pretends to write and says when, so that a cached answer shows.
fn create_file(call: &ToolCall) -> Result<ToolOutput, ToolError> {
    let params = call.params().as_map();
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    Ok(ToolOutput::new(json!({
        "path": params["path"],
        "bytes": params["content"].as_str().unwrap_or_default().len(),
        "createdAt": created_at,
    })))
}

/// The report: slow.
async fn report() -> Result<ToolOutput, ToolError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(ToolOutput::new(json!({"report": "all systems nominal"})))
}

/// One service for every tool: it dispatches on the tool's name.
async fn run_tool(call: ToolCall, searches: Arc<AtomicUsize>) -> Result<ToolOutput, ToolError> {
    match (call.tool_namespace(), call.tool_name()) {
        ("web", "search") => search(&call, &searches),
        ("vault", "createFile") => create_file(&call),
        ("reports", "report") => report().await,
        (ns, name) => Err(ToolError::new(
            ErrorCode::NotFound,
            format!("no implementation for {ns}::{name}"),
        )),
    }
}
