//! [`AdminRouter`]: the operator's API over a stack's breakers, loop sessions, dedupe
//! records and switches, behind a bearer token.

use std::collections::BTreeMap;
use std::fmt;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::auth::{require_token, BearerToken};
use crate::breaker::{BreakerAdmin, BreakerKey};
use crate::control::{ReliabilityControl, ShadowLayer};
use crate::envelope::ToolResult;
use crate::error::{ConfigError, ErrorCode, ToolError};
use crate::idempotency::{key_fingerprint, DedupeStore, StoreError};
use crate::loop_detect::LoopDetectHandle;
use crate::stack::ToolStack;
use crate::trace::{AuditLog, ExecutionEvent};

/// The shortest bearer token [`AdminRouter::new`] takes.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The admin API of a [`ToolStack`], JSON in and out, every route behind
/// `Authorization: Bearer <token>` (401 without it or with another token; the token is
/// compared in constant time). [`ToolRouter::admin`](super::ToolRouter::admin) nests it under
/// `/admin`; the paths below are relative to where it is mounted.
///
/// | route | what it does |
/// |---|---|
/// | `GET /breakers` | every breaker's [`BreakerStatus`](crate::breaker::BreakerStatus) |
/// | `GET /breakers/{key}` | one breaker; `key` is `tool:web::search`, `dependency:web` or `global` |
/// | `POST /breakers/{key}/force-open` | holds the breaker open until it is reset |
/// | `POST /breakers/{key}/reset` | closes the breaker, forgetting its counts |
/// | `GET /loops/{session}` | the loop detector's settings for the session |
/// | `POST /loops/{session}/reset` | forgets the session's recent calls |
/// | `GET /dedupe/records/{fingerprint}` | the dedupe record whose key has this fingerprint (as results and logs show it) |
/// | `GET /dedupe/records?key=…` | the dedupe record of a store key, with its fingerprint |
/// | `POST /dedupe/flush` | `{"prefix": "acme/"}`: deletes every record under the prefix |
/// | `GET /switches` | the kill switch, open mode, key derivation, shadow layers and the rollout percentage |
/// | `PUT /switches` | changes those given: `{"enabled": false, "shadow": {"breaker": true}, "rolloutPercent": 10}` |
///
/// Every change is logged at INFO (target `tower_toolcall::admin`) and, when the router has
/// an [`audit`](AdminRouter::audit) log, written to it as an `admin.change` event. A route
/// whose layer is switched off in the stack answers `NOT_FOUND` (404); errors are
/// [`ToolResult`] envelopes.
///
/// ```
/// use tower_toolcall::http::AdminRouter;
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::ToolStack;
///
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let admin: axum::Router = AdminRouter::new(&stack, "a long secret token")?.into_router();
/// assert!(AdminRouter::new(&stack, "short").is_err());
/// # let _ = admin;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[must_use]
pub struct AdminRouter<St> {
    state: AdminState<St>,
    token: BearerToken,
}

impl<St> fmt::Debug for AdminRouter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminRouter")
            .field("breakers", &self.state.breakers.is_some())
            .field("loop_sessions", &self.state.loops.is_some())
            .field("dedupe_store", &self.state.store.is_some())
            .field("audit", &self.state.audit.is_some())
            .finish_non_exhaustive()
    }
}

struct AdminState<St> {
    breakers: Option<BreakerAdmin>,
    loops: Option<LoopDetectHandle>,
    store: Option<St>,
    control: ReliabilityControl,
    audit: Option<AuditLog>,
    /// Sends the operator's actions to every replica, when set.
    fleet: Option<Fleet>,
}

#[cfg(feature = "redis")]
type Fleet = crate::fleet::FleetControl;
/// Without the `redis` feature there is no fleet.
#[cfg(not(feature = "redis"))]
type Fleet = std::convert::Infallible;

/// An operator action that a fleet shares.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
enum FleetAction<'a> {
    ForceOpen(&'a BreakerKey),
    ResetBreaker(&'a BreakerKey),
    ResetSession(&'a str),
    Enabled(bool),
    Shadow(ShadowLayer, bool),
}

impl FleetAction<'_> {
    /// Sends the action to every replica of `fleet`.
    #[cfg(feature = "redis")]
    async fn send(self, fleet: &Fleet) -> Result<(), Refused> {
        match self {
            FleetAction::ForceOpen(key) => fleet.force_open(key).await,
            FleetAction::ResetBreaker(key) => fleet.reset_breaker(key).await,
            FleetAction::ResetSession(session) => fleet.reset_session(session).await,
            FleetAction::Enabled(enabled) => fleet.set_enabled(enabled).await,
            FleetAction::Shadow(layer, shadow) => fleet.set_shadow(layer, shadow).await,
        }
        .map_err(error)
    }

    #[cfg(not(feature = "redis"))]
    async fn send(self, fleet: &Fleet) -> Result<(), Refused> {
        match *fleet {}
    }
}

impl<St: Clone> Clone for AdminState<St> {
    fn clone(&self) -> Self {
        AdminState {
            breakers: self.breakers.clone(),
            loops: self.loops.clone(),
            store: self.store.clone(),
            control: self.control.clone(),
            audit: self.audit.clone(),
            fleet: self.fleet.clone(),
        }
    }
}

impl<St: DedupeStore> AdminRouter<St> {
    /// The admin API of `stack`, admitting requests that carry `token`. The token must have
    /// at least [`MIN_TOKEN_BYTES`] bytes.
    pub fn new(stack: &ToolStack<St>, token: impl AsRef<str>) -> Result<Self, ConfigError> {
        let token = token.as_ref();
        if token.len() < MIN_TOKEN_BYTES {
            return Err(ConfigError::new(
                "admin.token",
                format!(
                    "must have at least {MIN_TOKEN_BYTES} bytes, got {}",
                    token.len()
                ),
            ));
        }
        Ok(AdminRouter {
            state: AdminState {
                breakers: stack.breakers(),
                loops: stack.loop_sessions(),
                store: stack.dedupe_store().cloned(),
                control: stack.control().clone(),
                audit: None,
                fleet: None,
            },
            token: BearerToken::new(token),
        })
    }

    /// Writes every change to `audit` as well as to the log.
    pub fn audit(mut self, audit: AuditLog) -> Self {
        self.state.audit = Some(audit);
        self
    }

    /// Sends force-opens, breaker resets, loop-session resets, the kill switch (`enabled`)
    /// and shadow changes to every replica of `fleet` (see [`fleet`](crate::fleet)), rather
    /// than to this replica only.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn fleet(mut self, fleet: crate::fleet::FleetControl) -> Self {
        self.state.fleet = Some(fleet);
        self
    }

    /// The axum router, every route behind the token.
    pub fn into_router(self) -> Router {
        Router::new()
            .route("/breakers", get(list_breakers::<St>))
            .route("/breakers/{key}", get(read_breaker::<St>))
            .route("/breakers/{key}/force-open", post(force_open::<St>))
            .route("/breakers/{key}/reset", post(reset_breaker::<St>))
            .route("/loops/{session}", get(read_loop_session::<St>))
            .route("/loops/{session}/reset", post(reset_loop_session::<St>))
            .route("/dedupe/records", get(read_dedupe_record::<St>))
            .route(
                "/dedupe/records/{fingerprint}",
                get(find_dedupe_record::<St>),
            )
            .route("/dedupe/flush", post(flush_dedupe::<St>))
            .route(
                "/switches",
                get(read_switches::<St>).put(change_switches::<St>),
            )
            .with_state(self.state)
            .layer(middleware::from_fn_with_state(self.token, require_token))
    }
}

impl<St> AdminState<St> {
    /// Logs a change at INFO and writes it to the audit log.
    fn changed(&self, target: &str, message: &str, details: Value) {
        tracing::info!(
            target: "tower_toolcall::admin",
            target_of_change = target,
            details = %details,
            "{message}"
        );
        if let Some(audit) = &self.audit {
            audit.record_event(ExecutionEvent::admin(target, message).payload(details));
        }
    }

    fn breakers(&self) -> Result<&BreakerAdmin, Refused> {
        self.breakers
            .as_ref()
            .ok_or_else(|| layer_off("the circuit breaker layer"))
    }

    fn loops(&self) -> Result<&LoopDetectHandle, Refused> {
        self.loops
            .as_ref()
            .ok_or_else(|| layer_off("loop detection"))
    }

    fn store(&self) -> Result<&St, Refused> {
        self.store
            .as_ref()
            .ok_or_else(|| layer_off("the idempotency layer"))
    }
}

/// A refused admin request, answered with its envelope.
struct Refused(ToolError);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        ToolResult::rejected(self.0).into_response()
    }
}

type Answer = Result<Response, Refused>;

fn error(error: ToolError) -> Refused {
    Refused(error)
}

fn layer_off(layer: &str) -> Refused {
    error(ToolError::rejected(
        ErrorCode::NotFound,
        format!("{layer} is switched off in this stack"),
    ))
}

fn parse_key(key: &str) -> Result<BreakerKey, Refused> {
    key.parse::<BreakerKey>().map_err(|e| {
        error(
            ToolError::rejected(ErrorCode::ValidationError, format!("`key` {}", e.problem()))
                .with_details(json!({"field": "key"})),
        )
    })
}

fn store_error(e: StoreError) -> Refused {
    error(ToolError::rejected(
        ErrorCode::StoreUnavailable,
        format!("the dedupe store failed: {e}"),
    ))
}

/// A JSON body, its errors answered with an envelope that names the field.
fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Refused> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        error(
            ToolError::rejected(
                ErrorCode::ValidationError,
                format!("invalid admin request: `{field}`: {}", e.inner()),
            )
            .with_details(json!({"field": field})),
        )
    })
}

async fn list_breakers<St>(State(state): State<AdminState<St>>) -> Answer {
    Ok(Json(state.breakers()?.snapshot()).into_response())
}

async fn read_breaker<St>(State(state): State<AdminState<St>>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    match state.breakers()?.status(&key) {
        Some(status) => Ok(Json(status).into_response()),
        None => Err(error(ToolError::rejected(
            ErrorCode::NotFound,
            format!("no breaker {key} yet: no call has needed it"),
        ))),
    }
}

async fn force_open<St>(State(state): State<AdminState<St>>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    let breakers = state.breakers()?;
    match &state.fleet {
        Some(fleet) => FleetAction::ForceOpen(&key).send(fleet).await?,
        None => breakers.force_open(&key),
    }
    state.changed(
        &key.short(),
        "breaker forced open",
        json!({"action": "force_open", "key": key}),
    );
    Ok(Json(breakers.status(&key)).into_response())
}

async fn reset_breaker<St>(State(state): State<AdminState<St>>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    let breakers = state.breakers()?;
    let existed = breakers.status(&key).is_some();
    match &state.fleet {
        Some(fleet) => FleetAction::ResetBreaker(&key).send(fleet).await?,
        None => {
            breakers.reset(&key);
        }
    }
    state.changed(
        &key.short(),
        "breaker reset",
        json!({"action": "reset", "key": key, "existed": existed}),
    );
    Ok(
        Json(json!({"key": key, "reset": existed, "status": breakers.status(&key)}))
            .into_response(),
    )
}

async fn read_loop_session<St>(
    State(state): State<AdminState<St>>,
    Path(session): Path<String>,
) -> Answer {
    let settings = state.loops()?.session_settings(&session);
    Ok(Json(json!({"session": session, "settings": settings})).into_response())
}

async fn reset_loop_session<St>(
    State(state): State<AdminState<St>>,
    Path(session): Path<String>,
) -> Answer {
    let loops = state.loops()?;
    match &state.fleet {
        Some(fleet) => FleetAction::ResetSession(&session).send(fleet).await?,
        None => loops.reset_session(&session).await.map_err(|problem| {
            error(ToolError::rejected(
                ErrorCode::StoreUnavailable,
                format!("the session's history could not be cleared ({problem}): retry later"),
            ))
        })?,
    }
    state.changed(
        &format!("session:{session}"),
        "loop session reset",
        json!({"action": "loop_reset", "session": session}),
    );
    Ok(Json(json!({"session": session, "reset": true})).into_response())
}

#[derive(Deserialize)]
struct RecordQuery {
    key: String,
}

async fn read_dedupe_record<St: DedupeStore>(
    State(state): State<AdminState<St>>,
    Query(query): Query<RecordQuery>,
) -> Answer {
    let record = state.store()?.get(&query.key).await.map_err(store_error)?;
    match record {
        Some(record) => Ok(Json(json!({
            "fingerprint": key_fingerprint(&query.key),
            "record": record,
        }))
        .into_response()),
        None => Err(error(ToolError::rejected(
            ErrorCode::NotFound,
            "the dedupe store has no live record under this key",
        ))),
    }
}

async fn find_dedupe_record<St: DedupeStore>(
    State(state): State<AdminState<St>>,
    Path(fingerprint): Path<String>,
) -> Answer {
    let record = state
        .store()?
        .find_by_fingerprint(&fingerprint)
        .await
        .map_err(store_error)?;
    match record {
        Some(record) => {
            Ok(Json(json!({"fingerprint": fingerprint, "record": record})).into_response())
        }
        None => Err(error(ToolError::rejected(
            ErrorCode::NotFound,
            "the dedupe store has no live record whose key has this fingerprint",
        ))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlushRequest {
    prefix: String,
}

async fn flush_dedupe<St: DedupeStore>(State(state): State<AdminState<St>>, body: Bytes) -> Answer {
    let request: FlushRequest = json_body(&body)?;
    let deleted = state
        .store()?
        .flush_prefix(&request.prefix)
        .await
        .map_err(store_error)?;
    state.changed(
        "dedupe",
        "dedupe records flushed",
        json!({"action": "flush_prefix", "prefix": request.prefix, "deleted": deleted}),
    );
    Ok(Json(json!({"prefix": request.prefix, "deleted": deleted})).into_response())
}

/// The switches as the API shows them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Switches {
    enabled: bool,
    open_mode: bool,
    derive_idempotency_keys: bool,
    shadow: BTreeMap<&'static str, bool>,
    rollout_percent: u8,
}

impl Switches {
    fn of(control: &ReliabilityControl) -> Self {
        Switches {
            enabled: control.is_enabled(),
            open_mode: control.is_breaker_enforced(),
            derive_idempotency_keys: control.derives_idempotency_keys(),
            shadow: ShadowLayer::ALL
                .into_iter()
                .map(|layer| (layer.as_str(), control.is_shadow(layer)))
                .collect(),
            rollout_percent: control.rollout_percent(),
        }
    }
}

/// A change of switches: the members given are changed, the others kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SwitchChange {
    enabled: Option<bool>,
    open_mode: Option<bool>,
    derive_idempotency_keys: Option<bool>,
    #[serde(default)]
    shadow: BTreeMap<String, bool>,
    rollout_percent: Option<u8>,
}

async fn read_switches<St>(State(state): State<AdminState<St>>) -> Answer {
    Ok(Json(Switches::of(&state.control)).into_response())
}

async fn change_switches<St>(State(state): State<AdminState<St>>, body: Bytes) -> Answer {
    let change: SwitchChange = json_body(&body)?;
    // Every layer name is checked before anything changes.
    let mut shadow = Vec::with_capacity(change.shadow.len());
    for (name, on) in &change.shadow {
        let layer = ShadowLayer::parse(name).ok_or_else(|| {
            error(
                ToolError::rejected(
                    ErrorCode::ValidationError,
                    format!(
                        "invalid admin request: `shadow.{name}` is not a layer with a shadow \
                         mode; use breaker, loop_detect, idempotency or rate_limit"
                    ),
                )
                .with_details(json!({"field": format!("shadow.{name}")})),
            )
        })?;
        shadow.push((layer, *on));
    }
    if let Some(percent @ 101..) = change.rollout_percent {
        return Err(error(
            ToolError::rejected(
                ErrorCode::ValidationError,
                format!(
                    "invalid admin request: `rolloutPercent` is {percent}; give a whole number \
                     from 0 to 100"
                ),
            )
            .with_details(json!({"field": "rolloutPercent"})),
        ));
    }
    let control = &state.control;
    let before = Switches::of(control);
    if let Some(fleet) = &state.fleet {
        // The switches the fleet shares go to every replica; the others stay this one's.
        if let Some(enabled) = change.enabled {
            FleetAction::Enabled(enabled).send(fleet).await?;
        }
        for (layer, on) in shadow.drain(..) {
            FleetAction::Shadow(layer, on).send(fleet).await?;
        }
    }
    if let Some(enabled) = change.enabled {
        control.set_enabled(enabled);
    }
    if let Some(open_mode) = change.open_mode {
        control.set_breaker_enforced(open_mode);
    }
    if let Some(derive) = change.derive_idempotency_keys {
        control.set_derive_idempotency_keys(derive);
    }
    for (layer, on) in shadow {
        control.set_shadow(layer, on);
    }
    if let Some(percent) = change.rollout_percent {
        control
            .set_rollout_percent(percent)
            .expect("the percentage was checked");
    }
    let after = Switches::of(control);
    state.changed(
        "switches",
        "switches changed",
        json!({"action": "switches", "before": before, "after": after}),
    );
    Ok(Json(after).into_response())
}
