use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::call::{
    BreakerScope, CallEnvelope, CallHints, CallRetryPolicy, Control, DedupeMode, Payload, Priority,
    RetryBudget, RunLink, Target, ToolCall, TraceContext, Transport, CONTRACT_VERSION,
};
use super::params::Params;
use crate::contract::error::ToolError;
use crate::contract::time::millis;

impl ToolCall {
    /// A builder for a call of tool `name` in `namespace`.
    pub fn builder(namespace: impl Into<String>, name: impl Into<String>) -> ToolCallBuilder {
        ToolCallBuilder::new(namespace.into(), name.into())
    }
}

/// Builds a [`ToolCall`] from code; made by [`ToolCall::builder`].
///
/// `session` and `actor` are required; the request id is a fresh ULID unless set.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall::{DedupeMode, ToolCall};
///
/// let call = ToolCall::builder("vault", "createFile")
///     .session("sess-42")
///     .actor("user-7")
///     .tenant("tenant-a")
///     .params(json!({"path": "XYZ/Foo.md", "content": "hello"}))
///     .idempotency_key("create-foo-1")
///     .dedupe_mode(DedupeMode::Enforced)
///     .timeout(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(call.request_id().len(), 26);
/// assert_eq!(call.idempotency_key(), Some("create-foo-1"));
/// # Ok::<(), tower_toolcall::ToolError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct ToolCallBuilder {
    envelope: CallEnvelope,
    params: Option<Value>,
}

impl ToolCallBuilder {
    pub(super) fn new(namespace: String, name: String) -> Self {
        ToolCallBuilder {
            envelope: CallEnvelope {
                contract_version: CONTRACT_VERSION.to_owned(),
                request_id: String::new(),
                tool_call_id: None,
                tool_name: name,
                tool_namespace: namespace,
                target: Target::default(),
                payload: Payload::new(Params::empty()),
                transport: Transport::default(),
                control: Control::default(),
                trace: TraceContext::default(),
                run: None,
            },
            params: None,
        }
    }

    /// `target.sessionKey` (required).
    pub fn session(mut self, session_key: impl Into<String>) -> Self {
        self.envelope.target.session_key = session_key.into();
        self
    }

    /// `target.actorId` (required).
    pub fn actor(mut self, actor_id: impl Into<String>) -> Self {
        self.envelope.target.actor_id = actor_id.into();
        self
    }

    /// `target.tenantId`.
    pub fn tenant(mut self, tenant_id: impl Into<String>) -> Self {
        self.envelope.target.tenant_id = Some(tenant_id.into());
        self
    }

    /// `target.agentId`.
    pub fn agent(mut self, agent_id: impl Into<String>) -> Self {
        self.envelope.target.agent_id = Some(agent_id.into());
        self
    }

    /// `target.workspaceId`.
    pub fn workspace(mut self, workspace_id: impl Into<String>) -> Self {
        self.envelope.target.workspace_id = Some(workspace_id.into());
        self
    }

    /// `target.correlationId`.
    pub fn correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.envelope.target.correlation_id = Some(correlation_id.into());
        self
    }

    /// `requestId`; a fresh ULID when not set.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.envelope.request_id = request_id.into();
        self
    }

    /// `toolCallId`, the id the model gave the call.
    pub fn tool_call_id(mut self, tool_call_id: impl Into<String>) -> Self {
        self.envelope.tool_call_id = Some(tool_call_id.into());
        self
    }

    /// `payload.params`; must be a JSON object. Empty when not set.
    pub fn params(mut self, params: Value) -> Self {
        self.params = Some(params);
        self
    }

    /// `payload.idempotencyKey`.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.envelope.payload.idempotency_key = Some(key.into());
        self
    }

    /// `payload.callHints.timeoutMs`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.hints().timeout_ms = Some(millis(timeout));
        self
    }

    /// `payload.callHints.expectedRetrySafe`.
    pub fn expected_retry_safe(mut self, safe: bool) -> Self {
        self.hints().expected_retry_safe = Some(safe);
        self
    }

    /// `payload.callHints.safetyCritical`.
    pub fn safety_critical(mut self, critical: bool) -> Self {
        self.hints().safety_critical = Some(critical);
        self
    }

    /// `payload.callHints.priority`: where the call waits among its tool's queued calls.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.hints().priority = Some(priority);
        self
    }

    /// `transport.dedupeMode`.
    pub fn dedupe_mode(mut self, mode: DedupeMode) -> Self {
        self.envelope.transport.dedupe_mode = Some(mode);
        self
    }

    /// `transport.retryBudget`.
    pub fn retry_budget(mut self, max_attempts: u32, max_elapsed: Duration) -> Self {
        self.envelope.transport.retry_budget =
            Some(RetryBudget::new(max_attempts, millis(max_elapsed)));
        self
    }

    /// `transport.retryPolicy`: how the caller would like the call retried, within the
    /// tool's policy ([`CallRetryPolicy`]).
    pub fn retry_policy(mut self, policy: CallRetryPolicy) -> Self {
        self.envelope.transport.retry_policy = Some(policy);
        self
    }

    /// `transport.circuitBreakerHint`.
    pub fn breaker_scope(mut self, scope: BreakerScope) -> Self {
        self.envelope.transport.circuit_breaker_hint = Some(scope);
        self
    }

    /// `control.deadlineAtMs`, in Unix milliseconds.
    pub fn deadline_at_ms(mut self, deadline_at_ms: u64) -> Self {
        self.envelope.control.deadline_at_ms = Some(deadline_at_ms);
        self
    }

    /// Adds a tag to `control.requestTags`.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.envelope
            .control
            .request_tags
            .get_or_insert_with(Vec::new)
            .push(tag.into());
        self
    }

    /// `control.fromHook`.
    pub fn from_hook(mut self, hook: impl Into<String>) -> Self {
        self.envelope.control.from_hook = Some(hook.into());
        self
    }

    /// `control.confirmationId`.
    pub fn confirmation_id(mut self, confirmation_id: impl Into<String>) -> Self {
        self.envelope.control.confirmation_id = Some(confirmation_id.into());
        self
    }

    /// `trace.traceparent`.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.envelope.trace.traceparent = Some(traceparent.into());
        self
    }

    /// Adds a member to `trace.baggage`.
    pub fn baggage(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envelope
            .trace
            .baggage
            .get_or_insert_with(BTreeMap::new)
            .insert(name.into(), value.into());
        self
    }

    /// `run`: the run and plan step that issue the call.
    pub fn run_link(mut self, link: RunLink) -> Self {
        self.envelope.run = Some(link);
        self
    }

    /// Checks the envelope and makes the call; a missing session or actor, an identifier
    /// longer than [`MAX_IDENTIFIER_BYTES`](super::MAX_IDENTIFIER_BYTES) (an idempotency key
    /// longer than [`MAX_IDEMPOTENCY_KEY_BYTES`](super::MAX_IDEMPOTENCY_KEY_BYTES)), or params
    /// that are not an object, are a `VALIDATION_ERROR` naming the field.
    pub fn build(mut self) -> Result<ToolCall, ToolError> {
        if let Some(params) = self.params.take() {
            self.envelope.payload.params = Params::from_value(params)?;
        }
        if self.envelope.request_id.is_empty() {
            self.envelope.request_id = ulid::Ulid::generate().to_string();
        }
        ToolCall::from_envelope(self.envelope)
    }

    fn hints(&mut self) -> &mut CallHints {
        self.envelope
            .payload
            .call_hints
            .get_or_insert_with(CallHints::default)
    }
}
