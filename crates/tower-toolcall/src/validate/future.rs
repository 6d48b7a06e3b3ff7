use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use crate::error::ToolError;
use crate::outcome::{ShortCircuit, ToolOutput};
use crate::registry::RegisteredTool;

pin_project! {
    /// The response future of [`EnvelopeValidate`](super::EnvelopeValidate): rejected with an
    /// error, or the inner call with an optional output check.
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
            output_schema: Option<Arc<RegisteredTool>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn rejected(error: ToolError) -> Self {
        let error = error.short_circuited(ShortCircuit::ValidationRejected);
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
        }
    }

    /// The inner call, unchecked: the layer is switched off.
    pub(super) fn passthrough(future: F) -> Self {
        ResponseFuture::called(future, None)
    }

    pub(super) fn called(future: F, output_schema: Option<Arc<RegisteredTool>>) -> Self {
        ResponseFuture {
            state: State::Called {
                future,
                output_schema,
            },
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
            Projection::Called {
                future,
                output_schema,
            } => {
                let result = ready!(future.poll(cx));
                let Some(tool) = output_schema.as_ref() else {
                    return Poll::Ready(result);
                };
                let mut output = result?;
                Poll::Ready(match tool.check_output(&output.content) {
                    Ok(()) => Ok(output),
                    Err(mut error) => {
                        *error.record_mut() = output.take_record();
                        Err(error)
                    }
                })
            }
        }
    }
}
