use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::ResponseFuture;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;
use crate::tool_table::{Acting, ToolTable};

/// Bounds each attempt of the inner service; made by
/// [`TimeoutLayer`](super::TimeoutLayer).
#[derive(Clone, Debug)]
pub struct Timeout<S> {
    inner: S,
    limits: Arc<ToolTable<Option<AttemptLimit>>>,
}

/// A tool's attempt timeout, resolved from its policy: its own, else the layer's default, if
/// any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AttemptLimit(pub(super) Option<Duration>);

impl AttemptLimit {
    /// The limit for `call`: the tool's, narrowed by `callHints.timeoutMs`.
    fn for_call(self, call: &ToolCall) -> Option<Duration> {
        let hint = call.call_hints().timeout_ms.map(Duration::from_millis);
        match (self.0, hint) {
            (Some(limit), Some(hint)) => Some(limit.min(hint)),
            (limit, hint) => limit.or(hint),
        }
    }
}

impl<S> Timeout<S> {
    pub(super) fn new(inner: S, limits: Arc<ToolTable<Option<AttemptLimit>>>) -> Self {
        Timeout { inner, limits }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for Timeout<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let Some(Acting { tool: limit, .. }) = self.limits.gate(&call, None) else {
            return ResponseFuture::passthrough(self.inner.call(call));
        };
        let limit = limit.for_call(&call);
        ResponseFuture::new(self.inner.call(call), limit)
    }
}
