//! Pieces every middleware service of the crate shares.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use crate::control::ShadowLayer;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::{outcome_record_mut, ShadowDecision, ShadowVerdict, ToolOutput};

/// The `get_ref`, `get_mut` and `into_inner` of a middleware service whose inner service `S`
/// is its `inner` field.
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, by value.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

pub(crate) use inner_service_accessors;

pin_project! {
    /// The inner service's future, answered exactly as the inner service answers: the path of
    /// a layer that does not act on a call, because the operator switched every layer off,
    /// the tool's policy switches the layer off, or the layer is in shadow mode. In shadow
    /// mode the decision the layer would have enforced is added to the call's record.
    #[derive(Debug)]
    pub(crate) struct Passthrough<F> {
        #[pin]
        future: F,
        shadow: Option<ShadowDecision>,
    }
}

impl<F> Passthrough<F> {
    /// The inner call, untouched.
    pub(crate) fn new(future: F) -> Self {
        Passthrough {
            future,
            shadow: None,
        }
    }

    /// The inner call, run although a layer in shadow mode decided otherwise (see
    /// [`shadow_decision`]); the decision is added to the call's record when it ends.
    pub(crate) fn shadowed(future: F, decision: ShadowDecision) -> Self {
        Passthrough {
            future,
            shadow: Some(decision),
        }
    }
}

impl<F> Future for Passthrough<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut outcome = ready!(this.future.poll(cx));
        if let Some(decision) = this.shadow.take() {
            outcome_record_mut(&mut outcome).shadow.push(decision);
        }
        Poll::Ready(outcome)
    }
}

/// What `layer`, in shadow mode, would have done to `call`, logged at DEBUG where it decides.
pub(crate) fn shadow_decision(
    call: &ToolCall,
    layer: ShadowLayer,
    verdict: ShadowVerdict,
) -> ShadowDecision {
    tracing::debug!(
        request_id = &*crate::redact::identifier(call.request_id()),
        tool = call.tool_name(),
        layer = layer.as_str(),
        decision = verdict.as_str(),
        "layer in shadow mode let the call through"
    );
    ShadowDecision::new(layer, verdict)
}
