use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use priority_semaphore::{AcquireFuture, Permit};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::places::QueueTicket;
use super::service::deadline_passed;
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::{ShortCircuit, ToolOutput};

pin_project! {
    /// The response future of [`Bulkhead`](super::Bulkhead): the call, holding its place
    /// until it ends; refused with `RATE_LIMITED`; or waiting for a place.
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<F>,
        waiting: Option<Box<Waiting<S>>>,
        // The call's place, given back when the call ends or is dropped.
        permit: Option<Permit>,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Called { #[pin] future: F },
        Rejected { error: Option<ToolError> },
        // In the queue; leaves it when the future is dropped.
        Queued { acquire: AcquireFuture, deadline: Option<Pin<Box<Sleep>>> },
        // Has a place; waiting for the service to be ready.
        Ready,
    }
}

/// A call waiting for a place, and the ready service that will make it.
pub(super) struct Waiting<S> {
    service: S,
    call: ToolCall,
    since: Instant,
    /// Its place in the queue, given back when it gets a place or leaves.
    ticket: Option<QueueTicket>,
}

impl<S> Waiting<S> {
    pub(super) fn new(service: S, call: ToolCall, ticket: QueueTicket) -> Self {
        Waiting {
            service,
            call,
            since: Instant::now(),
            ticket: Some(ticket),
        }
    }
}

impl<S, F> ResponseFuture<S, F> {
    /// The inner call, holding `permit` (none when the tool is not limited).
    pub(super) fn called(future: F, permit: Option<Permit>) -> Self {
        ResponseFuture {
            state: State::Called { future },
            waiting: None,
            permit,
        }
    }

    pub(super) fn rejected(error: ToolError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            waiting: None,
            permit: None,
        }
    }

    /// A call waiting for a place until `deadline`, if it has one.
    pub(super) fn queued(
        waiting: Waiting<S>,
        acquire: AcquireFuture,
        deadline: Option<Instant>,
    ) -> Self {
        ResponseFuture {
            state: State::Queued {
                acquire,
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            },
            waiting: Some(Box::new(waiting)),
            permit: None,
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
                Projection::Called { future } => {
                    let outcome = ready!(future.poll(cx));
                    // The place is free again as soon as the call ends.
                    this.permit.take();
                    return Poll::Ready(outcome);
                }
                Projection::Rejected { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("bulkhead::ResponseFuture polled after completion")))
                }
                Projection::Queued { acquire, deadline } => {
                    let waiting = this.waiting.as_mut().expect("a queued call waits");
                    match Pin::new(acquire).poll(cx) {
                        Poll::Ready(Ok(permit)) => {
                            *this.permit = Some(permit);
                            waiting.ticket.take();
                            this.state.set(State::Ready);
                        }
                        Poll::Ready(Err(_closed)) => {
                            // The layer never closes its places.
                            let error = ToolError::rejected(
                                ErrorCode::InternalError,
                                "the bulkhead's places were closed; try again",
                            )
                            .short_circuited(ShortCircuit::BulkheadFull);
                            this.state.set(State::Rejected { error: Some(error) });
                        }
                        Poll::Pending => {
                            let Some(deadline) = deadline else {
                                return Poll::Pending;
                            };
                            ready!(deadline.as_mut().poll(cx));
                            let error = deadline_passed(&waiting.call, waiting.since.elapsed());
                            // Leaves the queue: the wait is dropped with its state.
                            this.waiting.take();
                            this.state.set(State::Rejected { error: Some(error) });
                        }
                    }
                }
                Projection::Ready => {
                    let waiting = this.waiting.as_mut().expect("an admitted call waited");
                    ready!(waiting.service.poll_ready(cx))?;
                    let Waiting {
                        mut service, call, ..
                    } = *this.waiting.take().expect("an admitted call waited");
                    this.state.set(State::Called {
                        future: service.call(call),
                    });
                }
            }
        }
    }
}

impl<S, F> std::fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("holds_place", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}
