use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::error::ToolError;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Timeout`](super::Timeout): the attempt, raced against its
    /// timeout once it has to wait.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        attempt: F,
        limit: Option<Duration>,
        // Armed when the attempt first waits, so that an attempt answering at once costs no
        // timer; boxed to keep the future small.
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<F> ResponseFuture<F> {
    /// The attempt, unbounded: the layer is switched off.
    pub(super) fn passthrough(attempt: F) -> Self {
        ResponseFuture::new(attempt, None)
    }

    pub(super) fn new(attempt: F, limit: Option<Duration>) -> Self {
        ResponseFuture {
            attempt,
            limit,
            timer: None,
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
        if let Poll::Ready(outcome) = this.attempt.poll(cx) {
            return Poll::Ready(outcome);
        }
        let Some(limit) = *this.limit else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(timer.as_mut().poll(cx));
        tracing::debug!(
            timeout_ms = crate::time::millis(limit),
            "tool attempt timed out"
        );
        Poll::Ready(Err(ToolError::timeout(limit)))
    }
}
