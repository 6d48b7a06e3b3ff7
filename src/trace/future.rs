use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::Span;

use super::layer::TraceConfig;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Trace`](super::Trace): the inner call, polled inside the
    /// call's span, reported when it ends.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        span: Span,
        call: ToolCall,
        start: Instant,
        config: Arc<TraceConfig>,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn new(
        future: F,
        span: Span,
        call: ToolCall,
        start: Instant,
        config: Arc<TraceConfig>,
    ) -> Self {
        ResponseFuture {
            future,
            span,
            call,
            start,
            config,
        }
    }
}

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let outcome = ready!(this.future.poll(cx));
        let elapsed = this.start.elapsed();
        super::events::finished(
            this.span,
            this.call,
            &outcome,
            elapsed,
            &this.config.redactor,
        );
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &this.config.metrics {
            metrics.record_call(this.call, &outcome, elapsed);
        }
        if let Some(audit) = &this.config.audit {
            super::events::audit_finished(audit, this.call, &outcome, elapsed);
        }
        Poll::Ready(outcome)
    }
}
