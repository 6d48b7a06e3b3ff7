//! The client side: a remote MCP server's tools as a `Service<ToolCall>`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequest, CallToolResult, CancelledNotificationParam, ClientConfig, ClientRequest,
    ProgressNotificationParam, RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions};
use rmcp::{ClientHandler, RoleClient};
use tower::Service;

use super::convert::{error_from_service, outcome_of, request_params};
use super::policy::{registry_for, Trust};
use super::progress::{log_progress, ProgressCalls};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{ErrorCode, ToolCall, ToolError, ToolOutput};

/// The request ids of the calls in flight, by the progress token rmcp gave their request.
type Calls = ProgressCalls;

/// The tools of a remote MCP server as a `Service<ToolCall>`, over any rmcp client
/// transport (stdio of a child process, streamable HTTP, an in-process pipe).
///
/// This crate enables rmcp's stdio and child-process transports; its `http` feature adds
/// rmcp's streamable-HTTP client transport (`rmcp::transport::StreamableHttpClientTransport`,
/// on `reqwest` without TLS: enable one of `reqwest`'s TLS features for `https`).
///
/// Each call is a `tools/call` of the call's tool name with its params as arguments and its
/// idempotency key, confirmation and `traceparent` in `_meta`. A result is the output; an
/// `isError` result is a `ToolError` (with the code, class and retry-after a stacked server
/// wrote, else an unclassified `UPSTREAM_ERROR`); a transport that failed or closed is a
/// retriable `UPSTREAM_UNAVAILABLE`. A call dropped before its answer (a timeout, a caller
/// that went away) cancels its request on the server.
///
/// Put a [`ToolStack`](tower_toolcall::ToolStack) built from [`McpClient::registry`] around it, and the
/// agent's outgoing calls get dedupe, retries of what MCP marks safe, a breaker per tool
/// (or one per server: calls sent with `BreakerScope::Dependency` share the breaker of the
/// server's namespace) and loop detection.
///
/// ```no_run
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_toolcall_mcp::{McpClient, Trust};
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
    in_flight: Option<Calls>,
}

impl McpClient {
    /// Calls the server behind `peer` (from a running rmcp client: `running.peer().clone()`).
    pub fn new(peer: Peer<RoleClient>) -> Self {
        McpClient {
            peer,
            in_flight: None,
        }
    }

    /// Tells `events`, the handler the rmcp client was served with, which call each progress
    /// notification belongs to, so that its events carry the call's request id.
    pub fn with_progress_events(mut self, events: &ProgressEvents) -> Self {
        self.in_flight = Some(events.in_flight.clone());
        self
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
        let Some(in_flight) = self.in_flight.clone() else {
            return Box::pin(async move {
                match peer.call_tool(params).await {
                    Ok(result) => outcome_of(result),
                    Err(error) => Err(error_from_service(error)),
                }
            });
        };
        let request_id: Arc<str> = call.request_id().into();
        Box::pin(async move {
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = peer
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await
                .map_err(error_from_service)?;
            let _tracked = in_flight.insert(handle.progress_token.clone(), request_id);
            let mut cancel = CancelOnDrop {
                peer: peer.clone(),
                id: Some(handle.id.clone()),
            };
            let answer = handle.await_response().await;
            cancel.id = None;
            match answer.map_err(error_from_service)? {
                ServerResult::CallToolResult(result) => outcome_of(result),
                ServerResult::EmptyResult(_) => outcome_of(CallToolResult::success(Vec::new())),
                _ => Err(ToolError::new(
                    ErrorCode::UpstreamError,
                    "the MCP server answered tools/call with something other than a result",
                )),
            }
        })
    }
}

/// Cancels a request on the server when its caller drops the call before the answer.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        let cancelled = CancelledNotificationParam::new(
            Some(id),
            Some("the caller dropped the tool call".to_owned()),
        );
        runtime.spawn(async move {
            let _ = peer.notify_cancelled(cancelled).await;
        });
    }
}

/// An rmcp client handler that logs a server's progress notifications as
/// `tool_call_progress` events: `requestId` (the call's, when the [`McpClient`] was given
/// these events with [`McpClient::with_progress_events`]; else the progress token),
/// `progress`, `total` and `message`.
///
/// Serve the client with it instead of `()` or a bare `ClientConfig`:
///
/// ```no_run
/// use tower_toolcall_mcp::{McpClient, ProgressEvents};
///
/// # async fn run(transport: tokio::io::DuplexStream) -> Result<(), Box<dyn std::error::Error>> {
/// let events = ProgressEvents::default();
/// let running = rmcp::ServiceExt::serve(events.clone(), transport).await?;
/// let client = McpClient::new(running.peer().clone()).with_progress_events(&events);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProgressEvents {
    info: ClientConfig,
    in_flight: Calls,
}

impl ProgressEvents {
    /// Sends `info` (the client's name, version and capabilities) when connecting.
    pub fn with_info(mut self, info: ClientConfig) -> Self {
        self.info = info;
        self
    }
}

impl ClientHandler for ProgressEvents {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let call = self.in_flight.get(&params.progress_token);
        log_progress(call.as_deref(), &params);
    }
}
