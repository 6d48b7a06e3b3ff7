//! A flaky MCP upstream over streamable HTTP, for the gateway's tests and its safety
//! benchmark: `pay`, a payment that is not idempotent and loses 10 % of its answers after it
//! acted, and `balance`, a read that fails for 20 % of its calls. Which calls are unlucky is
//! decided by each tool's call count, so that every hundred calls of a tool has exactly its
//! share, the first call included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{json, Value};

/// How long a lost answer is held.
pub(crate) const LOST: Duration = Duration::from_millis(1_500);
/// The upstream: what it did.
#[derive(Clone, Default)]
pub(crate) struct Upstream {
    /// Executions of each payment id.
    pub(crate) payments: Arc<Mutex<HashMap<String, u64>>>,
    /// Payments made (the balance).
    pub(crate) made: Arc<AtomicU64>,
    /// Calls of every tool that reached the upstream.
    pub(crate) calls: Arc<AtomicU64>,
    /// The calls of each tool so far, which decide which of them fail or lose their answer:
    /// exactly the given share of each hundred.
    draws: Arc<[AtomicU64; 2]>,
    /// Payments whose answer was lost.
    pub(crate) lost: Arc<AtomicU64>,
}

impl Upstream {
    fn tools() -> Vec<Tool> {
        let schema = |props: Value| {
            Arc::new(
                json!({"type": "object", "properties": props})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        vec![
            Tool::new(
                "pay",
                "Makes a payment",
                schema(json!({"id": {"type": "string"}})),
            )
            .annotate(ToolAnnotations::new().destructive(false).idempotent(false)),
            Tool::new(
                "balance",
                "Reads the balance",
                schema(json!({"account": {"type": "string"}})),
            )
            .annotate(ToolAnnotations::new().read_only(true)),
        ]
    }

    /// `true` for `percent` % of the calls of the tool `tool` (0: pay, 1: balance), spread
    /// over every hundred of them.
    fn unlucky(&self, tool: usize, percent: u64) -> bool {
        let n = self.draws[tool].fetch_add(1, Ordering::SeqCst);
        (n * 19) % 100 < percent
    }
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Upstream::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let args = request.arguments.unwrap_or_default();
        match request.name.as_ref() {
            "pay" => {
                let id = args
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                *self.payments.lock().unwrap().entry(id).or_default() += 1;
                self.made.fetch_add(1, Ordering::SeqCst);
                if self.unlucky(0, 10) {
                    // Acted, but the answer never arrives in time.
                    self.lost.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(LOST).await;
                }
                Ok(CallToolResult::structured(json!({"paid": true})).into())
            }
            _ => {
                if self.unlucky(1, 20) {
                    return Err(ErrorData::internal_error(
                        "the ledger is busy; try again",
                        None,
                    ));
                }
                let balance = self.made.load(Ordering::SeqCst);
                Ok(CallToolResult::success(vec![ContentBlock::text(balance.to_string())]).into())
            }
        }
    }
}

/// Serves a fresh upstream on a free loopback port; its state and URL.
pub(crate) async fn upstream() -> (Upstream, String) {
    let state = Upstream::default();
    let url = crate::http::serve(state.clone()).await;
    (state, url)
}
