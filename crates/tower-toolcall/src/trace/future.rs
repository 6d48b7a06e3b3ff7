use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::Span;

use super::audit::ExecutionEvent;
use super::event_kind::{EventKind, EventLevel};
use super::layer::TraceConfig;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::event::LayerEvent;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Trace`](super::Trace): the inner call, polled inside the
    /// call's span, reported (and handed to the hooks, when it was short-circuited) when it
    /// ends.
    ///
    /// Dropped before the call ended (its caller gave up on it), it drops the inner call
    /// first, so that an attempt it cuts short ends in the audit log before the run, then
    /// writes `run.cancelled`: the tool may have acted, the outcome is unknown.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        // `None` once dropped ahead of the rest.
        #[pin]
        future: Option<F>,
        observed: Option<Observed>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let Some(observed) = this.observed.take() {
                this.future.set(None);
                if let Some(audit) = &observed.config.audit {
                    audit.record_event(
                        ExecutionEvent::new(
                            EventKind::RunCancelled,
                            &observed.call,
                            "call dropped before it ended; outcome unknown",
                        )
                        .level(EventLevel::Warn),
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
            future: Some(future),
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
            future: Some(future),
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
        let future = this
            .future
            .as_pin_mut()
            .expect("a trace future is polled after it was dropped");
        let Some(observed) = this.observed.as_ref() else {
            return future.poll(cx);
        };
        let outcome = {
            let _entered = observed.span.enter();
            ready!(future.poll(cx))
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
        config.sinks.emit(&LayerEvent::CallFinished {
            call,
            outcome: &outcome,
            elapsed,
        });
        if let Some(audit) = &config.audit {
            super::events::audit_finished(audit, call, &outcome, elapsed);
        }
        if let Some(hooks) = &config.hooks {
            hooks.short_circuited(call, &outcome);
        }
        Poll::Ready(outcome)
    }
}
