//! [`ToolRouter`]: `POST /v1/tools/call` and `GET /v1/tools` over any tool service.

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};
use tower_service::Service;

use super::admin::AdminRouter;
use super::extract::JsonToolCall;
use super::tools::tool_listing;
use crate::envelope::{ResultEnvelopeLayer, ToolCall, ToolResult};
use crate::error::ToolError;
use crate::idempotency::DedupeStore;
use crate::outcome::ToolOutput;
use crate::registry::ToolRegistry;

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

/// The service behind the call route: any tool service, answering with envelopes.
type CallService = BoxCloneSyncService<ToolCall, ToolResult, Infallible>;

/// Builds the axum [`Router`] of a tool gateway:
///
/// | route | answer |
/// |---|---|
/// | `POST /v1/tools/call` | the call, read by [`JsonToolCall`], goes through the service; the [`ToolResult`] comes back with the status of its code |
/// | `GET /v1/tools` | the registered tools, their schemas and capabilities ([`tool_listing`]) |
/// | `/admin/…` | the [`AdminRouter`], when one is given |
///
/// The service is any `Service<ToolCall>` answering `ToolOutput` / `ToolError` — typically
/// tools behind a [`ToolStack`](crate::ToolStack). It must be `Clone + Send + Sync`, as axum's
/// state is; the router boxes it, so no type of the stack shows in the router's.
///
/// ```
/// use serde_json::json;
/// use tower::Layer;
/// use tower_toolcall::http::{AdminRouter, ToolRouter};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
///
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let tools = stack.layer(tool_fn(|call: ToolCall| async move {
///     Ok(ToolOutput::new(json!({"echo": call.params()})))
/// }));
/// let app: axum::Router = ToolRouter::new(stack.registry().clone(), tools)
///     .body_limit(256 * 1024)
///     .admin(AdminRouter::new(&stack, "a long secret token")?)
///     .into_router();
/// // axum::serve(listener, app).await
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct ToolRouter {
    registry: ToolRegistry,
    service: CallService,
    body_limit: usize,
    unavailable_retry_after: Option<Duration>,
    admin: Option<Router>,
}

impl fmt::Debug for ToolRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRouter")
            .field("registry", &self.registry)
            .field("body_limit", &self.body_limit)
            .field("unavailable_retry_after", &self.unavailable_retry_after)
            .field("admin", &self.admin.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct ToolsState {
    registry: ToolRegistry,
    service: CallService,
    unavailable_retry_after: Option<Duration>,
}

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
            service: BoxCloneSyncService::new(ResultEnvelopeLayer::new().layer(service)),
            body_limit: DEFAULT_BODY_LIMIT,
            unavailable_retry_after: Some(DEFAULT_UNAVAILABLE_RETRY_AFTER),
            admin: None,
        }
    }

    /// The largest request body of a call, in bytes (default [`DEFAULT_BODY_LIMIT`]); a
    /// larger one is answered `PAYLOAD_TOO_LARGE` (413).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// When a `503` result that has no `retryAfterMs` of its own tells the client to come
    /// back (default [`DEFAULT_UNAVAILABLE_RETRY_AFTER`]; `None` for never): a breaker an
    /// operator holds open, a dedupe store or an upstream that is down. The result's
    /// `retryAfterMs` and the `Retry-After` header both get it, so that clients back off
    /// instead of calling again at once. Results with a time of their own (a breaker open
    /// after failures, a rate limit) keep it.
    pub fn unavailable_retry_after(mut self, after: Option<Duration>) -> Self {
        self.unavailable_retry_after = after;
        self
    }

    /// Nests `admin` under [`ADMIN_PATH`]. Without it, the router has no admin routes.
    pub fn admin<St: DedupeStore>(mut self, admin: AdminRouter<St>) -> Self {
        self.admin = Some(admin.into_router());
        self
    }

    /// The axum router.
    pub fn into_router(self) -> Router {
        let state = ToolsState {
            registry: self.registry,
            service: self.service,
            unavailable_retry_after: self.unavailable_retry_after,
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

async fn call_tool(
    State(state): State<ToolsState>,
    JsonToolCall(call): JsonToolCall,
) -> ToolResult {
    let mut result = match state.service.oneshot(call).await {
        Ok(result) => result,
        Err(never) => match never {},
    };
    if let (Some(after), Some(error)) = (state.unavailable_retry_after, result.error.as_mut()) {
        if error.retry_after_ms.is_none() && error.code.http_status() == 503 {
            error.retry_after_ms = Some(crate::time::millis(after));
        }
    }
    result
}

async fn list_tools(State(state): State<ToolsState>) -> Json<Value> {
    Json(tool_listing(&state.registry))
}
