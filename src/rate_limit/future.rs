use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::limiter::ToolLimit;
use super::service::over_limit;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::middleware::Passthrough;
use crate::outcome::{ShadowDecision, ShortCircuit, ToolOutput};

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the call, refused with
    /// `RATE_LIMITED`, or waiting for its quota.
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<F>,
        waiting: Option<Box<Waiting<S>>>,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Called { #[pin] future: Passthrough<F> },
        Rejected { error: Option<ToolError> },
        Sleeping { sleep: Pin<Box<Sleep>> },
        // The quota allows the call; waiting for the service to be ready.
        Ready,
    }
}

/// A call waiting for its quota.
struct Waiting<S> {
    service: S,
    call: ToolCall,
    limit: Arc<ToolLimit>,
    key: String,
    /// When the longest allowed wait ends.
    give_up_at: Instant,
}

impl<S, F> ResponseFuture<S, F> {
    /// The inner call: within its quota, or not limited.
    pub(super) fn called(future: F) -> Self {
        ResponseFuture::passthrough(Passthrough::new(future))
    }

    /// The inner call, run at once although it is over its quota: the layer is in shadow
    /// mode.
    pub(super) fn shadowed(future: F, decision: ShadowDecision) -> Self {
        ResponseFuture::passthrough(Passthrough::shadowed(future, decision))
    }

    fn passthrough(future: Passthrough<F>) -> Self {
        ResponseFuture {
            state: State::Called { future },
            waiting: None,
        }
    }

    pub(super) fn rejected(error: ToolError) -> Self {
        let error = error.short_circuited(ShortCircuit::RateLimited);
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            waiting: None,
        }
    }

    pub(super) fn waiting(
        service: S,
        call: ToolCall,
        limit: Arc<ToolLimit>,
        key: String,
        wait: Duration,
    ) -> Self {
        let now = Instant::now();
        ResponseFuture {
            state: State::Sleeping {
                sleep: Box::pin(tokio::time::sleep_until(now + wait)),
            },
            waiting: Some(Box::new(Waiting {
                service,
                call,
                give_up_at: now + limit.max_wait,
                limit,
                key,
            })),
        }
    }
}

impl<S, F> Future for ResponseFuture<S, F>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError, Future = F>,
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                Projection::Called { future } => return future.poll(cx),
                Projection::Rejected { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("rate_limit::ResponseFuture polled after completion")))
                }
                Projection::Sleeping { sleep } => {
                    ready!(sleep.as_mut().poll(cx));
                    let waiting = this.waiting.as_mut().expect("a sleeping call waits");
                    match waiting.limit.check(&waiting.key) {
                        Ok(()) => this.state.set(State::Ready),
                        Err(wait) if Instant::now() + wait <= waiting.give_up_at => {
                            sleep.as_mut().reset(Instant::now() + wait);
                        }
                        Err(wait) => {
                            let error = over_limit(&waiting.call, &waiting.limit, wait);
                            this.state.set(State::Rejected { error: Some(error) });
                        }
                    }
                }
                Projection::Ready => {
                    let waiting = this.waiting.as_mut().expect("a ready call waited");
                    ready!(waiting.service.poll_ready(cx))?;
                    let Waiting {
                        mut service, call, ..
                    } = *this.waiting.take().expect("a ready call waited");
                    let future = Passthrough::new(service.call(call));
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}

impl<S, F> std::fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
