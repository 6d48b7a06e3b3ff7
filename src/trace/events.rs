//! The span and the log events of a call, and its audit lines.
//!
//! Events carry the field set of the tool reliability contract: `event`, `requestId`,
//! `toolName`, `sessionKey`, `correlationId`, `idempotencyKeyHash` (a fingerprint, never the
//! key), `state`, `attempt`, `elapsedMs`, `fromCache`, `errorCode`, `retriable` and
//! `breakerState`, and `path` — the [`ShortCircuit`] path — when a layer answered without
//! running the tool. Error messages are redacted.

use std::time::Duration;

use serde_json::json;
use tracing::field::Empty;
use tracing::Span;

use super::audit::{AuditLog, ExecutionEvent};
use super::redact::Redactor;
use crate::envelope::{ResultStatus, ToolCall, ToolResult};
use crate::error::ToolError;
use crate::idempotency::key_fingerprint;
use crate::outcome::{record_of, CallRecord, ShortCircuit, ToolOutput};
use crate::time::millis;

/// The span of one call: `execute_tool {tool}` with the OpenTelemetry GenAI attributes, and,
/// with the feature `opentelemetry`, the caller's `traceparent` as its remote parent.
pub(super) fn call_span(call: &ToolCall) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.tool_name(),
        gen_ai.tool.call.id = call.envelope().tool_call_id.as_deref(),
        requestId = call.request_id(),
        sessionKey = call.session_key(),
        correlationId = call.envelope().target.correlation_id.as_deref(),
        error.type = Empty,
    );
    if !span.is_disabled() {
        span.record(
            "otel.name",
            format!("execute_tool {}", call.tool_name()).as_str(),
        );
        #[cfg(feature = "opentelemetry")]
        super::traceparent::adopt_remote_parent(&span, call);
    }
    span
}

/// `tool_call_start`.
pub(super) fn started(call: &ToolCall) {
    tracing::debug!(
        event = "tool_call_start",
        requestId = call.request_id(),
        toolName = call.tool_name(),
        sessionKey = call.session_key(),
        correlationId = call.envelope().target.correlation_id.as_deref(),
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
    match outcome {
        Ok(output) => {
            let record = output.record();
            tracing::info!(
                event = "tool_call_end",
                requestId = call.request_id(),
                toolName = call.tool_name(),
                sessionKey = call.session_key(),
                correlationId = call.envelope().target.correlation_id.as_deref(),
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
            let blocked = is_blocked(record);
            let message = redactor.redact_str(error.message());
            tracing::info!(
                event = if blocked {
                    "tool_call_blocked"
                } else {
                    "tool_call_end"
                },
                requestId = call.request_id(),
                toolName = call.tool_name(),
                sessionKey = call.session_key(),
                correlationId = call.envelope().target.correlation_id.as_deref(),
                idempotencyKeyHash = key_hash(call, record).as_deref(),
                state = ResultStatus::of_error(error).as_str(),
                attempt = record.attempts.unwrap_or(1),
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
            requestId = call.request_id(),
            toolName = call.tool_name(),
            sessionKey = call.session_key(),
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
    let attempts = record.attempts.unwrap_or(1);
    for retried in &record.retried_by {
        audit.record_event(
            ExecutionEvent::new("step.failed", call, "attempt failed; retrying")
                .step(retried.attempt)
                .level("warn")
                .payload(json!({
                    "errorCode": retried.reason_code,
                    "latencyMs": retried.latency_ms,
                    "delayMs": retried.delay_ms,
                })),
        );
    }
    for decision in &record.shadow {
        let (layer, verdict) = (decision.layer.as_str(), decision.verdict.as_str());
        audit.record_event(
            ExecutionEvent::new(
                "step.shadow",
                call,
                format!("{layer} in shadow mode: {verdict}"),
            )
            .payload(json!({ "layer": layer, "decision": verdict })),
        );
    }
    let (kind, level, message) = match outcome {
        Ok(_) => ("run.finished", "info", "call succeeded".to_owned()),
        Err(error) if is_blocked(record) => (
            "run.blocked",
            "warn",
            format!("call refused: {}", error.code()),
        ),
        Err(error) => (
            "run.failed",
            "error",
            format!("call failed: {}", error.code()),
        ),
    };
    // The attempt that ran last, unless a layer refused the last one.
    if attempts > 0 && !record.from_cache && !is_blocked(record) {
        let step = if outcome.is_ok() {
            ExecutionEvent::new("step.finished", call, "attempt succeeded")
        } else {
            ExecutionEvent::new("step.failed", call, "attempt failed").level("warn")
        };
        audit.record_event(step.step(attempts));
    }
    audit.record_event(
        ExecutionEvent::new(kind, call, message)
            .level(level)
            .payload(json!({ "attempts": attempts, "fromCache": record.from_cache })),
    );
    let mut result = ToolResult::from_outcome(call, outcome.clone());
    result.duration_ms = millis(elapsed);
    audit.record_result(result);
}

/// `true` when a layer refused the call: it short-circuited the last attempt with an answer
/// of its own (not a replay of another call's result), or no attempt ran the tool.
fn is_blocked(record: &CallRecord) -> bool {
    match record.short_circuit {
        Some(_) => !record.from_cache,
        None => record.attempts == Some(0),
    }
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
