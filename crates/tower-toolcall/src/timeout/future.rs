use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::service::{Limits, StreamLimit};
use crate::error::ToolError;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`Timeout`](super::Timeout): the attempt, raced against its
    /// timeout once it has to wait.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        attempt: F,
        limits: Limits,
        // Armed when the attempt first waits, so that an attempt answering at once costs no
        // timer; boxed to keep the future small.
        timer: Option<Pin<Box<Sleep>>>,
        // When the timer was first armed: the attempt's start, for the wait for a first chunk.
        armed_at: Option<Instant>,
    }
}

impl<F> ResponseFuture<F> {
    /// The attempt, unbounded: the layer is switched off.
    pub(super) fn passthrough(attempt: F) -> Self {
        ResponseFuture::new(
            attempt,
            Limits {
                attempt: None,
                stream: None,
            },
        )
    }

    pub(super) fn new(attempt: F, limits: Limits) -> Self {
        ResponseFuture {
            attempt,
            limits,
            timer: None,
            armed_at: None,
        }
    }
}

/// What the timer found when it fired: the attempt is out of time, or it may wait until a
/// later instant.
enum Expiry {
    Attempt(Duration),
    Idle(Duration),
    Later(Instant),
}

impl Limits {
    /// The first instant the timer must fire after `armed_at`, when the attempt began to
    /// wait; `None` when nothing bounds it.
    fn first_check(&self, armed_at: Instant) -> Option<Instant> {
        match (&self.stream, self.attempt) {
            // A chunk may come at once and start the idle clock: look again after `idle`.
            (Some(stream), Some(attempt)) => Some(armed_at + attempt.min(stream.idle)),
            (Some(stream), None) => Some(armed_at + stream.idle),
            (None, attempt) => attempt.map(|attempt| armed_at + attempt),
        }
    }

    /// What holds at `now`, the timer having fired.
    fn expiry(&self, armed_at: Instant, now: Instant) -> Expiry {
        let Some(StreamLimit { tap, idle }) = &self.stream else {
            return Expiry::Attempt(self.attempt.unwrap_or_default());
        };
        match tap.last_sent_at() {
            // Chunks flow: each gap is bounded by the idle timeout, and a later chunk only
            // moves the end further.
            Some(last) if last + *idle > now => Expiry::Later(last + *idle),
            Some(_) => Expiry::Idle(*idle),
            // No chunk yet: the attempt timeout bounds the wait for the first; look again
            // within `idle` in case one comes.
            None => match self.attempt {
                Some(attempt) if armed_at + attempt <= now => Expiry::Attempt(attempt),
                Some(attempt) => Expiry::Later((now + *idle).min(armed_at + attempt)),
                None => Expiry::Later(now + *idle),
            },
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
        let armed_at = *this.armed_at.get_or_insert_with(Instant::now);
        let timer = match this.timer {
            Some(timer) => timer,
            None => match this.limits.first_check(armed_at) {
                Some(at) => this.timer.insert(Box::pin(tokio::time::sleep_until(at))),
                None => return Poll::Pending,
            },
        };
        loop {
            ready!(timer.as_mut().poll(cx));
            let error = match this.limits.expiry(armed_at, Instant::now()) {
                Expiry::Later(at) => {
                    timer.as_mut().reset(at);
                    continue;
                }
                Expiry::Attempt(limit) => {
                    tracing::debug!(
                        timeout_ms = crate::time::millis(limit),
                        "tool attempt timed out"
                    );
                    ToolError::timeout(limit)
                }
                Expiry::Idle(idle) => {
                    tracing::debug!(
                        idle_timeout_ms = crate::time::millis(idle),
                        "streamed answer stalled"
                    );
                    ToolError::new(
                        crate::ErrorCode::Timeout,
                        format!(
                            "the tool sent no chunk of its answer for {} ms; try again or raise \
                             the idle timeout",
                            idle.as_millis()
                        ),
                    )
                }
            };
            return Poll::Ready(Err(error));
        }
    }
}
