use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::Span;

use super::audit::ExecutionEvent;
use super::layer::TraceConfig;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Trace`](super::Trace): the inner call, polled inside the
    /// call's span, reported (and handed to the hooks, when it was short-circuited) when it
    /// ends.
    ///
    /// Dropped before the call ended (its caller gave up on it), it writes `run.cancelled` to
    /// the audit log: the tool may have acted, the outcome is unknown.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        observed: Option<Observed>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(observed) = this.observed.take() {
                if let Some(audit) = &observed.config.audit {
                    audit.record_event(
                        ExecutionEvent::new(
                            "run.cancelled",
                            &observed.call,
                            "call dropped before it ended; outcome unknown",
                        )
                        .level("warn"),
                    );
                }
            }
        }
    }
}

/// What a call that is listened to keeps until it ends.
#[derive(Debug)]
struct Observed {
    span: Span,
    call: ToolCall,
    start: Instant,
    config: Arc<TraceConfig>,
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
            observed: Some(Observed {
                span,
                call,
                start,
                config,
            }),
        }
    }

    /// The inner call, when nothing listens.
    pub(super) fn unobserved(future: F) -> Self {
        ResponseFuture {
            future,
            observed: None,
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
        let Some(observed) = this.observed.as_ref() else {
            return this.future.poll(cx);
        };
        let outcome = {
            let _entered = observed.span.enter();
            ready!(this.future.poll(cx))
        };
        let Some(Observed {
            span,
            call,
            start,
            config,
        }) = this.observed.take()
        else {
            unreachable!("checked above")
        };
        let _entered = span.enter();
        let (span, call, start, config) = (&span, &call, &start, &config);
        let elapsed = start.elapsed();
        super::events::finished(span, call, &outcome, elapsed, &config.redactor);
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &config.metrics {
            metrics.record_call(call, &outcome, elapsed);
        }
        if let Some(audit) = &config.audit {
            super::events::audit_finished(audit, call, &outcome, elapsed);
        }
        if let Some(hooks) = &config.hooks {
            hooks.short_circuited(call, &outcome);
        }
        Poll::Ready(outcome)
    }
}
