use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::limiter::ToolLimit;
use super::service::{over_limit, refused, Limits};
use super::store::Admission;
use crate::control::ShadowLayer;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::middleware::{shadow_decision, Passthrough};
use crate::outcome::{ShadowDecision, ShadowVerdict, ShortCircuit, ToolOutput};
use crate::shared_store::StoreFuture;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the call, refused with
    /// `RATE_LIMITED`, waiting for its quota, or for the shared store's answer.
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
        // Asking the shared store for the call's quota.
        Checking { check: StoreFuture<'static, Admission> },
        Sleeping { sleep: Pin<Box<Sleep>> },
        // The quota allows the call; waiting for the service to be ready.
        Ready,
    }
}

/// A call that the quota has not let through yet, and the ready service that will make it.
pub(super) struct Waiting<S> {
    service: S,
    call: ToolCall,
    limit: Arc<ToolLimit>,
    key: String,
    /// The layer is in shadow mode for the call: over its quota, it runs at once.
    shadow: bool,
    /// Set when the call runs over its quota in shadow mode.
    decision: Option<ShadowDecision>,
    /// When the longest allowed wait ends.
    give_up_at: Instant,
    limits: Option<Arc<Limits>>,
}

impl<S> Waiting<S> {
    pub(super) fn new(
        service: S,
        call: ToolCall,
        limit: Arc<ToolLimit>,
        key: String,
        shadow: bool,
    ) -> Self {
        Waiting {
            service,
            call,
            give_up_at: Instant::now() + limit.max_wait,
            limit,
            key,
            shadow,
            decision: None,
            limits: None,
        }
    }

    /// What happens after the quota said "not before `wait`".
    fn over_quota<F>(&mut self, wait: Duration) -> State<F> {
        if self.shadow {
            let verdict = if self.limit.waits_for(wait) {
                ShadowVerdict::WouldWait
            } else {
                ShadowVerdict::WouldLimit
            };
            self.decision = Some(shadow_decision(&self.call, ShadowLayer::RateLimit, verdict));
            return State::Ready;
        }
        if self.limit.waits_for(wait) && Instant::now() + wait <= self.give_up_at {
            return State::Sleeping {
                sleep: Box::pin(tokio::time::sleep(wait)),
            };
        }
        State::Rejected {
            error: Some(rejection(refused(&self.call, &self.limit, wait))),
        }
    }

    /// Asks the quota again after a wait: the shared store's, or this process's.
    fn check_again<F>(&mut self) -> State<F> {
        if let Some(store) = self
            .limits
            .as_ref()
            .and_then(|limits| limits.store.as_ref())
        {
            return State::Checking {
                check: store.acquire(&self.key, self.limit.quota()),
            };
        }
        match self.limit.check(&self.key) {
            Ok(()) => State::Ready,
            Err(wait) if Instant::now() + wait <= self.give_up_at => State::Sleeping {
                sleep: Box::pin(tokio::time::sleep(wait)),
            },
            Err(wait) => State::Rejected {
                error: Some(rejection(over_limit(&self.call, &self.limit, wait))),
            },
        }
    }

    /// What the shared store's `answer` means for the call.
    fn answered<F>(
        &mut self,
        answer: Result<Admission, crate::shared_store::StoreError>,
    ) -> State<F> {
        let outages = &self
            .limits
            .as_ref()
            .expect("a checked call has its limits")
            .outages;
        match answer {
            Ok(Admission::Allowed) => {
                outages.succeeded("rate_limit");
                State::Ready
            }
            Ok(Admission::RetryAfter(wait)) => {
                outages.succeeded("rate_limit");
                self.over_quota(wait)
            }
            Err(error) => match outages.failed("rate_limit", &error) {
                Ok(()) => State::Ready,
                Err(error) => State::Rejected {
                    error: Some(rejection(error)),
                },
            },
        }
    }
}

fn rejection(error: ToolError) -> ToolError {
    error.short_circuited(ShortCircuit::RateLimited)
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
        ResponseFuture {
            state: State::Rejected {
                error: Some(rejection(error)),
            },
            waiting: None,
        }
    }

    /// A call over its quota that waits `wait` for it.
    pub(super) fn waiting(waiting: Waiting<S>, limits: Arc<Limits>, wait: Duration) -> Self {
        ResponseFuture {
            state: State::Sleeping {
                sleep: Box::pin(tokio::time::sleep(wait)),
            },
            waiting: Some(Box::new(Waiting {
                limits: Some(limits),
                ..waiting
            })),
        }
    }

    /// A call whose quota the shared store is checking.
    pub(super) fn checking(
        waiting: Waiting<S>,
        limits: Arc<Limits>,
        check: StoreFuture<'static, Admission>,
    ) -> Self {
        ResponseFuture {
            state: State::Checking { check },
            waiting: Some(Box::new(Waiting {
                limits: Some(limits),
                ..waiting
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
                Projection::Checking { check } => {
                    let answer = ready!(check.as_mut().poll(cx));
                    let waiting = this.waiting.as_mut().expect("a checked call waits");
                    this.state.set(waiting.answered(answer));
                }
                Projection::Sleeping { sleep } => {
                    ready!(sleep.as_mut().poll(cx));
                    let waiting = this.waiting.as_mut().expect("a sleeping call waits");
                    this.state.set(waiting.check_again());
                }
                Projection::Ready => {
                    let waiting = this.waiting.as_mut().expect("a ready call waited");
                    ready!(waiting.service.poll_ready(cx))?;
                    let Waiting {
                        mut service,
                        call,
                        decision,
                        ..
                    } = *this.waiting.take().expect("a ready call waited");
                    let future = match decision {
                        Some(decision) => Passthrough::shadowed(service.call(call), decision),
                        None => Passthrough::new(service.call(call)),
                    };
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
