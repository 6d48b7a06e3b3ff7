//! The server side: an `rmcp` server whose every `tools/call` goes through a stack.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequest, CallToolResult, ClientNotification, ClientRequest, ContentBlock, ErrorData,
    ProtocolVersion, ServerConfig, ServerResult,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use super::convert::{error_from_mcp, outcome_and_blocks, result_of, result_with_blocks, CallMeta};
use super::in_flight::InFlight;
use super::progress::{ProgressCalls, ProgressTransport};
use tower_toolcall::envelope::MAX_IDENTIFIER_BYTES;
use tower_toolcall::{ErrorCode, ToolCall, ToolError, ToolOutput};

/// The `tools/call` requests being served, by the request id of their `ToolCall`.
type Pending = InFlight<String, Served>;

/// A `tools/call` being served: what the handler needs for each attempt, and the content
/// blocks of the handler's last successful answer.
#[derive(Clone)]
struct Served {
    request: CallToolRequest,
    context: RequestContext<RoleServer>,
    blocks: Arc<Mutex<Option<Vec<ContentBlock>>>>,
}

/// The actor of calls whose client sent no `clientInfo`.
const UNKNOWN_CLIENT: &str = "unknown-mcp-client";

/// An `rmcp` [`ServerHandler`] whose every `tools/call` runs through a tower stack.
///
/// Each `tools/call` becomes a [`ToolCall`] in the server's namespace (MCP names are flat):
/// the session is this connection's (one `McpServer` per connection, as rmcp's transports
/// create one handler per connection), the request id is the session's followed by the
/// JSON-RPC request's id, the actor is the client's `clientInfo.name`, and the
/// request's `_meta.idempotencyKey`, `_meta.traceparent` and `_meta.confirmationId` fill the
/// envelope. The call goes through the stack, whose innermost service is the handler's own
/// `tools/call` with the original request (its arguments the call's params, as the layers
/// leave them) and context, so that the tool's progress
/// notifications (for the request's `_meta.progressToken`) reach the client as before.
///
/// A call once dispatched is detached from its request: it runs on a task of its own, to its
/// end or its timeout, whether the client cancels the request or the connection ends. So
/// its idempotency record stays in flight, and a re-send of the call with the same
/// idempotency key (over this connection or another, within the key's scope) joins it or
/// gets its result instead of running the tool again. For the same reason, the cancellation
/// token of the context the handler gets is not the request's: it is cancelled when the
/// stack gives the attempt up (a timeout) or the attempt ends.
///
/// The answer is the tool's
/// `CallToolResult` (its content blocks as the tool wrote them; an answer from the
/// idempotency cache rebuilds them from the stored output), or an `isError` result whose text is the error's code and message (a
/// stopped loop tells the model to change its approach) and whose structured content is
/// `{"error": {"code", "message", "retriable", …}}`.
///
/// Every other request and notification goes to the handler untouched.
///
/// ```
/// use std::sync::Arc;
/// use rmcp::model::Tool;
/// use rmcp::ServerHandler;
/// use tower_toolcall_mcp::{registry_for, McpServer, Trust};
/// use tower_toolcall::ToolStack;
///
/// fn stacked<H: ServerHandler>(handler: H, tools: &[Tool]) -> Result<McpServer<H>, tower_toolcall::ConfigError> {
///     let registry = registry_for("notes", tools, Trust::Trusted, None)?;
///     let stack = ToolStack::builder(registry).build()?;
///     Ok(McpServer::new(handler, "notes", stack))
/// }
/// ```
pub struct McpServer<H> {
    handler: Arc<H>,
    service: BoxCloneSyncService<ToolCall, ToolOutput, ToolError>,
    namespace: Arc<str>,
    session: String,
    pending: Pending,
    /// The calls by progress token, once the server is served over
    /// [`progress_events`](McpServer::progress_events).
    progress: OnceLock<ProgressCalls>,
}

impl<H: ServerHandler> McpServer<H> {
    /// Serves `handler`'s tools, in `namespace`, through `layer` (a [`ToolStack`](tower_toolcall::ToolStack)
    /// or any layer of `Service<ToolCall>`), with a fresh session.
    pub fn new<L>(handler: H, namespace: impl Into<Arc<str>>, layer: L) -> Self
    where
        L: Layer<HandlerTool<H>>,
        L::Service: Service<ToolCall, Response = ToolOutput, Error = ToolError>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<ToolCall>>::Future: Send + 'static,
    {
        let handler = Arc::new(handler);
        let pending = Pending::default();
        let tool = HandlerTool {
            handler: handler.clone(),
            pending: pending.clone(),
        };
        McpServer {
            handler,
            service: BoxCloneSyncService::new(layer.layer(tool)),
            namespace: namespace.into(),
            session: ulid::Ulid::generate().to_string(),
            pending,
            progress: OnceLock::new(),
        }
    }

    /// `transport`, whose progress notifications for the calls of this server (a handler's
    /// `notify_progress` with the request's `_meta.progressToken`) are logged as
    /// `tool_call_progress` events of the call (`requestId`, `progress`, `total`, `message`)
    /// on their way to the client. Serve the server over it:
    ///
    /// ```no_run
    /// # use tower_toolcall_mcp::McpServer;
    /// # async fn run<H: rmcp::ServerHandler>(server: McpServer<H>, pipe: tokio::io::DuplexStream) -> Result<(), Box<dyn std::error::Error>> {
    /// let transport = server.progress_events(pipe);
    /// let running = rmcp::ServiceExt::serve(server, transport).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// The handler sends its notifications through the request context's `Peer`, which rmcp
    /// does not let a wrapper replace (its constructor is private to rmcp), so they are
    /// observed where they leave: in the transport.
    pub fn progress_events<T, E, A>(
        &self,
        transport: T,
    ) -> impl rmcp::transport::Transport<RoleServer, Error = E> + 'static
    where
        T: rmcp::transport::IntoTransport<RoleServer, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        ProgressTransport {
            inner: transport.into_transport(),
            calls: self.progress.get_or_init(ProgressCalls::default).clone(),
        }
    }

    /// The session key of this connection's calls.
    pub fn session_key(&self) -> &str {
        &self.session
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequest,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        // The arguments move into the call; each attempt sends the call's params.
        let arguments = request.params.arguments.take().unwrap_or_default();
        let mut call = match self.tool_call(&request, arguments, &context) {
            Ok(call) => call,
            Err(err) => return result_of(Err(err)),
        };
        let progress_token = self
            .progress
            .get()
            .and_then(|calls| Some((calls, context.meta.get_progress_token()?)));
        let blocks = Arc::<Mutex<_>>::default();
        let served = Served {
            request,
            context,
            blocks: blocks.clone(),
        };
        // A request id the client reuses while its first request runs gets a fresh one.
        let served = match self
            .pending
            .insert_new(call.request_id().to_owned(), served)
        {
            Ok(entry) => entry,
            Err(served) => {
                call.envelope_mut().request_id = ulid::Ulid::generate().to_string();
                self.pending.insert(call.request_id().to_owned(), served)
            }
        };
        let progress =
            progress_token.map(|(calls, token)| calls.insert(token, call.request_id().into()));
        // Once dispatched, the call runs on a task of its own, to its end
        // (bounded by the stack's timeouts), whatever becomes of this request: a client that
        // cancels it or drops the connection leaves the idempotency record in flight, so a
        // re-send joins the call or gets its result. The request's entries leave with the
        // call.
        let service = self.service.clone();
        let outcome = tower_toolcall::detach::detach(async move {
            let _entries = (served, progress);
            service.oneshot(call).await
        })
        .await;
        match outcome {
            // The tool's own answer keeps its content blocks as they were.
            Ok(output) if !output.record().from_cache => {
                let kept = blocks.lock().unwrap_or_else(PoisonError::into_inner).take();
                match kept {
                    Some(blocks) => result_with_blocks(output, blocks),
                    None => result_of(Ok(output)),
                }
            }
            outcome => result_of(outcome),
        }
    }

    /// The request id of the call for the JSON-RPC request `id`: unique, as the session is
    /// this connection's and a client never reuses the id of a request in flight.
    fn request_id(&self, id: &rmcp::model::RequestId) -> String {
        let id = format!("{}-{id}", self.session);
        if id.len() <= MAX_IDENTIFIER_BYTES {
            id
        } else {
            ulid::Ulid::generate().to_string()
        }
    }

    fn tool_call(
        &self,
        request: &CallToolRequest,
        arguments: serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<ToolCall, ToolError> {
        let params = &request.params;
        let meta = CallMeta::of(params.meta.as_ref());
        let context_meta = CallMeta::of(Some(&context.meta));
        let actor = context
            .client_info()
            .map(|client| client.name)
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| UNKNOWN_CLIENT.to_owned());
        let mut builder = ToolCall::builder(&*self.namespace, params.name.as_ref())
            .session(&self.session)
            .request_id(self.request_id(&context.id))
            .actor(actor)
            .params(Value::Object(arguments));
        if let Some(key) = meta.idempotency_key.or(context_meta.idempotency_key) {
            builder = builder.idempotency_key(key);
        }
        if let Some(traceparent) = meta.traceparent.or(context_meta.traceparent) {
            builder = builder.traceparent(traceparent);
        }
        if let Some(confirmation) = meta.confirmation_id.or(context_meta.confirmation_id) {
            builder = builder.confirmation_id(confirmation);
        }
        builder.build()
    }
}

impl<H: ServerHandler> rmcp::Service<RoleServer> for McpServer<H> {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let ClientRequest::CallToolRequest(request) = request else {
            return rmcp::Service::handle_request(&*self.handler, request, context).await;
        };
        let current = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        let mut result = ServerResult::CallToolResult(self.call_tool(request, context).await);
        if !current {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
        }
        Ok(result)
    }

    fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + Send + '_ {
        rmcp::Service::handle_notification(&*self.handler, notification, context)
    }

    fn get_info(&self) -> ServerConfig {
        ServerHandler::get_info(&*self.handler)
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        ServerHandler::supported_protocol_versions(&*self.handler)
    }
}

impl<H> fmt::Debug for McpServer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("namespace", &self.namespace)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// The handler's own `tools/call` as the innermost `Service<ToolCall>` of an
/// [`McpServer`]'s stack; made by [`McpServer::new`].
pub struct HandlerTool<H> {
    handler: Arc<H>,
    pending: Pending,
}

impl<H> Clone for HandlerTool<H> {
    fn clone(&self) -> Self {
        HandlerTool {
            handler: self.handler.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<H> fmt::Debug for HandlerTool<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerTool").finish_non_exhaustive()
    }
}

impl<H: ServerHandler> Service<ToolCall> for HandlerTool<H> {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let served = self.pending.get(call.request_id());
        let handler = self.handler.clone();
        Box::pin(async move {
            let Served {
                mut request,
                mut context,
                blocks,
            } = served.ok_or_else(|| {
                ToolError::new(
                    ErrorCode::InternalError,
                    format!(
                        "no tools/call request is being served for call {}; send calls through \
                         the McpServer that made this tool",
                        call.request_id()
                    ),
                )
            })?;
            // The attempt is the stack's, not the request's: the client's cancellation of the
            // request (or the connection's end) does not stop it. The handler's token is
            // cancelled when the stack gives the attempt up (its timeout), or when it ends.
            context.ct = Default::default();
            let _cancel_when_given_up = context.ct.clone().drop_guard();
            // The params move to the handler unless a layer keeps the call for another attempt.
            let params = call.params().clone();
            drop(call);
            request.params.arguments = Some(params.into_map());
            let request = ClientRequest::CallToolRequest(request);
            let answer = rmcp::Service::handle_request(&*handler, request, context).await;
            let mut last_blocks = blocks.lock().unwrap_or_else(PoisonError::into_inner);
            *last_blocks = None;
            match answer {
                Ok(ServerResult::CallToolResult(result)) => {
                    let (outcome, blocks) = outcome_and_blocks(result);
                    *last_blocks = blocks;
                    outcome
                }
                Ok(_) => Err(ToolError::new(
                    ErrorCode::UpstreamError,
                    "the tool answered with input requests or a task, which a call through the \
                     stack cannot carry; answer with a complete result",
                )),
                Err(error) => Err(error_from_mcp(&error)),
            }
        })
    }
}
