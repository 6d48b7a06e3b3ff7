use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::ToolHooks;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;

/// Runs hooks before and after every call of the inner service; made by
/// [`HookLayer`](super::HookLayer).
pub struct Hook<S, H> {
    inner: S,
    hooks: Arc<H>,
}

impl<S, H> Hook<S, H> {
    pub(super) fn new(inner: S, hooks: Arc<H>) -> Self {
        Hook { inner, hooks }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S: Clone, H> Clone for Hook<S, H> {
    fn clone(&self) -> Self {
        Hook {
            inner: self.inner.clone(),
            hooks: self.hooks.clone(),
        }
    }
}

impl<S: fmt::Debug, H: fmt::Debug> fmt::Debug for Hook<S, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hook")
            .field("inner", &self.inner)
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl<S, H> Service<ToolCall> for Hook<S, H>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
    H: ToolHooks,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ToolCall) -> Self::Future {
        match self.hooks.before_attempt(&mut call) {
            Ok(()) => {
                let attempt = self.inner.call(call.clone());
                ResponseFuture::attempt(attempt, call, self.hooks.clone())
            }
            Err(error) => {
                let outcome = Err(error.into_rejection());
                self.hooks.after_attempt(&call, &outcome);
                ResponseFuture::rejected(outcome)
            }
        }
    }
}
