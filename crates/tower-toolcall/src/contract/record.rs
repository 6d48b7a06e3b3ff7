//! The per-call [`CallRecord`] that every layer enriches on the way out, and its parts: what
//! the idempotency cache matched, the retried attempts, the breaker's state, the layer that
//! answered without running the tool, and what the layers in shadow mode would have done.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the layers learned about one call: attempts, cache use, retries, breaker state and
/// duration.
///
/// Each layer fills in its part on the response (or the error) it passes outward.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CallRecord {
    /// How many times the tool was executed, as the retry layer counted them (a retried
    /// call); `None` when no retry layer counted: the tool ran once, unless the call was
    /// [rejected](crate::ToolError::is_rejected).
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
    /// The fields of the caller's `transport.retryPolicy` that asked for more than the tool
    /// allows, and what was applied instead.
    pub retry_clamped: Vec<RetryClamp>,
    /// The hedge the retry layer sent beside a slow attempt, when it sent one.
    pub hedge: Option<HedgeRecord>,
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
        retry_clamped: Vec::new(),
        hedge: None,
    };
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
    /// The bulkhead refused the call: every place of its tool was taken and its queue full,
    /// or the call's deadline passed while it waited.
    BulkheadFull,
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
            ShortCircuit::BulkheadFull => "bulkhead_full",
            ShortCircuit::CacheHit => "cache_hit",
            ShortCircuit::InflightJoin => "inflight_join",
            ShortCircuit::KeyConflict => "key_conflict",
            ShortCircuit::BreakerOpen => "breaker_open",
        }
    }
}

/// A layer that can run in shadow mode: deciding, logging and counting, never enforcing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShadowLayer {
    /// The circuit breaker: `would_reject` instead of `CIRCUIT_OPEN`, `would_open` when a
    /// failure trips it.
    Breaker,
    /// Loop detection: `would_block` instead of `LOOP_DETECTED`.
    LoopDetect,
    /// Idempotency: `would_replay`, `would_join` or `would_conflict` instead of answering
    /// from the store; the tool runs again.
    Idempotency,
    /// The rate limiter: `would_limit` or `would_wait` instead of `RATE_LIMITED` or a wait.
    RateLimit,
}

impl ShadowLayer {
    /// Every layer that has a shadow mode.
    pub const ALL: [ShadowLayer; 4] = [
        ShadowLayer::Breaker,
        ShadowLayer::LoopDetect,
        ShadowLayer::Idempotency,
        ShadowLayer::RateLimit,
    ];

    /// The layer's name in `TOOL_RELIABILITY_SHADOW`, logs and the `layer` metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            ShadowLayer::Breaker => "breaker",
            ShadowLayer::LoopDetect => "loop_detect",
            ShadowLayer::Idempotency => "idempotency",
            ShadowLayer::RateLimit => "rate_limit",
        }
    }

    /// The layer named `name`, as [`as_str`](Self::as_str) spells it.
    pub fn parse(name: &str) -> Option<ShadowLayer> {
        ShadowLayer::ALL.into_iter().find(|l| l.as_str() == name)
    }
}

impl fmt::Display for ShadowLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// A second attempt the retry layer sent beside a slow one, and which of the two answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct HedgeRecord {
    /// The attempt that was hedged (1-based).
    pub attempt: u32,
    /// How long that attempt had run when the hedge was sent, in milliseconds.
    pub delay_ms: u64,
    /// The attempt whose answer the call returned: `attempt`, `attempt + 1` (the hedge), or
    /// a later retry when both failed; `None` when the call failed.
    pub winner: Option<u32>,
}

impl HedgeRecord {
    /// Attempt `attempt` (1-based) was hedged after `delay_ms`, and `winner` answered.
    ///
    /// ```
    /// use tower_toolcall::HedgeRecord;
    ///
    /// let hedge = HedgeRecord::new(1, 50, Some(2));
    /// assert_eq!((hedge.attempt, hedge.delay_ms, hedge.winner), (1, 50, Some(2)));
    /// assert!(hedge.hedge_won());
    /// ```
    pub fn new(attempt: u32, delay_ms: u64, winner: Option<u32>) -> Self {
        HedgeRecord {
            attempt,
            delay_ms,
            winner,
        }
    }

    /// Whether the hedge answered the call, not the attempt it hedged.
    pub fn hedge_won(&self) -> bool {
        self.winner == Some(self.attempt + 1)
    }
}

/// One field of a caller's `transport.retryPolicy` that the retry layer narrowed to what the
/// tool allows, as listed in the result's `retryPolicyClamped`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RetryClamp {
    /// The field, as the envelope spells it (`maxAttempts`, `maxDelayMs`, …).
    pub field: String,
    /// What the caller asked for.
    pub requested: serde_json::Value,
    /// What the call got: the tool's bound (`null` when the field does not apply to the
    /// tool, such as a jitter spread for a tool whose jitter is not `percent`).
    pub applied: serde_json::Value,
}

impl RetryClamp {
    /// `field` asked for `requested` and got `applied`.
    pub fn new(
        field: impl Into<String>,
        requested: impl Into<serde_json::Value>,
        applied: impl Into<serde_json::Value>,
    ) -> Self {
        RetryClamp {
            field: field.into(),
            requested: requested.into(),
            applied: applied.into(),
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
