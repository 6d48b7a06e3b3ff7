//! The client side: a remote MCP server's tools as a `Service<ToolCall>`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use rmcp::service::Peer;
use rmcp::RoleClient;
use tower::Service;

use super::convert::{error_from_service, outcome_of, request_params};
use super::policy::{registry_for, Trust};
use crate::registry::ToolRegistry;
use crate::{ErrorCode, ToolCall, ToolError, ToolOutput};

/// The tools of a remote MCP server as a `Service<ToolCall>`, over any rmcp client
/// transport (stdio of a child process, streamable HTTP, an in-process pipe).
///
/// Each call is a `tools/call` of the call's tool name with its params as arguments and its
/// idempotency key, confirmation and `traceparent` in `_meta`. A result is the output; an
/// `isError` result is a `ToolError` (with the code, class and retry-after a stacked server
/// wrote, else an unclassified `UPSTREAM_ERROR`); a transport that failed or closed is a
/// retriable `UPSTREAM_UNAVAILABLE`. Put a [`ToolStack`](crate::ToolStack) built from
/// [`McpClient::registry`] around it, and the agent's outgoing calls get dedupe, retries of
/// what MCP marks safe, a breaker per tool and loop detection.
///
/// ```no_run
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_toolcall::mcp::{McpClient, Trust};
/// use tower_toolcall::{ToolCall, ToolStack};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let command = tokio::process::Command::new("my-mcp-server");
/// let running = rmcp::ServiceExt::serve((), rmcp::transport::TokioChildProcess::new(command)?).await?;
/// let client = McpClient::new(running.peer().clone());
/// let registry = client.registry("notes", Trust::Trusted, None).await?;
/// let tools = ServiceBuilder::new()
///     .layer(ToolStack::builder(registry).build()?)
///     .service(client);
/// let call = ToolCall::builder("notes", "search").session("s").actor("agent").build()?;
/// let output = tools.oneshot(call).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct McpClient {
    peer: Peer<RoleClient>,
}

impl McpClient {
    /// Calls the server behind `peer` (from a running rmcp client: `running.peer().clone()`).
    pub fn new(peer: Peer<RoleClient>) -> Self {
        McpClient { peer }
    }

    /// The peer.
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Lists the server's tools and registers them in `namespace` with policy from their
    /// annotations, under the operator's registry (see [`registry_for`]).
    pub async fn registry(
        &self,
        namespace: &str,
        trust: Trust,
        operator: Option<&ToolRegistry>,
    ) -> Result<ToolRegistry, ToolError> {
        let tools = self
            .peer
            .list_all_tools()
            .await
            .map_err(error_from_service)?;
        registry_for(namespace, &tools, trust, operator).map_err(|err| {
            ToolError::new(
                ErrorCode::ValidationError,
                format!("the tools of the MCP server give no valid registry: {err}"),
            )
        })
    }
}

impl Service<ToolCall> for McpClient {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let peer = self.peer.clone();
        let params = request_params(&call);
        Box::pin(async move {
            match peer.call_tool(params).await {
                Ok(result) => outcome_of(result),
                Err(error) => Err(error_from_service(error)),
            }
        })
    }
}
