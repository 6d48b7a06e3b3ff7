//! What clients reach: MCP over stdio, and over HTTP streamable MCP at `/mcp`, the
//! `ToolCall` envelope at `/v1/tools/call`, `/metrics`, `/admin`, `/healthz` and `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::StreamExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use serde_json::value::RawValue;
use tower_toolcall::Principal;
use tower_toolcall_axum::authn::Authentication;
use tower_toolcall_axum::{
    ServeConfig, ServerTls, ToolRouter, ADMIN_PATH, DEFAULT_CONFIRMATION_TTL,
};
use tower_toolcall_mcp::{
    stdio_transport, McpServer, SessionAnswer, ToolList, DEFAULT_MAX_LINE_BYTES,
};

use crate::gateway::{Gateway, Lasting, Scrape};
use crate::mcp_sessions::{Refusal, Sessions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves MCP over the process's stdin and stdout until the host closes stdin.
pub(crate) async fn serve_stdio(lasting: &Lasting) -> Result<(), BoxError> {
    let running = rmcp::ServiceExt::serve(
        lasting.mcp.connection(),
        stdio_transport(DEFAULT_MAX_LINE_BYTES)?,
    )
    .await?;
    running.waiting().await?;
    Ok(())
}

/// MCP over streamable HTTP at `/mcp`, behind `auth` when there is one. It outlives
/// reloads: its sessions go on over the gateway in service. Its Host and Origin are checked
/// with every other route's ([`HostGuard`](tower_toolcall_axum::HostGuard)), not by rmcp.
pub(crate) fn mcp_router(lasting: &Lasting, auth: Option<&Authentication>) -> Router {
    let server = lasting.mcp.connection();
    // A stateless request (2026-07-28) is answered in plain JSON unless its call sends
    // progress first.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_json_response(true);
    // Sessions idle out by the gateway's clock, not rmcp's: the calls the gateway answers
    // itself never reach rmcp's session.
    let mut open = LocalSessionManager::default();
    open.session_config.keep_alive = None;
    let open = Arc::new(open);
    let service = StreamableHttpService::new(move || Ok(server.connection()), open.clone(), config);
    let (max, max_per_principal) = lasting.http.max_sessions;
    let sessions = Sessions::new(open, max, max_per_principal);
    sessions.expire_idle(lasting.http.session_idle);
    let admission = Admission {
        body_timeout: lasting.http.body_timeout,
        sessions,
        listed: lasting.listed.clone(),
        server: lasting.mcp.clone(),
    };
    let router = Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::map_response(session_ended))
        .layer(axum::middleware::from_fn(move |request, next| {
            admission.clone().admit(request, next)
        }));
    match auth {
        Some(auth) => {
            let lasting = lasting.clone();
            router
                .route_layer(axum::middleware::map_request(move |request| {
                    std::future::ready(with_principal(request, |p| lasting.capped(p)))
                }))
                .route_layer(auth.layer())
        }
        None => router,
    }
}

/// The most bytes of an MCP request's body.
const MAX_MCP_BODY: usize = 4 << 20;

/// What `/mcp` checks before MCP sees a request: its whole body arrives in time, a request
/// that would open a session finds room for one, and a request in a session is its owner's.
/// It answers a session's `tools/list` itself, from the list's shared encoding, and the
/// session's `tools/call` requests that need no confirmation (see [`Admission::admit`]).
#[derive(Clone)]
struct Admission {
    body_timeout: Duration,
    sessions: Arc<Sessions>,
    listed: ToolList,
    server: Arc<McpServer<ToolList>>,
}

impl Admission {
    /// Reads the request's whole body within the body timeout (at most [`MAX_MCP_BODY`]
    /// bytes) before MCP sees it, so that a client that sends it slowly holds a connection
    /// for that long at most: `408` and the connection closed when it is late, `413` when it
    /// is too large. An `initialize` without a session is answered `503` with a retry-after
    /// when the gateway holds its limit of open sessions, `429` when its principal holds
    /// its own. A request naming another principal's session is answered as one naming no
    /// session there is: `404`. In an open session, a `tools/list` is answered here with
    /// the list's shared encoding (see [`listing`]), and a `tools/call` that needs no
    /// confirmation by the MCP server without rmcp's session
    /// ([`McpServer::answer_in_session`]): in plain JSON unless its progress comes first.
    async fn admit(
        self,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> Response {
        let (parts, body) = request.into_parts();
        let principal = parts.extensions.get::<Principal>();
        let session = parts
            .headers
            .get("mcp-session-id")
            .map(|id| id.to_str().unwrap_or_default().to_owned());
        // Without authentication every session is the one user's: nothing to check.
        if let (Some(id), Some(principal)) = (&session, principal) {
            if !self.sessions.may_use(id, &Sessions::owner(Some(principal))) {
                return (
                    StatusCode::NOT_FOUND,
                    "Not Found: Session not found; open a session of your own (initialize)",
                )
                    .into_response();
            }
        }
        let read =
            tokio::time::timeout(self.body_timeout, axum::body::to_bytes(body, MAX_MCP_BODY));
        let bytes = match read.await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                return (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the request body is over {MAX_MCP_BODY} bytes; send a smaller one"),
                )
                    .into_response()
            }
            Err(_) => {
                return (
                    StatusCode::REQUEST_TIMEOUT,
                    [(axum::http::header::CONNECTION, "close")],
                    format!(
                        "the request body did not arrive within {} ms; send it at once",
                        self.body_timeout.as_millis()
                    ),
                )
                    .into_response()
            }
        };
        let client = session.as_deref().and_then(|id| self.sessions.touch(id));
        let posted = parts.method == axum::http::Method::POST;
        if let (Some(id), true) = (&session, posted) {
            if self.sessions.is_open(id).await {
                if let Some(request) = tools_list(&parts.method, &bytes) {
                    return listing(request, self.listed.encoded_for(principal));
                }
                let answered = self
                    .server
                    .answer_in_session(&parts, &bytes, id, client.as_deref())
                    .await;
                match answered {
                    Some(SessionAnswer::Json(json)) => {
                        self.sessions.touch(id);
                        return (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            json,
                        )
                            .into_response();
                    }
                    Some(SessionAnswer::Events(events)) => {
                        let events = events.map(Ok::<_, std::convert::Infallible>);
                        return (
                            [
                                (axum::http::header::CONTENT_TYPE, "text/event-stream"),
                                (axum::http::header::CACHE_CONTROL, "no-cache"),
                            ],
                            axum::body::Body::from_stream(events),
                        )
                            .into_response();
                    }
                    _ => {}
                }
            }
        }
        let method = parts.method.clone();
        let request = axum::extract::Request::from_parts(parts, bytes.clone().into());
        if method == axum::http::Method::DELETE {
            let response = next.run(request).await;
            if let Some(id) = session.filter(|_| response.status().is_success()) {
                self.sessions.ended(&id);
            }
            return response;
        }
        let initialize = match (posted, &session) {
            (true, None) => initialize(&bytes),
            _ => None,
        };
        let Some(initialize) = initialize else {
            return next.run(request).await;
        };
        let owner = Sessions::owner(request.extensions().get::<Principal>());
        let opening = match self
            .sessions
            .open(owner, initialize.client.as_deref())
            .await
        {
            Ok(opening) => opening,
            Err(refusal) => {
                let status = match refusal {
                    Refusal::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
                    Refusal::PrincipalFull(_) => StatusCode::TOO_MANY_REQUESTS,
                };
                tracing::warn!(
                    event = "mcp_sessions_full",
                    status = status.as_u16(),
                    "a new MCP session was refused: {refusal}"
                );
                return (
                    status,
                    [(axum::http::header::RETRY_AFTER, "5")],
                    refusal.to_string(),
                )
                    .into_response();
            }
        };
        let response = next.run(request).await;
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok())
        {
            opening.opened(id);
        }
        response
    }
}

/// The id of a `tools/list` request for the whole list (no cursor), when `body` is one.
fn tools_list<'a>(method: &axum::http::Method, body: &'a [u8]) -> Option<&'a RawValue> {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        jsonrpc: &'a str,
        #[serde(borrow)]
        id: &'a RawValue,
        #[serde(borrow)]
        method: &'a str,
        params: Option<Params>,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        cursor: Option<serde::de::IgnoredAny>,
    }
    // A call's body is not parsed twice: a tools/list request is short, and names its
    // method (a search of a few hundred bytes; no parse).
    let named = || memchr::memmem::find(body, b"\"tools/list\"").is_some();
    if method != axum::http::Method::POST || body.len() > 4096 || !named() {
        return None;
    }
    let request = serde_json::from_slice::<Request<'_>>(body).ok()?;
    let whole = request.params.is_none_or(|params| params.cursor.is_none());
    (request.jsonrpc == "2.0" && request.method == "tools/list" && whole).then_some(request.id)
}

/// The answer to the `tools/list` request `id`: one JSON-RPC response whose result is
/// `encoded`, sent as it is (the bytes are the list's, shared, not a copy).
fn listing(id: &RawValue, encoded: bytes::Bytes) -> Response {
    let head = format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":", id.get());
    let parts = [
        bytes::Bytes::from(head),
        encoded,
        bytes::Bytes::from_static(b"}"),
    ];
    let body = axum::body::Body::from_stream(futures_util::stream::iter(
        parts.map(Ok::<_, std::convert::Infallible>),
    ));
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// An `initialize` request, which opens a session: the name its client gives itself.
struct Initialize {
    client: Option<String>,
}

/// `body` as an `initialize` request, when it is one (whatever else it says: rmcp judges
/// the rest).
fn initialize(body: &[u8]) -> Option<Initialize> {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
    }
    #[derive(serde::Deserialize)]
    struct Request {
        params: Params,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        client_info: ClientInfo,
    }
    #[derive(serde::Deserialize)]
    struct ClientInfo {
        name: String,
    }
    let method = serde_json::from_slice::<Method<'_>>(body).ok()?.method;
    (method == Some("initialize")).then(|| Initialize {
        client: serde_json::from_slice::<Request>(body)
            .ok()
            .map(|request| request.params.client_info.name),
    })
}

/// The answer to a `DELETE /mcp` that ended a session: `200 OK`, as the official SDKs'
/// clients expect (rmcp answers `202 Accepted`, which they report as a failed termination).
async fn session_ended(request_method: axum::http::Method, mut response: Response) -> Response {
    if request_method == axum::http::Method::DELETE && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// The HTTP fronts of `gateway` but MCP's: `/v1` behind `auth` when there is one, the
/// probes, `/metrics` unless it has an address of its own, and the admin API when there is
/// a token.
pub(crate) fn http_router(
    gateway: &Gateway,
    lasting: &Lasting,
    auth: Option<&Authentication>,
    metrics_here: bool,
) -> Router {
    let mut envelope = ToolRouter::new(gateway.registry.clone(), gateway.tools.clone())
        .body_timeout(lasting.http.body_timeout)
        .call_slots(lasting.call_slots.clone())
        .issue_confirmations(DEFAULT_CONFIRMATION_TTL);
    if let Some(access) = gateway.access.clone() {
        let names = gateway.names.clone();
        envelope = envelope.visible_to(move |principal, namespace, name| {
            access.allows(principal, &names.listed_name(namespace, name))
        });
        if let Some(denials) = gateway.denials.clone() {
            let names = gateway.names.clone();
            envelope = envelope.on_denied(move |principal, namespace, name| {
                denials.denied(principal, &names.listed_name(namespace, name))
            });
        }
    }
    let mut envelope = envelope.into_router();
    if let Some(auth) = auth {
        if let Some(access) = gateway.access.clone() {
            envelope = envelope.route_layer(axum::middleware::map_request(move |request| {
                std::future::ready(with_principal(request, |p| access.capped(p)))
            }));
        }
        envelope = envelope.route_layer(auth.layer());
    }
    let mut probes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready));
    if metrics_here {
        probes = probes.route("/metrics", get(scrape));
    }
    let probes = probes.with_state(Probes {
        upstreams: gateway.upstreams.clone(),
        down: gateway.down.clone(),
        scrape: lasting.scrape.clone(),
    });
    let mut router = envelope.merge(probes);
    match &gateway.admin {
        Some(admin) => router = router.nest(ADMIN_PATH, admin.clone()),
        None => tracing::info!("no admin token: no admin API"),
    }
    router
}

/// `request` with its authenticated principal changed by `change`: the priority its calls may
/// claim capped by its roles, before a front binds its calls to it.
fn with_principal(
    mut request: axum::extract::Request,
    change: impl FnOnce(Principal) -> Principal,
) -> axum::extract::Request {
    if let Some(principal) = request.extensions_mut().remove::<Principal>() {
        request.extensions_mut().insert(change(principal));
    }
    request
}

/// `/metrics` alone, for an address of its own.
pub(crate) fn metrics_router(series: Scrape) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(Probes {
            upstreams: Arc::default(),
            down: Arc::default(),
            scrape: series,
        })
}

#[derive(Clone)]
struct Probes {
    upstreams: Arc<Vec<crate::upstreams::Upstream>>,
    down: Arc<Vec<crate::upstreams::Down>>,
    scrape: Scrape,
}

/// `GET /readyz`: 200 once every required upstream is connected; else 503 naming those
/// the gateway waits for. Either way, `down` names each upstream that failed to start (an
/// optional one keeps the gateway ready); the log says why.
async fn ready(State(probes): State<Probes>) -> Response {
    let waiting: Vec<&str> = probes
        .upstreams
        .iter()
        .filter(|u| u.config.required && !u.is_up())
        .map(|u| u.config.name.as_str())
        .chain(
            probes
                .down
                .iter()
                .filter(|d| d.config.required)
                .map(|d| d.config.name.as_str()),
        )
        .collect();
    // Names only: the probe answers anyone who reaches it, and a reason may name paths and
    // hosts. The reasons are in the log.
    let down: Vec<&str> = probes.down.iter().map(|d| d.config.name.as_str()).collect();
    let mut answer = json!({"ready": waiting.is_empty()});
    if !waiting.is_empty() {
        answer["waitingFor"] = json!(waiting);
    }
    if !down.is_empty() {
        answer["down"] = json!(down);
    }
    let status = if waiting.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(answer)).into_response()
}

/// `GET /metrics`: every series in the Prometheus text format.
async fn scrape(State(probes): State<Probes>) -> String {
    probes.scrape.render()
}

/// Serves `router` on `listener` until `shutdown`, then lets the calls in flight finish.
pub(crate) async fn serve_http(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), BoxError> {
    let mut limits = ServeConfig::default()
        .header_read_timeout(Duration::from_secs(10))
        .max_connections(1024);
    if let Some(tls) = tls {
        limits = limits.tls(tls);
    }
    tower_toolcall_axum::serve(listener, router, limits, shutdown).await?;
    Ok(())
}
