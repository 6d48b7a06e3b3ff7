use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tower_service::Service;

use super::future::{ResponseFuture, Waiting};
use super::places::{Entry, Held, Limits, Places, Scope};
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
    limits: Arc<ToolTable<Option<Limits>>>,
}

impl<S> Bulkhead<S> {
    pub(super) fn new(inner: S, limits: Arc<ToolTable<Option<Limits>>>) -> Self {
        Bulkhead { inner, limits }
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
        let Some(Acting { tool: limits, .. }) = self.limits.gate(&call, None) else {
            return ResponseFuture::called(self.inner.call(call), Held::default());
        };
        // The tool's place first, then the namespace's: a call waiting for its tool holds
        // no place its namespace's other tools could use.
        let mut held = Held::default();
        let stages = [&limits.tool, &limits.namespace];
        for (stage, places) in stages.into_iter().enumerate() {
            let Some(places) = places else { continue };
            let ticket = match places.enter() {
                Entry::Place(permit) => {
                    held.hold(places.scope, permit);
                    continue;
                }
                Entry::Full => return ResponseFuture::rejected(full(&call, places)),
                Entry::Queue(ticket) => ticket,
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
            // The ready service makes the call once it has its places.
            let clone = self.inner.clone();
            let service = mem::replace(&mut self.inner, clone);
            let acquire = places.wait(call.priority());
            let then = if stage == 0 {
                limits.namespace.clone()
            } else {
                None
            };
            let waiting = Waiting::new(service, call, ticket, then, deadline);
            return ResponseFuture::queued(waiting, acquire, held);
        }
        ResponseFuture::called(self.inner.call(call), held)
    }
}

/// The error of a call that found every place of its tool (or of its namespace) taken and
/// the queue full, logged.
pub(super) fn full(call: &ToolCall, places: &Places) -> ToolError {
    let wait_ms = millis(places.retry_after).max(1);
    tracing::debug!(
        event = "tool_call_blocked",
        requestId = &*identifier(call.request_id()),
        toolName = call.tool_name(),
        retry_after_ms = wait_ms,
        "bulkhead refused the call"
    );
    let (whose, limit) = match places.scope {
        Scope::Tool => (call.tool_name().to_owned(), "tool"),
        Scope::Namespace => (
            format!("the namespace {}", call.tool_namespace()),
            "namespace",
        ),
    };
    ToolError::rejected(
        ErrorCode::RateLimited,
        format!(
            "{whose} is running {} calls at once and {} more are waiting, as many as it \
             allows: {} was not called; retry after {wait_ms} ms",
            places.max_concurrent,
            places.max_queued,
            call.tool_name(),
        ),
    )
    .with_retry_after(places.retry_after)
    .with_details(json!({
        "retryAfterMs": wait_ms,
        "maxConcurrent": places.max_concurrent,
        "maxQueued": places.max_queued,
        "limit": limit,
    }))
    .short_circuited(ShortCircuit::BulkheadFull)
}

/// The error of a call whose deadline passed while it waited for a place of `scope`.
pub(super) fn deadline_passed(call: &ToolCall, scope: Scope, waited: Duration) -> ToolError {
    let whose = match scope {
        Scope::Tool => call.tool_name().to_owned(),
        Scope::Namespace => format!("the tools of the namespace {}", call.tool_namespace()),
    };
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
             running calls of {whose}: it was not called; try again later or with a later \
             deadline",
            millis(waited),
        ),
    )
    .with_details(json!({ "queuedMs": millis(waited) }))
    .short_circuited(ShortCircuit::BulkheadFull)
}
