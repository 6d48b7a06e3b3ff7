//! [`ToolRouter`]: `POST /v1/tools/call` and `GET /v1/tools` over any tool service.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::Semaphore;
use tower::util::BoxCloneSyncService;
use tower::Layer;
use tower_service::Service;

use super::admin::AdminRouter;
use super::confirm::IssuedConfirmations;
use super::extract::{json_content_type, JsonToolCall};
use super::tools::tool_listing;
use tower_toolcall::detach::detached;
use tower_toolcall::envelope::{
    ChunkEnvelope, FinalChunk, ResultEnvelopeLayer, ToolCall, ToolResult,
};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::stream::{StreamPart, Streamed};
use tower_toolcall::ToolOutput;
use tower_toolcall::{ErrorCode, Principal, ToolError};

/// The largest request body [`ToolRouter`] reads by default: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// The path of the call route.
pub const CALL_PATH: &str = "/v1/tools/call";

/// The path of the tool listing.
pub const TOOLS_PATH: &str = "/v1/tools";

/// The path the admin router is nested under by [`ToolRouter::admin`].
pub const ADMIN_PATH: &str = "/admin";

/// When a `503 Service Unavailable` answer without a time of its own tells the client to
/// come back, by default: 30 seconds.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How long a request's body may take to arrive by default: 30 seconds.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many calls [`ToolRouter`] runs at once by default: 64.
pub const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 64;

/// When a call refused because the router is full is told to come back: 1 second.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The tool service as the router is given it.
type ToolService = BoxCloneSyncService<ToolCall, ToolOutput, ToolError>;

/// The service behind the call route: the tools within the limit of calls in flight,
/// answering with envelopes.
type CallService = BoxCloneSyncService<ToolCall, ToolResult, Infallible>;

/// Builds the axum [`Router`] of a tool gateway:
///
/// | route | answer |
/// |---|---|
/// | `POST /v1/tools/call` | the call, read by [`JsonToolCall`], goes through the service; the [`ToolResult`] comes back with the status of its code; to a caller that sends `Accept: text/event-stream` or `payload.callHints.preferStreaming: true`, as server-sent events instead: a `chunk` event per chunk the tool streams ([`ChunkEnvelope`]), then a `result` event with the whole result ([`FinalChunk`]) |
/// | `GET /v1/tools` | the registered tools, their schemas and capabilities ([`tool_listing`]) |
/// | `/admin/…` | the [`AdminRouter`], when one is given |
///
/// The service is any `Service<ToolCall>` answering `ToolOutput` / `ToolError` — typically
/// tools behind a [`ToolStack`](tower_toolcall::ToolStack). It must be `Clone + Send + Sync`, as axum's
/// state is; the router boxes it, so no type of the stack shows in the router's.
///
/// # Facing untrusted clients
///
/// - **Content type.** The call route takes `application/json` bodies only (and `+json`
///   types); others are answered `415`, so that a web page cannot send a call as a CORS
///   "simple request" without a preflight. Nothing else authenticates the caller: put the
///   router behind your own authentication, and treat a `control.confirmationId` that
///   arrives over HTTP as only as trustworthy as the caller who sent it, unless the router
///   [issues the ids itself](ToolRouter::issue_confirmations).
/// - **Disconnects.** A call, once dispatched, is [detached](tower_toolcall::detach::detached) from
///   its connection: a client that disconnects does not cancel it. It runs to its end
///   (bounded by the stack's timeouts), its idempotency record stays in flight, and a re-send
///   with the same `Idempotency-Key` joins it or gets its result.
/// - **Calls in flight** are bounded ([`max_calls_in_flight`](ToolRouter::max_calls_in_flight));
///   a call over the limit is answered `503` with `UPSTREAM_UNAVAILABLE` and `Retry-After`
///   at once. A call holds its parsed params while it runs, up to some 30 times the size of
///   its body for a body of many small values: the body limit times the calls in flight
///   bounds that memory.
/// - **Slow clients.** The body must arrive within [`body_timeout`](ToolRouter::body_timeout)
///   (`408` otherwise). Headers and idle connections are the server's to bound: serve the
///   router with [`serve`](super::serve), whose [`ServeConfig`](super::ServeConfig) sets a
///   header-read timeout (which also closes idle keep-alive connections) and a cap on
///   connections. `axum::serve` sets neither.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower::Layer;
/// use tower_toolcall_axum::{AdminRouter, ToolRouter};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
///
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let tools = stack.layer(tool_fn(|call: ToolCall| async move {
///     Ok(ToolOutput::new(json!({"echo": call.params()})))
/// }));
/// let app: axum::Router = ToolRouter::new(stack.registry().clone(), tools)
///     .body_limit(256 * 1024)
///     .body_timeout(Duration::from_secs(10))
///     .max_calls_in_flight(32)
///     .admin(AdminRouter::new(&stack, "a long secret token")?)
///     .into_router();
/// // tower_toolcall_axum::serve(listener, app, ServeConfig::default(), shutdown).await
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct ToolRouter {
    registry: ToolRegistry,
    service: ToolService,
    body_limit: usize,
    body_timeout: Duration,
    max_calls_in_flight: usize,
    unavailable_retry_after: Option<Duration>,
    admin: Option<Router>,
    visible: Option<Arc<VisibleFn>>,
    denied: Option<Arc<DeniedFn>>,
    confirmations: Option<IssuedConfirmations>,
    slots: Option<CallSlots>,
}

/// The calls one or more [`ToolRouter`]s run at once (see
/// [`ToolRouter::call_slots`]). Clones share the count.
#[derive(Clone, Debug)]
pub struct CallSlots {
    slots: Arc<Semaphore>,
    limit: usize,
}

impl CallSlots {
    /// Room for `calls` calls at once (at least 1).
    pub fn new(calls: usize) -> Self {
        let limit = calls.clamp(1, Semaphore::MAX_PERMITS);
        CallSlots {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl fmt::Debug for ToolRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRouter")
            .field("registry", &self.registry)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("max_calls_in_flight", &self.max_calls_in_flight)
            .field("unavailable_retry_after", &self.unavailable_retry_after)
            .field("admin", &self.admin.is_some())
            .field("filtered", &self.visible.is_some())
            .field("issues_confirmations", &self.confirmations.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct ToolsState {
    registry: ToolRegistry,
    service: CallService,
    body_timeout: Duration,
    unavailable_retry_after: Option<Duration>,
    visible: Option<Arc<VisibleFn>>,
    denied: Option<Arc<DeniedFn>>,
    confirmations: Option<IssuedConfirmations>,
}

/// Whether the caller (its principal, if any) sees the tool of this namespace and name.
type VisibleFn = dyn Fn(Option<&Principal>, &str, &str) -> bool + Send + Sync;

/// Told of each call refused because its caller may not see the tool.
type DeniedFn = dyn Fn(Option<&Principal>, &str, &str) + Send + Sync;

impl ToolRouter {
    /// A router that lists the tools of `registry` and calls `service`.
    pub fn new<S>(registry: ToolRegistry, service: S) -> Self
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        ToolRouter {
            registry,
            service: BoxCloneSyncService::new(service),
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_calls_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            unavailable_retry_after: Some(DEFAULT_UNAVAILABLE_RETRY_AFTER),
            admin: None,
            visible: None,
            denied: None,
            confirmations: None,
            slots: None,
        }
    }

    /// The largest request body of a call, in bytes (default [`DEFAULT_BODY_LIMIT`]); a
    /// larger one is answered `PAYLOAD_TOO_LARGE` (413).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// How long a call's body may take to arrive, from when its headers were read (default
    /// [`DEFAULT_BODY_TIMEOUT`]); a slower one is answered `408 Request Timeout` with a
    /// `TIMEOUT` envelope, and the connection is closed.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// How many calls run at once (default [`DEFAULT_MAX_CALLS_IN_FLIGHT`], at least 1: `0`
    /// counts as 1). A call that finds them all taken is answered at once with
    /// `UPSTREAM_UNAVAILABLE` (503) and a `Retry-After` of one second; the tool does not run.
    /// A call whose client disconnected still counts until it ends.
    pub fn max_calls_in_flight(mut self, calls: usize) -> Self {
        self.max_calls_in_flight = calls.clamp(1, Semaphore::MAX_PERMITS);
        self.slots = None;
        self
    }

    /// Counts the calls in flight in `slots` (whose limit then replaces
    /// [`max_calls_in_flight`](ToolRouter::max_calls_in_flight)'s), shared with the other
    /// routers given them: the routers that replace one another in a server that reloads
    /// keep one count, so that a reload never adds room.
    ///
    /// ```
    /// use tower_toolcall_axum::{CallSlots, ToolRouter};
    /// use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
    ///
    /// let slots = CallSlots::new(256);
    /// let tools = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(serde_json::json!({}))) });
    /// let before = ToolRouter::new(ToolRegistry::open(), tools.clone()).call_slots(slots.clone());
    /// let after = ToolRouter::new(ToolRegistry::open(), tools).call_slots(slots);
    /// # let _ = (before, after);
    /// ```
    pub fn call_slots(mut self, slots: CallSlots) -> Self {
        self.max_calls_in_flight = slots.limit;
        self.slots = Some(slots);
        self
    }

    /// When a `503` result that has no `retryAfterMs` of its own tells the client to come
    /// back (default [`DEFAULT_UNAVAILABLE_RETRY_AFTER`]; `None` for never): a breaker an
    /// operator holds open, a dedupe store or an upstream that is down. The result's
    /// `retryAfterMs` and the `Retry-After` header both get it, so that clients back off
    /// instead of calling again at once. Results with a time of their own (a breaker open
    /// after failures, a rate limit, a full router) keep it.
    pub fn unavailable_retry_after(mut self, after: Option<Duration>) -> Self {
        self.unavailable_retry_after = after;
        self
    }

    /// Shows each caller only the tools `visible` says it may call: `GET /v1/tools` lists
    /// the others to no one, and their calls are refused `POLICY_DENIED` (403) before the
    /// stack, in the same words as a call of a tool that does not exist. `visible` gets the
    /// caller's [`Principal`] (none without authentication), the tool's namespace and name.
    ///
    /// ```
    /// use tower_toolcall_axum::ToolRouter;
    /// use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::{tool_fn, Principal, ToolCall, ToolOutput};
    ///
    /// let tools = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(serde_json::json!({}))) });
    /// let router = ToolRouter::new(ToolRegistry::open(), tools).visible_to(
    ///     |principal: Option<&Principal>, namespace: &str, _name: &str| {
    ///         namespace == "web" || principal.is_some_and(|p| p.has_role("admin"))
    ///     },
    /// );
    /// # let _ = router;
    /// ```
    pub fn visible_to<F>(mut self, visible: F) -> Self
    where
        F: Fn(Option<&Principal>, &str, &str) -> bool + Send + Sync + 'static,
    {
        self.visible = Some(Arc::new(visible));
        self
    }

    /// Calls `denied` with the caller, the namespace and the name of each call refused
    /// because the caller may not see the tool (see [`visible_to`](ToolRouter::visible_to)):
    /// for an audit of refusals.
    pub fn on_denied<F>(mut self, denied: F) -> Self
    where
        F: Fn(Option<&Principal>, &str, &str) + Send + Sync + 'static,
    {
        self.denied = Some(Arc::new(denied));
        self
    }

    /// Issues the confirmation ids itself, and believes no other: a call refused for want of
    /// the user's confirmation (`POLICY_DENIED`, details `reason: "confirmation_required"`)
    /// gets an id bound to that very call (its caller, tool and canonical arguments), in its
    /// details (`confirmationId`, `expiresInMs`) and its message; the same call sent again
    /// with `control.confirmationId` set to it within `ttl` runs, once. Any other id (made
    /// up, issued for another call or caller, used, expired) is refused `POLICY_DENIED`
    /// before the stack. Without this, the router passes a caller's confirmation id on as
    /// it came (see [facing untrusted clients](ToolRouter#facing-untrusted-clients)).
    ///
    /// ```
    /// use tower_toolcall_axum::{ToolRouter, DEFAULT_CONFIRMATION_TTL};
    /// use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
    ///
    /// let tools = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(serde_json::json!({}))) });
    /// let router = ToolRouter::new(ToolRegistry::open(), tools)
    ///     .issue_confirmations(DEFAULT_CONFIRMATION_TTL);
    /// # let _ = router;
    /// ```
    pub fn issue_confirmations(mut self, ttl: Duration) -> Self {
        self.confirmations = Some(IssuedConfirmations::new(ttl));
        self
    }

    /// Nests `admin` under [`ADMIN_PATH`]. Without it, the router has no admin routes.
    pub fn admin(mut self, admin: AdminRouter) -> Self {
        self.admin = Some(admin.into_router());
        self
    }

    /// The axum router.
    pub fn into_router(self) -> Router {
        let slots = self
            .slots
            .unwrap_or_else(|| CallSlots::new(self.max_calls_in_flight));
        let limited = InFlightLimit {
            inner: self.service,
            slots: slots.slots,
            limit: slots.limit,
        };
        let state = ToolsState {
            registry: self.registry,
            service: BoxCloneSyncService::new(ResultEnvelopeLayer::new().layer(limited)),
            body_timeout: self.body_timeout,
            unavailable_retry_after: self.unavailable_retry_after,
            visible: self.visible,
            denied: self.denied,
            confirmations: self.confirmations,
        };
        let router = Router::new()
            .route(
                CALL_PATH,
                post(call_tool).layer(DefaultBodyLimit::max(self.body_limit)),
            )
            .route(TOOLS_PATH, get(list_tools))
            .with_state(state);
        match self.admin {
            Some(admin) => router.nest(ADMIN_PATH, admin),
            None => router,
        }
    }
}

async fn call_tool(State(state): State<ToolsState>, request: Request) -> Response {
    if let Err(error) = json_content_type(request.headers()) {
        let result = ToolResult::rejected(error);
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Json(result)).into_response();
    }
    let principal = request.extensions().get::<Principal>().cloned();
    let accepts_stream = accepts_event_stream(request.headers());
    let read = tokio::time::timeout(state.body_timeout, JsonToolCall::from_request(request, &()));
    let mut call = match read.await {
        Ok(Ok(JsonToolCall(call))) => call,
        Ok(Err(rejected)) => return rejected.into_response(),
        Err(_) => return body_too_slow(state.body_timeout),
    };
    if !state.sees(principal.as_ref(), call.tool_namespace(), call.tool_name()) {
        if let Some(denied) = &state.denied {
            denied(principal.as_ref(), call.tool_namespace(), call.tool_name());
        }
        let denied = ToolError::rejected(
            ErrorCode::PolicyDenied,
            format!(
                "you may not call the tool {}: call one of the tools that GET {TOOLS_PATH} \
                 lists for you",
                call.tool_name()
            ),
        );
        return ToolResult::from_outcome(&call, Err(denied)).into_response();
    }
    // The caller is who its authentication says, whatever the body says.
    if let Some(principal) = principal {
        call.bind_principal(principal);
    }
    if let Some(confirmations) = &state.confirmations {
        if let Err(refused) = confirmations.redeem(&call) {
            return ToolResult::from_outcome(&call, Err(refused)).into_response();
        }
    }
    let streams = accepts_stream || call.call_hints().prefer_streaming == Some(true);
    if streams {
        return stream_answer(state, call);
    }
    // Detached: a client that disconnects does not cancel the call.
    let answer = detached(state.service.clone(), call.clone()).await;
    state.finish(&call, answer).into_response()
}

/// Whether the caller asks for the answer in chunks: `Accept: text/event-stream`, or
/// `callHints.preferStreaming` in the body.
fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|kind| {
            let kind = kind.split(';').next().unwrap_or_default().trim();
            kind.eq_ignore_ascii_case("text/event-stream")
        })
}

/// The answer as server-sent events: one `chunk` event per chunk (a [`ChunkEnvelope`]), then
/// one `result` event with the whole result (a [`FinalChunk`]). The call runs detached: a
/// client that goes away mid-stream does not stop it.
fn stream_answer(state: ToolsState, mut call: ToolCall) -> Response {
    let chunks = call.stream_chunks();
    let answer = detached(state.service.clone(), call.clone());
    let events = Streamed::new(answer, chunks).map(move |part| {
        let event = match part {
            StreamPart::Chunk(chunk) => Event::default()
                .event("chunk")
                .json_data(ChunkEnvelope::new(&call, &chunk)),
            StreamPart::Done(answer) => {
                let result = state.finish(&call, answer);
                let chunks = result.streamed.map_or(0, |streamed| streamed.chunks);
                Event::default()
                    .event("result")
                    .json_data(FinalChunk::new(result, chunks))
            }
            _ => unreachable!("a streamed call yields chunks and its answer"),
        };
        Ok::<_, Infallible>(event.unwrap_or_else(|_| Event::default().event("error")))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The answer to a body that did not arrive in time: `408`, and the connection closed.
fn body_too_slow(timeout: Duration) -> Response {
    let error = ToolError::rejected(
        ErrorCode::Timeout,
        format!(
            "the request body did not arrive within {} ms; send it at once, or a smaller one",
            timeout.as_millis()
        ),
    );
    (
        StatusCode::REQUEST_TIMEOUT,
        [(header::CONNECTION, "close")],
        Json(ToolResult::rejected(error)),
    )
        .into_response()
}

async fn list_tools(
    State(state): State<ToolsState>,
    principal: Option<axum::Extension<Principal>>,
) -> Json<Value> {
    let mut listing = tool_listing(&state.registry);
    if state.visible.is_some() {
        let principal = principal.map(|axum::Extension(p)| p);
        if let Some(Value::Array(tools)) = listing.get_mut("tools") {
            tools.retain(|tool| {
                let part = |member: &str| tool[member].as_str().unwrap_or_default().to_owned();
                state.sees(principal.as_ref(), &part("namespace"), &part("name"))
            });
        }
    }
    Json(listing)
}

impl ToolsState {
    /// The result of `call` as the caller gets it: a confirmation id issued for a call that
    /// needs one, and a `Retry-After` on a busy answer.
    fn finish(&self, call: &ToolCall, answer: Result<ToolResult, ToolError>) -> ToolResult {
        let mut result = match answer {
            Ok(result) => result,
            Err(failure) => ToolResult::from_outcome(call, Err(failure)),
        };
        if let (Some(confirmations), Some(error)) = (&self.confirmations, result.error.as_mut()) {
            confirmations.issue_for(call, error);
        }
        if let (Some(after), Some(error)) = (self.unavailable_retry_after, result.error.as_mut()) {
            if error.retry_after_ms.is_none() && error.code.http_status() == 503 {
                error.retry_after_ms = Some(crate::millis(after));
            }
        }
        result
    }

    fn sees(&self, principal: Option<&Principal>, namespace: &str, name: &str) -> bool {
        self.visible
            .as_ref()
            .is_none_or(|visible| visible(principal, namespace, name))
    }
}

/// Runs a call when fewer than `limit` are running; refuses it at once otherwise. The slot
/// is held by the call's future, so a call whose client went away counts until it ends.
#[derive(Clone)]
struct InFlightLimit {
    inner: ToolService,
    slots: Arc<Semaphore>,
    limit: usize,
}

impl Service<ToolCall> for InFlightLimit {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = BoxFuture<'static, Result<ToolOutput, ToolError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let answer = self.inner.call(call);
                Box::pin(async move {
                    let answer = answer.await;
                    drop(slot);
                    answer
                })
            }
            Err(_) => {
                let busy = ToolError::rejected(
                    ErrorCode::UpstreamUnavailable,
                    format!(
                        "the gateway is running {} calls, its limit; try again in a moment",
                        self.limit
                    ),
                )
                .with_retry_after(BUSY_RETRY_AFTER);
                Box::pin(std::future::ready(Err(busy)))
            }
        }
    }
}
