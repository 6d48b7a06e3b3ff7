use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use super::audit::ExecutionEvent;
use super::event_kind::EventKind;
use super::future::ResponseFuture;
use super::layer::TraceConfig;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;

/// Traces the calls of the inner service; made by [`TraceLayer`](super::TraceLayer).
#[derive(Clone, Debug)]
pub struct Trace<S> {
    inner: S,
    config: Arc<TraceConfig>,
}

impl<S> Trace<S> {
    pub(super) fn new(inner: S, config: Arc<TraceConfig>) -> Self {
        Trace { inner, config }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for Trace<S>
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
        let span = super::events::call_span(&call, &self.config.redactor);
        if span.is_disabled() && !self.config.observes() {
            // Nothing listens: no clock, no copy of the call.
            return ResponseFuture::unobserved(self.inner.call(call));
        }
        let future = {
            let _entered = span.enter();
            super::events::started(&call, &self.config.redactor);
            if let Some(audit) = &self.config.audit {
                audit.record_call(&call);
                audit.record_event(ExecutionEvent::new(
                    EventKind::RunStarted,
                    &call,
                    "call received",
                ));
            }
            self.inner.call(call.clone())
        };
        ResponseFuture::new(future, span, call, Instant::now(), self.config.clone())
    }
}
