use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

use super::hedge::{hedge_delay, Hedging};
use super::policy::{
    caller_retries, give_up, repeat_safety, retry_safety, CallLimits, GiveUp, History, Narrowed,
};
use super::service::ToolRetry;
use crate::classify::Verdict;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::{CallRecord, HedgeRecord, RetryRecord, ShadowDecision, ToolOutput};
use crate::redact::identifier;
use crate::spans;
use crate::time::millis;

pin_project! {
    /// The response future of [`Retry`](super::Retry): attempts (with a hedge beside a slow
    /// one), backoff sleeps between them, and the deadline over both.
    pub struct ResponseFuture<S, F> {
        #[pin]
        kind: Kind<S, F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, F> {
        // The layer is switched off: by the operator, or by the tool's policy.
        Passthrough { #[pin] future: F },
        // Rejected before the first attempt.
        Expired { error: Option<ToolError> },
        Retrying {
            #[pin]
            step: Step<F>,
            run: Run<S>,
        },
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<F> {
        // An attempt, and the hedge sent beside it once there is one.
        Attempt { #[pin] first: Slot<F>, #[pin] hedge: Slot<F> },
        Backoff { sleep: Pin<Box<Sleep>>, span: Span },
        // Waiting for the service to be ready for the next attempt.
        Ready,
        Done,
    }
}

pin_project! {
    /// One attempt in flight, or none.
    #[project = SlotProj]
    enum Slot<F> {
        Idle,
        Running { #[pin] future: F, span: Span, attempt: u32 },
    }
}

impl<F> Slot<F> {
    fn is_running(&self) -> bool {
        matches!(self, Slot::Running { .. })
    }
}

/// What polling the attempts in flight gave.
enum Polled {
    /// One answered: the call's answer.
    Answered(ToolOutput),
    /// The last one running failed.
    Failed(ToolError),
    /// This many still run.
    Pending(u32),
}

/// What a retried call keeps between attempts.
struct Run<S> {
    service: S,
    call: ToolCall,
    tool: Arc<ToolRetry>,
    /// The attempt started last, 1-based (a hedge is an attempt).
    attempt: u32,
    /// Attempts that ran the tool (a layer below may refuse one).
    executed: u32,
    /// Whether an attempt may have reached the tool: one whose failure does not say the
    /// request went unprocessed.
    reached: bool,
    attempt_started: Option<Instant>,
    /// Resolved at the first failure or wait of the first attempt, so that an attempt that
    /// succeeds at once reads no clock.
    limits: Option<CallLimits>,
    /// The deadline over attempts and sleeps, armed when the call first waits.
    deadline: Option<Pin<Box<Sleep>>>,
    retried_by: Vec<RetryRecord>,
    /// What layers in shadow mode would have done to the attempts that failed and were
    /// retried; the final record lists them before those of the last attempt.
    shadow: Vec<ShadowDecision>,
    previous_delay: Option<Duration>,
    /// The error of the latest failed attempt, while the next one is prepared.
    last_error: Option<ToolError>,
    hedging: Hedging,
}

/// What follows a failed attempt.
enum Next {
    Stop(ToolError),
    Sleep(Duration),
}

impl<S, F> ResponseFuture<S, F> {
    pub(super) fn passthrough(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    pub(super) fn expired(error: ToolError) -> Self {
        ResponseFuture {
            kind: Kind::Expired { error: Some(error) },
        }
    }

    pub(super) fn first_attempt(
        mut service: S,
        call: ToolCall,
        tool: Arc<ToolRetry>,
        limits: Option<CallLimits>,
    ) -> Self
    where
        S: Service<ToolCall, Future = F>,
    {
        let first = attempt_of(&call, 1);
        let span = spans::attempt(&first);
        let future = span.in_scope(|| service.call(first));
        let hedging = if tool.policy.hedges() {
            Hedging::Unarmed
        } else {
            Hedging::Never
        };
        ResponseFuture {
            kind: Kind::Retrying {
                step: Step::running(future, span, 1),
                run: Run {
                    service,
                    call,
                    tool,
                    attempt: 1,
                    executed: 0,
                    reached: false,
                    attempt_started: None,
                    limits,
                    deadline: None,
                    retried_by: Vec::new(),
                    shadow: Vec::new(),
                    previous_delay: None,
                    last_error: None,
                    hedging,
                },
            },
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
        let (mut step, run) = match self.project().kind.project() {
            KindProj::Passthrough { future } => return future.poll(cx),
            KindProj::Expired { error } => {
                return Poll::Ready(Err(error
                    .take()
                    .expect("retry::ResponseFuture polled after completion")))
            }
            KindProj::Retrying { step, run } => (step, run),
        };
        loop {
            match step.as_mut().project() {
                StepProj::Attempt {
                    mut first,
                    mut hedge,
                } => match run.poll_attempts(cx, first.as_mut(), hedge.as_mut()) {
                    Polled::Answered(output) => {
                        step.set(Step::Done);
                        return Poll::Ready(Ok(output));
                    }
                    Polled::Failed(error) => match run.failed(error) {
                        Next::Stop(error) => {
                            step.set(Step::Done);
                            return Poll::Ready(Err(error));
                        }
                        Next::Sleep(delay) => {
                            let span = spans::backoff(&run.call, run.attempt, delay);
                            let sleep = Box::pin(tokio::time::sleep(delay));
                            step.set(Step::Backoff { sleep, span });
                        }
                    },
                    Polled::Pending(running) => {
                        if let Poll::Ready(error) = run.poll_deadline(cx, running) {
                            step.set(Step::Done);
                            return Poll::Ready(Err(error));
                        }
                        let Some((future, span, attempt)) = run.poll_hedge(cx) else {
                            return Poll::Pending;
                        };
                        hedge.set(Slot::Running {
                            future,
                            span,
                            attempt,
                        });
                    }
                },
                StepProj::Backoff { sleep, span } => {
                    ready!(span.in_scope(|| sleep.as_mut().poll(cx)));
                    step.set(Step::Ready);
                }
                StepProj::Ready => {
                    if let Poll::Ready(error) = run.poll_deadline(cx, 0) {
                        step.set(Step::Done);
                        return Poll::Ready(Err(error));
                    }
                    match ready!(run.service.poll_ready(cx)) {
                        Ok(()) => {
                            let (future, span) = run.next_attempt();
                            step.set(Step::running(future, span, run.attempt));
                        }
                        Err(error) => {
                            step.set(Step::Done);
                            return Poll::Ready(Err(run.stopped(error)));
                        }
                    }
                }
                StepProj::Done => panic!("retry::ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S> Run<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    fn next_attempt(&mut self) -> (S::Future, Span) {
        self.attempt += 1;
        self.attempt_started = Some(Instant::now());
        if matches!(self.hedging, Hedging::Armed { .. } | Hedging::Due { .. }) {
            self.hedging = Hedging::Unarmed;
        }
        let call = attempt_of(&self.call, self.attempt);
        let span = spans::attempt(&call);
        let future = span.in_scope(|| self.service.call(call));
        (future, span)
    }

    /// Polls the attempts in flight: the first answer is the call's (the other attempt is
    /// then dropped with the step); a failure while the other still runs is noted, and the
    /// call waits for the other.
    fn poll_attempts(
        &mut self,
        cx: &mut Context<'_>,
        first: Pin<&mut Slot<S::Future>>,
        hedge: Pin<&mut Slot<S::Future>>,
    ) -> Polled {
        let mut running = u32::from(first.is_running()) + u32::from(hedge.is_running());
        for mut slot in [first, hedge] {
            let SlotProj::Running {
                future,
                span,
                attempt,
            } = slot.as_mut().project()
            else {
                continue;
            };
            let attempt = *attempt;
            match span.in_scope(|| future.poll(cx)) {
                Poll::Pending => {}
                Poll::Ready(Ok(output)) => {
                    return Polled::Answered(self.succeeded(output, running - 1, attempt));
                }
                Poll::Ready(Err(error)) => {
                    slot.set(Slot::Idle);
                    running -= 1;
                    if running == 0 {
                        return Polled::Failed(error);
                    }
                    self.lost(error);
                }
            }
        }
        Polled::Pending(running)
    }

    /// Moves the call's hedge on while its attempt runs: arms it when a repeat is safe,
    /// waits for its delay, then for the service to be ready; returns the hedge when it is
    /// sent. Refused (no attempt left, the breaker not closed, the budget spent) it is never
    /// sent.
    fn poll_hedge(&mut self, cx: &mut Context<'_>) -> Option<(S::Future, Span, u32)> {
        loop {
            match &mut self.hedging {
                Hedging::Never | Hedging::Sent { .. } => return None,
                Hedging::Unarmed => {
                    let tool = &self.tool;
                    // Two attempts of a call whose caller reads chunks would both send them.
                    let safe = match self.call.chunk_tap() {
                        Some(_) => Err("the caller reads the answer in chunks"),
                        None => repeat_safety(&tool.profile, &tool.policy, &self.call),
                    };
                    let delay = hedge_delay(&tool.policy, tool.latencies.as_ref());
                    let (Ok(()), Some(delay)) = (safe, delay) else {
                        self.hedging = Hedging::Never;
                        return None;
                    };
                    let started = self.attempt_started.unwrap_or_else(Instant::now);
                    let sleep = Box::pin(tokio::time::sleep_until(started + delay));
                    self.hedging = Hedging::Armed { sleep, delay };
                }
                Hedging::Armed { sleep, delay } => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return None;
                    }
                    self.hedging = Hedging::Due { delay: *delay };
                }
                Hedging::Due { delay } => {
                    let delay = *delay;
                    match self.service.poll_ready(cx) {
                        Poll::Pending => return None,
                        Poll::Ready(Err(_)) => {
                            self.hedging = Hedging::Never;
                            return None;
                        }
                        Poll::Ready(Ok(())) => {}
                    }
                    if let Err(why) = self.may_hedge() {
                        tracing::debug!(
                            requestId = &*identifier(self.call.request_id()),
                            toolName = self.call.tool_name(),
                            why,
                            "slow attempt not hedged"
                        );
                        self.hedging = Hedging::Never;
                        return None;
                    }
                    let hedged = self.attempt;
                    self.attempt += 1;
                    self.hedging = Hedging::Sent {
                        attempt: hedged,
                        delay,
                    };
                    self.tool.hedges.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        event = "tool_call_hedge",
                        requestId = &*identifier(self.call.request_id()),
                        toolName = self.call.tool_name(),
                        sessionKey = &*identifier(self.call.session_key()),
                        attempt = hedged,
                        delayMs = millis(delay),
                        "hedging a slow tool call"
                    );
                    let call = attempt_of(&self.call, self.attempt);
                    let span = spans::attempt(&call);
                    let future = span.in_scope(|| self.service.call(call));
                    return Some((future, span, self.attempt));
                }
            }
        }
    }

    /// Whether the hedge may go now: an attempt is left, the breaker over the call is closed
    /// (a hedge is never a probe), and the global retry budget pays for it.
    fn may_hedge(&mut self) -> Result<(), &'static str> {
        let now = Instant::now();
        if self.attempt >= self.limits(now).max_attempts {
            return Err("no attempt is left");
        }
        let tool = &self.tool;
        if tool
            .breakers
            .as_ref()
            .is_some_and(|b| !b.0.closed_for(&self.call))
        {
            return Err("the breaker over the call is not closed");
        }
        if tool.budget.as_ref().is_some_and(|b| !b.try_withdraw(now)) {
            return Err("the retry budget is spent");
        }
        Ok(())
    }
}

impl<F> Step<F> {
    /// Attempt `attempt` running, without a hedge.
    fn running(future: F, span: Span, attempt: u32) -> Self {
        Step::Attempt {
            first: Slot::Running {
                future,
                span,
                attempt,
            },
            hedge: Slot::Idle,
        }
    }
}

/// The call of attempt `attempt` (1-based): a copy of `call` numbered for the layers and hooks
/// below.
fn attempt_of(call: &ToolCall, attempt: u32) -> ToolCall {
    let mut call = call.clone();
    call.set_attempt(attempt);
    call
}

impl<S> Run<S> {
    /// The call's limits, resolved the first time with the first attempt's start.
    fn limits(&mut self, now: Instant) -> CallLimits {
        let started = *self.attempt_started.get_or_insert(now);
        *self
            .limits
            .get_or_insert_with(|| CallLimits::new(&self.tool.policy, &self.call, started))
    }

    /// The answer of attempt `winner`; `others` attempts still ran and are dropped.
    fn succeeded(&mut self, mut output: ToolOutput, others: u32, winner: u32) -> ToolOutput {
        self.executed += 1 + others;
        if let Some(latencies) = &self.tool.latencies {
            let now = Instant::now();
            latencies.record(now.saturating_duration_since(self.attempt_started.unwrap_or(now)));
        }
        if self.attempt > 1 {
            self.fill(output.record_mut());
        }
        self.note_hedge(output.record_mut(), Some(winner));
        self.note_clamps(output.record_mut());
        output
    }

    /// Notes a failed attempt while another still runs.
    fn lost(&mut self, mut error: ToolError) {
        if !error.is_rejected() {
            self.executed += 1;
        }
        self.reached |= !error.is_not_processed();
        self.shadow.append(&mut error.record_mut().shadow);
    }

    /// The final error of a call the layer does not retry.
    fn stopped(&mut self, mut error: ToolError) -> ToolError {
        self.fill(error.record_mut());
        self.note_hedge(error.record_mut(), None);
        self.note_clamps(error.record_mut());
        error
    }

    /// Writes the hedge, when one was sent, into the record: `winner` answered.
    fn note_hedge(&self, record: &mut CallRecord, winner: Option<u32>) {
        if let Hedging::Sent { attempt, delay } = self.hedging {
            record.hedge = Some(HedgeRecord::new(attempt, millis(delay), winner));
        }
    }

    /// Lists in the record the fields of the caller's retry policy that asked for more than
    /// the tool allows.
    fn note_clamps(&self, record: &mut CallRecord) {
        if let Some(caller) = &self.call.transport().retry_policy {
            record.retry_clamped = Narrowed::of(&self.tool.policy, Some(caller)).clamped;
        }
    }

    /// Writes the attempts, the retries and the shadow decisions of the earlier attempts
    /// into the record of a retried call (a retry was scheduled, even one whose attempt the
    /// service's failed readiness kept from running); a call that ran once and was not
    /// retried keeps its record as the layers below left it.
    fn fill(&mut self, record: &mut CallRecord) {
        if self.attempt > 1 || !self.retried_by.is_empty() {
            record.attempts = Some(self.executed);
            record.retried_by = std::mem::take(&mut self.retried_by);
            self.carry_shadow(record);
        }
    }

    /// Puts the shadow decisions of the earlier attempts before those of the last one.
    fn carry_shadow(&mut self, record: &mut CallRecord) {
        if !self.shadow.is_empty() {
            let last = std::mem::replace(&mut record.shadow, std::mem::take(&mut self.shadow));
            record.shadow.extend(last);
        }
    }

    fn give_up(&mut self, why: GiveUp, last: ToolError, cut_short: bool) -> ToolError {
        let limits = self.limits.expect("limits are resolved before giving up");
        let history = History {
            attempts: self.executed,
            reached: self.reached,
            retried_by: std::mem::take(&mut self.retried_by),
            cut_short,
        };
        let mut error = give_up(why, last, &self.call, &limits, history);
        self.carry_shadow(error.record_mut());
        self.note_hedge(error.record_mut(), None);
        self.note_clamps(error.record_mut());
        error
    }

    /// Decides what follows a failed attempt.
    fn failed(&mut self, error: ToolError) -> Next {
        let now = Instant::now();
        let limits = self.limits(now);
        let latency = now.saturating_duration_since(self.attempt_started.unwrap_or(now));
        if !error.is_rejected() {
            self.executed += 1;
        }
        self.reached |= !error.is_not_processed();
        let tool = self.tool.clone();
        let (classification, mut error) = tool.classifier.classify_error(error, &tool.profile);
        if classification.verdict() != Verdict::Retriable
            || !caller_retries(&self.call, error.code())
        {
            return Next::Stop(self.stopped(error));
        }
        if let Err(why) = retry_safety(&tool.profile, &tool.policy, &self.call, &error) {
            tracing::debug!(
                requestId = &*identifier(self.call.request_id()),
                toolName = self.call.tool_name(),
                errorCode = error.code().as_str(),
                why,
                "retriable failure not retried"
            );
            return Next::Stop(self.stopped(error));
        }
        if self.attempt >= limits.max_attempts {
            return Next::Stop(self.give_up(GiveUp::MaxAttempts, error, false));
        }
        let delay = error.retry_after().unwrap_or_else(|| {
            tool.rng
                .delay(&limits.backoff, self.attempt, self.previous_delay)
        });
        if let Some(why) = limits.reached(now + delay) {
            return Next::Stop(self.give_up(why, error, false));
        }
        if let Some(budget) = &tool.budget {
            if !budget.try_withdraw(now) {
                return Next::Stop(self.give_up(GiveUp::RetryBudget, error, false));
            }
        }
        tracing::info!(
            event = "tool_call_retry",
            requestId = &*identifier(self.call.request_id()),
            toolName = self.call.tool_name(),
            sessionKey = &*identifier(self.call.session_key()),
            attempt = self.attempt,
            delayMs = millis(delay),
            errorCode = error.code().as_str(),
            reason = classification.reason(),
            "retrying tool call"
        );
        self.retried_by.push(RetryRecord {
            attempt: self.attempt,
            delay_ms: millis(delay),
            reason_code: classification.reason().to_owned(),
            latency_ms: millis(latency),
        });
        self.previous_delay = Some(delay);
        self.shadow.append(&mut error.record_mut().shadow);
        self.last_error = Some(error);
        Next::Sleep(delay)
    }

    /// Polls the deadline over the call, arming it the first time. When it has passed, the
    /// call ends: `running` attempts (a hedge is one) are cut short.
    fn poll_deadline(&mut self, cx: &mut Context<'_>, running: u32) -> Poll<ToolError> {
        if self.deadline.is_none() {
            let limits = self.limits(Instant::now());
            self.deadline = Some(Box::pin(tokio::time::sleep_until(limits.end())));
        }
        let deadline = self.deadline.as_mut().expect("armed above");
        ready!(deadline.as_mut().poll(cx));
        let now = Instant::now();
        let limits = self.limits(now);
        let why = limits.reached(now).unwrap_or(GiveUp::RetryDeadline);
        let attempt_running = running > 0;
        let last = if attempt_running {
            self.executed += running;
            self.reached = true;
            let started = self.attempt_started.unwrap_or(now);
            ToolError::timeout(now.saturating_duration_since(started))
        } else {
            self.last_error
                .take()
                .expect("a failed attempt precedes every wait between attempts")
        };
        Poll::Ready(self.give_up(why, last, attempt_running))
    }
}

impl<S, F> std::fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
