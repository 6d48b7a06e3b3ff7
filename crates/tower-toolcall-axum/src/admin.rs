//! [`AdminRouter`]: the operator's API over a stack's breakers, loop sessions, dedupe
//! records and switches, behind a bearer token.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::auth::{require_token, BearerToken};
use tower_toolcall::breaker::{BreakerAdmin, BreakerKey};
use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
use tower_toolcall::envelope::{ToolResult, MAX_IDENTIFIER_BYTES};
use tower_toolcall::idempotency::{key_fingerprint, DedupeStore, StoreError};
use tower_toolcall::loop_detect::LoopDetectHandle;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::stack::{FleetActions, OperatorAction, ToolStack};
use tower_toolcall::trace::{AuditLog, ExecutionEvent};
use tower_toolcall::{ConfigError, ErrorCode, ToolError};

/// The shortest bearer token [`AdminRouter::new`] takes.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The admin API of a [`ToolStack`], JSON in and out, every route behind
/// `Authorization: Bearer <token>` (401 without it or with another token; the token is
/// compared in constant time). [`ToolRouter::admin`](super::ToolRouter::admin) nests it under
/// `/admin`; the paths below are relative to where it is mounted.
///
/// | route | what it does |
/// |---|---|
/// | `GET /breakers` | every breaker's [`BreakerStatus`](tower_toolcall::breaker::BreakerStatus) |
/// | `GET /breakers/{key}` | one breaker; `key` is `tool:web::search`, `dependency:web` or `global` |
/// | `POST /breakers/{key}/force-open` | holds the breaker open until it is reset; `key` must name a registered tool or namespace (any well-formed name when the registry is open) |
/// | `POST /breakers/{key}/reset` | closes the breaker, forgetting its counts |
/// | `GET /loops/{session}` | the loop detector's settings for the session |
/// | `POST /loops/{session}/reset` | forgets the session's recent calls |
/// | `GET /dedupe/records/{fingerprint}` | the dedupe record whose key has this fingerprint (as results and logs show it) |
/// | `GET /dedupe/records?key=…` | the dedupe record of a store key, with its fingerprint |
/// | `POST /dedupe/flush` | `{"prefix": "acme/"}`: deletes every record under the prefix; an empty prefix (every tenant's records) only with `"all": true` |
/// | `GET /switches` | the kill switch, open mode, key derivation, shadow layers and the rollout percentage |
/// | `PUT /switches` | changes those given: `{"enabled": false, "shadow": {"breaker": true}, "rolloutPercent": 10}` |
///
/// Every change is logged at INFO (target `tower_toolcall::admin`) and, when the router has
/// an [`audit`](AdminRouter::audit) log, written to it as an `admin.change` event. A change
/// of switches sent to a [fleet](AdminRouter::fleet) that fails part-way is answered
/// `STORE_UNAVAILABLE` (503) naming the parts applied, the part that failed and the parts
/// not tried, and is logged at WARN and audited as such. A route whose layer is switched off
/// in the stack answers `NOT_FOUND` (404); errors are [`ToolResult`] envelopes. Requests
/// without the token get the same 401 whatever the path, one that exists or not; refusals
/// are logged at INFO at most once a second, with the count of those not logged.
///
/// ```
/// use tower_toolcall_axum::AdminRouter;
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
pub struct AdminRouter {
    state: AdminState,
    token: BearerToken,
    /// Routes of the application's own, behind the same token.
    extra: Router,
}

impl fmt::Debug for AdminRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminRouter")
            .field("breakers", &self.state.breakers.is_some())
            .field("loop_sessions", &self.state.loops.is_some())
            .field("dedupe_store", &self.state.store.is_some())
            .field("audit", &self.state.audit.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct AdminState {
    /// What force-opens are checked against.
    registry: ToolRegistry,
    breakers: Option<BreakerAdmin>,
    loops: Option<LoopDetectHandle>,
    store: Option<Arc<dyn DedupeStore>>,
    control: ReliabilityControl,
    audit: Option<AuditLog>,
    /// Sends the operator's actions to every replica, when set.
    fleet: Option<Fleet>,
}

type Fleet = Arc<dyn FleetActions>;

/// Sends `action` to every replica of `fleet`.
async fn send(fleet: &Fleet, action: OperatorAction) -> Result<(), Refused> {
    fleet.act(action).await.map_err(error)
}

impl AdminRouter {
    /// The admin API of `stack`, admitting requests that carry `token`. The token must have
    /// at least [`MIN_TOKEN_BYTES`] bytes.
    pub fn new(stack: &ToolStack, token: impl AsRef<str>) -> Result<Self, ConfigError> {
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
                registry: stack.registry().clone(),
                breakers: stack.breakers(),
                loops: stack.loop_sessions(),
                store: stack.dedupe_store().cloned(),
                control: stack.control().clone(),
                audit: None,
                fleet: None,
            },
            token: BearerToken::new(token),
            extra: Router::new(),
        })
    }

    /// Writes every change to `audit` as well as to the log.
    pub fn audit(mut self, audit: AuditLog) -> Self {
        self.state.audit = Some(audit);
        self
    }

    /// Sends force-opens, breaker resets, loop-session resets, the kill switch (`enabled`)
    /// and shadow changes to every replica of `fleet` (see [`FleetActions`]; `FleetControl`
    /// of the crate `tower-toolcall-redis` is one), rather than to this replica only.
    pub fn fleet(mut self, fleet: impl FleetActions) -> Self {
        self.state.fleet = Some(Arc::new(fleet));
        self
    }

    /// Adds `routes` of the application's own (what only it knows: its upstreams' states,
    /// say), behind the same token as the others. Their paths must not be the router's.
    ///
    /// ```
    /// use axum::routing::get;
    /// use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::ToolStack;
    /// use tower_toolcall_axum::AdminRouter;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// let admin = AdminRouter::new(&stack, "a-token-of-at-least-32-bytes-0123456789")?
    ///     .routes(axum::Router::new().route("/upstreams", get(|| async { "[]" })));
    /// # let _ = admin.into_router();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn routes(mut self, routes: Router) -> Self {
        self.extra = self.extra.merge(routes);
        self
    }

    /// The axum router, every route behind the token.
    pub fn into_router(self) -> Router {
        let extra = self.extra;
        Router::new()
            .route("/breakers", get(list_breakers))
            .route("/breakers/{key}", get(read_breaker))
            .route("/breakers/{key}/force-open", post(force_open))
            .route("/breakers/{key}/reset", post(reset_breaker))
            .route("/loops/{session}", get(read_loop_session))
            .route("/loops/{session}/reset", post(reset_loop_session))
            .route("/dedupe/records", get(read_dedupe_record))
            .route("/dedupe/records/{fingerprint}", get(find_dedupe_record))
            .route("/dedupe/flush", post(flush_dedupe))
            .route("/switches", get(read_switches).put(change_switches))
            .fallback(no_route)
            .with_state(self.state)
            .merge(extra)
            // After the fallback, so that a path that does not exist is refused like one
            // that does: the routes cannot be listed without the token.
            .layer(middleware::from_fn_with_state(self.token, require_token))
    }
}

impl AdminState {
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

    fn store(&self) -> Result<&dyn DedupeStore, Refused> {
        self.store
            .as_deref()
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

async fn list_breakers(State(state): State<AdminState>) -> Answer {
    Ok(Json(state.breakers()?.snapshot()).into_response())
}

async fn read_breaker(State(state): State<AdminState>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    match state.breakers()?.status(&key) {
        Some(status) => Ok(Json(status).into_response()),
        None => Err(error(ToolError::rejected(
            ErrorCode::NotFound,
            format!("no breaker {key} yet: no call has needed it"),
        ))),
    }
}

async fn force_open(State(state): State<AdminState>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    let breakers = state.breakers()?;
    check_breaker_key(&state.registry, &key)?;
    match &state.fleet {
        Some(fleet) => send(fleet, OperatorAction::ForceOpen(key.clone())).await?,
        None => {
            if !breakers.force_open(&key) {
                return Err(error(ToolError::rejected(
                    ErrorCode::Conflict,
                    format!(
                        "{key} could not be held open: every breaker made on demand is forced \
                         open or in use; reset some first"
                    ),
                )));
            }
        }
    }
    state.changed(
        &key.short(),
        "breaker forced open",
        json!({"action": "force_open", "key": key}),
    );
    Ok(Json(breakers.status(&key)).into_response())
}

/// Refuses a breaker key that no call can have: a tool or namespace the registry does not
/// know (when it is closed), or a name no call could carry.
fn check_breaker_key(registry: &ToolRegistry, key: &BreakerKey) -> Result<(), Refused> {
    let names: &[&str] = match key {
        BreakerKey::Tool { namespace, name } => &[namespace.as_str(), name.as_str()],
        BreakerKey::Dependency { namespace } => &[namespace.as_str()],
        _ => &[],
    };
    let malformed = names.iter().any(|name| {
        name.len() > MAX_IDENTIFIER_BYTES
            || name.trim().is_empty()
            || name.chars().any(char::is_control)
    });
    let known = match key {
        BreakerKey::Tool { namespace, name } => registry.get(namespace, name).is_some(),
        BreakerKey::Dependency { namespace } => registry
            .tools()
            .any(|tool| tool.descriptor().namespace == *namespace),
        _ => true,
    };
    let problem = if malformed {
        format!(
            "is not a name a tool can have: names are 1 to {MAX_IDENTIFIER_BYTES} bytes without \
             control characters"
        )
    } else if !known && !registry.is_open() {
        format!("names {key}, which the registry does not have; check the spelling")
    } else {
        return Ok(());
    };
    Err(error(
        ToolError::rejected(
            ErrorCode::ValidationError,
            format!("invalid admin request: `key` {problem}"),
        )
        .with_details(json!({"field": "key"})),
    ))
}

/// The answer to a path with no route (behind the token, like every other).
async fn no_route() -> Refused {
    error(ToolError::rejected(
        ErrorCode::NotFound,
        "the admin API has no such route",
    ))
}

async fn reset_breaker(State(state): State<AdminState>, Path(key): Path<String>) -> Answer {
    let key = parse_key(&key)?;
    let breakers = state.breakers()?;
    let existed = breakers.status(&key).is_some();
    match &state.fleet {
        Some(fleet) => send(fleet, OperatorAction::ResetBreaker(key.clone())).await?,
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

async fn read_loop_session(State(state): State<AdminState>, Path(session): Path<String>) -> Answer {
    let settings = state.loops()?.session_settings(&session);
    Ok(Json(json!({"session": session, "settings": settings})).into_response())
}

async fn reset_loop_session(
    State(state): State<AdminState>,
    Path(session): Path<String>,
) -> Answer {
    let loops = state.loops()?;
    match &state.fleet {
        Some(fleet) => send(fleet, OperatorAction::ResetSession(session.clone())).await?,
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

async fn read_dedupe_record(
    State(state): State<AdminState>,
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

async fn find_dedupe_record(
    State(state): State<AdminState>,
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
    /// Says that an empty prefix, every tenant's records, is meant.
    #[serde(default)]
    all: bool,
}

async fn flush_dedupe(State(state): State<AdminState>, body: Bytes) -> Answer {
    let request: FlushRequest = json_body(&body)?;
    let refused = |field: &str, problem: &str| {
        error(
            ToolError::rejected(
                ErrorCode::ValidationError,
                format!("invalid admin request: `{field}` {problem}"),
            )
            .with_details(json!({"field": field})),
        )
    };
    match (request.prefix.is_empty(), request.all) {
        (true, false) => {
            return Err(refused(
                "prefix",
                "is empty, which would delete every tenant's records; give a prefix, or send \
                 `\"all\": true` with it to mean every record",
            ))
        }
        (false, true) => {
            return Err(refused(
                "all",
                "is true with a prefix; send an empty prefix with it, or leave it out",
            ))
        }
        _ => {}
    }
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

async fn read_switches(State(state): State<AdminState>) -> Answer {
    Ok(Json(Switches::of(&state.control)).into_response())
}

async fn change_switches(State(state): State<AdminState>, body: Bytes) -> Answer {
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
        let mut steps: Vec<SwitchStep> = change
            .enabled
            .map(SwitchStep::Enabled)
            .into_iter()
            .collect();
        steps.extend(
            shadow
                .drain(..)
                .map(|(layer, on)| SwitchStep::Shadow(layer, on)),
        );
        let local = local_parts(&change);
        state
            .send_switch_steps(&steps, &local, |step| send(fleet, step.action()))
            .await?;
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

/// One switch a fleet shares, sent to every replica on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SwitchStep {
    Enabled(bool),
    Shadow(ShadowLayer, bool),
}

impl SwitchStep {
    fn action(self) -> OperatorAction {
        match self {
            SwitchStep::Enabled(enabled) => OperatorAction::SetEnabled(enabled),
            SwitchStep::Shadow(layer, on) => OperatorAction::SetShadow(layer, on),
        }
    }

    /// The step as the log, the audit event and the answer show it: `{"enabled": false}`.
    fn describe(self) -> Value {
        match self {
            SwitchStep::Enabled(enabled) => json!({"enabled": enabled}),
            SwitchStep::Shadow(layer, on) => json!({ format!("shadow.{}", layer.as_str()): on }),
        }
    }
}

/// The parts of a change that only this replica applies, after the fleet's, as the answer
/// names them.
fn local_parts(change: &SwitchChange) -> Vec<Value> {
    let mut parts = Vec::new();
    if let Some(open_mode) = change.open_mode {
        parts.push(json!({"openMode": open_mode}));
    }
    if let Some(derive) = change.derive_idempotency_keys {
        parts.push(json!({"deriveIdempotencyKeys": derive}));
    }
    if let Some(percent) = change.rollout_percent {
        parts.push(json!({"rolloutPercent": percent}));
    }
    parts
}

impl AdminState {
    /// Sends `steps` in order through `send`. When one fails, the steps sent before it stay
    /// applied on every replica: the change is logged at WARN and audited as partly applied
    /// (the steps applied, the one that failed, the steps and `local` parts not tried), and
    /// the answer says the same.
    async fn send_switch_steps<F, Fut>(
        &self,
        steps: &[SwitchStep],
        local: &[Value],
        mut send: F,
    ) -> Result<(), Refused>
    where
        F: FnMut(SwitchStep) -> Fut,
        Fut: std::future::Future<Output = Result<(), Refused>>,
    {
        for (sent, step) in steps.iter().enumerate() {
            let Err(Refused(failure)) = send(*step).await else {
                continue;
            };
            let describe = |steps: &[SwitchStep]| -> Vec<Value> {
                steps.iter().map(|step| step.describe()).collect()
            };
            let mut not_tried = describe(&steps[sent + 1..]);
            not_tried.extend(local.iter().cloned());
            let details = json!({
                "action": "switches",
                "applied": describe(&steps[..sent]),
                "failed": step.describe(),
                "notApplied": not_tried,
                "error": failure.message(),
            });
            tracing::warn!(
                target: "tower_toolcall::admin",
                target_of_change = "switches",
                details = %details,
                "switches partly changed: the fleet refused one of them"
            );
            if let Some(audit) = &self.audit {
                audit.record_event(
                    ExecutionEvent::admin("switches", "switches partly changed")
                        .payload(details.clone()),
                );
            }
            let listed = |parts: &Value| -> String {
                match parts.as_array().map(Vec::as_slice) {
                    None | Some([]) => "nothing".to_owned(),
                    Some(parts) => parts
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                }
            };
            return Err(error(
                ToolError::rejected(
                    ErrorCode::StoreUnavailable,
                    format!(
                        "the fleet refused {} ({}); applied on every replica, and kept: {}; \
                         not applied: {}; send the change again when the fleet is back",
                        details["failed"],
                        failure.message(),
                        listed(&details["applied"]),
                        listed(&details["notApplied"]),
                    ),
                )
                .with_details(details),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use tower_toolcall::trace::{AuditSink, AuditStream, Redactor};

    #[derive(Clone, Default)]
    struct Events(Arc<Mutex<Vec<Value>>>);

    impl AuditSink for Events {
        fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> std::io::Result<()> {
            if stream == AuditStream::Events {
                self.0
                    .lock()
                    .unwrap()
                    .push(serde_json::from_slice(line).unwrap());
            }
            Ok(())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_change_the_fleet_refuses_part_way_is_logged_audited_and_answered() {
        let events = Events::default();
        let audit = AuditLog::with_sink(events.clone(), 16, Redactor::default());
        let state: AdminState = AdminState {
            registry: ToolRegistry::open(),
            breakers: None,
            loops: None,
            store: None,
            control: ReliabilityControl::default(),
            audit: Some(audit.clone()),
            fleet: None,
        };
        let steps = [
            SwitchStep::Enabled(false),
            SwitchStep::Shadow(ShadowLayer::Breaker, true),
            SwitchStep::Shadow(ShadowLayer::RateLimit, true),
        ];
        let local = [json!({"openMode": false})];
        let mut sent = Vec::new();
        let refused = state
            .send_switch_steps(&steps, &local, |step| {
                sent.push(step);
                let answer = match step {
                    SwitchStep::Shadow(ShadowLayer::Breaker, _) => Err(error(ToolError::rejected(
                        ErrorCode::StoreUnavailable,
                        "redis is down",
                    ))),
                    _ => Ok(()),
                };
                std::future::ready(answer)
            })
            .await
            .expect_err("the second step failed");
        assert_eq!(sent, steps[..2], "nothing is sent after the failure");

        let expected = json!({
            "action": "switches",
            "applied": [{"enabled": false}],
            "failed": {"shadow.breaker": true},
            "notApplied": [{"shadow.rate_limit": true}, {"openMode": false}],
            "error": "redis is down",
        });
        assert_eq!(refused.0.code(), ErrorCode::StoreUnavailable);
        assert_eq!(refused.0.details(), Some(&expected));
        assert!(
            refused.0.message().contains(
                "applied on every replica, and kept: {\"enabled\":false}; not applied: \
                 {\"shadow.rate_limit\":true}, {\"openMode\":false};"
            ),
            "{}",
            refused.0.message()
        );
        audit.shutdown();
        {
            let events = events.0.lock().unwrap();
            assert_eq!(events.len(), 1, "{events:?}");
            assert_eq!(events[0]["type"], "admin.change");
            assert_eq!(events[0]["payload"], expected);
        }

        // Every step sent: nothing recorded here, the caller records the whole change.
        let all = state
            .send_switch_steps(&steps, &local, |_| std::future::ready(Ok(())))
            .await;
        assert!(all.is_ok());
    }
}
