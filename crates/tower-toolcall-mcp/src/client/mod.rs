//! The client side: a remote MCP server's tools as a `Service<ToolCall>`.

mod child;
#[cfg(feature = "http")]
mod http;
mod stderr;
mod upstream;

pub use child::DEFAULT_MAX_MESSAGE_BYTES;

#[cfg(feature = "http")]
pub use http::{pooled_http_client, pooled_http_client_builder, DEFAULT_HTTP_IDLE_TIMEOUT};

pub use upstream::{
    UpstreamState, UpstreamStats, DEFAULT_RECONNECT_BACKOFF, DEFAULT_RECONNECT_TIMEOUT,
};

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequest, CallToolResult, CancelledNotificationParam, ClientConfig, ClientRequest,
    ProgressNotificationParam, ProgressToken, RequestId, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceError};
use tower::Service;

use super::convert::{error_from_service, outcome_of, request_params, IsError};
use super::in_flight::InFlight;
use super::policy::{registry_for, Trust};
use super::progress::{log_progress, ProgressRelay, Relayed};
use child::{ChildTransport, Verdict};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::retry::Backoff;
use tower_toolcall::{ErrorCode, ToolCall, ToolError, ToolOutput};
use upstream::{Connection, Connector, Upstream};

/// The calls in flight, by the progress token rmcp gave their request.
type Calls = InFlight<ProgressToken, InFlightCall>;

/// A call in flight: its request id, and the client its progress is relayed to.
#[derive(Clone, Debug)]
struct InFlightCall {
    request_id: Arc<str>,
    relayed: Option<Relayed>,
}

/// The server a client calls: one connection as it was given, or a connection kept up.
#[derive(Clone, Debug)]
enum Link {
    Fixed(Peer<RoleClient>),
    Kept(Upstream),
}

/// The tools of a remote MCP server as a `Service<ToolCall>`, over any rmcp client
/// transport (stdio of a child process, streamable HTTP, an in-process pipe).
///
/// This crate enables rmcp's stdio and child-process transports; its `http` feature adds
/// rmcp's streamable-HTTP client transport (`rmcp::transport::StreamableHttpClientTransport`,
/// on `reqwest` without TLS: enable one of `reqwest`'s TLS features for `https`).
///
/// Each call is a `tools/call` of the call's tool name with its params as arguments and its
/// idempotency key, confirmation and `traceparent` in `_meta`. A result is the output. An
/// `isError` result is a `ToolError`: with the code, class and retry-after a stacked server
/// wrote, else by default the tool's answer to the model, a terminal `UPSTREAM_ERROR` that is
/// neither retried nor counted by a breaker ([`IsError`]; configurable per server and per
/// tool). A JSON-RPC error is a `VALIDATION_ERROR` (invalid params), `NOT_FOUND` (unknown
/// method or tool) or `INTERNAL_ERROR`. A request the transport could not send is a retriable
/// `UPSTREAM_UNAVAILABLE` that did not run; one whose connection closed after it was sent is
/// an `UPSTREAM_UNAVAILABLE` whose outcome is unknown (retried only where the tool's policy
/// makes that safe). A call dropped before its answer (a timeout, a caller that went away)
/// cancels its request on the server.
///
/// **A server kept up.** A client made with [`spawn`](McpClient::spawn),
/// [`connect`](McpClient::connect) (or `http`, feature `http`) keeps its connection: when it
/// ends (the server process exits, the stream closes, a call finds the transport closed), it
/// is made again at once, then with [`DEFAULT_RECONNECT_BACKOFF`] between failed attempts,
/// without end and without rebuilding the stack; each loss and each reconnection is logged
/// (`mcp_upstream_down`, `mcp_upstream_reconnected`, `mcp_upstream_reconnect_failed`) and
/// counted ([`stats`](McpClient::stats)). Meanwhile the server's every tool fails at once
/// with a retriable `UPSTREAM_UNAVAILABLE` that did not run and a retry-after until the next
/// attempt: one breaker for the whole server, which every tool consults. Those failures, and
/// the transport's, are counted there and not by the stack's breakers per tool, which would
/// otherwise stay open after the server came back.
///
/// Put a [`ToolStack`](tower_toolcall::ToolStack) built from [`McpClient::registry`] around it, and the
/// agent's outgoing calls get dedupe, retries of what MCP marks safe, a breaker per tool
/// and loop detection.
///
/// ```no_run
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_toolcall_mcp::{McpClient, Trust};
/// use tower_toolcall::{ToolCall, ToolStack};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = McpClient::spawn("notes", || tokio::process::Command::new("my-mcp-server")).await?;
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
    link: Link,
    in_flight: Option<Calls>,
    relay: Option<ProgressRelay>,
    tool_list: Option<tokio::sync::watch::Receiver<u64>>,
    is_error: IsError,
    is_error_by_tool: Arc<HashMap<String, IsError>>,
    /// Why this side closed the connection last, when it did.
    verdict: Verdict,
}

impl McpClient {
    /// Calls the server behind `peer` (from a running rmcp client: `running.peer().clone()`),
    /// as long as that connection lasts.
    pub fn new(peer: Peer<RoleClient>) -> Self {
        McpClient::over(Link::Fixed(peer))
    }

    fn over(link: Link) -> Self {
        McpClient {
            link,
            in_flight: None,
            relay: None,
            tool_list: None,
            is_error: IsError::default(),
            is_error_by_tool: Arc::default(),
            verdict: Verdict::default(),
        }
    }

    /// Connects with `connect` (an rmcp client served over a fresh transport, each time it
    /// is called), and keeps the connection up: see [a server kept up](McpClient#a-server-kept-up).
    /// `name` names the server in logs and messages. `Err` when the first connection fails.
    ///
    /// ```no_run
    /// use rmcp::ServiceExt;
    /// use tower_toolcall_mcp::McpClient;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = McpClient::connect("time", || async {
    ///     let command = tokio::process::Command::new("mcp-server-time");
    ///     let transport = rmcp::transport::TokioChildProcess::new(command)?;
    ///     ().serve(transport)
    ///         .await
    ///         .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
    /// })
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect<F, Fut, H, E>(
        name: impl Into<Arc<str>>,
        connect: F,
    ) -> Result<Self, ToolError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RunningService<RoleClient, H>, E>> + Send + 'static,
        H: ClientHandler,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        McpClient::connect_with_backoff(name, connect, DEFAULT_RECONNECT_BACKOFF).await
    }

    /// [`connect`](McpClient::connect), with `backoff` between failed reconnection attempts.
    pub async fn connect_with_backoff<F, Fut, H, E>(
        name: impl Into<Arc<str>>,
        connect: F,
        backoff: Backoff,
    ) -> Result<Self, ToolError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RunningService<RoleClient, H>, E>> + Send + 'static,
        H: ClientHandler,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let connector: Connector = Arc::new(move || {
            let connecting = connect();
            Box::pin(async move { connecting.await.map(Connection::of).map_err(Into::into) })
        });
        let upstream = Upstream::start(name.into(), connector, backoff).await?;
        Ok(McpClient::over(Link::Kept(upstream)))
    }

    /// Starts the stdio server that `command` makes (called again for each restart), and
    /// keeps it running: see [a server kept up](McpClient#a-server-kept-up). The server's
    /// notifications are followed ([`ClientEvents`]): its progress, logged as events of the
    /// calls they report on, and its tool list changes
    /// ([`tool_list_changes`](McpClient::tool_list_changes)).
    ///
    /// Its stderr is read line by line, each line an INFO event `upstream_stderr` with the
    /// server's `name` (at most 4 KiB of a line; the rest is cut), so that the logs of a
    /// process that fronts servers hold only its own lines, in its own format.
    ///
    /// A message from the server longer than [`DEFAULT_MAX_MESSAGE_BYTES`] closes the
    /// connection (made again as for any other end), and the request it answered fails with
    /// an error that names the server and the bound: see
    /// [`spawn_bounded`](McpClient::spawn_bounded).
    pub async fn spawn<F>(name: impl Into<Arc<str>>, command: F) -> Result<Self, ToolError>
    where
        F: Fn() -> tokio::process::Command + Send + Sync + 'static,
    {
        McpClient::spawn_bounded(name, DEFAULT_MAX_MESSAGE_BYTES, command).await
    }

    /// [`spawn`](McpClient::spawn), reading no message longer than `max_message_bytes` from
    /// the server: a longer one closes the connection, is logged at ERROR as
    /// `upstream_message_too_large`, and fails its request (a `tools/list` too, at once,
    /// rather than after a wait for an answer that was dropped) with an error that names the
    /// server and the bound.
    ///
    /// ```no_run
    /// use tower_toolcall_mcp::McpClient;
    ///
    /// # async fn run() -> Result<(), tower_toolcall::ToolError> {
    /// let client = McpClient::spawn_bounded("catalog", 32 << 20, || {
    ///     tokio::process::Command::new("mcp-server-catalog")
    /// })
    /// .await?;
    /// let tools = client.tools().await?;
    /// # let _ = tools;
    /// # Ok(()) }
    /// ```
    pub async fn spawn_bounded<F>(
        name: impl Into<Arc<str>>,
        max_message_bytes: usize,
        command: F,
    ) -> Result<Self, ToolError>
    where
        F: Fn() -> tokio::process::Command + Send + Sync + 'static,
    {
        let name: Arc<str> = name.into();
        let events = ClientEvents::default();
        let handler = events.clone();
        let verdict = Verdict::default();
        let server = name.clone();
        let why = verdict.clone();
        let client = McpClient::connect(name, move || {
            let (handler, command, server) = (handler.clone(), command(), server.clone());
            let why = why.clone();
            // Started when the connection is made, not when it is asked for.
            async move {
                let (transport, stderr) =
                    ChildTransport::spawn(command, &server, max_message_bytes, &why)?;
                if let Some(stderr) = stderr {
                    tokio::spawn(stderr::log_lines(server, stderr));
                }
                let serving = rmcp::ServiceExt::serve(handler.clone(), transport);
                handler.connected(serving).await
            }
        })
        .await?;
        let mut client = client.with_events(&events);
        client.verdict = verdict;
        Ok(client)
    }

    /// Connects to the streamable-HTTP server at `url` and keeps the connection up (a lost
    /// session is initialized again): see [a server kept up](McpClient#a-server-kept-up).
    /// Its notifications are followed as [`spawn`](McpClient::spawn)'s are.
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub async fn http(
        name: impl Into<Arc<str>>,
        url: impl Into<Arc<str>>,
    ) -> Result<Self, ToolError> {
        let config =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url,
            );
        McpClient::http_with(name, config).await
    }

    /// [`http`](McpClient::http) with rmcp's whole transport configuration: headers sent on
    /// every request (an API key), timeouts, limits (its `max_concurrent_requests`, 16 by
    /// default, bounds the requests in flight to the server: raise it to the calls you run
    /// at once).
    ///
    /// Its requests go over one pool of keep-alive connections for the client's life
    /// ([`pooled_http_client`]), not a new connection per request as rmcp's default client
    /// makes them.
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub async fn http_with(
        name: impl Into<Arc<str>>,
        config: rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
    ) -> Result<Self, ToolError> {
        let client = pooled_http_client().map_err(|err| {
            ToolError::new(
                ErrorCode::InternalError,
                format!("the HTTP client cannot be made: {err}"),
            )
        })?;
        McpClient::http_with_client(name, client, config).await
    }

    /// [`http_with`](McpClient::http_with) over the HTTP client `client`: your TLS roots and
    /// certificates, proxies, pool (one client for the connection's life, made again over
    /// it when the session is lost). A first connection that cannot be made fails naming its
    /// innermost cause, as a request of `client` finds it (a certificate no root vouches
    /// for: `invalid peer certificate: UnknownIssuer`).
    ///
    /// ```no_run
    /// use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    /// use tower_toolcall_mcp::{pooled_http_client, McpClient};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // A server that answers kept-alive connections late: a new connection per request.
    /// let client = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    /// let config = StreamableHttpClientTransportConfig::with_uri("http://127.0.0.1:9000/mcp");
    /// let search = McpClient::http_with_client("search", client, config).await?;
    /// # let _ = (search, pooled_http_client()?);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub async fn http_with_client(
        name: impl Into<Arc<str>>,
        client: reqwest::Client,
        config: rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
    ) -> Result<Self, ToolError> {
        let events = ClientEvents::default();
        let handler = events.clone();
        let (probe, url) = (client.clone(), config.uri.clone());
        let connected = McpClient::connect(name, move || {
            let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
                client.clone(),
                config.clone(),
            );
            let serving = rmcp::ServiceExt::serve(handler.clone(), transport);
            handler.clone().connected(serving)
        })
        .await;
        match connected {
            Ok(connected) => Ok(connected.with_events(&events)),
            Err(err) => match http::why_unreachable(&probe, &url).await {
                Some(cause) => {
                    let message = format!("{} ({cause})", err.message());
                    Err(err.with_message(message))
                }
                None => Err(err),
            },
        }
    }

    /// Follows the notifications that `events`, the handler the rmcp client was served with,
    /// receives: it learns which call each progress notification belongs to (so that its
    /// events carry the call's request id, and a [relay](McpClient::relay_progress) knows
    /// where it goes), and [`tool_list_changes`](McpClient::tool_list_changes) sees the
    /// server's tool list changes.
    pub fn with_events(mut self, events: &ClientEvents) -> Self {
        self.in_flight = Some(events.in_flight.clone());
        self.tool_list = Some(events.tool_list.subscribe());
        self
    }

    /// Relays the progress the server reports on each call to the client of the
    /// [`McpServer`](crate::McpServer) that `relay` was given to, when that client asked for it
    /// (see [`ProgressRelay`]). Needs the server's notifications followed: a client made with
    /// [`spawn`](McpClient::spawn), [`connect`](McpClient::connect) over [`ClientEvents`], or
    /// `http`, or given [`with_events`](McpClient::with_events).
    pub fn relay_progress(mut self, relay: &ProgressRelay) -> Self {
        self.relay = Some(relay.clone());
        self
    }

    /// Bounds each reconnection attempt by `timeout` (default
    /// [`DEFAULT_RECONNECT_TIMEOUT`](crate::DEFAULT_RECONNECT_TIMEOUT)): a server started
    /// again that never answers `initialize` is given up and tried again after the backoff,
    /// rather than left "restarting" for ever. Clones share it; a client made with
    /// [`new`](McpClient::new) never reconnects.
    pub fn reconnect_within(self, timeout: std::time::Duration) -> Self {
        if let Link::Kept(upstream) = &self.link {
            upstream.reconnect_within(timeout);
        }
        self
    }

    /// A receiver that sees a new value each time the server says its tools changed
    /// (`notifications/tools/list_changed`) or its connection is made again (a server that
    /// restarted may list other tools): list them again with [`tools`](McpClient::tools).
    /// For a client whose notifications are not followed (see
    /// [`with_events`](McpClient::with_events)), the receiver's sender is gone: `changed()`
    /// returns `Err` at once.
    ///
    /// ```no_run
    /// # async fn run(client: tower_toolcall_mcp::McpClient) -> Result<(), tower_toolcall::ToolError> {
    /// let mut changes = client.tool_list_changes();
    /// while changes.changed().await.is_ok() {
    ///     let tools = client.tools().await?;
    ///     println!("the server lists {} tools now", tools.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn tool_list_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        match &self.tool_list {
            Some(changes) => changes.clone(),
            None => tokio::sync::watch::channel(0).1,
        }
    }

    /// What an `isError` result of the server's tools means (by default
    /// [`IsError::Answer`]: the tool's answer to the model).
    pub fn with_is_error(mut self, is_error: IsError) -> Self {
        self.is_error = is_error;
        self
    }

    /// What an `isError` result of the tool `name` means, over the server's setting.
    pub fn with_is_error_for(mut self, name: impl Into<String>, is_error: IsError) -> Self {
        Arc::make_mut(&mut self.is_error_by_tool).insert(name.into(), is_error);
        self
    }

    /// The peer of the current connection; `None` while a kept connection is being made
    /// again.
    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        match &self.link {
            Link::Fixed(peer) => Some(peer.clone()),
            Link::Kept(upstream) => upstream.current().ok().map(|(peer, _)| peer),
        }
    }

    /// Where the connection stands: always [`UpstreamState::Connected`] for a client made
    /// with [`new`](McpClient::new), which does not watch its connection.
    pub fn state(&self) -> UpstreamState {
        match &self.link {
            Link::Fixed(_) => UpstreamState::Connected,
            Link::Kept(upstream) => upstream.state(),
        }
    }

    /// What keeping the connection up has done so far (zeros for [`new`](McpClient::new)).
    pub fn stats(&self) -> UpstreamStats {
        match &self.link {
            Link::Fixed(_) => UpstreamStats::default(),
            Link::Kept(upstream) => upstream.stats(),
        }
    }

    /// The server's tools, as its `tools/list` gives them (every page).
    pub async fn tools(&self) -> Result<Vec<Tool>, ToolError> {
        let (peer, _) = self.current()?;
        peer.list_all_tools()
            .await
            .map_err(|error| explained(&self.verdict, error_from_service(error), ""))
    }

    /// Lists the server's tools and registers them in `namespace` with policy from their
    /// annotations, under the operator's registry (see [`registry_for`]).
    pub async fn registry(
        &self,
        namespace: &str,
        trust: Trust,
        operator: Option<&ToolRegistry>,
    ) -> Result<ToolRegistry, ToolError> {
        let tools = self.tools().await?;
        registry_for(namespace, &tools, trust, operator).map_err(|err| {
            ToolError::new(
                ErrorCode::ValidationError,
                format!("the tools of the MCP server give no valid registry: {err}"),
            )
        })
    }

    /// The peer to call and its connection's generation.
    fn current(&self) -> Result<(Peer<RoleClient>, u64), ToolError> {
        match &self.link {
            Link::Fixed(peer) => Ok((peer.clone(), 0)),
            Link::Kept(upstream) => upstream.current(),
        }
    }
}

/// `err`, a request's end with its connection, in the words of why this side closed the
/// connection when it did, then `then`.
fn explained(verdict: &Verdict, err: ToolError, then: &str) -> ToolError {
    match verdict.take() {
        Some(why) => err.with_message(format!("{why}{then}")),
        None => err,
    }
}

/// How a call's request failed: the error, said in the words of a kept connection when the
/// whole server failed (its transport), which is then made again.
fn failed(link: &Link, verdict: &Verdict, generation: u64, error: ServiceError) -> ToolError {
    let server_wide = matches!(
        error,
        ServiceError::TransportSend(_) | ServiceError::TransportClosed
    );
    let err = error_from_service(error);
    let err = if server_wide {
        explained(verdict, err, "; the call may or may not have run")
    } else {
        err
    };
    match link {
        Link::Kept(upstream) if server_wide => {
            upstream.lost(generation);
            // Counted once, on the server's own breaker: the connection.
            err.with_health_failure(false)
        }
        _ => err,
    }
}

impl Service<ToolCall> for McpClient {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = tower_toolcall::BoxToolFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let (peer, generation) = match self.current() {
            Ok(current) => current,
            Err(err) => return Box::pin(std::future::ready(Err(err))),
        };
        let link = self.link.clone();
        let verdict = self.verdict.clone();
        let is_error = self
            .is_error_by_tool
            .get(call.tool_name())
            .copied()
            .unwrap_or(self.is_error);
        let params = request_params(&call);
        let in_flight = self.in_flight.clone();
        let tracked = InFlightCall {
            request_id: call.request_id().into(),
            relayed: self.relay.as_ref().and_then(|r| r.get(call.request_id())),
        };
        Box::pin(async move {
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = peer
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await
                .map_err(|error| failed(&link, &verdict, generation, error))?;
            let _tracked =
                in_flight.map(|calls| calls.insert(handle.progress_token.clone(), tracked));
            let mut cancel = CancelOnDrop {
                peer: peer.clone(),
                id: Some(handle.id.clone()),
            };
            let answer = handle.await_response().await;
            cancel.id = None;
            match answer.map_err(|error| failed(&link, &verdict, generation, error))? {
                ServerResult::CallToolResult(result) => outcome_of(result, is_error),
                ServerResult::EmptyResult(_) => {
                    outcome_of(CallToolResult::success(Vec::new()), is_error)
                }
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

/// An rmcp client handler that follows a server's notifications for an [`McpClient`]:
/// - progress, logged as `tool_call_progress` events (`requestId`: the call's, when the
///   client was given these events with [`McpClient::with_events`], else the progress token;
///   `progress`, `total`, `message`), and relayed when the client
///   [relays progress](McpClient::relay_progress);
/// - tool list changes, seen by [`McpClient::tool_list_changes`].
///
/// [`McpClient::spawn`] and `http` serve their connections with it. Serve a client of your
/// own with it instead of `()` or a bare `ClientConfig`:
///
/// ```no_run
/// use tower_toolcall_mcp::{ClientEvents, McpClient};
///
/// # async fn run(transport: tokio::io::DuplexStream) -> Result<(), Box<dyn std::error::Error>> {
/// let events = ClientEvents::default();
/// let running = rmcp::ServiceExt::serve(events.clone(), transport).await?;
/// let client = McpClient::new(running.peer().clone()).with_events(&events);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ClientEvents {
    info: ClientConfig,
    in_flight: Calls,
    /// Bumped on each `notifications/tools/list_changed`, and each connection after the
    /// first.
    tool_list: Arc<tokio::sync::watch::Sender<u64>>,
    connections: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for ClientEvents {
    fn default() -> Self {
        ClientEvents {
            info: ClientConfig::default(),
            in_flight: Calls::default(),
            tool_list: Arc::new(tokio::sync::watch::Sender::new(0)),
            connections: Arc::default(),
        }
    }
}

impl ClientEvents {
    /// Sends `info` (the client's name, version and capabilities) when connecting.
    pub fn with_info(mut self, info: ClientConfig) -> Self {
        self.info = info;
        self
    }

    /// The connection `serving` makes with this handler; once made, when it is not the
    /// first, the server's tools may have changed.
    async fn connected<E>(
        self,
        serving: impl Future<Output = Result<RunningService<RoleClient, ClientEvents>, E>>,
    ) -> Result<RunningService<RoleClient, ClientEvents>, Box<dyn std::error::Error + Send + Sync>>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let running = serving.await.map_err(Into::into)?;
        let before = self
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if before > 0 {
            self.tool_list.send_modify(|changes| *changes += 1);
        }
        Ok(running)
    }
}

impl ClientHandler for ClientEvents {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let call = self.in_flight.get(&params.progress_token);
        log_progress(call.as_ref().map(|c| &*c.request_id), &params);
        if let Some(relayed) = call.and_then(|c| c.relayed) {
            relayed.send(&params);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(
            event = "mcp_tool_list_changed",
            "the MCP server's tools changed"
        );
        self.tool_list.send_modify(|changes| *changes += 1);
    }
}
