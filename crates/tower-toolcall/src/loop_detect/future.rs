use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::service::{Answers, Monitor};
use super::tracker::{lock, SharedHistory};
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::middleware::Passthrough;
use crate::outcome::ToolOutput;

use self::shared::{Pending, StoreStep};

pin_project! {
    /// The response future of [`LoopDetect`](super::LoopDetect): refused with
    /// `LOOP_DETECTED`, the inner call, whose outcome is reported to the session's history,
    /// the inner call untracked, or a call whose session history is in a shared store.
    pub struct ResponseFuture<S, F> {
        #[pin]
        state: State<F>,
        pending: Option<Box<Pending<S>>>,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Rejected { error: Option<ToolError> },
        Called {
            #[pin]
            future: F,
            report: Option<OutcomeReport>,
        },
        Passthrough { #[pin] future: Passthrough<F> },
        // Waiting for the shared store: its answer, or the write of how a call ended.
        Store { step: StoreStep },
        // The call may run; waiting for the service to be ready.
        Ready,
    }
}

/// Where an admitted call's outcome goes.
#[derive(Debug)]
pub(super) struct OutcomeReport {
    history: SharedHistory,
    seq: u64,
    /// Set for result-aware calls, whose answers are digested.
    answers: Option<Answers>,
}

impl OutcomeReport {
    pub(super) fn new(history: SharedHistory, seq: u64, answers: Option<Answers>) -> Self {
        OutcomeReport {
            history,
            seq,
            answers,
        }
    }

    fn record(self, result: &Result<ToolOutput, ToolError>) {
        let answers = self.answers.as_ref().map(Answers::parts);
        let outcome = Monitor::outcome_of(answers, result, self.seq);
        lock(&self.history).record_outcome(self.seq, outcome, tokio::time::Instant::now());
    }
}

impl<S, F> ResponseFuture<S, F> {
    pub(super) fn rejected(error: ToolError) -> Self {
        ResponseFuture::in_state(State::Rejected { error: Some(error) })
    }

    pub(super) fn called(future: F, report: OutcomeReport) -> Self {
        ResponseFuture::in_state(State::Called {
            future,
            report: Some(report),
        })
    }

    /// The inner call, untracked: detection is off for it, or the layer is in shadow mode
    /// and the call would have been refused.
    pub(super) fn passthrough(future: Passthrough<F>) -> Self {
        ResponseFuture::in_state(State::Passthrough { future })
    }

    fn in_state(state: State<F>) -> Self {
        ResponseFuture {
            state,
            pending: None,
        }
    }
}

impl<S, F> Future for ResponseFuture<S, F>
where
    S: tower_service::Service<ToolCall, Response = ToolOutput, Error = ToolError, Future = F>,
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                Projection::Rejected { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("ResponseFuture polled after completion")))
                }
                Projection::Called { future, report } => {
                    let result = ready!(future.poll(cx));
                    if let Some(report) = report.take() {
                        report.record(&result);
                    }
                    if let Some(pending) = this.pending.as_mut() {
                        if let Some(step) = pending.finished(&result) {
                            this.state.set(State::Store { step });
                            pending.result = Some(result);
                            continue;
                        }
                    }
                    return Poll::Ready(result);
                }
                Projection::Passthrough { future } => return future.poll(cx),
                Projection::Store { step } => {
                    let answer = ready!(step.poll(cx));
                    let pending = this.pending.as_mut().expect("a stored call is pending");
                    match pending.next(answer) {
                        Next::Done(result) => return Poll::Ready(result),
                        Next::State(state) => this.state.set(state),
                    }
                }
                Projection::Ready => {
                    let pending = this.pending.as_mut().expect("a ready call is pending");
                    ready!(pending.service().poll_ready(cx))?;
                    let state = pending.call();
                    this.state.set(state);
                }
            }
        }
    }
}

/// What follows a step of a call over the shared store.
enum Next<F> {
    State(State<F>),
    Done(Result<ToolOutput, ToolError>),
}

mod shared {
    //! A call whose session history is in the shared store.

    use super::*;
    use crate::loop_detect::detector::{Decision, Outcome};
    use crate::loop_detect::service::{Judgement, SharedCheck};
    use crate::loop_detect::store::{Observed, Settled, Tracked};
    use crate::outcome::ShadowDecision;
    use crate::shared_store::StoreError;
    use crate::shared_store::StoreFuture;

    const LAYER: &str = "loop_detect";

    /// A store operation on its way.
    pub(in crate::loop_detect) enum StoreStep {
        Observe(StoreFuture<'static, Observed>),
        Settle(StoreFuture<'static, ()>),
    }

    /// What a store step answered: matched as soon as it is polled, never kept, so its size
    /// costs nothing that boxing the large variant would save.
    #[allow(clippy::large_enum_variant)]
    pub(in crate::loop_detect) enum Answer {
        Observed(Result<Observed, StoreError>),
        Settled(Result<(), StoreError>),
    }

    impl StoreStep {
        pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
            match self {
                StoreStep::Observe(observe) => observe.as_mut().poll(cx).map(Answer::Observed),
                StoreStep::Settle(settle) => settle.as_mut().poll(cx).map(Answer::Settled),
            }
        }
    }

    /// The call, the ready service that will make it, and what the store said so far.
    pub(in crate::loop_detect) struct Pending<S> {
        service: Option<S>,
        call: Option<ToolCall>,
        session: String,
        check: SharedCheck,
        monitor: Arc<Monitor>,
        /// The call's sequence number in its session, once observed.
        seq: Option<u64>,
        /// When the call came (Unix ms), and how the previous identical call ended and
        /// since when its answer had been the same, once observed.
        streak: (u64, Option<(Outcome, u64)>),
        /// Run the call over its loop, in shadow mode.
        shadow: Option<ShadowDecision>,
        /// Refuse the call with this error once its refusal is written.
        refusal: Option<ToolError>,
        /// The call's result, while how it ended is written.
        pub(super) result: Option<Result<ToolOutput, ToolError>>,
    }

    impl<S> Pending<S> {
        pub(super) fn service(&mut self) -> &mut S {
            self.service
                .as_mut()
                .expect("the service is kept until the call")
        }

        /// Makes the call: tracked when admitted, untracked otherwise.
        pub(super) fn call<F>(&mut self) -> State<F>
        where
            S: tower_service::Service<
                ToolCall,
                Response = ToolOutput,
                Error = ToolError,
                Future = F,
            >,
        {
            let mut service = self.service.take().expect("the call is made once");
            let call = self.call.take().expect("the call is made once");
            let future = service.call(call);
            match (self.shadow.take(), self.seq) {
                (Some(decision), _) => State::Passthrough {
                    future: Passthrough::shadowed(future, decision),
                },
                (None, Some(_)) => State::Called {
                    future,
                    report: None,
                },
                (None, None) => State::Passthrough {
                    future: Passthrough::new(future),
                },
            }
        }

        /// How the admitted call ended, to write when the session's rules need it: a
        /// failure, or a poller's result.
        pub(super) fn finished(
            &mut self,
            result: &Result<ToolOutput, ToolError>,
        ) -> Option<StoreStep> {
            let seq = self.seq.take()?;
            let result_aware = self.check.call.below.limits.result_aware;
            if result.is_ok() && !result_aware && self.check.call.facts.resend.is_none() {
                // A success reads as a pending call to every rule but those that read
                // answers or when a call ended.
                return None;
            }
            let answers = result_aware.then_some((&*self.monitor, &*self.check.noise));
            let outcome = Monitor::outcome_of(answers, result, seq);
            let (at_ms, previous) = self.streak;
            let since_ms = match previous {
                Some((answered, since)) if answered == outcome => since,
                _ => at_ms,
            };
            Some(StoreStep::Settle(self.check.store.finish(
                &self.session,
                seq,
                Settled::Done { outcome, since_ms },
                None,
            )))
        }

        /// The next state after a store step answered.
        pub(super) fn next<F>(&mut self, answer: Answer) -> Next<F> {
            match answer {
                Answer::Observed(Ok(observed)) => {
                    self.monitor.outages.succeeded(LAYER);
                    self.judge(observed)
                }
                Answer::Observed(Err(error)) => match self.monitor.outages.failed(LAYER, &error) {
                    Ok(()) => Next::State(State::Ready),
                    Err(refusal) => Next::State(State::Rejected {
                        error: Some(refusal),
                    }),
                },
                Answer::Settled(written) => {
                    match written {
                        Ok(()) => self.monitor.outages.succeeded(LAYER),
                        // The call goes on (or its answer goes back): the failure policy
                        // concerns checks, not the record of a call already decided.
                        Err(error) => self.monitor.outages.unreachable(LAYER, &error),
                    }
                    if let Some(result) = self.result.take() {
                        return Next::Done(result);
                    }
                    match self.refusal.take() {
                        Some(error) => Next::Done(Err(error)),
                        None => Next::State(State::Ready),
                    }
                }
            }
        }

        /// Judges the call on the settings and history the store answered.
        fn judge<F>(&mut self, observed: Observed) -> Next<F> {
            let Observed { settings, tracked } = observed;
            let sessions = &self.monitor.tiers.sessions;
            if sessions.get(&self.session).unwrap_or_default() != settings {
                // Set through another replica: this one reads them the same from now on.
                sessions.update(&self.session, |_| settings.clone());
            }
            let Some(Tracked {
                decision,
                seq,
                chance,
                at_ms,
                previous,
            }) = tracked
            else {
                // The session switched detection off: the call runs untracked.
                return Next::State(State::Ready);
            };
            let check = &self.check;
            let (_, limits) = check.call.under(&settings);
            let call = self
                .call
                .as_ref()
                .expect("the call is judged before it is made");
            // Only a refusal logs the params: read them again then (they are cached).
            let canonical = match decision {
                Decision::Reject(_) => call
                    .params()
                    .canonical(&self.monitor.canonical)
                    .unwrap_or_default(),
                Decision::Admit(_) | Decision::Resend => std::borrow::Cow::Borrowed(""),
            };
            let judgement =
                self.monitor
                    .judge(call, decision, &limits, check.call.signature(), &canonical);
            match judgement {
                Judgement::Admit(_) => {
                    self.seq = Some(seq);
                    self.streak = (at_ms, previous);
                    return Next::State(State::Ready);
                }
                // The idempotency layer behind answers it: the store forgets it as a call.
                Judgement::Resend => {
                    let settle = check
                        .store
                        .finish(call.session_key(), seq, Settled::Resent, None);
                    return Next::State(State::Store {
                        step: StoreStep::Settle(settle),
                    });
                }
                Judgement::Refuse(error) => self.refusal = Some(error),
                Judgement::Shadow(decision) => self.shadow = Some(decision),
            }
            let settle = check
                .store
                .finish(call.session_key(), seq, Settled::Rejected, chance);
            Next::State(State::Store {
                step: StoreStep::Settle(settle),
            })
        }
    }

    impl<S, F> ResponseFuture<S, F> {
        /// A call whose session history the shared store holds: asks it first.
        pub(in crate::loop_detect) fn shared(
            service: S,
            call: ToolCall,
            check: SharedCheck,
            monitor: Arc<Monitor>,
        ) -> Self {
            let observe = check.store.check(call.session_key(), check.call);
            ResponseFuture {
                state: State::Store {
                    step: StoreStep::Observe(observe),
                },
                pending: Some(Box::new(Pending {
                    session: call.session_key().to_owned(),
                    service: Some(service),
                    call: Some(call),
                    check,
                    monitor,
                    seq: None,
                    streak: (0, None),
                    shadow: None,
                    refusal: None,
                    result: None,
                })),
            }
        }
    }
}

impl<S, F> std::fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
