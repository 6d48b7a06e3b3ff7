use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::ToolHooks;
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Hook`](super::Hook): the attempt, reported to the hooks when
    /// it ends, or the error of a denied attempt.
    pub struct ResponseFuture<F, H>
    where
        H: ToolHooks,
    {
        #[pin]
        state: State<F>,
        // Fires `after_attempt` once: with the outcome, or on drop when the attempt never
        // finished.
        after: Option<AfterAttempt<H>>,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Attempt { #[pin] future: F },
        // The hooks denied the attempt: rejected; they have seen its outcome already.
        Rejected { outcome: Option<Result<ToolOutput, ToolError>> },
    }
}

impl<F, H: ToolHooks> ResponseFuture<F, H> {
    pub(super) fn attempt(future: F, call: ToolCall, hooks: Arc<H>) -> Self {
        ResponseFuture {
            state: State::Attempt { future },
            after: Some(AfterAttempt::new(call, hooks)),
        }
    }

    pub(super) fn rejected(outcome: Result<ToolOutput, ToolError>) -> Self {
        ResponseFuture {
            state: State::Rejected {
                outcome: Some(outcome),
            },
            after: None,
        }
    }
}

impl<F, H> Future for ResponseFuture<F, H>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
    H: ToolHooks,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            Projection::Rejected { outcome } => Poll::Ready(
                outcome
                    .take()
                    .expect("hooks::ResponseFuture polled after completion"),
            ),
            Projection::Attempt { future } => {
                let outcome = ready!(future.poll(cx));
                if let Some(after) = this.after {
                    after.fire(&outcome);
                }
                Poll::Ready(outcome)
            }
        }
    }
}

impl<F, H: ToolHooks> fmt::Debug for ResponseFuture<F, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// The `after_attempt` an attempt owes its hooks: fired with the attempt's outcome, or, when
/// the attempt is dropped before it finished, with a `CANCELLED` error.
struct AfterAttempt<H: ToolHooks> {
    call: ToolCall,
    hooks: Arc<H>,
    owed: bool,
}

impl<H: ToolHooks> AfterAttempt<H> {
    fn new(call: ToolCall, hooks: Arc<H>) -> Self {
        AfterAttempt {
            call,
            hooks,
            owed: true,
        }
    }

    fn fire(&mut self, outcome: &Result<ToolOutput, ToolError>) {
        if std::mem::take(&mut self.owed) {
            self.hooks.after_attempt(&self.call, outcome);
        }
    }
}

impl<H: ToolHooks> Drop for AfterAttempt<H> {
    fn drop(&mut self) {
        // A tool that panicked left no outcome to report.
        if self.owed && !std::thread::panicking() {
            self.fire(&Err(ToolError::new(
                ErrorCode::Cancelled,
                "the attempt was dropped before it finished: its timeout passed or the caller \
                 stopped waiting",
            )));
        }
    }
}
