use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

use super::policy::{caller_retries, give_up, retry_safety, CallLimits, GiveUp, History, Narrowed};
use super::service::ToolRetry;
use crate::classify::Verdict;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::{CallRecord, RetryRecord, ShadowDecision, ToolOutput};
use crate::redact::identifier;
use crate::spans;
use crate::time::millis;

pin_project! {
    /// The response future of [`Retry`](super::Retry): attempts, backoff sleeps between them,
    /// and the deadline over both.
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
        Attempt { #[pin] future: F, span: Span },
        Backoff { sleep: Pin<Box<Sleep>>, span: Span },
        // Waiting for the service to be ready for the next attempt.
        Ready,
        Done,
    }
}

/// What a retried call keeps between attempts.
struct Run<S> {
    service: S,
    call: ToolCall,
    tool: Arc<ToolRetry>,
    /// The attempt running or last run, 1-based.
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
        ResponseFuture {
            kind: Kind::Retrying {
                step: Step::Attempt { future, span },
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
                StepProj::Attempt { future, span } => match span.in_scope(|| future.poll(cx)) {
                    Poll::Ready(Ok(output)) => {
                        step.set(Step::Done);
                        return Poll::Ready(Ok(run.succeeded(output)));
                    }
                    Poll::Ready(Err(error)) => match run.failed(error) {
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
                    Poll::Pending => {
                        if let Poll::Ready(error) = run.poll_deadline(cx, true) {
                            step.set(Step::Done);
                            return Poll::Ready(Err(error));
                        }
                        return Poll::Pending;
                    }
                },
                StepProj::Backoff { sleep, span } => {
                    ready!(span.in_scope(|| sleep.as_mut().poll(cx)));
                    step.set(Step::Ready);
                }
                StepProj::Ready => {
                    if let Poll::Ready(error) = run.poll_deadline(cx, false) {
                        step.set(Step::Done);
                        return Poll::Ready(Err(error));
                    }
                    match ready!(run.service.poll_ready(cx)) {
                        Ok(()) => {
                            let (future, span) = run.next_attempt();
                            step.set(Step::Attempt { future, span });
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
        let call = attempt_of(&self.call, self.attempt);
        let span = spans::attempt(&call);
        let future = span.in_scope(|| self.service.call(call));
        (future, span)
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

    fn succeeded(&mut self, mut output: ToolOutput) -> ToolOutput {
        self.executed += 1;
        if self.attempt > 1 {
            self.fill(output.record_mut());
        }
        self.note_clamps(output.record_mut());
        output
    }

    /// The final error of a call the layer does not retry.
    fn stopped(&mut self, mut error: ToolError) -> ToolError {
        self.fill(error.record_mut());
        self.note_clamps(error.record_mut());
        error
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
    /// call ends: `attempt_running` says whether an attempt is being cut short.
    fn poll_deadline(&mut self, cx: &mut Context<'_>, attempt_running: bool) -> Poll<ToolError> {
        if self.deadline.is_none() {
            let limits = self.limits(Instant::now());
            self.deadline = Some(Box::pin(tokio::time::sleep_until(limits.end())));
        }
        let deadline = self.deadline.as_mut().expect("armed above");
        ready!(deadline.as_mut().poll(cx));
        let now = Instant::now();
        let limits = self.limits(now);
        let why = limits.reached(now).unwrap_or(GiveUp::RetryDeadline);
        let last = if attempt_running {
            self.executed += 1;
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
