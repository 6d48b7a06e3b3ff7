use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use priority_semaphore::AcquireFuture;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::places::{Entry, Held, Places, QueueTicket};
use super::service::{deadline_passed, full};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::{ShortCircuit, ToolOutput};

pin_project! {
    /// The response future of [`Bulkhead`](super::Bulkhead): the call, holding its places
    /// until it ends; refused with `RATE_LIMITED`; or waiting for a place.
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<F>,
        waiting: Option<Box<Waiting<S>>>,
        // The call's places, given back when the call ends or is dropped.
        held: Held,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Called { #[pin] future: F },
        Rejected { error: Option<ToolError> },
        // In a queue; leaves it when the future is dropped.
        Queued { acquire: AcquireFuture },
        // Has its places; waiting for the service to be ready.
        Ready,
    }
}

/// A call waiting for a place, and the ready service that will make it.
pub(super) struct Waiting<S> {
    service: S,
    call: ToolCall,
    since: Instant,
    /// When it gives up waiting, if it has a deadline: one for all its waits.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Its place in the queue it waits in, given back when it gets a place or leaves.
    ticket: Option<QueueTicket>,
    /// The places to enter once it has this one: its namespace's, after its tool's.
    then: Option<Arc<Places>>,
}

impl<S> Waiting<S> {
    pub(super) fn new(
        service: S,
        call: ToolCall,
        ticket: QueueTicket,
        then: Option<Arc<Places>>,
        deadline: Option<Instant>,
    ) -> Self {
        Waiting {
            service,
            call,
            since: Instant::now(),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            ticket: Some(ticket),
            then,
        }
    }
}

impl<S, F> ResponseFuture<S, F> {
    /// The inner call, holding `held` (nothing when the tool is not limited).
    pub(super) fn called(future: F, held: Held) -> Self {
        ResponseFuture {
            state: State::Called { future },
            waiting: None,
            held,
        }
    }

    pub(super) fn rejected(error: ToolError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            waiting: None,
            held: Held::default(),
        }
    }

    /// A call waiting for a place, holding `held` meanwhile.
    pub(super) fn queued(waiting: Waiting<S>, acquire: AcquireFuture, held: Held) -> Self {
        ResponseFuture {
            state: State::Queued { acquire },
            waiting: Some(Box::new(waiting)),
            held,
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
                    // The places are free again as soon as the call ends.
                    *this.held = Held::default();
                    return Poll::Ready(outcome);
                }
                Projection::Rejected { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("bulkhead::ResponseFuture polled after completion")))
                }
                Projection::Queued { acquire } => {
                    let waiting = this.waiting.as_mut().expect("a queued call waits");
                    match Pin::new(acquire).poll(cx) {
                        Poll::Ready(Ok(permit)) => {
                            let ticket = waiting.ticket.take().expect("a queued call has a ticket");
                            this.held.hold(ticket.places().scope, permit);
                            drop(ticket);
                            let Some(places) = waiting.then.take() else {
                                this.state.set(State::Ready);
                                continue;
                            };
                            // Its tool's place, then its namespace's.
                            match places.enter() {
                                Entry::Place(permit) => {
                                    this.held.hold(places.scope, permit);
                                    this.state.set(State::Ready);
                                }
                                Entry::Queue(ticket) => {
                                    let acquire = places.wait(waiting.call.priority());
                                    waiting.ticket = Some(ticket);
                                    this.state.set(State::Queued { acquire });
                                }
                                Entry::Full => {
                                    let error = full(&waiting.call, &places);
                                    *this.held = Held::default();
                                    this.waiting.take();
                                    this.state.set(State::Rejected { error: Some(error) });
                                }
                            }
                        }
                        Poll::Ready(Err(_closed)) => {
                            // The layer never closes its places.
                            let error = ToolError::rejected(
                                ErrorCode::InternalError,
                                "the bulkhead's places were closed; try again",
                            )
                            .short_circuited(ShortCircuit::BulkheadFull);
                            *this.held = Held::default();
                            this.state.set(State::Rejected { error: Some(error) });
                        }
                        Poll::Pending => {
                            let Some(deadline) = &mut waiting.deadline else {
                                return Poll::Pending;
                            };
                            ready!(deadline.as_mut().poll(cx));
                            let scope = waiting
                                .ticket
                                .as_ref()
                                .expect("a queued call has a ticket")
                                .places()
                                .scope;
                            let error =
                                deadline_passed(&waiting.call, scope, waiting.since.elapsed());
                            // Leaves the queue, and gives back the place it holds.
                            this.waiting.take();
                            *this.held = Held::default();
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
            .field("holds_place", &self.held.holds_any())
            .finish_non_exhaustive()
    }
}
