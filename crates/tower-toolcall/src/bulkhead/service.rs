use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tower_service::Service;

use super::future::{ResponseFuture, Waiting};
use super::places::ToolPlaces;
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::{ShortCircuit, ToolOutput};
use crate::redact::identifier;
use crate::time::millis;
use crate::tool_table::{Acting, ToolTable};

/// Holds each tool's calls to its places; made by [`BulkheadLayer`](super::BulkheadLayer).
#[derive(Clone, Debug)]
pub struct Bulkhead<S> {
    inner: S,
    places: Arc<ToolTable<Option<Arc<ToolPlaces>>>>,
}

impl<S> Bulkhead<S> {
    pub(super) fn new(inner: S, places: Arc<ToolTable<Option<Arc<ToolPlaces>>>>) -> Self {
        Bulkhead { inner, places }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for Bulkhead<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Places are per tool: a full tool waits or refuses in `call`, so that it never holds
        // up the others.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        // The bulkhead has no shadow mode: it always holds calls to their places.
        let Some(Acting { tool: places, .. }) = self.places.gate(&call, None) else {
            return ResponseFuture::called(self.inner.call(call), None);
        };
        if let Some(permit) = places.try_enter() {
            return ResponseFuture::called(self.inner.call(call), Some(permit));
        }
        let Some(ticket) = places.join_queue() else {
            places.count_refusal();
            return ResponseFuture::rejected(full(&call, places));
        };
        // The queued time counts against the call's deadline and its retry budget's time.
        let now = Instant::now();
        let budget = call
            .transport()
            .retry_budget
            .map(|budget| now + Duration::from_millis(budget.max_elapsed_ms));
        let deadline = match (call.deadline_from(now), budget) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The ready service makes the call once it has a place.
        let clone = self.inner.clone();
        let service = mem::replace(&mut self.inner, clone);
        let acquire = places.wait(call.priority());
        let waiting = Waiting::new(service, call, ticket);
        ResponseFuture::queued(waiting, acquire, deadline)
    }
}

/// The error of a call that found every place of its tool taken and its queue full, logged.
fn full(call: &ToolCall, places: &ToolPlaces) -> ToolError {
    let wait_ms = millis(places.retry_after).max(1);
    tracing::debug!(
        event = "tool_call_blocked",
        requestId = &*identifier(call.request_id()),
        toolName = call.tool_name(),
        retry_after_ms = wait_ms,
        "bulkhead refused the call"
    );
    ToolError::rejected(
        ErrorCode::RateLimited,
        format!(
            "{} is running {} calls at once and {} more are waiting, as many as it allows: it \
             was not called; retry after {wait_ms} ms",
            call.tool_name(),
            places.max_concurrent,
            places.max_queued,
        ),
    )
    .with_retry_after(places.retry_after)
    .with_details(json!({
        "retryAfterMs": wait_ms,
        "maxConcurrent": places.max_concurrent,
        "maxQueued": places.max_queued,
    }))
    .short_circuited(ShortCircuit::BulkheadFull)
}

/// The error of a call whose deadline passed while it waited for a place.
pub(super) fn deadline_passed(call: &ToolCall, waited: Duration) -> ToolError {
    tracing::debug!(
        event = "tool_call_blocked",
        requestId = &*identifier(call.request_id()),
        toolName = call.tool_name(),
        waited_ms = millis(waited),
        "the call's deadline passed while it waited for a place in the bulkhead"
    );
    ToolError::rejected(
        ErrorCode::Timeout,
        format!(
            "the call's deadline passed after {} ms while it waited for a place among the \
             running calls of {}: it was not called; try again later or with a later deadline",
            millis(waited),
            call.tool_name(),
        ),
    )
    .with_details(json!({ "queuedMs": millis(waited) }))
    .short_circuited(ShortCircuit::BulkheadFull)
}
