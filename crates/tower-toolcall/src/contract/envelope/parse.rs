//! Turning malformed envelopes into `VALIDATION_ERROR`s that name the field.

use std::fmt;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::call::{
    CallEnvelope, CallRetryPolicy, ToolCall, CONTRACT_VERSION, MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_IDENTIFIER_BYTES, MAX_TRACEPARENT_BYTES, PAYLOAD_VERSION,
};
use super::ijson::{self, IJsonValue};
use super::params::{json_kind, Params};
use crate::contract::error::{ErrorCode, ToolError};
use crate::contract::serde_message::{missing_field, not_i_json, strip_position};

impl ToolCall {
    /// Parses and checks a JSON envelope.
    ///
    /// Malformed input becomes a `VALIDATION_ERROR` whose message names the field path (for
    /// example ``invalid tool call: `target.sessionKey` is required``) and whose details hold
    /// `{"field": path}`. Input that is not JSON at all gets a message that says so, with the
    /// line and column.
    ///
    /// The text must be I-JSON (RFC 7493), in the members that the crate ignores too: no
    /// member name twice in one object (``invalid tool call: `payload.params.path` must be
    /// unique…``), valid Unicode, numbers that a double can hold, and an object wherever the
    /// contract says object.
    pub fn from_json(bytes: &[u8]) -> Result<ToolCall, ToolError> {
        ToolCall::from_value(i_json(bytes)?)
    }

    /// Checks a JSON value as an envelope, like [`from_json`](ToolCall::from_json).
    pub fn from_value(value: Value) -> Result<ToolCall, ToolError> {
        ToolCall::from_envelope(envelope(value)?)
    }

    /// Checks an envelope and wraps it.
    pub fn from_envelope(envelope: CallEnvelope) -> Result<ToolCall, ToolError> {
        check_envelope(&envelope)?;
        Ok(ToolCall::from_checked(envelope))
    }

    /// Checks the envelope's invariants: at once when they were checked as the call was made
    /// and the envelope has not been changed since through
    /// [`envelope_mut`](ToolCall::envelope_mut); by reading it again otherwise.
    pub fn check(&self) -> Result<(), ToolError> {
        if self.is_checked() {
            return Ok(());
        }
        check_envelope(self.envelope())
    }
}

impl<'de> Deserialize<'de> for ToolCall {
    /// Reads the envelope as [`from_json`](ToolCall::from_json) does, and refuses what it
    /// refuses.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let IJsonValue(value) = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let problem = e.into_inner();
            if path == "." {
                de::Error::custom(format_args!("invalid tool call: {problem}"))
            } else {
                de::Error::custom(format_args!("invalid tool call: `{path}` {problem}"))
            }
        })?;
        ToolCall::from_value(value).map_err(|e| de::Error::custom(e.message()))
    }
}

impl TryFrom<CallEnvelope> for ToolCall {
    type Error = ToolError;

    fn try_from(envelope: CallEnvelope) -> Result<Self, ToolError> {
        ToolCall::from_envelope(envelope)
    }
}

/// Reads JSON text as I-JSON (RFC 7493) into a value: the first step of parsing an envelope.
pub(crate) fn i_json(bytes: &[u8]) -> Result<Value, ToolError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let IJsonValue(value) =
        IJsonValue::deserialize(&mut de).map_err(|error| i_json_error(bytes, &error))?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// Reads an envelope from a JSON value: the second step of parsing one.
pub(crate) fn envelope(mut value: Value) -> Result<CallEnvelope, ToolError> {
    let Value::Object(members) = &mut value else {
        return Err(
            ToolError::invalid_field("", "must be a JSON object").with_message(format!(
            "invalid tool call: the envelope must be a JSON object, got {}; send one JSON object",
            json_kind(&value)
        )),
        );
    };
    // The params move into the envelope as they are: deserializing them from the value would
    // build them a second time.
    let params = members
        .get_mut("payload")
        .and_then(Value::as_object_mut)
        .and_then(|payload| payload.get_mut("params"))
        .map(|params| std::mem::replace(params, Value::Object(Map::new())));
    let mut envelope =
        CallEnvelope::deserialize(&value).map_err(|error| envelope_error(&value, &error))?;
    if let Some(params) = params {
        envelope.payload.params = Params::from_value(params)?;
    }
    Ok(envelope)
}

// Valid input is the common case, so it is read without tracking the path of each member;
// a refusal reads the input again with the path tracked, to name the member in the error.

/// The error of reading `bytes` as I-JSON, which first gave `error`, naming the member.
fn i_json_error(bytes: &[u8], error: &serde_json::Error) -> ToolError {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, IJsonValue>(&mut de) {
        Err(tracked) => from_json_error(tracked),
        Ok(_) => not_json(error),
    }
}

/// The error of reading `value` as an envelope, which first gave `error`, naming the member.
fn envelope_error(value: &Value, error: &serde_json::Error) -> ToolError {
    match serde_path_to_error::deserialize::<_, CallEnvelope>(value) {
        Err(tracked) => from_value_error(tracked),
        Ok(_) => field_error(".", error),
    }
}

/// The invariants that types alone do not hold.
pub(crate) fn check_envelope(env: &CallEnvelope) -> Result<(), ToolError> {
    if env.contract_version != CONTRACT_VERSION {
        return Err(ToolError::invalid_field(
            "contractVersion",
            format_args!(
                "must be \"{CONTRACT_VERSION}\", got {:?}",
                env.contract_version
            ),
        ));
    }
    non_empty("requestId", &env.request_id)?;
    non_empty("toolName", &env.tool_name)?;
    non_empty("toolNamespace", &env.tool_namespace)?;
    non_empty("target.sessionKey", &env.target.session_key)?;
    non_empty("target.actorId", &env.target.actor_id)?;
    for (field, id) in identifiers(env) {
        if let Some(id) = id {
            identifier(field, id, MAX_IDENTIFIER_BYTES)?;
        }
    }
    if env.payload.version != PAYLOAD_VERSION {
        return Err(ToolError::invalid_field(
            "payload.version",
            format_args!(
                "must be \"{PAYLOAD_VERSION}\", got {:?}",
                env.payload.version
            ),
        ));
    }
    if let Some(key) = &env.payload.idempotency_key {
        non_empty("payload.idempotencyKey", key)?;
        identifier("payload.idempotencyKey", key, MAX_IDEMPOTENCY_KEY_BYTES)?;
    }
    if let Some(traceparent) = &env.trace.traceparent {
        if traceparent.len() > MAX_TRACEPARENT_BYTES {
            return Err(ToolError::invalid_field(
                "trace.traceparent",
                format_args!(
                    "must be at most {MAX_TRACEPARENT_BYTES} bytes, got {}; send a W3C \
                     traceparent (55 bytes)",
                    traceparent.len()
                ),
            ));
        }
    }
    if let Some(run) = &env.run {
        for (field, id) in [
            ("run.runId", &run.run_id),
            ("run.stepId", &run.step_id),
            ("run.callId", &run.call_id),
        ] {
            non_empty(field, id)?;
            identifier(field, id, MAX_IDENTIFIER_BYTES)?;
        }
        if run.attempt == 0 {
            return Err(ToolError::invalid_field(
                "run.attempt",
                "must be at least 1, got 0",
            ));
        }
    }
    if let Some(budget) = &env.transport.retry_budget {
        if budget.max_attempts == 0 {
            return Err(ToolError::invalid_field(
                "transport.retryBudget.maxAttempts",
                "must be at least 1, got 0",
            ));
        }
    }
    if let Some(policy) = &env.transport.retry_policy {
        check_retry_policy(policy)?;
    }
    Ok(())
}

/// The ranges of `transport.retryPolicy`; values in range but wider than the tool allows
/// are clamped by the retry layer, not refused here.
fn check_retry_policy(policy: &CallRetryPolicy) -> Result<(), ToolError> {
    const FIELD: &str = "transport.retryPolicy";
    if policy.max_attempts == Some(0) {
        return Err(ToolError::invalid_field(
            &format!("{FIELD}.maxAttempts"),
            "must be at least 1 (the first attempt), got 0",
        ));
    }
    if let Some(multiplier) = policy.backoff_multiplier {
        if !(1.0..=1000.0).contains(&multiplier) {
            return Err(ToolError::invalid_field(
                &format!("{FIELD}.backoffMultiplier"),
                format_args!("must be a number from 1 to 1000, got {multiplier}"),
            ));
        }
    }
    if let Some(percent) = policy.jitter_percent {
        if percent > 100 {
            return Err(ToolError::invalid_field(
                &format!("{FIELD}.jitterPercent"),
                format_args!("must be from 0 to 100, got {percent}"),
            ));
        }
    }
    if let (Some(initial), Some(max)) = (policy.initial_delay_ms, policy.max_delay_ms) {
        if max < initial {
            return Err(ToolError::invalid_field(
                &format!("{FIELD}.maxDelayMs"),
                format_args!("must not be below initialDelayMs ({initial}), got {max}"),
            ));
        }
    }
    for (i, code) in policy.retryable_errors.iter().flatten().enumerate() {
        if ErrorCode::parse(code).is_none() {
            return Err(ToolError::invalid_field(
                &format!("{FIELD}.retryableErrors[{i}]"),
                format_args!(
                    "is not a known error code: {code:?}; send codes such as \"TIMEOUT\" or \
                     \"UPSTREAM_UNAVAILABLE\""
                ),
            ));
        }
    }
    Ok(())
}

/// The envelope's identifiers, each with its field path.
fn identifiers(env: &CallEnvelope) -> [(&'static str, Option<&str>); 11] {
    let target = &env.target;
    [
        ("requestId", Some(&env.request_id)),
        ("toolCallId", env.tool_call_id.as_deref()),
        ("toolName", Some(&env.tool_name)),
        ("toolNamespace", Some(&env.tool_namespace)),
        ("target.agentId", target.agent_id.as_deref()),
        ("target.sessionKey", Some(&target.session_key)),
        ("target.actorId", Some(&target.actor_id)),
        ("target.workspaceId", target.workspace_id.as_deref()),
        ("target.correlationId", target.correlation_id.as_deref()),
        ("target.tenantId", target.tenant_id.as_deref()),
        (
            "control.confirmationId",
            env.control.confirmation_id.as_deref(),
        ),
    ]
}

/// An identifier: at most `limit` bytes, and no control characters (CR, LF, NUL, …), which
/// would split or forge the log lines, headers and store keys it ends up in.
fn identifier(field: &str, id: &str, limit: usize) -> Result<(), ToolError> {
    at_most(field, id, limit)?;
    match id.chars().find(|c| c.is_control()) {
        Some(c) => Err(ToolError::invalid_field(
            field,
            format_args!(
                "must not contain control characters, got U+{:04X}; remove it",
                u32::from(c)
            ),
        )),
        None => Ok(()),
    }
}

fn at_most(field: &str, value: &str, limit: usize) -> Result<(), ToolError> {
    if value.len() > limit {
        Err(ToolError::invalid_field(
            field,
            format_args!(
                "must be at most {limit} bytes, got {}; send a shorter identifier, or a \
                 digest of a longer one",
                value.len()
            ),
        ))
    } else {
        Ok(())
    }
}

fn non_empty(field: &str, value: &str) -> Result<(), ToolError> {
    if value.chars().all(char::is_whitespace) {
        Err(ToolError::invalid_field(field, "must not be empty"))
    } else {
        Ok(())
    }
}

fn from_json_error(err: serde_path_to_error::Error<serde_json::Error>) -> ToolError {
    let path = member_path(err.path());
    if matches!(
        err.inner().classify(),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof
    ) {
        let message = err.inner().to_string();
        if strip_position(&message) == "recursion limit exceeded" {
            return nested_too_deep(&path);
        }
        return match not_i_json(strip_position(&message)) {
            Some(problem) if path != "." => {
                ToolError::invalid_field(&path, Problem(ijson::problem(problem)))
            }
            _ => not_json(err.inner()),
        };
    }
    field_error(&path, err.inner())
}

/// The path of the member an error is in; an error in a member's name is in the object
/// that holds it.
fn member_path(path: &serde_path_to_error::Path) -> String {
    let path = path.to_string();
    match path.strip_suffix("?") {
        Some("") => ".".to_owned(),
        Some(object) => object.trim_end_matches('.').to_owned(),
        None => path,
    }
}

fn from_value_error(err: serde_path_to_error::Error<serde_json::Error>) -> ToolError {
    let path = err.path().to_string();
    field_error(&path, err.inner())
}

/// JSON nested deeper than the parser follows (128 levels), under the member at `path`:
/// refused naming the member that holds it, as the depth limit of the params does.
fn nested_too_deep(path: &str) -> ToolError {
    let field = if path.starts_with("payload.params") {
        "payload.params"
    } else {
        path.split(['.', '[']).next().unwrap_or_default()
    };
    let shown = if field.is_empty() || field == "?" {
        "the envelope"
    } else {
        field
    };
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!(
            "invalid tool call: `{shown}` nests deeper than {JSON_NESTING_LIMIT} levels of \
             JSON; flatten it"
        ),
    )
    .with_details(serde_json::json!({"field": field, "maxDepth": JSON_NESTING_LIMIT}))
}

/// How deep the JSON parser follows arrays and objects.
const JSON_NESTING_LIMIT: usize = 128;

pub(crate) fn not_json(err: &serde_json::Error) -> ToolError {
    let problem = strip_position(&err.to_string()).to_owned();
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!(
            "invalid tool call: the body is not valid JSON ({problem} at line {}, column {}); \
             send one JSON object",
            err.line(),
            err.column()
        ),
    )
}

/// Maps a serde error at `path` to a message that names the field.
fn field_error(path: &str, err: &serde_json::Error) -> ToolError {
    let message = err.to_string();
    let problem = strip_position(&message);
    if let Some(missing) = missing_field(problem) {
        let field = join(path, missing);
        return ToolError::invalid_field(&field, "is required");
    }
    if path == "." {
        return ToolError::invalid_field("", Problem(problem))
            .with_message(format!("invalid tool call: {problem}"));
    }
    ToolError::invalid_field(path, Problem(problem))
}

struct Problem<'a>(&'a str);

impl fmt::Display for Problem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        if p.starts_with("must ") || p.starts_with("is ") {
            f.write_str(p)
        } else {
            write!(f, "is invalid: {p}")
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path == "." || path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}
