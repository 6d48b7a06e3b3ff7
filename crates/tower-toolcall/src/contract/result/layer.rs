use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::ToolResult;
use crate::contract::envelope::ToolCall;
use crate::contract::error::ToolError;
use crate::contract::outcome::ToolOutput;

/// Turns a tool stack into a service that answers every call with a [`ToolResult`]
/// envelope, its duration measured here. Put it outermost, at the edge where results go
/// back to the agent.
///
/// ```
/// use serde_json::json;
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_toolcall::{tool_fn, ResultEnvelopeLayer, ResultStatus, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let mut svc = ServiceBuilder::new()
///     .layer(ResultEnvelopeLayer::new())
///     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("done"))) }));
/// let call = ToolCall::builder("ns", "tool").session("s").actor("u").build().unwrap();
/// let result = svc.ready().await.unwrap().call(call).await.unwrap();
/// assert_eq!(result.status, ResultStatus::Success);
/// # });
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ResultEnvelopeLayer {
    _priv: (),
}

impl ResultEnvelopeLayer {
    /// The layer.
    pub fn new() -> Self {
        ResultEnvelopeLayer { _priv: () }
    }
}

impl<S> Layer<S> for ResultEnvelopeLayer {
    type Service = ResultEnvelope<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ResultEnvelope {
            inner,
            not_ready: None,
        }
    }
}

/// The service of [`ResultEnvelopeLayer`].
///
/// It is always ready: when the inner service's readiness fails, the error is kept and the
/// next call is answered with it as an error envelope, without calling the inner service;
/// the call after that polls the inner service's readiness again.
#[derive(Debug)]
pub struct ResultEnvelope<S> {
    inner: S,
    /// The inner service's readiness error, kept for the next call.
    not_ready: Option<ToolError>,
}

impl<S: Clone> Clone for ResultEnvelope<S> {
    /// A clone polls the inner service's readiness for itself.
    fn clone(&self) -> Self {
        ResultEnvelope {
            inner: self.inner.clone(),
            not_ready: None,
        }
    }
}

impl<S> Service<ToolCall> for ResultEnvelope<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    type Response = ToolResult;
    type Error = Infallible;
    type Future = ResultEnvelopeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A stack whose readiness fails still answers every call with an envelope: the
        // readiness error is kept and answers the next call, which the failed service never
        // sees.
        if self.not_ready.is_none() {
            if let Err(error) = ready!(self.inner.poll_ready(cx)) {
                // The call it answers is rejected: the stack never saw it.
                self.not_ready = Some(error.into_rejection());
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let start = Instant::now();
        let future = match self.not_ready.take() {
            Some(error) => Answer::NotReady { error: Some(error) },
            None => Answer::Called {
                future: self.inner.call(call.clone()),
            },
        };
        ResultEnvelopeFuture {
            future,
            call: Some(call),
            start,
        }
    }
}

pin_project! {
    /// The response future of [`ResultEnvelope`].
    #[derive(Debug)]
    pub struct ResultEnvelopeFuture<F> {
        #[pin]
        future: Answer<F>,
        call: Option<ToolCall>,
        start: Instant,
    }
}

pin_project! {
    /// The outcome of a call: the inner service's, or the readiness error it gave instead.
    #[project = AnswerProj]
    #[derive(Debug)]
    enum Answer<F> {
        Called { #[pin] future: F },
        NotReady { error: Option<ToolError> },
    }
}

impl<F> Future for ResultEnvelopeFuture<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolResult, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut outcome = match this.future.project() {
            AnswerProj::Called { future } => ready!(future.poll(cx)),
            AnswerProj::NotReady { error } => Err(error
                .take()
                .expect("ResultEnvelopeFuture polled after completion")),
        };
        let elapsed = this.start.elapsed();
        match &mut outcome {
            Ok(output) => output.record_mut().duration = Some(elapsed),
            Err(error) => error.record_mut().duration = Some(elapsed),
        }
        let call = this
            .call
            .take()
            .expect("ResultEnvelopeFuture polled after completion");
        Poll::Ready(Ok(ToolResult::from_outcome(&call, outcome)))
    }
}
