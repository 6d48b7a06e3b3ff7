//! The result envelope: [`ToolResult`], made from a call's outcome, and the
//! [`ResultEnvelopeLayer`] that answers every call with one. Public as
//! [`tower_toolcall::envelope`](crate::envelope).

mod chunk;
mod layer;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::classify::decided_retriable;
use crate::contract::envelope::ToolCall;
use crate::contract::error::{ErrorCode, ToolError};
use crate::contract::outcome::{
    BreakerState, CacheMatch, CallRecord, HedgeRecord, RetryClamp, RetryRecord, ToolOutput,
};
use crate::contract::time::millis;
pub use chunk::{ChunkContent, ChunkEnvelope, FinalChunk, StreamTally};
pub use layer::{ResultEnvelope, ResultEnvelopeFuture, ResultEnvelopeLayer};

/// The result envelope of a call, as it goes back to the agent (camelCase JSON).
///
/// Made from the outcome of a stack by [`ToolResult::from_outcome`]; every layer has put what
/// it knows into the outcome's [`CallRecord`], so the envelope is complete.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::{ResultStatus, ToolCall, ToolError, ToolOutput, ToolResult};
///
/// let call = ToolCall::builder("agents.tools.web", "search")
///     .session("s")
///     .actor("u")
///     .build()?;
/// let ok = ToolResult::from_outcome(&call, Ok(ToolOutput::new(json!({"hits": 3}))));
/// assert_eq!(ok.status, ResultStatus::Success);
/// assert_eq!(ok.attempts, 1);
///
/// let failed = ToolResult::from_outcome(&call, Err(ToolError::from_http_status(404, "no such page")));
/// assert_eq!(failed.status, ResultStatus::Error);
/// assert_eq!(failed.error.unwrap().code, "NOT_FOUND");
/// # Ok::<(), ToolError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ToolResult {
    /// The call's `requestId`.
    pub request_id: String,
    /// How the call ended.
    pub status: ResultStatus,
    /// `true` when the answer came from the idempotency cache or an in-flight join.
    pub from_cache: bool,
    /// How the idempotency cache matched, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMatch>,
    /// The call's `toolName`.
    pub tool_name: String,
    /// How long the call took.
    pub duration_ms: u64,
    /// How many times the tool was executed.
    pub attempts: u32,
    /// The output, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ToolOutput>,
    /// The error, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ResultError>,
    /// One entry per retried attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_by: Option<Vec<RetryRecord>>,
    /// The fields of the call's `transport.retryPolicy` narrowed to what the tool allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_clamped: Option<Vec<RetryClamp>>,
    /// The hedge sent beside a slow attempt, and the attempt that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeRecord>,
    /// The chunks the tool sent before this result, when the caller asked for them and the
    /// tool sent any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streamed: Option<StreamTally>,
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResultStatus {
    /// The tool succeeded.
    Success,
    /// The call failed and trying again will not help.
    Error,
    /// The call failed and a later attempt may succeed.
    RetriableError,
    /// Every allowed attempt failed, or the retry deadline passed.
    RetryExhausted,
    /// A circuit breaker refused the call.
    CircuitOpen,
    /// The call ran out of time.
    Timeout,
    /// The call was cancelled.
    Cancelled,
    /// The call was not executed and nothing failed.
    Skipped,
    /// A chunk of an answer still streaming ([`ChunkEnvelope`]); never the status of a whole
    /// result.
    Partial,
}

/// `error` of a result envelope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ResultError {
    /// The stable error code, written as its string, e.g. `"TIMEOUT"`.
    pub code: ErrorCode,
    /// What went wrong and what to do about it.
    pub message: String,
    /// A later attempt may succeed.
    pub retriable: bool,
    /// Trying again will not help.
    pub terminal: bool,
    /// The circuit breaker's state, when a breaker saw the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_state: Option<BreakerState>,
    /// When to try again, in milliseconds, for an error that says (an open circuit, a rate
    /// limit, an upstream's `Retry-After`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Structured details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ResultError {
    /// The error `code` with `message`; `retriable` says whether a later attempt may succeed
    /// (and `terminal` is its opposite).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_toolcall::envelope::ResultError;
    /// use tower_toolcall::{BreakerState, ErrorCode};
    ///
    /// let error = ResultError::new(ErrorCode::CircuitOpen, "search is failing; try later", true)
    ///     .with_breaker_state(BreakerState::Open)
    ///     .with_retry_after(Duration::from_secs(30));
    /// assert!(error.retriable && !error.terminal);
    /// assert_eq!(error.breaker_state, Some(BreakerState::Open));
    /// assert_eq!(error.retry_after_ms, Some(30_000));
    /// ```
    pub fn new(code: ErrorCode, message: impl Into<String>, retriable: bool) -> Self {
        ResultError {
            code,
            message: message.into(),
            retriable,
            terminal: !retriable,
            breaker_state: None,
            retry_after_ms: None,
            details: None,
        }
    }

    /// Sets when to try again.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after_ms = Some(millis(after));
        self
    }

    /// When to try again, when the error says.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }

    /// The error of an envelope from `error`, whether a later attempt may succeed decided by
    /// `retriable`.
    fn of_error(error: &ToolError, retriable: bool) -> Self {
        ResultError {
            code: error.code(),
            message: error.message().to_owned(),
            retriable,
            terminal: !retriable,
            breaker_state: error.record().breaker_state,
            retry_after_ms: error.retry_after().map(millis),
            details: error.details().cloned(),
        }
    }

    /// Sets the circuit breaker's state.
    pub fn with_breaker_state(mut self, state: BreakerState) -> Self {
        self.breaker_state = Some(state);
        self
    }

    /// Sets the structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
}

impl ResultStatus {
    /// The status as it is written in envelopes and logs, e.g. `retry_exhausted`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Success => "success",
            ResultStatus::Error => "error",
            ResultStatus::RetriableError => "retriable_error",
            ResultStatus::RetryExhausted => "retry_exhausted",
            ResultStatus::CircuitOpen => "circuit_open",
            ResultStatus::Timeout => "timeout",
            ResultStatus::Cancelled => "cancelled",
            ResultStatus::Skipped => "skipped",
            ResultStatus::Partial => "partial",
        }
    }

    /// The status of a failed call with `error`: the code says it for the ways a call ends
    /// early; otherwise the [classifier](crate::classify) decided whether the error is
    /// retriable, in the layers that saw it, or here with the default classifier when none
    /// did.
    pub fn of_error(error: &ToolError) -> ResultStatus {
        ResultStatus::of_decided_error(error, decided_retriable(error))
    }

    fn of_decided_error(error: &ToolError, retriable: bool) -> ResultStatus {
        match error.code() {
            ErrorCode::CircuitOpen => ResultStatus::CircuitOpen,
            ErrorCode::RetryExhausted => ResultStatus::RetryExhausted,
            ErrorCode::Timeout => ResultStatus::Timeout,
            ErrorCode::Cancelled => ResultStatus::Cancelled,
            _ if retriable => ResultStatus::RetriableError,
            _ => ResultStatus::Error,
        }
    }
}

impl ToolResult {
    /// The result envelope of `call` from the outcome of a stack.
    pub fn from_outcome(call: &ToolCall, outcome: Result<ToolOutput, ToolError>) -> ToolResult {
        match outcome {
            Ok(mut output) => {
                let record = output.take_record();
                let attempts = record.attempts.unwrap_or(1);
                let status = ResultStatus::Success;
                ToolResult::with_record(call, status, record, attempts, Some(output), None)
            }
            Err(error) => {
                let retriable = decided_retriable(&error);
                let status = ResultStatus::of_decided_error(&error, retriable);
                let result_error = ResultError::of_error(&error, retriable);
                ToolResult::with_record(
                    call,
                    status,
                    error.record().clone(),
                    error.attempts(),
                    None,
                    Some(result_error),
                )
            }
        }
    }

    /// The result envelope of input that never became a call: a body that is not a
    /// `ToolCall`, a header that contradicts it. Nothing ran (`attempts` is 0); `requestId`
    /// and `toolName` are empty until the caller sets what it could read of them.
    ///
    /// ```
    /// use tower_toolcall::{ErrorCode, ResultStatus, ToolCall, ToolResult};
    ///
    /// let error = ToolCall::from_json(br#"{"contractVersion": "1.1"}"#).unwrap_err();
    /// let result = ToolResult::rejected(error);
    /// assert_eq!(result.status, ResultStatus::Error);
    /// assert_eq!(result.attempts, 0);
    /// let error = result.error.unwrap();
    /// assert_eq!(error.code, ErrorCode::ValidationError);
    /// assert_eq!(error.code.http_status(), 400);
    /// ```
    pub fn rejected(error: ToolError) -> ToolResult {
        let retriable = decided_retriable(&error);
        ToolResult {
            request_id: String::new(),
            status: ResultStatus::of_decided_error(&error, retriable),
            from_cache: false,
            cache: None,
            tool_name: String::new(),
            duration_ms: 0,
            attempts: 0,
            output: None,
            error: Some(ResultError::of_error(&error, retriable)),
            retried_by: None,
            retry_policy_clamped: None,
            hedge: None,
            streamed: None,
        }
    }

    /// The HTTP status of the result: 200 unless it failed, the
    /// [status of its error code](ErrorCode::http_status) when it did.
    ///
    /// ```
    /// use tower_toolcall::{ErrorCode, ToolError, ToolResult};
    ///
    /// let result = ToolResult::rejected(ToolError::rejected(ErrorCode::RateLimited, "slow down"));
    /// assert_eq!(result.http_status(), 429);
    /// ```
    pub fn http_status(&self) -> u16 {
        self.error.as_ref().map_or(200, |e| e.code.http_status())
    }

    fn with_record(
        call: &ToolCall,
        status: ResultStatus,
        record: CallRecord,
        attempts: u32,
        output: Option<ToolOutput>,
        error: Option<ResultError>,
    ) -> ToolResult {
        ToolResult {
            request_id: call.request_id().to_owned(),
            status,
            from_cache: record.from_cache,
            cache: record.cache,
            tool_name: call.tool_name().to_owned(),
            duration_ms: record.duration.map_or(0, millis),
            attempts,
            output,
            error,
            retried_by: (!record.retried_by.is_empty()).then_some(record.retried_by),
            retry_policy_clamped: (!record.retry_clamped.is_empty())
                .then_some(record.retry_clamped),
            hedge: record.hedge,
            streamed: StreamTally::of(call),
        }
    }

    /// `true` when the status is `success`.
    pub fn is_success(&self) -> bool {
        self.status == ResultStatus::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> ToolCall {
        ToolCall::builder("ns", "tool")
            .session("s")
            .actor("u")
            .build()
            .unwrap()
    }

    fn error_fields(error: ToolError) -> (ResultStatus, bool, bool) {
        let result = ToolResult::from_outcome(&call(), Err(error));
        let error = result.error.unwrap();
        (result.status, error.retriable, error.terminal)
    }

    #[test]
    fn an_error_no_layer_classified_gets_the_default_classifier_verdict() {
        let overloaded = ToolError::new(ErrorCode::UpstreamError, "busy").with_http_status(503);
        assert_eq!(
            error_fields(overloaded),
            (ResultStatus::RetriableError, true, false)
        );
        // Nothing vouches for a tool the result knows nothing about: an error that says
        // nothing is terminal.
        let unknown = ToolError::new(ErrorCode::InternalError, "?");
        assert_eq!(error_fields(unknown), (ResultStatus::Error, false, true));
    }

    #[test]
    fn a_refused_call_keeps_the_class_of_its_error() {
        let throttled = ToolError::rejected(ErrorCode::RateLimited, "slow down");
        assert_eq!(
            error_fields(throttled),
            (ResultStatus::RetriableError, true, false)
        );
        let looping = ToolError::rejected(ErrorCode::LoopDetected, "loop");
        assert_eq!(error_fields(looping), (ResultStatus::Error, false, true));
    }
}
