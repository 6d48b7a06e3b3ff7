use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::CONFIRMATION_REQUIRED;
use crate::canonical::{self, CanonicalOptions};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::ToolOutput;
use crate::registry::{RegisteredTool, ToolRegistry};

/// Validates calls before the inner service sees them; made by
/// [`EnvelopeValidateLayer`](super::EnvelopeValidateLayer).
#[derive(Clone, Debug)]
pub struct EnvelopeValidate<S> {
    inner: S,
    validator: Arc<Validator>,
}

#[derive(Debug)]
pub(super) struct Validator {
    pub(super) registry: ToolRegistry,
    pub(super) canonical: CanonicalOptions,
    pub(super) max_params_bytes: usize,
    pub(super) check_output: bool,
}

impl<S> EnvelopeValidate<S> {
    pub(super) fn new(inner: S, validator: Arc<Validator>) -> Self {
        EnvelopeValidate { inner, validator }
    }

    crate::middleware::inner_service_accessors!();
}

impl Validator {
    /// Admits a call, or says why not. On admission, returns the tool whose output schema
    /// the response must satisfy, if any.
    fn admit(&self, call: &ToolCall) -> Result<Option<Arc<RegisteredTool>>, ToolError> {
        call.check()?;
        let (namespace, name) = (call.tool_namespace(), call.tool_name());
        if self.registry.is_denied(namespace, name) {
            return Err(ToolError::rejected(
                ErrorCode::PolicyDenied,
                format!("tool {namespace}::{name} is denied by policy; use another tool"),
            ));
        }
        let tool = self.registry.tool_for(call);
        let policy = match tool {
            Some(tool) => &tool.descriptor().policy,
            None if self.registry.is_open() => self.registry.unregistered_policy(),
            None => {
                return Err(ToolError::rejected(
                    ErrorCode::NotFound,
                    format!(
                        "tool {namespace}::{name} is not registered; call a registered tool \
                         or register this one"
                    ),
                ));
            }
        };
        if let Some(tool) = tool {
            let descriptor = tool.descriptor();
            if descriptor.confirmation_required
                && descriptor.risk.is_mutating()
                && call.control().confirmation_id.is_none()
            {
                return Err(ToolError::rejected(
                    ErrorCode::PolicyDenied,
                    format!(
                        "tool {namespace}::{name} ({}) needs the user's confirmation; ask for it \
                         and send its id as `control.confirmationId`",
                        descriptor.risk.as_str()
                    ),
                )
                .with_details(serde_json::json!({ "reason": CONFIRMATION_REQUIRED })));
            }
        }
        if policy.validate.is_off() {
            return Ok(None);
        }
        let overrides = policy.validate.overrides();
        let max_bytes = overrides
            .and_then(|o| o.max_params_bytes)
            .unwrap_or(self.max_params_bytes);
        canonical::check_limits(call.params().as_value(), &self.canonical, max_bytes)?;
        let Some(tool) = tool else {
            return Ok(None);
        };
        tool.check_params(call.params().as_value())?;
        let check_output = overrides
            .and_then(|o| o.check_output)
            .unwrap_or(self.check_output);
        Ok((check_output && tool.has_output_schema()).then(|| tool.clone()))
    }
}

impl<S> Service<ToolCall> for EnvelopeValidate<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        if !self.validator.registry.control().is_enabled() {
            return ResponseFuture::passthrough(self.inner.call(call));
        }
        match self.validator.admit(&call) {
            Ok(output_schema) => ResponseFuture::called(self.inner.call(call), output_schema),
            Err(error) => {
                tracing::debug!(
                    request_id = call.request_id(),
                    tool = call.tool_name(),
                    error_code = error.code().as_str(),
                    "tool call rejected by validation"
                );
                ResponseFuture::rejected(error)
            }
        }
    }
}
