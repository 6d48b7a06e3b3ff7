use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::detector::Outcome;
use super::service::Monitor;
use super::tracker::{lock, SharedHistory};
use crate::error::ToolError;
use crate::middleware::Passthrough;
use crate::outcome::ToolOutput;

pin_project! {
    /// The response future of [`LoopDetect`](super::LoopDetect): refused with
    /// `LOOP_DETECTED`, the inner call, whose outcome is reported to the session's history,
    /// or the inner call untracked.
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
        Rejected { error: Option<ToolError> },
        Called {
            #[pin]
            future: F,
            report: Option<OutcomeReport>,
        },
        Passthrough { #[pin] future: Passthrough<F> },
    }
}

/// Where an admitted call's outcome goes.
#[derive(Debug)]
pub(super) struct OutcomeReport {
    history: SharedHistory,
    seq: u64,
    /// Set for pollers, whose outputs are fingerprinted.
    results: Option<Arc<Monitor>>,
}

impl OutcomeReport {
    pub(super) fn new(history: SharedHistory, seq: u64, results: Option<Arc<Monitor>>) -> Self {
        OutcomeReport {
            history,
            seq,
            results,
        }
    }

    fn record(self, result: &Result<ToolOutput, ToolError>) {
        let outcome = match result {
            Ok(output) => Outcome::Succeeded(
                self.results
                    .as_ref()
                    .map_or(0, |monitor| monitor.result_fingerprint(output, self.seq)),
            ),
            Err(error) => Outcome::Failed(error.code()),
        };
        lock(&self.history).record_outcome(self.seq, outcome);
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn rejected(error: ToolError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
        }
    }

    pub(super) fn called(future: F, report: OutcomeReport) -> Self {
        ResponseFuture {
            state: State::Called {
                future,
                report: Some(report),
            },
        }
    }

    /// The inner call, untracked: detection is off for it, or the layer is in shadow mode
    /// and the call would have been refused.
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
        match self.project().state.project() {
            Projection::Rejected { error } => Poll::Ready(Err(error
                .take()
                .expect("ResponseFuture polled after completion"))),
            Projection::Called { future, report } => {
                let result = ready!(future.poll(cx));
                if let Some(report) = report.take() {
                    report.record(&result);
                }
                Poll::Ready(result)
            }
            Projection::Passthrough { future } => future.poll(cx),
        }
    }
}
