use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use tokio::time::Instant;

use super::ijson::{object, optional_name, optional_object};
use super::params::Params;
use super::principal::Principal;
use super::resolution::ToolResolution;
use crate::contract::chunks::{ChunkSender, ChunkStream, ChunkTap};
use crate::contract::time::unix_now_ms;

/// The only contract version this crate speaks.
pub const CONTRACT_VERSION: &str = "1.1";
/// The only payload version this crate speaks.
pub const PAYLOAD_VERSION: &str = "1.0";
/// The most bytes an identifier of a call may have: `requestId`, `toolCallId`, `toolName`,
/// `toolNamespace`, `confirmationId` and the ids of `target`.
pub const MAX_IDENTIFIER_BYTES: usize = 256;
/// The most bytes of `payload.idempotencyKey`, as in Stripe's API.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;
/// The most bytes of `trace.traceparent` (a W3C `traceparent` has 55).
pub const MAX_TRACEPARENT_BYTES: usize = 512;

/// One tool call: the envelope of contract version 1.1, cheap to clone.
///
/// A `ToolCall` is an [`Arc`] around a validated [`CallEnvelope`]: cloning it (as the retry
/// layer does for every attempt) costs one reference count, whatever the size of the params.
/// It is made by [`ToolCall::builder`], parsed by [`ToolCall::from_json`], or checked from an
/// envelope by [`ToolCall::from_envelope`]; each of them rejects a malformed envelope with a
/// `VALIDATION_ERROR` that names the field.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::ToolCall;
///
/// let call = ToolCall::builder("agents.tools.web", "search")
///     .session("sess-42")
///     .actor("user-7")
///     .params(json!({"query": "rust tower retry"}))
///     .build()?;
/// assert_eq!(call.tool_name(), "search");
/// assert_eq!(call.params().as_map()["query"], "rust tower retry");
///
/// let json = serde_json::to_vec(&call).unwrap();
/// let parsed = ToolCall::from_json(&json)?;
/// assert_eq!(parsed.envelope(), call.envelope());
/// # Ok::<(), tower_toolcall::ToolError>(())
/// ```
///
/// Besides the envelope, a call carries the number of the [attempt](ToolCall::attempt) it
/// makes: 1 unless a [`RetryLayer`](crate::RetryLayer) outside is trying it again. The
/// attempt number is not on the wire and not part of the call's identity: two calls are
/// equal when their envelopes are.
#[derive(Clone)]
pub struct ToolCall {
    inner: Arc<SharedCall>,
    attempt: u32,
}

/// What the clones of a call share.
#[derive(Clone)]
struct SharedCall {
    envelope: CallEnvelope,
    /// Where a registry found the call's tool; not part of the call's identity.
    tool: ToolResolution,
    /// An idempotency key that a hook put on the call; not on the wire and not part of the
    /// call's identity.
    hook_idempotency_key: Option<Box<str>>,
    /// How far the caller's idempotency key reaches, as the edge that read it says; not on
    /// the wire.
    caller_key_scope: Option<KeyScope>,
    /// The authenticated caller the edge bound the call to; not on the wire.
    principal: Option<Principal>,
    /// The stream the caller reads the tool's chunks from, when it asked for one; not on the
    /// wire.
    chunks: Option<Arc<ChunkTap>>,
    /// The envelope holds its invariants: it was checked when the call was made and has not
    /// been lent mutably since, so [`ToolCall::check`] need not read it again.
    checked: bool,
}

/// The fields of a tool call, as they are on the wire (camelCase JSON).
///
/// Its `Deserialize` checks the types and that each section is an object; parse envelopes
/// with [`ToolCall::from_json`], which also holds the whole text to I-JSON (no member name
/// twice, valid Unicode, numbers that a double can hold) and checks the invariants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CallEnvelope {
    /// Always `"1.1"`.
    pub contract_version: String,
    /// Unique id of this request (a ULID when the builder makes it).
    pub request_id: String,
    /// The id the model gave the call, kept for observability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name within its namespace, e.g. `search`.
    pub tool_name: String,
    /// The tool's namespace, e.g. `agents.tools.web`.
    pub tool_namespace: String,
    /// Who calls, on whose behalf, in which session.
    #[serde(deserialize_with = "object")]
    pub target: Target,
    /// The params and what the caller says about them.
    #[serde(deserialize_with = "object")]
    pub payload: Payload,
    /// Dedupe mode, retry budget and breaker scope.
    #[serde(default, deserialize_with = "object")]
    pub transport: Transport,
    /// Deadline, tags, hook provenance and confirmation.
    #[serde(default, deserialize_with = "object")]
    pub control: Control,
    /// W3C trace context.
    #[serde(default, deserialize_with = "object")]
    pub trace: TraceContext,
    /// The run and plan step the call belongs to, when an executor issued it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_object"
    )]
    pub run: Option<RunLink>,
}

/// `run`: links a call to the run, the plan step and the iteration that issued it.
///
/// An executor of plans (`tower-toolcall-executor`'s) puts it on every call it dispatches;
/// the trace layer's audit events use its ids, so that they agree with the executor's.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::envelope::{Iteration, RunLink};
///
/// let link = RunLink::new("run-1", "hotels", "hotels[2]:1")
///     .with_attempt(2)
///     .with_iteration(Iteration::new(2, "item", json!({"city": "Lyon"})))
///     .with_loop_id("run-1/hotels");
/// let wire = serde_json::to_value(&link).unwrap();
/// assert_eq!(wire["stepId"], "hotels");
/// assert_eq!(wire["iteration"]["itemValue"]["city"], "Lyon");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunLink {
    /// The run (one execution of a plan).
    pub run_id: String,
    /// The plan step that issued the call.
    pub step_id: String,
    /// The call, unique within the run.
    pub call_id: String,
    /// The executor's attempt at the step's item, 1-based.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The item of a `foreach` expansion the call is for.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_object"
    )]
    pub iteration: Option<Iteration>,
    /// The `foreach` expansion the call belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_id: Option<String>,
}

fn first_attempt() -> u32 {
    1
}

impl RunLink {
    /// A link to `step_id` of `run_id`, for the call `call_id`, first attempt.
    pub fn new(
        run_id: impl Into<String>,
        step_id: impl Into<String>,
        call_id: impl Into<String>,
    ) -> Self {
        RunLink {
            run_id: run_id.into(),
            step_id: step_id.into(),
            call_id: call_id.into(),
            attempt: 1,
            iteration: None,
            loop_id: None,
        }
    }

    /// Sets `attempt`.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Sets `iteration`.
    pub fn with_iteration(mut self, iteration: Iteration) -> Self {
        self.iteration = Some(iteration);
        self
    }

    /// Sets `loopId`.
    pub fn with_loop_id(mut self, loop_id: impl Into<String>) -> Self {
        self.loop_id = Some(loop_id.into());
        self
    }
}

/// `run.iteration`: which item of a `foreach` a call is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Iteration {
    /// The item's index, from 0.
    pub index: u64,
    /// The name the step's templates use for the item (`item` in `{item.path}`).
    pub item_name: String,
    /// The item.
    pub item_value: Value,
}

impl Iteration {
    /// The item `item_value` at `index`, bound to `item_name`.
    pub fn new(index: u64, item_name: impl Into<String>, item_value: Value) -> Self {
        Iteration {
            index,
            item_name: item_name.into(),
            item_value,
        }
    }
}

/// `target`: who calls, on whose behalf, in which session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Target {
    /// The agent that issued the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The conversation or run the call belongs to. Required.
    pub session_key: String,
    /// The user or account on whose behalf the call runs. Required.
    pub actor_id: String,
    /// The workspace, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// Correlates the call with others across services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The tenant; it prefixes every dedupe store key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
}

impl Target {
    /// A target of `session_key` and `actor_id`, the two required members.
    ///
    /// ```
    /// use tower_toolcall::envelope::Target;
    ///
    /// let mut target = Target::new("sess-42", "user-7");
    /// target.tenant_id = Some("tenant-a".into());
    /// assert_eq!(target.session_key, "sess-42");
    /// assert_eq!(target.tenant_id.as_deref(), Some("tenant-a"));
    /// ```
    pub fn new(session_key: impl Into<String>, actor_id: impl Into<String>) -> Self {
        Target {
            session_key: session_key.into(),
            actor_id: actor_id.into(),
            ..Target::default()
        }
    }
}

/// `payload`: the params and what the caller says about them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Payload {
    /// Always `"1.0"`.
    pub version: String,
    /// The tool's params: a JSON object.
    pub params: Params,
    /// The caller's idempotency key; it wins over any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Hints about safety and timing.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_object"
    )]
    pub call_hints: Option<CallHints>,
}

impl Payload {
    /// A payload of version [`PAYLOAD_VERSION`] with `params`, no idempotency key and no hints.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall::envelope::{Params, Payload};
    ///
    /// let mut payload = Payload::new(Params::from_value(json!({"q": "tower"}))?);
    /// payload.idempotency_key = Some("search-1".into());
    /// assert_eq!(payload.version, "1.0");
    /// assert_eq!(payload.idempotency_key.as_deref(), Some("search-1"));
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn new(params: Params) -> Self {
        Payload {
            version: PAYLOAD_VERSION.to_owned(),
            params,
            idempotency_key: None,
            call_hints: None,
        }
    }
}

/// `payload.callHints`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CallHints {
    /// The call has effects that must not happen twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_critical: Option<bool>,
    /// The caller vouches that repeating the call is safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_retry_safe: Option<bool>,
    /// Attempt timeout in milliseconds; never negative.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "millis"
    )]
    pub timeout_ms: Option<u64>,
    /// Where the call waits among the calls of its tool queued for a place in the bulkhead;
    /// `normal` when absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_name"
    )]
    pub priority: Option<Priority>,
    /// The caller would rather read the answer in chunks, as the tool makes it, when the tool
    /// streams (an edge answers with chunk envelopes; see [`stream`](crate::stream)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_streaming: Option<bool>,
}

/// `payload.callHints.priority`: a scheduling hint. Among the calls of one tool waiting for a
/// place in its bulkhead, `high` ones are admitted before `normal` ones, and those before
/// `low` ones; calls of one priority are admitted in the order they arrived. It never lets a
/// call past a limit.
///
/// ```
/// use tower_toolcall::envelope::Priority;
///
/// assert_eq!(serde_json::to_string(&Priority::High).unwrap(), r#""high""#);
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert!(Priority::High > Priority::Normal && Priority::Normal > Priority::Low);
/// ```
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Priority {
    /// Admitted after every waiting `normal` and `high` call.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Admitted before every waiting `normal` and `low` call.
    High,
}

impl Priority {
    /// The name the envelope spells it with: `"low"`, `"normal"` or `"high"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

/// `transport`: how the reliability layers treat this call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Transport {
    /// How duplicates are handled; the tool's policy decides when absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_name"
    )]
    pub dedupe_mode: Option<DedupeMode>,
    /// Narrows the retry policy for this call.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_object"
    )]
    pub retry_budget: Option<RetryBudget>,
    /// How the caller would like the call retried; it only narrows the tool's policy.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_object"
    )]
    pub retry_policy: Option<CallRetryPolicy>,
    /// Which circuit breaker guards the call.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_name"
    )]
    pub circuit_breaker_hint: Option<BreakerScope>,
}

/// How the idempotency layer treats a duplicate of a running call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum DedupeMode {
    /// Wait for the running call and return its result: the tool runs once.
    Enforced,
    /// Fail fast with `IDEMPOTENCY_IN_FLIGHT`; retriable cached failures run again.
    BestEffort,
    /// No deduplication at all.
    Disabled,
}

/// `transport.retryBudget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RetryBudget {
    /// Attempts in all, the first included; at least 1.
    pub max_attempts: u32,
    /// Time for all attempts and backoff sleeps, in milliseconds.
    #[serde(deserialize_with = "required_millis")]
    pub max_elapsed_ms: u64,
}

impl RetryBudget {
    /// A budget of `max_attempts` attempts in all and `max_elapsed_ms` milliseconds.
    pub fn new(max_attempts: u32, max_elapsed_ms: u64) -> Self {
        RetryBudget {
            max_attempts,
            max_elapsed_ms,
        }
    }
}

/// `transport.retryPolicy`: how the caller would like the call retried (every field
/// optional).
///
/// It only narrows what the tool's retry policy allows: at most the tool's attempts, delays
/// within the tool's bounds (never shorter than its base delay, never longer than its cap),
/// a backoff that grows at least as fast as the tool's (×2), a jitter spread at most the
/// tool's, and only errors the tool would retry. A wider request is clamped, never refused;
/// the result's `retryPolicyClamped` lists each clamped field. A value out of its range
/// (`maxAttempts` 0, a multiplier below 1, a percent above 100, an unknown error code) is
/// refused, naming the field.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::ToolCall;
///
/// let call = ToolCall::from_value(json!({
///     "contractVersion": "1.1", "requestId": "r-1",
///     "toolName": "search", "toolNamespace": "web",
///     "target": {"sessionKey": "s", "actorId": "u"},
///     "payload": {"version": "1.0", "params": {}},
///     "transport": {"retryPolicy": {"maxAttempts": 2, "retryableErrors": ["TIMEOUT"]}},
/// }))?;
/// let policy = call.transport().retry_policy.as_ref().unwrap();
/// assert_eq!(policy.max_attempts, Some(2));
/// # Ok::<(), tower_toolcall::ToolError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CallRetryPolicy {
    /// Attempts in all, the first included; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The delay before the first retry, in milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "millis"
    )]
    pub initial_delay_ms: Option<u64>,
    /// The longest delay before a retry, in milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "millis"
    )]
    pub max_delay_ms: Option<u64>,
    /// How much each delay grows over the one before; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_multiplier: Option<f64>,
    /// The spread of the jitter around each delay, in percent (0 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_percent: Option<u32>,
    /// The error codes (`"TIMEOUT"`, `"UPSTREAM_UNAVAILABLE"`, …) the caller wants retried;
    /// an error the tool would retry is retried only when its code is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable_errors: Option<Vec<String>>,
}

/// `transport.circuitBreakerHint`: the scope of the breaker that guards the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum BreakerScope {
    /// One breaker per tool (the default).
    Tool,
    /// One breaker per dependency (the tool's namespace).
    Dependency,
    /// One breaker for every tool.
    Global,
}

/// `control`: deadline, tags and provenance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Control {
    /// Absolute deadline of the whole call, in Unix milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "millis"
    )]
    pub deadline_at_ms: Option<u64>,
    /// Free-form tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_tags: Option<Vec<String>>,
    /// The hook that issued or rewrote the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_hook: Option<String>,
    /// The user approval this call executes under (required for tools whose policy asks for
    /// confirmation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
}

/// `trace`: W3C trace context.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct TraceContext {
    /// The W3C `traceparent` of the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// W3C baggage; `gen_ai.system` and `gen_ai.request.model` name the backend and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<BTreeMap<String, String>>,
}

impl ToolCall {
    /// Wraps `envelope`, which [`check_envelope`](super::parse::check_envelope) accepted.
    pub(super) fn from_checked(envelope: CallEnvelope) -> ToolCall {
        ToolCall {
            inner: Arc::new(SharedCall {
                envelope,
                tool: ToolResolution::default(),
                hook_idempotency_key: None,
                caller_key_scope: None,
                principal: None,
                chunks: None,
                checked: true,
            }),
            attempt: 1,
        }
    }

    /// Whether the envelope's invariants were checked as the call was made and the envelope
    /// has not been changed since.
    pub(super) fn is_checked(&self) -> bool {
        self.inner.checked
    }

    /// The envelope.
    pub fn envelope(&self) -> &CallEnvelope {
        &self.inner.envelope
    }

    /// Mutable access to the envelope; copies it first if another clone shares it. The params
    /// stay shared until they are changed themselves.
    pub fn envelope_mut(&mut self) -> &mut CallEnvelope {
        let inner = Arc::make_mut(&mut self.inner);
        // The tool may change: where a registry found it is looked up again; and the envelope
        // may lose its invariants: it is checked again.
        inner.tool.clear();
        inner.checked = false;
        &mut inner.envelope
    }

    /// The envelope, by value.
    pub fn into_envelope(self) -> CallEnvelope {
        Arc::try_unwrap(self.inner)
            .map(|inner| inner.envelope)
            .unwrap_or_else(|shared| shared.envelope.clone())
    }

    /// The tool's end of the call's stream: each chunk it [sends](ChunkSender::send) reaches
    /// the caller at once when the caller asked for chunks
    /// ([`stream_chunks`](ToolCall::stream_chunks)), and is dropped otherwise. See
    /// [`stream`](crate::stream).
    pub fn chunks(&self) -> ChunkSender {
        ChunkSender::new(self.inner.chunks.clone())
    }

    /// Asks for the call's answer in chunks, as the tool sends them: the stream to read them
    /// from. Asking again gives another reader of the same chunks, from the first. A tool
    /// that does not stream sends none, and the call's answer still comes whole.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall::ToolCall;
    ///
    /// let mut call = ToolCall::builder("agents.tools.docs", "summarize").session("s").actor("u").build()?;
    /// let mut chunks = call.stream_chunks();
    /// let tool_side = call.clone();
    /// tool_side.chunks().send(json!({"partial": "Tower"}));
    /// assert_eq!(chunks.try_next().unwrap().index, 0);
    /// assert!(chunks.try_next().is_none());
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn stream_chunks(&mut self) -> ChunkStream {
        if let Some(tap) = &self.inner.chunks {
            return tap.reader();
        }
        let tap = ChunkTap::new();
        let reader = tap.reader();
        Arc::make_mut(&mut self.inner).chunks = Some(tap);
        reader
    }

    /// The call's stream, when its caller asked for one.
    pub(crate) fn chunk_tap(&self) -> Option<&Arc<ChunkTap>> {
        self.inner.chunks.as_ref()
    }

    /// Chunks sent for this call so far: 0 when the caller asked for none.
    pub(crate) fn chunks_sent(&self) -> u32 {
        self.inner.chunks.as_ref().map_or(0, |tap| tap.sent().0)
    }

    /// The attempt this call makes, 1-based: 1 for the first, 2 for the first retry, and so
    /// on. A [`RetryLayer`](crate::RetryLayer) numbers the calls it sends below it; anywhere
    /// else the number is 1.
    ///
    /// ```
    /// use tower_toolcall::ToolCall;
    ///
    /// let call = ToolCall::builder("ns", "tool").session("s").actor("u").build()?;
    /// assert_eq!(call.attempt(), 1);
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Puts an idempotency key on the call, for application code (a hook, a gateway) that
    /// knows which calls are the same operation when the caller did not say.
    ///
    /// The [`IdempotencyLayer`](crate::IdempotencyLayer) uses it when the call has no
    /// `payload.idempotencyKey` of its own (the caller's key wins), before any key derived
    /// from the params; the [`RetryLayer`](crate::RetryLayer) counts it as a key the tool may
    /// be given. The key is not part of the envelope: it is never serialized, and two calls
    /// that differ only by it are equal. Set it before the call enters the idempotency layer.
    ///
    /// ```
    /// use tower_toolcall::ToolCall;
    ///
    /// let mut call = ToolCall::builder("vault", "createFile").session("s").actor("u").build()?;
    /// let wire = call.to_json();
    /// call.set_hook_idempotency_key("order-1234");
    /// assert_eq!(call.to_json(), wire, "not on the wire");
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn set_hook_idempotency_key(&mut self, key: impl Into<String>) {
        let key = key.into().into_boxed_str();
        Arc::make_mut(&mut self.inner).hook_idempotency_key = Some(key);
    }

    /// The idempotency key a hook put on the call, if any.
    pub(crate) fn hook_idempotency_key(&self) -> Option<&str> {
        self.inner.hook_idempotency_key.as_deref()
    }

    /// Widens the scope of the caller's `payload.idempotencyKey` to at least `scope`, for an
    /// edge whose sessions do not outlive a connection: an MCP server scopes a client's key
    /// by its actor, so that a re-send over a new connection finds the first call. The
    /// tool's own scope applies when it is wider; keys from hooks and derived keys keep it.
    /// Not on the wire.
    ///
    /// ```
    /// use tower_toolcall::registry::KeyScope;
    /// use tower_toolcall::ToolCall;
    ///
    /// let mut call = ToolCall::builder("vault", "createFile")
    ///     .session("connection-1")
    ///     .actor("u")
    ///     .idempotency_key("order-1234")
    ///     .build()?;
    /// let wire = call.to_json();
    /// call.set_caller_key_scope(KeyScope::Actor);
    /// assert_eq!(call.to_json(), wire, "not on the wire");
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn set_caller_key_scope(&mut self, scope: KeyScope) {
        Arc::make_mut(&mut self.inner).caller_key_scope = Some(scope);
    }

    /// The scope the edge set for the caller's key, if any.
    pub(crate) fn caller_key_scope(&self) -> Option<KeyScope> {
        self.inner.caller_key_scope
    }

    /// Binds the call to the authenticated `principal`, for an edge that authenticated its
    /// caller: the call's `target.actorId` and `target.tenantId` become the principal's,
    /// whatever the request said; its `target.sessionKey` is scoped under the principal
    /// ([`Principal::session_key`]), so that no two principals share a loop session or a
    /// session's quota; and none of its idempotency keys reaches past the principal: a tool
    /// whose keys are global keeps them per actor for a bound call, so that no principal
    /// reads, probes or pre-claims another's. Binding the call to the principal it is bound
    /// to already changes nothing. The principal is not on the wire.
    ///
    /// ```
    /// use tower_toolcall::{Principal, ToolCall};
    ///
    /// let mut call = ToolCall::builder("vault", "read")
    ///     .session("s-1")
    ///     .actor("whoever-the-client-says")
    ///     .build()?;
    /// let alice = Principal::new("alice").with_tenant("acme");
    /// call.bind_principal(alice.clone());
    /// assert_eq!(call.actor_id(), "alice");
    /// assert_eq!(call.tenant_id(), Some("acme"));
    /// assert_eq!(call.session_key(), alice.session_key("s-1"));
    /// assert_eq!(call.principal(), Some(&alice));
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn bind_principal(&mut self, principal: Principal) {
        if self.inner.principal.as_ref() == Some(&principal) {
            return;
        }
        let session = principal.session_key(self.session_key());
        let target = &mut self.envelope_mut().target;
        target.session_key = session;
        target.actor_id = principal.id().to_owned();
        target.tenant_id = principal.tenant().map(str::to_owned);
        Arc::make_mut(&mut self.inner).principal = Some(principal);
    }

    /// The authenticated caller the call is bound to, if an edge bound it
    /// ([`bind_principal`](ToolCall::bind_principal)).
    pub fn principal(&self) -> Option<&Principal> {
        self.inner.principal.as_ref()
    }

    /// The instant of the call's `control.deadlineAtMs` (Unix milliseconds) on the tokio
    /// clock, seen from `now`; a deadline in the past is `now`.
    pub(crate) fn deadline_from(&self, now: Instant) -> Option<Instant> {
        let at = self.control().deadline_at_ms?;
        Some(now + Duration::from_millis(at.saturating_sub(unix_now_ms())))
    }

    /// Where a registry found the call's tool, as the registry remembers it.
    pub(crate) fn tool_resolution(&self) -> &ToolResolution {
        &self.inner.tool
    }

    /// Numbers the attempt this call makes.
    pub(crate) fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }

    /// `requestId`.
    pub fn request_id(&self) -> &str {
        &self.inner.envelope.request_id
    }

    /// `toolName`.
    pub fn tool_name(&self) -> &str {
        &self.inner.envelope.tool_name
    }

    /// `toolNamespace`.
    pub fn tool_namespace(&self) -> &str {
        &self.inner.envelope.tool_namespace
    }

    /// `target.sessionKey`.
    pub fn session_key(&self) -> &str {
        &self.inner.envelope.target.session_key
    }

    /// `target.actorId`.
    pub fn actor_id(&self) -> &str {
        &self.inner.envelope.target.actor_id
    }

    /// `target.tenantId`.
    pub fn tenant_id(&self) -> Option<&str> {
        self.inner.envelope.target.tenant_id.as_deref()
    }

    /// `payload.params`.
    pub fn params(&self) -> &Params {
        &self.inner.envelope.payload.params
    }

    /// A digest of who calls which tool with which arguments: the tenant, the actor, the
    /// tool's namespace and name, and the canonical params (under the default
    /// [`CanonicalOptions`](crate::canonical::CanonicalOptions)). A re-send of the call under
    /// another request id has the same; another caller, tool or arguments never do. What an
    /// approval given for "this very call" (a user's confirmation) is bound to.
    ///
    /// ```
    /// use tower_toolcall::ToolCall;
    /// let call = |actor: &str, n: u32| {
    ///     ToolCall::builder("mail", "send").session("s").actor(actor)
    ///         .params(serde_json::json!({"to": "bob", "n": n})).build().unwrap()
    /// };
    /// assert_eq!(call("ada", 1).call_digest()?, call("ada", 1).call_digest()?);
    /// assert_ne!(call("ada", 1).call_digest()?, call("eve", 1).call_digest()?);
    /// assert_ne!(call("ada", 1).call_digest()?, call("ada", 2).call_digest()?);
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn call_digest(&self) -> Result<String, crate::ToolError> {
        let params = self
            .params()
            .canonical(&crate::canonical::CanonicalOptions::default())?;
        // A JSON array keeps the parts apart whatever they hold.
        let parts = serde_json::json!([
            self.tenant_id(),
            self.actor_id(),
            self.tool_namespace(),
            self.tool_name(),
            &*params,
        ]);
        Ok(crate::canonical::params_digest(&parts.to_string()))
    }

    /// `payload.idempotencyKey`.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.inner.envelope.payload.idempotency_key.as_deref()
    }

    /// `payload.callHints`, or the empty hints.
    pub fn call_hints(&self) -> &CallHints {
        static NONE: CallHints = CallHints {
            safety_critical: None,
            expected_retry_safe: None,
            timeout_ms: None,
            priority: None,
            prefer_streaming: None,
        };
        self.inner
            .envelope
            .payload
            .call_hints
            .as_ref()
            .unwrap_or(&NONE)
    }

    /// `payload.callHints.priority`, `normal` when absent, and at most the
    /// [bound principal's cap](Principal::max_priority).
    pub fn priority(&self) -> Priority {
        let asked = self.call_hints().priority.unwrap_or_default();
        match &self.inner.principal {
            Some(principal) => asked.min(principal.max_priority()),
            None => asked,
        }
    }

    /// `transport`.
    pub fn transport(&self) -> &Transport {
        &self.inner.envelope.transport
    }

    /// `control`.
    pub fn control(&self) -> &Control {
        &self.inner.envelope.control
    }

    /// `trace`.
    pub fn trace(&self) -> &TraceContext {
        &self.inner.envelope.trace
    }

    /// `run`: the run and plan step that issued the call, if an executor did.
    pub fn run_link(&self) -> Option<&RunLink> {
        self.inner.envelope.run.as_ref()
    }

    /// The envelope as compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.inner.envelope).expect("an envelope always serializes")
    }
}

impl fmt::Debug for ToolCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCall")
            .field("request_id", &self.inner.envelope.request_id)
            .field(
                "tool",
                &format_args!("{}::{}", self.tool_namespace(), self.tool_name()),
            )
            .field("session_key", &self.inner.envelope.target.session_key)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ToolCall {
    /// Compares the envelopes; the attempt number is not part of a call's identity.
    fn eq(&self, other: &Self) -> bool {
        self.inner.envelope == other.inner.envelope
    }
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.inner.envelope.serialize(serializer)
    }
}

/// Deserializes milliseconds: a whole, non-negative JSON number.
fn millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    required_millis(deserializer).map(Some)
}

fn required_millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Millis;

    impl Visitor<'_> for Millis {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a whole, non-negative number of milliseconds")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format_args!("must not be negative, got {v}")))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            if v < 0.0 {
                Err(E::custom(format_args!("must not be negative, got {v}")))
            } else {
                Err(E::custom(format_args!(
                    "must be a whole number of milliseconds, got {v}"
                )))
            }
        }
    }

    deserializer.deserialize_any(Millis)
}

/// Whose calls share an idempotency key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyScope {
    /// Keys are scoped to the session and actor (the default).
    Session,
    /// Keys are shared by every session of the same actor (and tenant): a caller that sends
    /// a key again from another session (a new connection, a restarted client) finds the
    /// first call.
    Actor,
    /// Keys are shared by every session; only for tools that are safe for it.
    Global,
}
