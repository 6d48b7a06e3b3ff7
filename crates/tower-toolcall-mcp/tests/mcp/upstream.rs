//! What an upstream's failures mean behind the stack: an `isError` answer, a failure the
//! operator says is one, and a request lost after it was sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_toolcall::breaker::BreakerKey;
use tower_toolcall::{ErrorClass, ErrorCode, ToolCall, ToolStack};
use tower_toolcall_mcp::{registry_for, IsError, McpClient, Trust};

/// A server whose `lookup` (read-only) answers `isError` and whose `charge` (writes, not
/// idempotent) never answers; counts the calls of each.
#[derive(Clone, Default)]
struct Upstream {
    lookups: Arc<AtomicUsize>,
    charges: Arc<AtomicUsize>,
    charging: Arc<tokio::sync::Notify>,
}

impl Upstream {
    fn tools() -> Vec<Tool> {
        let schema = Arc::new(serde_json::Map::new());
        vec![
            Tool::new("lookup", "Looks a record up", schema.clone())
                .annotate(ToolAnnotations::new().read_only(true)),
            Tool::new("charge", "Charges a card", schema)
                .annotate(ToolAnnotations::new().destructive(false).idempotent(false)),
        ]
    }
}

impl ServerHandler for Upstream {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "lookup" {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            return Ok(CallToolResult::error(vec![ContentBlock::text("no such record")]).into());
        }
        self.charges.fetch_add(1, Ordering::SeqCst);
        self.charging.notify_one();
        std::future::pending().await
    }
}

fn call(name: &str) -> ToolCall {
    ToolCall::builder("shop", name)
        .session("s")
        .actor("agent")
        .params(json!({"id": "r-1"}))
        .build()
        .unwrap()
}

/// The running ends of an upstream served over a pipe: the server (to stop it) and the
/// client (alive while the test calls through it).
struct Served {
    server: rmcp::service::RunningService<RoleServer, Upstream>,
    _client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

async fn served(upstream: Upstream) -> (McpClient, Served) {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move { upstream.serve(server_end).await.unwrap() });
    let client = ().serve(client_end).await.unwrap();
    let server = server.await.unwrap();
    let mcp = McpClient::new(client.peer().clone());
    (
        mcp,
        Served {
            server,
            _client: client,
        },
    )
}

#[tokio::test(start_paused = true)]
async fn an_is_error_answer_is_terminal_and_not_counted_unless_the_operator_says_otherwise() {
    for (is_error, calls, failures) in [(IsError::Answer, 1, 0), (IsError::Failure, 4, 4)] {
        let upstream = Upstream::default();
        let (client, _server) = served(upstream.clone()).await;
        let client = client.with_is_error_for("lookup", is_error);
        let registry = registry_for("shop", &Upstream::tools(), Trust::Trusted, None).unwrap();
        let stack = ToolStack::builder(registry).build().unwrap();
        let breakers = stack.breakers().unwrap();
        let err = stack
            .layer(client)
            .oneshot(call("lookup"))
            .await
            .unwrap_err();
        assert_eq!(
            upstream.lookups.load(Ordering::SeqCst),
            calls,
            "{is_error:?}"
        );
        let stats = breakers
            .status(&BreakerKey::tool("shop", "lookup"))
            .unwrap()
            .stats;
        assert_eq!(stats.failures, failures, "{is_error:?}");
        match is_error {
            IsError::Answer => {
                assert_eq!(err.code(), ErrorCode::UpstreamError);
                assert_eq!(err.class(), ErrorClass::Terminal);
                assert_eq!(err.message(), "no such record");
            }
            _ => assert_eq!(err.code(), ErrorCode::RetryExhausted),
        }
    }
}

#[tokio::test]
async fn a_write_lost_after_it_was_sent_is_not_retried() {
    let upstream = Upstream::default();
    let (client, served) = served(upstream.clone()).await;
    let registry = registry_for("shop", &Upstream::tools(), Trust::Trusted, None).unwrap();
    let tools = ToolStack::builder(registry).build().unwrap().layer(client);
    let charging = upstream.charging.clone();
    let lost = tokio::spawn(tools.oneshot(call("charge")));
    charging.notified().await;
    // The server goes away with the charge in flight: it may or may not have happened.
    served.server.cancel().await.unwrap();
    let err = lost.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable, "{err:?}");
    assert!(!err.is_not_processed(), "the outcome is unknown");
    assert_eq!(
        upstream.charges.load(Ordering::SeqCst),
        1,
        "not charged twice"
    );
    assert!(
        err.message().contains("may or may not have run"),
        "{}",
        err.message()
    );
}
