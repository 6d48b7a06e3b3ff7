use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::cell::{BreakerCell, Recorded};
use super::service::ToolBreaker;
use super::state::{CallOutcome, Ticket};
use crate::classify::Verdict;
use crate::control::ShadowLayer;
use crate::error::{ErrorCode, ToolError};
use crate::middleware::Passthrough;
use crate::outcome::{
    outcome_record_mut, BreakerState, ShadowDecision, ShadowVerdict, ShortCircuit, ToolOutput,
};

pin_project! {
    /// The response future of [`CircuitBreaker`](super::CircuitBreaker): refused with
    /// `CIRCUIT_OPEN`, or the inner call, whose outcome the breaker records.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = Projection]
    #[derive(Debug)]
    enum State<F> {
        Rejected {
            state: BreakerState,
            retry_after: Option<Duration>,
        },
        Admitted {
            #[pin]
            future: F,
            permit: Permit,
        },
        Passthrough {
            #[pin]
            future: Passthrough<F>,
        },
        Done,
    }
}

/// An admitted call's place in its breaker. Dropped without an outcome (the caller gave up on
/// the call), it frees a probe's place.
#[derive(Debug)]
struct Permit {
    tool: Arc<ToolBreaker>,
    /// The breaker of another scope than the tool's own, which `tool` holds.
    scoped: Option<Arc<BreakerCell>>,
    ticket: Option<Ticket>,
    /// Whether the breaker fails this call's session fast, as the control said on admission.
    fail_fast: bool,
}

impl Permit {
    fn cell(&self) -> &BreakerCell {
        self.scoped
            .as_deref()
            .or(self.tool.own.as_deref())
            .expect("a registered tool has its own breaker")
    }

    /// Records `outcome`, handing it back with the classifier's verdict settled in it.
    fn record(
        &mut self,
        outcome: Result<ToolOutput, ToolError>,
    ) -> (Recorded, Result<ToolOutput, ToolError>) {
        let ticket = self.ticket.take().expect("a permit records once");
        let (classification, outcome) = self
            .tool
            .classifier
            .classify_outcome(outcome, &self.tool.profile);
        let counted = match classification.verdict() {
            Verdict::Success => CallOutcome::Success,
            _ if classification.is_health_failure() => CallOutcome::Failure,
            _ => CallOutcome::Neutral,
        };
        (self.cell().record(ticket, counted), outcome)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            if ticket.is_probe() {
                self.cell().release(ticket);
            }
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn rejected(state: BreakerState, retry_after: Option<Duration>) -> Self {
        ResponseFuture {
            state: State::Rejected { state, retry_after },
        }
    }

    pub(super) fn admitted(
        future: F,
        tool: Arc<ToolBreaker>,
        scoped: Option<Arc<BreakerCell>>,
        ticket: Ticket,
        fail_fast: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Admitted {
                future,
                permit: Permit {
                    tool,
                    scoped,
                    ticket: Some(ticket),
                    fail_fast,
                },
            },
        }
    }

    /// The inner call, not counted: the layer is switched off, or the breaker would have
    /// refused the call but does not fail calls fast.
    pub(super) fn passthrough(future: Passthrough<F>) -> Self {
        ResponseFuture {
            state: State::Passthrough { future },
        }
    }
}

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.state.as_mut().project() {
            Projection::Admitted { future, permit } => {
                let (recorded, mut outcome) = permit.record(ready!(future.poll(cx)));
                let record = outcome_record_mut(&mut outcome);
                record.breaker_state = Some(recorded.state);
                if recorded.opened && !permit.fail_fast {
                    // The transition itself is logged as when enforcing.
                    record.shadow.push(ShadowDecision::new(
                        ShadowLayer::Breaker,
                        ShadowVerdict::WouldOpen,
                    ));
                }
                this.state.set(State::Done);
                Poll::Ready(outcome)
            }
            Projection::Passthrough { future } => future.poll(cx),
            Projection::Rejected { state, retry_after } => {
                let error = circuit_open(*state, *retry_after);
                this.state.set(State::Done);
                Poll::Ready(Err(error))
            }
            Projection::Done => panic!("breaker::ResponseFuture polled after completion"),
        }
    }
}

/// The error of a call refused by a breaker in `state`.
fn circuit_open(state: BreakerState, retry_after: Option<Duration>) -> ToolError {
    let message = match state {
        BreakerState::HalfOpen => {
            "the circuit breaker is testing whether the tool recovered and admits no other call \
             now: the tool was not called; try again shortly"
        }
        BreakerState::ForcedOpen => {
            "an operator holds the circuit breaker of this tool open: the tool was not called; \
             use another tool or ask the operator"
        }
        _ => {
            "the circuit breaker is open after repeated failures of this tool or its \
             dependency: the tool was not called; try again after the cooldown or use another \
             tool"
        }
    };
    let mut error = ToolError::rejected(ErrorCode::CircuitOpen, message)
        .short_circuited(ShortCircuit::BreakerOpen);
    if let Some(after) = retry_after {
        error = error.with_retry_after(after);
    }
    error.record_mut().breaker_state = Some(state);
    error
}
