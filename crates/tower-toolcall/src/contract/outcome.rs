//! What a tool returns ([`ToolOutput`]) and the per-call [`CallRecord`] that every layer
//! enriches on the way out, so that one conversion at the edge produces the whole
//! [`ToolResult`](crate::ToolResult) envelope.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::contract::control::ShadowLayer;
use crate::contract::error::ToolError;

/// The successful output of a tool: its `content` and optional `metadata`.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::ToolOutput;
///
/// let out = ToolOutput::new(json!({"hits": 3})).with_metadata("source", json!("docs.rs"));
/// assert_eq!(out.content, json!({"hits": 3}));
/// assert_eq!(out.metadata.unwrap()["source"], "docs.rs");
/// ```
///
/// The [`CallRecord`] the layers enrich is kept out of line and allocated only when a layer
/// writes to it, so that an output stays small as it moves through the stack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolOutput {
    /// What the tool produced.
    pub content: Value,
    /// Data about the output (timestamps, etags, sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(skip)]
    record: Option<Box<CallRecord>>,
}

impl ToolOutput {
    /// An output with `content` and no metadata.
    pub fn new(content: Value) -> Self {
        ToolOutput {
            content,
            metadata: None,
            record: None,
        }
    }

    /// What the layers recorded about the call.
    pub fn record(&self) -> &CallRecord {
        static EMPTY: CallRecord = CallRecord::EMPTY;
        self.record.as_deref().unwrap_or(&EMPTY)
    }

    /// Mutable access to the record, for layers.
    pub fn record_mut(&mut self) -> &mut CallRecord {
        self.record.get_or_insert_with(Box::default)
    }

    /// Takes the record out, leaving an empty one.
    pub fn take_record(&mut self) -> CallRecord {
        self.record.take().map(|record| *record).unwrap_or_default()
    }

    /// Replaces the record.
    pub fn with_record(mut self, record: CallRecord) -> Self {
        self.record = Some(Box::new(record));
        self
    }

    /// Adds one metadata member.
    pub fn with_metadata(mut self, name: impl Into<String>, value: Value) -> Self {
        self.metadata
            .get_or_insert_with(Map::new)
            .insert(name.into(), value);
        self
    }
}

/// How many times the tool ran for a call that ended with `outcome`: the count the retry
/// layer wrote, else none for a call that was [rejected](ToolError::is_rejected), else one.
pub(crate) fn attempts_of(outcome: &Result<ToolOutput, ToolError>) -> u32 {
    match outcome {
        Ok(output) => output.record().attempts.unwrap_or(1),
        Err(error) => error.attempts(),
    }
}

/// The record of a call's outcome, whichever way it ended.
pub(crate) fn record_of(outcome: &Result<ToolOutput, ToolError>) -> &CallRecord {
    match outcome {
        Ok(output) => output.record(),
        Err(error) => error.record(),
    }
}

/// What the layers learned about one call: attempts, cache use, retries, breaker state and
/// duration.
///
/// Each layer fills in its part on the response (or the error) it passes outward.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CallRecord {
    /// How many times the tool was executed, as the retry layer counted them (a retried
    /// call); `None` when no retry layer counted: the tool ran once, unless the call was
    /// [rejected](ToolError::is_rejected).
    pub attempts: Option<u32>,
    /// `true` when the answer came from the idempotency cache or an in-flight join.
    pub from_cache: bool,
    /// How the idempotency cache matched, when it did.
    pub cache: Option<CacheMatch>,
    /// One entry per retried attempt.
    pub retried_by: Vec<RetryRecord>,
    /// The circuit breaker's state when the call finished, when a breaker saw it.
    pub breaker_state: Option<BreakerState>,
    /// How long the call took, measured at the edge.
    pub duration: Option<Duration>,
    /// The layer that answered without running the tool, when one did (for a retried call:
    /// on its last attempt).
    pub short_circuit: Option<ShortCircuit>,
    /// What the layers in shadow mode would have done to the call, in the order they
    /// decided it.
    pub shadow: Vec<ShadowDecision>,
}

impl CallRecord {
    /// The record of a call no layer has written anything about.
    pub const EMPTY: CallRecord = CallRecord {
        attempts: None,
        from_cache: false,
        cache: None,
        retried_by: Vec::new(),
        breaker_state: None,
        duration: None,
        short_circuit: None,
        shadow: Vec::new(),
    };
}

/// The record of an outcome, success or error, for a layer to write in.
pub(crate) fn outcome_record_mut(outcome: &mut Result<ToolOutput, ToolError>) -> &mut CallRecord {
    match outcome {
        Ok(output) => output.record_mut(),
        Err(error) => error.record_mut(),
    }
}

/// How a layer answered a call without running the tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShortCircuit {
    /// The envelope validation layer refused the call.
    ValidationRejected,
    /// Loop detection blocked the call.
    LoopBlocked,
    /// The rate limiter refused the call.
    RateLimited,
    /// The idempotency layer answered with a completed call's result.
    CacheHit,
    /// The idempotency layer answered with the result of a running call it joined.
    InflightJoin,
    /// The idempotency layer refused a key reused with other params.
    KeyConflict,
    /// An open circuit breaker failed the call fast.
    BreakerOpen,
}

impl ShortCircuit {
    /// The path's name in logs and audit lines.
    pub const fn as_str(self) -> &'static str {
        match self {
            ShortCircuit::ValidationRejected => "validation_rejected",
            ShortCircuit::LoopBlocked => "loop_blocked",
            ShortCircuit::RateLimited => "rate_limited",
            ShortCircuit::CacheHit => "cache_hit",
            ShortCircuit::InflightJoin => "inflight_join",
            ShortCircuit::KeyConflict => "key_conflict",
            ShortCircuit::BreakerOpen => "breaker_open",
        }
    }
}

/// What a layer in shadow mode would have done to a call, had it enforced its decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ShadowDecision {
    /// The layer that decided.
    pub layer: ShadowLayer,
    /// What it would have done.
    pub verdict: ShadowVerdict,
}

impl ShadowDecision {
    /// The decision of `layer` that it would have done `verdict`.
    ///
    /// ```
    /// use tower_toolcall::control::ShadowLayer;
    /// use tower_toolcall::{ShadowDecision, ShadowVerdict};
    ///
    /// let decision = ShadowDecision::new(ShadowLayer::Breaker, ShadowVerdict::WouldOpen);
    /// assert_eq!(decision.layer.as_str(), "breaker");
    /// assert_eq!(decision.verdict.as_str(), "would_open");
    /// ```
    pub const fn new(layer: ShadowLayer, verdict: ShadowVerdict) -> Self {
        ShadowDecision { layer, verdict }
    }
}

/// What a layer in shadow mode would have done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShadowVerdict {
    /// The breaker would have opened after this call's failure.
    WouldOpen,
    /// The breaker would have failed this call fast.
    WouldReject,
    /// Loop detection would have blocked this call.
    WouldBlock,
    /// The idempotency layer would have answered with a completed call's result.
    WouldReplay,
    /// The idempotency layer would have joined a running call.
    WouldJoin,
    /// The idempotency layer would have refused a key reused with other params.
    WouldConflict,
    /// The rate limiter would have refused this call.
    WouldLimit,
    /// The rate limiter would have made this call wait.
    WouldWait,
}

impl ShadowVerdict {
    /// The verdict's name in logs and the `decision` metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            ShadowVerdict::WouldOpen => "would_open",
            ShadowVerdict::WouldReject => "would_reject",
            ShadowVerdict::WouldBlock => "would_block",
            ShadowVerdict::WouldReplay => "would_replay",
            ShadowVerdict::WouldJoin => "would_join",
            ShadowVerdict::WouldConflict => "would_conflict",
            ShadowVerdict::WouldLimit => "would_limit",
            ShadowVerdict::WouldWait => "would_wait",
        }
    }
}

/// How the idempotency cache answered a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CacheMatch {
    /// Whether the call joined a running execution or found a completed one.
    pub matched_on: MatchedOn,
    /// Age of the cached record in milliseconds.
    pub age_ms: u64,
    /// A short hash that identifies the key without revealing it.
    pub key_fingerprint: String,
}

impl CacheMatch {
    /// A match on `matched_on`, of a record `age_ms` milliseconds old, whose key has the
    /// fingerprint `key_fingerprint`.
    pub fn new(matched_on: MatchedOn, age_ms: u64, key_fingerprint: impl Into<String>) -> Self {
        CacheMatch {
            matched_on,
            age_ms,
            key_fingerprint: key_fingerprint.into(),
        }
    }
}

/// What an idempotency cache hit matched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum MatchedOn {
    /// A call with the same key was running; this one waited for its result.
    Inflight,
    /// A call with the same key had completed; its result was returned.
    Completed,
}

/// One retried attempt, as listed in `retriedBy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RetryRecord {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// How long the layer waited before the next attempt, in milliseconds.
    pub delay_ms: u64,
    /// The error code that caused the retry.
    pub reason_code: String,
    /// How long the failed attempt took, in milliseconds.
    pub latency_ms: u64,
}

impl RetryRecord {
    /// The record of `attempt` (1-based), which failed with `reason_code` after `latency_ms`
    /// and was followed by a wait of `delay_ms`.
    ///
    /// ```
    /// use tower_toolcall::RetryRecord;
    ///
    /// let retry = RetryRecord::new(1, 250, "TIMEOUT", 1000);
    /// assert_eq!((retry.attempt, retry.delay_ms, retry.latency_ms), (1, 250, 1000));
    /// assert_eq!(retry.reason_code, "TIMEOUT");
    /// ```
    pub fn new(
        attempt: u32,
        delay_ms: u64,
        reason_code: impl Into<String>,
        latency_ms: u64,
    ) -> Self {
        RetryRecord {
            attempt,
            delay_ms,
            reason_code: reason_code.into(),
            latency_ms,
        }
    }
}

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls pass and their outcomes are counted.
    Closed,
    /// Calls fail fast with `CIRCUIT_OPEN` until the cooldown passes.
    Open,
    /// A limited number of probe calls test whether the dependency recovered.
    HalfOpen,
    /// Held open by an operator until reset.
    ForcedOpen,
}

impl BreakerState {
    /// The state's name as it appears in envelopes, logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::ForcedOpen => "forced_open",
        }
    }
}
