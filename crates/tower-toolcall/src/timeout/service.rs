use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::ResponseFuture;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;
use crate::stream::ChunkTap;
use crate::tool_table::{Acting, ToolTable};

/// Bounds each attempt of the inner service; made by
/// [`TimeoutLayer`](super::TimeoutLayer).
#[derive(Clone, Debug)]
pub struct Timeout<S> {
    inner: S,
    limits: Arc<ToolTable<Option<AttemptLimit>>>,
}

/// A tool's attempt timeout, resolved from its policy: its own, else the layer's default, if
/// any; and its idle timeout between the chunks of a streamed answer, else the attempt
/// timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AttemptLimit {
    pub(super) attempt: Option<Duration>,
    pub(super) idle: Option<Duration>,
}

impl AttemptLimit {
    /// The limits for `call`: the tool's attempt timeout narrowed by `callHints.timeoutMs`,
    /// and its idle timeout, which bounds only the gaps of a streamed answer.
    fn for_call(self, call: &ToolCall) -> Limits {
        let hint = call.call_hints().timeout_ms.map(Duration::from_millis);
        let attempt = match (self.attempt, hint) {
            (Some(limit), Some(hint)) => Some(limit.min(hint)),
            (limit, hint) => limit.or(hint),
        };
        let stream = call.chunk_tap().and_then(|tap| {
            let idle = self.idle.or(attempt)?;
            Some(StreamLimit {
                tap: tap.clone(),
                idle,
            })
        });
        Limits { attempt, stream }
    }
}

/// What bounds one attempt.
#[derive(Debug)]
pub(super) struct Limits {
    /// The attempt's time; for a streamed answer, the time to its first chunk.
    pub(super) attempt: Option<Duration>,
    /// For a call whose caller reads chunks: the longest gap between two.
    pub(super) stream: Option<StreamLimit>,
}

/// The idle timeout of a streamed answer, and its chunks.
#[derive(Debug)]
pub(super) struct StreamLimit {
    pub(super) tap: Arc<ChunkTap>,
    pub(super) idle: Duration,
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
        let limits = limit.for_call(&call);
        ResponseFuture::new(self.inner.call(call), limits)
    }
}
