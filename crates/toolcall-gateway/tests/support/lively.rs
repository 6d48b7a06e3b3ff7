//! An MCP upstream over streamable HTTP whose tools report progress, heed cancellation and
//! change: `scan`, a read that reports its progress and runs until it is done or cancelled;
//! `send`, a write that runs until it is done or cancelled; `grow`, which adds a tool to
//! the list and tells the client that the list changed; and `storm`, which does that every
//! `everyMs` for `count` times.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{json, Value};

/// The steps of progress `scan` reports.
pub(crate) const SCAN_STEPS: u64 = 3;

/// How the calls of one tool ended.
#[derive(Default)]
pub(crate) struct Ends {
    pub(crate) started: AtomicU64,
    pub(crate) finished: AtomicU64,
    /// Cancelled by the client before they finished.
    pub(crate) stopped: AtomicU64,
}

impl Ends {
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (
            self.started.load(Ordering::SeqCst),
            self.finished.load(Ordering::SeqCst),
            self.stopped.load(Ordering::SeqCst),
        )
    }
}

/// The upstream: what its tools did. Clones share it.
#[derive(Clone, Default)]
pub(crate) struct Lively {
    pub(crate) scan: Arc<Ends>,
    pub(crate) send: Arc<Ends>,
    /// The tools `grow` added.
    grown: Arc<Mutex<Vec<String>>>,
}

fn tool(name: String, description: &str, annotations: ToolAnnotations) -> Tool {
    let schema = json!({"type": "object", "properties": {"holdMs": {"type": "integer"}}});
    Tool::new(
        name,
        description.to_owned(),
        Arc::new(schema.as_object().cloned().unwrap_or_default()),
    )
    .annotate(annotations)
}

impl Lively {
    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![
            tool(
                "scan".into(),
                "Scans, reporting progress",
                ToolAnnotations::new().read_only(true),
            ),
            tool(
                "send".into(),
                "Sends a message",
                ToolAnnotations::new().destructive(false).idempotent(false),
            ),
            tool(
                "grow".into(),
                "Adds a tool",
                ToolAnnotations::new().destructive(false).idempotent(false),
            ),
            tool(
                "storm".into(),
                "Adds tools, one at a time, saying so each time",
                ToolAnnotations::new().destructive(false).idempotent(false),
            ),
        ];
        for name in self.grown.lock().unwrap().iter() {
            tools.push(tool(
                name.clone(),
                "A tool grown",
                ToolAnnotations::new().read_only(true),
            ));
        }
        tools
    }

    /// Adds a tool to the list: its name.
    fn grow(&self) -> String {
        let mut grown = self.grown.lock().unwrap();
        let name = format!("extra_{}", grown.len() + 1);
        grown.push(name.clone());
        name
    }

    /// Runs for `holdMs` of `args`, unless the request is cancelled first.
    async fn hold(
        ends: &Ends,
        args: &serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> bool {
        ends.started.fetch_add(1, Ordering::SeqCst);
        let hold = Duration::from_millis(args.get("holdMs").and_then(Value::as_u64).unwrap_or(0));
        tokio::select! {
            () = tokio::time::sleep(hold) => {
                ends.finished.fetch_add(1, Ordering::SeqCst);
                true
            }
            () = context.ct.cancelled() => {
                ends.stopped.fetch_add(1, Ordering::SeqCst);
                false
            }
        }
    }
}

impl ServerHandler for Lively {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        match request.name.as_ref() {
            "scan" => {
                if let Some(token) = context.meta.get_progress_token() {
                    for step in 1..=SCAN_STEPS {
                        let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                            .with_total(SCAN_STEPS as f64)
                            .with_message(format!("scanned {step} of {SCAN_STEPS}"));
                        let _ = context.peer.notify_progress(progress).await;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                let done = Lively::hold(&self.scan, &args, &context).await;
                Ok(CallToolResult::structured(json!({"scanned": done})).into())
            }
            "send" => {
                let done = Lively::hold(&self.send, &args, &context).await;
                Ok(CallToolResult::structured(json!({"sent": done})).into())
            }
            "grow" => {
                let name = self.grow();
                let _ = context.peer.notify_tool_list_changed().await;
                Ok(CallToolResult::structured(json!({"added": name})).into())
            }
            "storm" => {
                let count = args.get("count").and_then(Value::as_u64).unwrap_or(1);
                let every = args.get("everyMs").and_then(Value::as_u64).unwrap_or(20);
                for _ in 0..count {
                    self.grow();
                    let _ = context.peer.notify_tool_list_changed().await;
                    tokio::time::sleep(Duration::from_millis(every)).await;
                }
                Ok(CallToolResult::structured(json!({"added": count})).into())
            }
            name => Ok(CallToolResult::structured(json!({"ran": name})).into()),
        }
    }
}
