//! The server side: an `rmcp` server whose every `tools/call` goes through a stack.

mod confirm;
mod direct;
mod encoded;
mod handler;
mod streams;
mod tool_list;

pub use confirm::{Confirm, DEFAULT_CONFIRMATION_TIMEOUT};
use confirm::{Confirmations, Confirmed};
pub use direct::SessionAnswer;

use tool_list::Route;
pub use tool_list::ToolList;

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use super::convert::{error_from_mcp, outcome_and_blocks, result_of, result_with_blocks, IsError};
use super::identity::Identity;
use super::in_flight::{Entry, InFlight};
use super::meta::RequestMeta;
use super::progress::{ProgressCalls, ProgressRelay, ProgressTransport};
use super::wording::in_mcp_words;
use tower_toolcall::envelope::MAX_IDENTIFIER_BYTES;
use tower_toolcall::registry::KeyScope;
use tower_toolcall::{ErrorCode, Principal, ToolCall, ToolError, ToolOutput};

/// The `tools/call` requests being served, by the request id of their `ToolCall`: with what
/// the handler needs, for those rmcp serves.
type Pending = InFlight<String, Option<Served>>;

/// The calls that a client's cancellation stops, by the request id of their `ToolCall`.
type Stoppable = InFlight<String, Arc<tokio::sync::Notify>>;

/// The stack of a server, as every connection shares it.
type ToolService = BoxCloneSyncService<ToolCall, ToolOutput, ToolError>;

/// A `tools/call` being served: what the handler needs for each attempt, and the content
/// blocks of the handler's last successful answer.
#[derive(Clone)]
struct Served {
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
    blocks: Arc<Mutex<Option<Vec<ContentBlock>>>>,
}

/// An `rmcp` [`ServerHandler`] whose every `tools/call` runs through a tower stack; served
/// by rmcp over stdio (or any stream) and over streamable HTTP.
///
/// Each `tools/call` becomes a [`ToolCall`] in the server's namespace (MCP names are flat).
/// Its request id is the connection's followed by the JSON-RPC request's id; its arguments
/// are the params; `_meta.confirmationId` and `_meta.traceparent` fill the envelope.
///
/// **Who calls.** Nothing a client says about itself decides whose data a call reaches.
/// The principal is the one an HTTP server's authentication put in the request's
/// extensions (a middleware in front of rmcp's `StreamableHttpService`, after it checked
/// the credentials), else the server's own ([`principal`](McpServer::principal): a stdio
/// front's configured user). A call is [bound](ToolCall::bind_principal) to it: its actor
/// and tenant are the principal's, and its session, keys and quotas reach no other
/// principal's. The session is, in this order:
/// 1. the `_meta` member the operator named ([`session_from_meta`](McpServer::session_from_meta)),
///    when the request carries it;
/// 2. the transport session the server issued: the connection, over stdio or any stream
///    transport (one `McpServer` per connection: see [`connection`](McpServer::connection)),
///    or a streamable-HTTP session that began with `initialize` (2025-11-25). A stateless
///    request (2026-07-28) has none, and its `Mcp-Session-Id` header is never read;
/// 3. none: the principal's one session, or without a principal the single user's.
///
/// Without a principal the server is single-user: the actor is the operator's `_meta`
/// member ([`actor_from_meta`](McpServer::actor_from_meta)) or `local`. The client's name
/// (`clientInfo.name`) is only the call's `target.agentId`, for the audit.
///
/// **Keys.** The idempotency key is the first of the `_meta` members
/// [`DEFAULT_IDEMPOTENCY_KEY_MEMBERS`](crate::DEFAULT_IDEMPOTENCY_KEY_MEMBERS) (or the
/// operator's list: [`idempotency_key_members`](McpServer::idempotency_key_members)) the
/// request carries; a key that is not a string is a `VALIDATION_ERROR`. A caller's key is
/// scoped by its actor and tenant, never by the connection: a re-send over a new connection,
/// or after a reconnect, joins the first call or gets its result
/// ([`ToolCall::set_caller_key_scope`]). An answer from the idempotency cache says so in its
/// `_meta` ([`FROM_CACHE_META`](crate::FROM_CACHE_META)).
///
/// **Answers.** A success is the tool's `CallToolResult` (its content blocks as the tool
/// wrote them; an answer from the cache rebuilds them from the stored output). An error is
/// an `isError` result whose text is the error's code and a message in MCP's words (the
/// fields it names are `arguments.<path>` and `_meta.<member>`; a stopped loop tells the
/// model to change its approach), with no structured content, which could not match the
/// tool's output schema, and the code, retriable flag and retry-after in its `_meta`
/// ([`ERROR_META`](crate::ERROR_META)). The handler's own `isError` results are its answers to
/// the model: terminal, neither retried nor counted by a breaker.
///
/// A call once dispatched is detached from its request: it runs on a task of its own, to its
/// end or its timeout, whether the client cancels the request or the connection ends. So
/// its idempotency record stays in flight, and a re-send of the call with the same
/// idempotency key joins it or gets its result instead of running the tool again. For the
/// same reason, the cancellation token of the context the handler gets is not the request's:
/// it is cancelled when the stack gives the attempt up (a timeout) or the attempt ends.
///
/// **Cancellation.** A client's `notifications/cancelled` stops a call only of a tool that
/// its [`ToolList`] says to stop ([`ToolList::stop_repeatable_when_cancelled`]: tools that
/// are safe to repeat): the call is dropped, which frees its idempotency key (SPEC §5) and
/// makes an [`McpClient`](crate::McpClient) beneath cancel its request on the server behind.
/// A call of any other tool runs on, as above: stopped half-way, a write's outcome would be
/// known to no one, and its re-send would run it again.
///
/// **Progress.** Over an `McpClient` that [relays progress](crate::McpClient::relay_progress),
/// [`relay_progress`](McpServer::relay_progress) sends each call's progress on to the client
/// that asked for it with `_meta.progressToken`. A tool of the service that streams its
/// answer ([`tower_toolcall::stream`]) sends a client that asked for progress each chunk as a
/// `notifications/progress` (`progress` counting the chunks from 1, `message` the chunk's
/// text), then the whole result; a client that did not ask gets the whole result only.
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
///     Ok(McpServer::new(handler, "notes", stack).session_from_meta("agentSession"))
/// }
/// ```
pub struct McpServer<H> {
    handler: Arc<H>,
    service: ToolService,
    namespace: Arc<str>,
    /// Where each listed tool is called, for a server over a routed [`ToolList`].
    routes: Option<ToolList>,
    identity: Identity,
    /// This connection's id: the prefix of its calls' request ids, and the session of a
    /// stream transport.
    connection: String,
    pending: Pending,
    /// The calls by progress token, once the server is served over
    /// [`progress_events`](McpServer::progress_events).
    progress: OnceLock<ProgressCalls>,
    /// Where the calls' progress is relayed to.
    relay: Option<ProgressRelay>,
    stoppable: Stoppable,
    /// Whether this connection began with `initialize`: a session the server issued (over
    /// streamable HTTP, a 2025-11-25 session; a stateless request never initializes).
    initialized: Arc<AtomicBool>,
    /// The confirmations asked of the users, shared by the connections.
    confirmations: Confirmations,
    /// The calls that may run at once, shared by the connections.
    slots: Option<CallSlots>,
    /// The `subscriptions/listen` streams open, shared by the connections.
    streams: Option<Arc<streams::Streams>>,
}

/// The calls a server runs at once, counting those that run on after their client left.
#[derive(Clone, Debug)]
struct CallSlots {
    slots: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

/// When a call refused because the server is full is told to come back.
const BUSY_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl<H: ServerHandler> McpServer<H> {
    /// Serves `handler`'s tools, in `namespace`, through `layer` (a [`ToolStack`](tower_toolcall::ToolStack)
    /// or any layer of `Service<ToolCall>`) around the handler's own `tools/call`, whose
    /// original request (its arguments the call's params, as the layers leave them) and
    /// context it gets, so that its progress notifications reach the client as before.
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
        let service = BoxCloneSyncService::new(layer.layer(tool));
        McpServer::from_parts(handler, namespace.into(), service, pending)
    }
}

impl McpServer<ToolList> {
    /// Serves `tools`, in `namespace`, with every call going to `service`: a stack around
    /// anything that runs the tools. Over an [`McpClient`](crate::McpClient) it is a proxy
    /// that puts the stack between clients and another MCP server:
    ///
    /// ```no_run
    /// use tower::Layer;
    /// use tower_toolcall_mcp::{McpClient, McpServer, Trust};
    /// use tower_toolcall::ToolStack;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let upstream = McpClient::spawn("time", || tokio::process::Command::new("mcp-server-time")).await?;
    /// let tools = upstream.tools().await?;
    /// let registry = upstream.registry("time", Trust::Trusted, None).await?;
    /// let stack = ToolStack::builder(registry).build()?;
    /// let server = McpServer::over("time", stack.layer(upstream), tools);
    /// let running = rmcp::ServiceExt::serve(server, tower_toolcall_mcp::stdio_transport(4 << 20)?).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// `tools/list` is answered from `tools` in the shape of the protocol version each
    /// client negotiated, whatever version the upstream speaks. A [routed](ToolList::routed)
    /// list calls each tool in its own namespace (`namespace` is then only for names it does
    /// not list, which the stack refuses as unknown).
    pub fn over<S>(namespace: impl Into<Arc<str>>, service: S, tools: impl Into<ToolList>) -> Self
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let tools = tools.into();
        let mut server = McpServer::from_parts(
            Arc::new(tools.clone()),
            namespace.into(),
            BoxCloneSyncService::new(service),
            Pending::default(),
        );
        server.routes = Some(tools);
        server
    }
}

impl<H> McpServer<H> {
    fn from_parts(
        handler: Arc<H>,
        namespace: Arc<str>,
        service: ToolService,
        pending: Pending,
    ) -> Self {
        McpServer {
            handler,
            service,
            namespace,
            routes: None,
            identity: Identity::default(),
            connection: ulid::Ulid::generate().to_string(),
            pending,
            progress: OnceLock::new(),
            relay: None,
            stoppable: Stoppable::default(),
            initialized: Arc::default(),
            confirmations: Confirmations::default(),
            slots: None,
            streams: None,
        }
    }

    /// The server for another connection: the same handler, stack and settings, with a
    /// connection (and so a stream transport's session) of its own. Serve each connection,
    /// and give rmcp's streamable-HTTP service its handlers, this way:
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use tower_toolcall_mcp::{McpServer, ToolList};
    /// # fn run(server: McpServer<ToolList>) {
    /// use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    /// use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    ///
    /// let service = StreamableHttpService::new(
    ///     move || Ok(server.connection()),
    ///     Arc::new(LocalSessionManager::default()),
    ///     StreamableHttpServerConfig::default(),
    /// );
    /// # }
    /// ```
    pub fn connection(&self) -> Self {
        McpServer {
            handler: self.handler.clone(),
            service: self.service.clone(),
            namespace: self.namespace.clone(),
            routes: self.routes.clone(),
            identity: self.identity.clone(),
            connection: ulid::Ulid::generate().to_string(),
            pending: self.pending.clone(),
            progress: OnceLock::new(),
            relay: self.relay.clone(),
            stoppable: self.stoppable.clone(),
            initialized: Arc::default(),
            confirmations: self.confirmations.clone(),
            slots: self.slots.clone(),
            streams: self.streams.clone(),
        }
    }

    /// Holds at most `max` `subscriptions/listen` streams open over all the server's
    /// connections, and at most `per_caller` for one caller (one principal; without
    /// authentication, the one user); a stream beyond them is ended at once with an error
    /// saying which bound it met. Without it, the streams are not counted.
    pub fn max_listen_streams(mut self, max: usize, per_caller: usize) -> Self {
        self.streams = Some(streams::Streams::new(max, per_caller));
        self
    }

    /// Runs at most `calls` calls at once (at least 1), over all the server's connections,
    /// counting the calls that run on after their client cancelled or left (a call once
    /// dispatched runs to its end). A call that finds them all taken is answered at
    /// once with `UPSTREAM_UNAVAILABLE`, retriable, with a retry-after of one second; the
    /// tool does not run. Without it, the calls are not counted.
    pub fn max_calls_in_flight(mut self, calls: usize) -> Self {
        let limit = calls.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self.slots = Some(CallSlots {
            slots: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit,
        });
        self
    }

    /// How long a user has to answer a confirmation asked through elicitation (see
    /// [`Confirm::Elicit`]); [`DEFAULT_CONFIRMATION_TIMEOUT`] unless set. A call not confirmed
    /// in time is refused.
    pub fn confirmation_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.confirmations.timeout = timeout;
        self
    }

    /// Sends the progress that the service's [`McpClient`](crate::McpClient) relays (see
    /// [`ProgressRelay`]) on to each client that asked for it, under the progress token of
    /// its request.
    pub fn relay_progress(mut self, relay: &ProgressRelay) -> Self {
        self.relay = Some(relay.clone());
        self
    }

    /// Stops the call the client cancelled, if it is in flight and its tool is one to stop
    /// (see [cancellation](McpServer#cancellation)).
    fn stop(
        &self,
        cancelled: &rmcp::model::CancelledNotificationParam,
        http: Option<&http::request::Parts>,
    ) {
        let Some(id) = &cancelled.request_id else {
            return;
        };
        let request_id = self.request_id(self.transport(http), id);
        if let Some(stop) = self.stoppable.get(&request_id) {
            tracing::info!(
                event = "tool_call_stopped",
                requestId = %request_id,
                reason = cancelled.reason.as_deref(),
                "the client cancelled the call"
            );
            stop.notify_one();
        }
    }

    /// Takes the session of each call from the string `_meta` member `member` when the
    /// request carries it, before any other source (a client that keeps one agent session
    /// over many connections or stateless requests sends it).
    pub fn session_from_meta(mut self, member: impl Into<Arc<str>>) -> Self {
        self.identity.session_member = Some(member.into());
        self
    }

    /// Takes the actor of each call without a principal from the string `_meta` member
    /// `member` when the request carries it. Only for clients the operator trusts to say who
    /// they act for: the actor scopes idempotency keys. A call with a principal is the
    /// principal's, whatever the member says.
    pub fn actor_from_meta(mut self, member: impl Into<Arc<str>>) -> Self {
        self.identity.actor_member = Some(member.into());
        self
    }

    /// The principal of the requests whose transport authenticated none: the user a stdio
    /// front is configured for. An HTTP request's own principal (from the server's
    /// authentication) comes first.
    ///
    /// ```
    /// # use tower_toolcall_mcp::{McpServer, Principal, ToolList};
    /// # use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
    /// let tools = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(serde_json::json!({}))) });
    /// let server = McpServer::over("ns", tools, ToolList::new(Vec::new()))
    ///     .principal(Principal::new("alice").with_tenant("acme"));
    /// # let _ = server;
    /// ```
    pub fn principal(mut self, principal: Principal) -> Self {
        self.identity.principal = Some(principal);
        self
    }

    /// Reads the idempotency key from the first of `members` a request carries, instead of
    /// [`DEFAULT_IDEMPOTENCY_KEY_MEMBERS`](crate::DEFAULT_IDEMPOTENCY_KEY_MEMBERS).
    pub fn idempotency_key_members<I, S>(mut self, members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.identity.key_members = members.into_iter().map(Into::into).collect();
        self
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

    /// The session of this connection's calls over a stream transport, unless the request
    /// names another (see [who calls](McpServer#who-calls)).
    pub fn session_key(&self) -> &str {
        &self.connection
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// Answers a `tools/call` through the stack.
    async fn serve_call(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResponse {
        // Who calls: looked up once per call.
        let http = context.extensions.get::<http::request::Parts>();
        let client = context.client_info().map(|client| client.name);
        let asker = Asker {
            id: &context.id,
            principal: self.identity.principal(http),
            transport: self.transport(http),
            client: client.as_deref(),
        };
        let meta = request.meta.take();
        let (mut call, route) = match self.admit(
            &mut request,
            RequestMeta::new(meta.as_ref(), &context.meta),
            asker,
        ) {
            Ok(admitted) => admitted,
            Err(refused) => return refused.into(),
        };
        request.meta = meta;
        let slot = match self.slot() {
            Ok(slot) => slot,
            Err(busy) => return busy.into(),
        };
        // A tool that needs the user's confirmation gets it from the user or the host, never
        // from what the client says.
        if let Some(mode) = route.as_ref().and_then(|route| route.confirm) {
            let confirmed = self
                .confirmations
                .confirm(mode, &call, &request, &context)
                .await;
            match confirmed {
                Confirmed::Yes(id) => call.envelope_mut().control.confirmation_id = Some(id),
                Confirmed::Ask(asking) => return asking.into(),
                Confirmed::No(err) => return result_of(Err(in_mcp_words(err))).into(),
            }
        }
        let progress_token = self
            .progress
            .get()
            .and_then(|calls| Some((calls, context.meta.get_progress_token()?)));
        let relay_to = self.relay.as_ref().and_then(|relay| {
            Some((
                relay,
                context.peer.clone(),
                context.meta.get_progress_token()?,
            ))
        });
        let chunk_progress =
            (context.meta.get_progress_token()).map(|token| (context.peer.clone(), token));
        let blocks = Arc::<Mutex<_>>::default();
        let served = Served {
            request,
            context,
            blocks: blocks.clone(),
        };
        let served = self.pending_entry(&mut call, Some(served));
        let progress =
            progress_token.map(|(calls, token)| calls.insert(token, call.request_id().into()));
        let relayed = relay_to
            .map(|(relay, client, token)| relay.insert(call.request_id().into(), client, token));
        // A client that asked for progress gets each chunk of a streamed answer as one.
        let chunks = chunk_progress.map(|(peer, token)| (peer, token, call.stream_chunks()));
        let outcome = self.run(call, route.as_ref(), (served, progress, relayed, slot));
        let outcome = match chunks {
            Some((peer, token, chunks)) => chunks_as_progress(outcome, chunks, &peer, token).await,
            None => outcome.await,
        };
        let result = match outcome {
            // The tool's own answer keeps its content blocks as they were.
            Ok(output) if !output.record().from_cache => {
                let kept = blocks.lock().unwrap_or_else(PoisonError::into_inner).take();
                match kept {
                    Some(blocks) => result_with_blocks(output, blocks),
                    None => result_of(Ok(output)),
                }
            }
            Ok(output) => result_of(Ok(output)),
            Err(err) => result_of(Err(in_mcp_words(err))),
        };
        result.into()
    }

    /// The call of `request` from `asker` and where its tool is called; or the refusal to
    /// answer with, for a tool the caller may not see or a request the envelope refuses. The
    /// arguments move into the call; each attempt sends the call's params.
    fn admit(
        &self,
        request: &mut CallToolRequestParams,
        meta: RequestMeta<'_>,
        asker: Asker<'_>,
    ) -> Result<(ToolCall, Option<Route>), CallToolResult> {
        let arguments = request.arguments.take().unwrap_or_default();
        // A tool the caller may not see is refused as one that is not there.
        if let Some(routes) = &self.routes {
            if !routes.admits(asker.principal.as_ref(), &request.name) {
                return Err(result_of(Err(in_mcp_words(not_yours(&request.name)))));
            }
        }
        // Where the listed tool is called: looked up once per call. A routed list calls only
        // the tools it lists: a bare name never reaches a namespace by chance.
        let route = match self.routes.as_ref().map(|r| r.route(&request.name)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(route))) => Some(route),
            Some(Err(())) => return Err(result_of(Err(in_mcp_words(not_yours(&request.name))))),
        };
        match self.tool_call(request, route.as_ref(), arguments, meta, asker) {
            Ok(call) => Ok((call, route)),
            Err(err) => Err(result_of(Err(in_mcp_words(err)))),
        }
    }

    /// A slot for a call's whole run, when the server counts them; the refusal to answer
    /// with when they are all taken.
    fn slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, CallToolResult> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        match slots.slots.clone().try_acquire_owned() {
            Ok(slot) => Ok(Some(slot)),
            Err(_) => {
                let busy = ToolError::rejected(
                    ErrorCode::UpstreamUnavailable,
                    format!(
                        "the server is running {} calls, its limit; send the call again in a \
                         moment",
                        slots.limit
                    ),
                )
                .with_retry_after(BUSY_RETRY_AFTER);
                Err(result_of(Err(in_mcp_words(busy))))
            }
        }
    }

    /// `call` among the requests being served, with what the handler needs (`served`, for
    /// a call rmcp serves), until the entry is dropped. A request id the client reuses while
    /// its first request runs gets a fresh one.
    fn pending_entry(
        &self,
        call: &mut ToolCall,
        served: Option<Served>,
    ) -> Entry<String, Option<Served>> {
        match self
            .pending
            .insert_new(call.request_id().to_owned(), served)
        {
            Ok(entry) => entry,
            Err(served) => {
                call.envelope_mut().request_id = ulid::Ulid::generate().to_string();
                self.pending.insert(call.request_id().to_owned(), served)
            }
        }
    }

    /// Runs `call` through the stack on a task of its own, to its end (bounded by the
    /// stack's timeouts), whatever becomes of the request: a client that cancels it or drops
    /// the connection leaves the idempotency record in flight, so a re-send joins the call or
    /// gets its result. Only a tool safe to repeat stops when the client cancels. `entries`
    /// (the request's entries in the server's maps, its slot) leave with the call.
    fn run(
        &self,
        call: ToolCall,
        route: Option<&Route>,
        entries: impl Send + 'static,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send + 'static {
        let stops_when_cancelled = route.is_some_and(|route| route.stops_when_cancelled);
        let stop = stops_when_cancelled.then(|| {
            let stop = Arc::new(tokio::sync::Notify::new());
            let entry = self
                .stoppable
                .insert_new(call.request_id().to_owned(), stop.clone());
            (stop, entry.ok())
        });
        let service = self.service.clone();
        tower_toolcall::detach::detach(async move {
            let _entries = entries;
            match stop {
                Some((stop, _entry)) => tokio::select! {
                    outcome = service.oneshot(call) => outcome,
                    () = stop.notified() => Err(ToolError::new(
                        ErrorCode::Cancelled,
                        "the client cancelled the call",
                    )),
                },
                None => service.oneshot(call).await,
            }
        })
    }

    /// The transport session the server issued for a request that came over `http` (none
    /// over a stream transport): the connection over a stream transport; over streamable
    /// HTTP, the session rmcp routed the request to by its `Mcp-Session-Id` (a session that
    /// began with `initialize`); none for a stateless request.
    fn transport<'a>(&'a self, http: Option<&'a http::request::Parts>) -> Option<&'a str> {
        let Some(parts) = http else {
            return Some(&self.connection);
        };
        if !self.initialized.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let session = parts
            .headers
            .get(SESSION_ID_HEADER)
            .and_then(|id| id.to_str().ok());
        Some(session.unwrap_or(&self.connection))
    }

    /// The request id of the call for the JSON-RPC request `id` in the transport session
    /// `transport` (this connection's, for a stateless request): unique, as the session is,
    /// and a client never reuses the id of a request in flight.
    fn request_id(&self, transport: Option<&str>, id: &rmcp::model::RequestId) -> String {
        let id = format!("{}-{id}", transport.unwrap_or(&self.connection));
        if id.len() <= MAX_IDENTIFIER_BYTES {
            id
        } else {
            ulid::Ulid::generate().to_string()
        }
    }

    fn tool_call(
        &self,
        request: &CallToolRequestParams,
        route: Option<&Route>,
        arguments: serde_json::Map<String, Value>,
        meta: RequestMeta<'_>,
        asker: Asker<'_>,
    ) -> Result<ToolCall, ToolError> {
        let caller = self
            .identity
            .caller(&meta, asker.principal, asker.transport, asker.client)?;
        let (namespace, name) = match route {
            Some(route) => (&*route.namespace, route.name.as_str()),
            None => (&*self.namespace, request.name.as_ref()),
        };
        let mut builder = ToolCall::builder(namespace, name)
            .session(caller.session)
            .request_id(self.request_id(asker.transport, asker.id))
            .actor(caller.actor)
            .params(Value::Object(arguments));
        if let Some(client) = caller.client {
            builder = builder.agent(client);
        }
        if let Some(key) = meta.idempotency_key(&self.identity.key_members)? {
            builder = builder.idempotency_key(key);
        }
        if let Some(traceparent) = meta.traceparent() {
            builder = builder.traceparent(traceparent);
        }
        if let Some(confirmation) = meta.confirmation_id()? {
            builder = builder.confirmation_id(confirmation);
        }
        let mut call = builder.build()?;
        if let Some(principal) = caller.principal {
            call.bind_principal(principal);
        }
        // A connection is no longer than a session here: a caller's key reaches every
        // session of its actor, so that a re-send over a new connection finds the first call.
        call.set_caller_key_scope(KeyScope::Actor);
        Ok(call)
    }
}

/// The header of a streamable-HTTP request that names its session.
const SESSION_ID_HEADER: &str = "mcp-session-id";

/// Who sends a `tools/call`, as the server knows it: the JSON-RPC request's id, the
/// principal, the transport session the server issued, and the client's own name.
struct Asker<'a> {
    id: &'a rmcp::model::RequestId,
    principal: Option<Principal>,
    transport: Option<&'a str>,
    client: Option<&'a str>,
}

/// The refusal of a call of a tool the caller may not see: the same for a tool that is
/// there and one that is not.
/// Awaits `outcome`, sending each chunk of `chunks` to `peer` as a progress notification
/// under `token` while it runs: `progress` counts the chunks from 1, and `message` is the
/// chunk (a string as it is, other JSON as its text). Every chunk sent before the call
/// answered goes out before its answer; a client that stopped reading loses chunks, never
/// the answer.
async fn chunks_as_progress<F>(
    outcome: F,
    chunks: tower_toolcall::stream::ChunkStream,
    peer: &Peer<RoleServer>,
    token: ProgressToken,
) -> F::Output
where
    F: Future,
{
    use futures_util::StreamExt;
    use tower_toolcall::stream::{StreamPart, Streamed};

    let mut parts = std::pin::pin!(Streamed::new(outcome, chunks));
    let mut reachable = true;
    while let Some(part) = parts.next().await {
        match part {
            StreamPart::Chunk(chunk) if reachable => {
                let message = match &*chunk.content {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                let mut progress =
                    ProgressNotificationParam::new(token.clone(), f64::from(chunk.index + 1));
                progress.message = Some(message);
                if let Err(error) = peer.notify_progress(progress).await {
                    tracing::debug!(%error, "a chunk could not be sent as progress");
                    reachable = false;
                }
            }
            StreamPart::Chunk(_) => {}
            StreamPart::Done(outcome) => return outcome,
            _ => unreachable!("a streamed call yields chunks and its answer"),
        }
    }
    unreachable!("a streamed call ends with its answer")
}

fn not_yours(name: &str) -> ToolError {
    ToolError::rejected(
        ErrorCode::PolicyDenied,
        format!(
            "you may not call the tool {name}: call one of the tools that tools/list shows you"
        ),
    )
}

impl<H> fmt::Debug for McpServer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("namespace", &self.namespace)
            .field("connection", &self.connection)
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
    type Future = tower_toolcall::BoxToolFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let served = self.pending.get(call.request_id()).flatten();
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
            request.arguments = Some(params.into_map());
            let answer = ServerHandler::call_tool(&*handler, request, context).await;
            let mut last_blocks = blocks.lock().unwrap_or_else(PoisonError::into_inner);
            *last_blocks = None;
            match answer {
                Ok(CallToolResponse::Complete(result)) => {
                    let (outcome, blocks) = outcome_and_blocks(result, IsError::Answer);
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
