//! The span and the log events of a call, and its audit lines.
//!
//! Events carry the field set of the tool reliability contract: `event`, `requestId`,
//! `toolName`, `sessionKey`, `correlationId`, `idempotencyKeyHash` (a fingerprint, never the
//! key), `state`, `attempt`, `elapsedMs`, `fromCache`, `errorCode`, `retriable` and
//! `breakerState`, and `path` — the [`ShortCircuit`] path — when a layer answered without
//! running the tool. Error messages are redacted, and so are the identifiers of the call
//! ([`Redactor::redact_identifier`]), as the audit log redacts them.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::json;
use tracing::field::Empty;
use tracing::Span;

use super::audit::{AuditLog, ExecutionEvent};
use super::event_kind::{EventKind, EventLevel};
use crate::canonical::key_fingerprint;
use crate::envelope::{ResultStatus, ToolCall, ToolResult};
use crate::error::ToolError;
use crate::outcome::{attempts_of, record_of, CallRecord, ShortCircuit, ToolOutput};
use crate::redact::Redactor;
use crate::time::millis;

/// The identifiers of a call, as log lines show them.
struct Ids<'a> {
    request_id: Cow<'a, str>,
    session_key: Cow<'a, str>,
    correlation_id: Option<Cow<'a, str>>,
    tool_call_id: Option<Cow<'a, str>>,
}

impl<'a> Ids<'a> {
    fn of(call: &'a ToolCall, redactor: &Redactor) -> Self {
        let envelope = call.envelope();
        let redact = |id: &'a str| redactor.redact_identifier(id);
        Ids {
            request_id: redact(call.request_id()),
            session_key: redact(call.session_key()),
            correlation_id: envelope.target.correlation_id.as_deref().map(redact),
            tool_call_id: envelope.tool_call_id.as_deref().map(redact),
        }
    }
}

/// The span of one call: `execute_tool {tool}` with the OpenTelemetry GenAI attributes, and,
/// with the feature `opentelemetry`, the caller's `traceparent` as its remote parent.
pub(super) fn call_span(call: &ToolCall, redactor: &Redactor) -> Span {
    // The identifiers are redacted only when the span is enabled.
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.tool_name(),
        gen_ai.tool.call.id = Empty,
        requestId = Empty,
        sessionKey = Empty,
        correlationId = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        let ids = Ids::of(call, redactor);
        span.record(
            "otel.name",
            format!("execute_tool {}", call.tool_name()).as_str(),
        );
        span.record("gen_ai.tool.call.id", ids.tool_call_id.as_deref());
        span.record("requestId", &*ids.request_id);
        span.record("sessionKey", &*ids.session_key);
        span.record("correlationId", ids.correlation_id.as_deref());
        #[cfg(feature = "opentelemetry")]
        super::traceparent::adopt_remote_parent(&span, call);
    }
    span
}

/// `tool_call_start`.
pub(super) fn started(call: &ToolCall, redactor: &Redactor) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let ids = Ids::of(call, redactor);
    tracing::debug!(
        event = "tool_call_start",
        requestId = &*ids.request_id,
        toolName = call.tool_name(),
        sessionKey = &*ids.session_key,
        correlationId = ids.correlation_id.as_deref(),
        idempotencyKeyHash = caller_key_hash(call).as_deref(),
        "tool call started"
    );
}

/// `tool_call_end`, or `tool_call_blocked` when a layer refused the call (see [`is_blocked`]);
/// then one `tool_call_shadow` per decision a layer in shadow mode did not enforce.
pub(super) fn finished(
    span: &Span,
    call: &ToolCall,
    outcome: &Result<ToolOutput, ToolError>,
    elapsed: Duration,
    redactor: &Redactor,
) {
    let elapsed_ms = millis(elapsed);
    let ids = Ids::of(call, redactor);
    match outcome {
        Ok(output) => {
            let record = output.record();
            tracing::info!(
                event = "tool_call_end",
                requestId = &*ids.request_id,
                toolName = call.tool_name(),
                sessionKey = &*ids.session_key,
                correlationId = ids.correlation_id.as_deref(),
                idempotencyKeyHash = key_hash(call, record).as_deref(),
                state = ResultStatus::Success.as_str(),
                attempt = record.attempts.unwrap_or(1),
                elapsedMs = elapsed_ms,
                fromCache = record.from_cache,
                breakerState = record.breaker_state.map(|s| s.as_str()),
                path = record.short_circuit.map(ShortCircuit::as_str),
                "tool call ended"
            );
        }
        Err(error) => {
            span.record("error.type", error.code().as_str());
            let record = error.record();
            let blocked = error.is_rejected();
            let message = redactor.redact_str(error.message());
            tracing::info!(
                event = if blocked {
                    "tool_call_blocked"
                } else {
                    "tool_call_end"
                },
                requestId = &*ids.request_id,
                toolName = call.tool_name(),
                sessionKey = &*ids.session_key,
                correlationId = ids.correlation_id.as_deref(),
                idempotencyKeyHash = key_hash(call, record).as_deref(),
                state = ResultStatus::of_error(error).as_str(),
                attempt = attempts_of(outcome),
                elapsedMs = elapsed_ms,
                fromCache = record.from_cache,
                errorCode = error.code().as_str(),
                retriable = error.is_retriable(),
                breakerState = record.breaker_state.map(|s| s.as_str()),
                path = record.short_circuit.map(ShortCircuit::as_str),
                error = &*message,
                "{}",
                if blocked {
                    "tool call blocked"
                } else {
                    "tool call failed"
                }
            );
        }
    }
    for decision in &record_of(outcome).shadow {
        tracing::info!(
            event = "tool_call_shadow",
            requestId = &*ids.request_id,
            toolName = call.tool_name(),
            sessionKey = &*ids.session_key,
            layer = decision.layer.as_str(),
            decision = decision.verdict.as_str(),
            "layer in shadow mode did not enforce its decision"
        );
    }
}

/// The result line and the run and step events of a finished call.
pub(super) fn audit_finished(
    audit: &AuditLog,
    call: &ToolCall,
    outcome: &Result<ToolOutput, ToolError>,
    elapsed: Duration,
) {
    let record = record_of(outcome);
    let attempts = attempts_of(outcome);
    let blocked = matches!(outcome, Err(error) if error.is_rejected());
    for decision in &record.shadow {
        let (layer, verdict) = (decision.layer.as_str(), decision.verdict.as_str());
        audit.record_event(
            ExecutionEvent::new(
                EventKind::StepShadow,
                call,
                format!("{layer} in shadow mode: {verdict}"),
            )
            .payload(json!({ "layer": layer, "decision": verdict })),
        );
    }
    // A call answered without running the tool on its last attempt: one event of its own,
    // never an attempt (the attempt hooks write those that reached the tool).
    let path = record.short_circuit.map(ShortCircuit::as_str);
    if record.from_cache {
        let age = record.cache.as_ref().map(|cache| cache.age_ms);
        audit.record_event(
            ExecutionEvent::new(
                EventKind::StepCached,
                call,
                "answered from an idempotency record",
            )
            .payload(json!({ "path": path, "ageMs": age })),
        );
    } else if blocked || path.is_some() {
        let code = outcome.as_ref().err().map(|error| error.code().as_str());
        audit.record_event(
            ExecutionEvent::new(EventKind::StepRefused, call, "refused before the tool ran")
                .level(EventLevel::Warn)
                .payload(json!({ "path": path, "errorCode": code })),
        );
    }
    let (kind, level, message) = match outcome {
        Ok(_) => (
            EventKind::RunFinished,
            EventLevel::Info,
            "call succeeded".to_owned(),
        ),
        Err(error) if blocked => (
            EventKind::RunBlocked,
            EventLevel::Warn,
            format!("call rejected: {}", error.code()),
        ),
        Err(error) => (
            EventKind::RunFailed,
            EventLevel::Error,
            format!("call failed: {}", error.code()),
        ),
    };
    audit.record_event(
        ExecutionEvent::new(kind, call, message)
            .level(level)
            .payload(json!({ "attempts": attempts, "fromCache": record.from_cache })),
    );
    let mut result = ToolResult::from_outcome(call, outcome.clone());
    result.duration_ms = millis(elapsed);
    audit.record_result(result);
}

/// The fingerprint of the key the idempotency layer matched, else of the caller's key.
fn key_hash(call: &ToolCall, record: &CallRecord) -> Option<String> {
    match &record.cache {
        Some(cache) => Some(cache.key_fingerprint.clone()),
        None => caller_key_hash(call),
    }
}

fn caller_key_hash(call: &ToolCall) -> Option<String> {
    call.idempotency_key().map(key_fingerprint)
}
