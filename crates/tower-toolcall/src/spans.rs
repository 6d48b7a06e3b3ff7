//! The child spans the layers open inside a call's span: one per attempt and one per backoff
//! sleep. Every layer makes them here, so that their names and fields stay the same wherever
//! they come from.

use std::time::Duration;

use tracing::Span;

use crate::envelope::ToolCall;
use crate::redact::identifier;
use crate::time::millis;

/// The span of the attempt `call` makes ([`ToolCall::attempt`]).
pub(crate) fn attempt(call: &ToolCall) -> Span {
    tracing::info_span!(
        "tool_attempt",
        gen_ai.tool.name = call.tool_name(),
        tool.namespace = call.tool_namespace(),
        request_id = &*identifier(call.request_id()),
        retry.attempt = call.attempt(),
    )
}

/// The span of the sleep after attempt `attempt` of `call` failed.
pub(crate) fn backoff(call: &ToolCall, attempt: u32, delay: Duration) -> Span {
    tracing::info_span!(
        "tool_backoff",
        gen_ai.tool.name = call.tool_name(),
        tool.namespace = call.tool_namespace(),
        request_id = &*identifier(call.request_id()),
        retry.attempt = attempt,
        retry.delay_ms = millis(delay),
    )
}
