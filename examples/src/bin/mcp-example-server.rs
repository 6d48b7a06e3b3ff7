//! Run with: `cargo run -p tower-toolcall-examples --features mcp --bin mcp-example-server [-- --registry registry.toml] [--max-line-bytes 4194304]`,
//! or over streamable HTTP with `-- --http 127.0.0.1:8931`.
//!
//! An MCP server over stdio (or streamable HTTP at `/mcp`) whose every `tools/call` goes
//! through the whole stack, under the operator's `TOOL_RELIABILITY_*` switches from the
//! environment. Its tools
//! keep notes: `search` (read-only; its backend times out on the first search for `flaky`),
//! `put` (writes a note by id; idempotent) and `delete` (destructive); each reports its end
//! as a progress notification when the request asks for progress. Their annotations
//! become their policy, and a registry file given with `--registry` overrides it. Start it
//! from an MCP client (an agent, the MCP inspector, or `McpClient` over
//! `TokioChildProcess`): it speaks JSON-RPC on stdin and stdout. An incoming line longer than
//! `--max-line-bytes` (4 MiB by default) is dropped unread and unanswered, and the server
//! goes on serving the next lines.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::registry::{RetrySettings, ToolRegistry};
use tower_toolcall::{ConfigError, ToolStack};
use tower_toolcall_mcp::{registry_for, stdio_transport, McpServer, Trust, DEFAULT_MAX_LINE_BYTES};

/// The notes server's tools and what they hold.
#[derive(Clone, Debug, Default)]
pub struct Notes {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    notes: Mutex<BTreeMap<String, String>>,
    calls: Mutex<BTreeMap<String, usize>>,
    flaky_failed: AtomicBool,
}

impl Notes {
    /// How many times the tool `name` was called.
    pub fn calls(&self, name: &str) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// The tools, with their schemas and annotations.
    pub fn tools() -> Vec<Tool> {
        let schema = |value: Value| Arc::new(value.as_object().cloned().unwrap_or_default());
        vec![
            Tool::new(
                "search",
                "Searches the notes",
                schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string"}}
                })),
            )
            .with_raw_output_schema(schema(json!({
                "type": "object",
                "required": ["hits"],
                "properties": {"hits": {"type": "array"}}
            })))
            .annotate(ToolAnnotations::new().read_only(true).open_world(false)),
            Tool::new(
                "put",
                "Writes a note",
                schema(json!({
                    "type": "object",
                    "required": ["id", "text"],
                    "properties": {"id": {"type": "string"}, "text": {"type": "string"}}
                })),
            )
            .annotate(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(false)
                    .idempotent(true),
            ),
            Tool::new(
                "delete",
                "Deletes a note",
                schema(json!({
                    "type": "object",
                    "required": ["id"],
                    "properties": {"id": {"type": "string"}}
                })),
            )
            .annotate(ToolAnnotations::new().destructive(true)),
        ]
    }

    fn run(&self, name: &str, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        *self
            .state
            .calls
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default() += 1;
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut notes = self.state.notes.lock().unwrap();
        let structured = match name {
            "search" => {
                let query = text("query");
                if query == "flaky" && !self.state.flaky_failed.swap(true, Ordering::SeqCst) {
                    // A failure of the server, not an answer of the tool: a JSON-RPC error
                    // (an `isError` result would be the tool telling the model something).
                    return Err(ErrorData::internal_error(
                        "the search backend timed out",
                        None,
                    ));
                }
                let hits: Vec<&String> = notes.values().filter(|n| n.contains(&query)).collect();
                json!({ "hits": hits })
            }
            "put" => {
                notes.insert(text("id"), text("text"));
                json!({ "notes": notes.len() })
            }
            "delete" => json!({ "deleted": notes.remove(&text("id")).is_some() }),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::structured(structured))
    }
}

impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Notes::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = self.run(&request.name, &args)?;
        if let Some(token) = context.meta.get_progress_token() {
            let done = ProgressNotificationParam::new(token, 1.0)
                .with_total(1.0)
                .with_message(format!("{} done", request.name));
            let _ = context.peer.notify_progress(done).await;
        }
        Ok(result.into())
    }
}

/// The notes server behind the whole stack, its policy from the annotations under the
/// operator's registry.
pub fn stacked(
    notes: Notes,
    operator: Option<&ToolRegistry>,
) -> Result<McpServer<Notes>, ConfigError> {
    stacked_under(notes, operator, ReliabilityControl::default())
}

/// [`stacked`], under the operator's switches `control` (`TOOL_RELIABILITY_*` from the
/// environment, when the server runs as a program).
pub fn stacked_under(
    notes: Notes,
    operator: Option<&ToolRegistry>,
    control: ReliabilityControl,
) -> Result<McpServer<Notes>, ConfigError> {
    let registry =
        registry_for("notes", &Notes::tools(), Trust::Trusted, operator)?.with_control(control);
    let stack = ToolStack::builder(registry)
        .retry(|retry| {
            retry.settings(
                RetrySettings::default()
                    .with_base_delay_ms(1)
                    .with_max_delay_ms(5),
            )
        })
        .build()?;
    Ok(McpServer::new(notes, "notes", stack))
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve())
}

#[allow(dead_code)]
async fn serve() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    const USAGE: &str = "usage: mcp-example-server [--registry <registry.toml|json>] \
                         [--max-line-bytes <bytes>] [--http <address:port>]";
    let (mut operator, mut max_line_bytes, mut http) = (None, DEFAULT_MAX_LINE_BYTES, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--registry", Some(path)) => operator = Some(ToolRegistry::from_path(path)?),
            ("--max-line-bytes", Some(bytes)) => {
                max_line_bytes = bytes.parse().map_err(|_| USAGE)?;
            }
            ("--http", Some(address)) => http = Some(address),
            _ => return Err(USAGE.into()),
        }
    }
    let control = ReliabilityControl::from_env()?;
    let server = stacked_under(Notes::default(), operator.as_ref(), control)?;
    match http {
        Some(address) => serve_http(server, &address).await,
        None => {
            let running = rmcp::ServiceExt::serve(server, stdio_transport(max_line_bytes)?).await?;
            running.waiting().await?;
            Ok(())
        }
    }
}

/// Serves `server` over streamable HTTP at `http://<address>/mcp`: sessions for clients of
/// protocol versions before 2026-07-28, stateless requests for the others. Prints the bound
/// address (`listening on <address>`) on stdout once it accepts connections.
#[allow(dead_code)]
async fn serve_http(
    server: McpServer<Notes>,
    address: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let service = StreamableHttpService::new(
        move || Ok(server.connection()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
