use std::mem;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use super::backoff::SharedRng;
use super::budget::GlobalRetryBudget;
use super::future::ResponseFuture;
use super::hedge::LatencyWindow;
use super::policy::{CallLimits, RetryPolicy};
use crate::breaker_view::Breakers;
use crate::classify::{SharedClassifier, ToolProfile};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::ToolOutput;
use crate::tool_table::{Acting, ToolTable};

/// Retries failed calls when that may help and is safe; made by
/// [`RetryLayer`](super::RetryLayer).
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    tools: Arc<ToolTable<Option<Arc<ToolRetry>>>>,
}

/// Everything a call of one tool needs to be retried, resolved once.
#[derive(Debug)]
pub(crate) struct ToolRetry {
    pub(super) policy: RetryPolicy,
    pub(super) profile: ToolProfile,
    pub(super) classifier: SharedClassifier,
    pub(super) budget: Option<GlobalRetryBudget>,
    pub(super) rng: SharedRng,
    /// The tool's recent latencies, when its hedge delay is a percentile of them.
    pub(super) latencies: Option<LatencyWindow>,
    /// Hedges sent for the tool's calls.
    pub(super) hedges: AtomicU64,
    /// The breakers below, whose state may forbid a hedge.
    pub(super) breakers: Option<Breakers>,
}

impl<S> Retry<S> {
    pub(super) fn new(inner: S, tools: Arc<ToolTable<Option<Arc<ToolRetry>>>>) -> Self {
        Retry { inner, tools }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for Retry<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let Some(Acting { tool, .. }) = self.tools.gate(&call, None) else {
            return ResponseFuture::passthrough(self.inner.call(call));
        };
        if let Some(budget) = &tool.budget {
            budget.deposit();
        }
        let mut limits = None;
        if call.control().deadline_at_ms.is_some() {
            let now = Instant::now();
            let call_limits = CallLimits::new(&tool.policy, &call, now);
            if call_limits.call_deadline.is_some_and(|d| d <= now) {
                return ResponseFuture::expired(ToolError::rejected(
                    ErrorCode::Timeout,
                    "the call's deadline (control.deadlineAtMs) had passed before it started: \
                     the tool was not called; send it again with a later deadline",
                ));
            }
            limits = Some(call_limits);
        }
        // The ready service makes this call and keeps the retries; a clone takes its place.
        let clone = self.inner.clone();
        let service = mem::replace(&mut self.inner, clone);
        ResponseFuture::first_attempt(service, call, tool.clone(), limits)
    }
}
