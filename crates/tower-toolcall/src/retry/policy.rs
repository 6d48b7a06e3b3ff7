//! The retry policy of a tool, how a call narrows it, when a retry is safe, and the error of a
//! call that ran out of attempts, budget or time.

use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::backoff::Backoff;
use crate::classify::ToolProfile;
use crate::envelope::{CallRetryPolicy, ToolCall};
use crate::error::{ConfigError, ErrorCode, ToolError};
use crate::outcome::{RetryClamp, RetryRecord};
use crate::registry::{JitterKind, RetrySettings};
use crate::time::millis;

/// The retry policy of one tool: the layer's defaults with the tool's `policy.retry`
/// overrides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) deadline: Duration,
    pub(super) forwards_idempotency_key: bool,
    pub(super) hedge_delay: Option<Duration>,
    pub(super) hedge_percentile: Option<u32>,
}

impl Default for RetryPolicy {
    /// 4 attempts, full jitter of `min(4 s, 200 ms · 2^n)`, 30 s for all attempts.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            backoff: Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(4),
                JitterKind::Full,
                20,
            ),
            deadline: Duration::from_secs(30),
            forwards_idempotency_key: false,
            hedge_delay: None,
            hedge_percentile: None,
        }
    }
}

impl RetryPolicy {
    /// Attempts in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The time all attempts and sleeps may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether the tool forwards the call's idempotency key to its upstream.
    pub fn forwards_idempotency_key(&self) -> bool {
        self.forwards_idempotency_key
    }

    /// How long an attempt runs before it is hedged, unless the percentile decides;
    /// `None` when it does not apply.
    pub fn hedge_delay(&self) -> Option<Duration> {
        self.hedge_delay
    }

    /// The percentile of the tool's recent latencies after which an attempt is hedged.
    pub fn hedge_percentile(&self) -> Option<u32> {
        self.hedge_percentile
    }

    /// Whether the tool's calls may be hedged (when a repeat is safe).
    pub fn hedges(&self) -> bool {
        self.hedge_delay.is_some() || self.hedge_percentile.is_some()
    }

    /// This policy with `settings` over it, checked; errors name `<prefix>.<field>`
    /// (`retry.max_delay_ms` for the layer's settings, `policy.retry.max_delay_ms` for a
    /// tool's).
    pub(super) fn with_settings(
        &self,
        o: &RetrySettings,
        prefix: &str,
    ) -> Result<RetryPolicy, ConfigError> {
        let b = &self.backoff;
        let policy = RetryPolicy {
            max_attempts: o.max_attempts.unwrap_or(self.max_attempts),
            backoff: Backoff::new(
                o.base_delay_ms.map_or(b.base(), Duration::from_millis),
                o.max_delay_ms.map_or(b.max(), Duration::from_millis),
                o.jitter.unwrap_or(b.jitter()),
                o.jitter_percent.unwrap_or(b.percent()),
            ),
            deadline: o.deadline_ms.map_or(self.deadline, Duration::from_millis),
            forwards_idempotency_key: o
                .forwards_idempotency_key
                .unwrap_or(self.forwards_idempotency_key),
            hedge_delay: o
                .hedge_delay_ms
                .map(Duration::from_millis)
                .or(self.hedge_delay),
            hedge_percentile: o.hedge_percentile.or(self.hedge_percentile),
        };
        policy.check(prefix)?;
        Ok(policy)
    }

    /// Checks the numbers; errors name `<prefix>.<field>`.
    fn check(&self, prefix: &str) -> Result<(), ConfigError> {
        let b = &self.backoff;
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                format!("{prefix}.max_attempts"),
                "must be at least 1 (the first attempt), got 0",
            ));
        }
        if b.max() < b.base() {
            return Err(ConfigError::new(
                format!("{prefix}.max_delay_ms"),
                format!(
                    "must not be below the base delay ({} ms), got {} ms",
                    millis(b.base()),
                    millis(b.max())
                ),
            ));
        }
        if self.deadline.is_zero() {
            return Err(ConfigError::new(
                format!("{prefix}.deadline_ms"),
                "must be longer than zero",
            ));
        }
        if b.percent() > 100 {
            return Err(ConfigError::new(
                format!("{prefix}.jitter_percent"),
                format!("must be at most 100, got {}", b.percent()),
            ));
        }
        if self.hedge_delay.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                format!("{prefix}.hedge_delay_ms"),
                "must be at least 1: a hedge sent at once would run every call twice",
            ));
        }
        if let Some(p) = self.hedge_percentile.filter(|p| !(1..=99).contains(p)) {
            return Err(ConfigError::new(
                format!("{prefix}.hedge_percentile"),
                format!("must be between 1 and 99, got {p}"),
            ));
        }
        Ok(())
    }
}

/// The limits of one call: its tool's policy narrowed by the envelope.
#[derive(Clone, Copy, Debug)]
pub(super) struct CallLimits {
    /// Attempts in all: the policy's, at most `transport.retryBudget.maxAttempts` and
    /// `transport.retryPolicy.maxAttempts`.
    pub(super) max_attempts: u32,
    /// The backoff: the policy's, narrowed by `transport.retryPolicy`.
    pub(super) backoff: Backoff,
    /// Time for all attempts and sleeps: the policy's deadline, at most
    /// `transport.retryBudget.maxElapsedMs`.
    pub(super) retry_time: Duration,
    /// When `retry_time` runs out.
    pub(super) retry_deadline: Instant,
    /// `control.deadlineAtMs`, the call's own deadline.
    pub(super) call_deadline: Option<Instant>,
}

impl CallLimits {
    pub(super) fn new(policy: &RetryPolicy, call: &ToolCall, started: Instant) -> Self {
        let budget = call.transport().retry_budget;
        let narrowed = Narrowed::of(policy, call.transport().retry_policy.as_ref());
        let max_attempts = budget.map_or(narrowed.max_attempts, |b| {
            narrowed.max_attempts.min(b.max_attempts.max(1))
        });
        let retry_time = budget.map_or(policy.deadline, |b| {
            policy.deadline.min(Duration::from_millis(b.max_elapsed_ms))
        });
        CallLimits {
            max_attempts,
            backoff: narrowed.backoff,
            retry_time,
            retry_deadline: started + retry_time,
            call_deadline: call.deadline_from(started),
        }
    }

    /// The earlier of the two deadlines.
    pub(super) fn end(&self) -> Instant {
        self.call_deadline
            .map_or(self.retry_deadline, |d| d.min(self.retry_deadline))
    }

    /// Which deadline is reached at `at`, the call's first.
    pub(super) fn reached(&self, at: Instant) -> Option<GiveUp> {
        if self.call_deadline.is_some_and(|d| at >= d) {
            Some(GiveUp::CallDeadline)
        } else if at >= self.retry_deadline {
            Some(GiveUp::RetryDeadline)
        } else {
            None
        }
    }
}

/// A tool's policy narrowed by a caller's `transport.retryPolicy`, and each field that asked
/// for more than the policy allows.
#[derive(Debug)]
pub(super) struct Narrowed {
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) clamped: Vec<RetryClamp>,
}

impl Narrowed {
    /// `policy` narrowed by `caller`: at most the policy's attempts, a base delay and a cap
    /// within the policy's `[base, cap]`, a growth of at least the policy's doubling, a
    /// jitter spread of at most the policy's (applied only to `percent` jitter).
    pub(super) fn of(policy: &RetryPolicy, caller: Option<&CallRetryPolicy>) -> Narrowed {
        let mut narrowed = Narrowed {
            max_attempts: policy.max_attempts,
            backoff: policy.backoff,
            clamped: Vec::new(),
        };
        let Some(caller) = caller else {
            return narrowed;
        };
        let tool = &policy.backoff;
        let (tool_base, tool_max) = (millis(tool.base()), millis(tool.max()));
        let mut clamp = |field: &str, requested: Value, applied: Value| {
            narrowed
                .clamped
                .push(RetryClamp::new(field, requested, applied));
        };
        if let Some(asked) = caller.max_attempts {
            if asked > policy.max_attempts {
                clamp("maxAttempts", asked.into(), policy.max_attempts.into());
            }
            narrowed.max_attempts = asked.clamp(1, policy.max_attempts);
        }
        let base = match caller.initial_delay_ms {
            Some(asked) => {
                let applied = asked.clamp(tool_base, tool_max);
                if applied != asked {
                    clamp("initialDelayMs", asked.into(), applied.into());
                }
                applied
            }
            None => tool_base,
        };
        let max = match caller.max_delay_ms {
            Some(asked) => {
                let applied = asked.clamp(base, tool_max);
                if applied != asked {
                    clamp("maxDelayMs", asked.into(), applied.into());
                }
                applied
            }
            None => tool_max.max(base),
        };
        let multiplier_permille = match caller.backoff_multiplier {
            Some(asked) if asked < 2.0 => {
                clamp("backoffMultiplier", json!(asked), json!(2.0));
                2_000
            }
            // At most 1000 (the envelope's check), so the thousandths fit.
            Some(asked) => (asked * 1000.0).round() as u32,
            None => 2_000,
        };
        let percent = match caller.jitter_percent {
            Some(asked) if tool.jitter() != JitterKind::Percent => {
                clamp("jitterPercent", asked.into(), Value::Null);
                tool.percent()
            }
            Some(asked) if asked > tool.percent() => {
                clamp("jitterPercent", asked.into(), tool.percent().into());
                tool.percent()
            }
            Some(asked) => asked,
            None => tool.percent(),
        };
        narrowed.backoff = tool.narrowed(
            Duration::from_millis(base),
            Duration::from_millis(max),
            percent,
            multiplier_permille,
        );
        narrowed
    }
}

/// Whether the caller's `transport.retryPolicy.retryableErrors`, when it has one, lists
/// `code`.
pub(super) fn caller_retries(call: &ToolCall, code: ErrorCode) -> bool {
    let listed = call
        .transport()
        .retry_policy
        .as_ref()
        .and_then(|policy| policy.retryable_errors.as_ref());
    listed.is_none_or(|codes| codes.iter().any(|c| ErrorCode::parse(c) == Some(code)))
}

/// Whether another attempt of `call` may run after `error`, for a tool with `profile`.
///
/// Never once the tool sent its caller a chunk of the answer; else always when the error
/// says the request was not processed (connection refused, 429, 503 before processing);
/// otherwise when [`repeat_safety`] allows a repeat.
pub(super) fn retry_safety(
    profile: &ToolProfile,
    policy: &RetryPolicy,
    call: &ToolCall,
    error: &ToolError,
) -> Result<(), &'static str> {
    if call.chunks_sent() > 0 {
        return Err("part of the answer already reached the caller in chunks");
    }
    if error.is_not_processed() {
        return Ok(());
    }
    repeat_safety(profile, policy, call)
}

/// Whether `call` may run again while an earlier attempt may have been processed: the rule
/// of a retry after an error that does not say otherwise, and of every hedge.
///
/// A read-only tool may always run again. A mutating one needs a reason to believe it is
/// safe: the tool is idempotent; the call carries an idempotency key that the tool forwards
/// (`policy.retry.forwards_idempotency_key`); or the caller vouches for it with
/// `callHints.expectedRetrySafe`. A call marked `callHints.safetyCritical` never is.
pub(super) fn repeat_safety(
    profile: &ToolProfile,
    policy: &RetryPolicy,
    call: &ToolCall,
) -> Result<(), &'static str> {
    let hints = call.call_hints();
    if hints.safety_critical == Some(true) {
        return Err("the call is safety-critical and may have been processed");
    }
    if !profile.is_mutating() || profile.is_idempotent() {
        return Ok(());
    }
    let has_key = call.idempotency_key().is_some() || call.hook_idempotency_key().is_some();
    if has_key && policy.forwards_idempotency_key {
        return Ok(());
    }
    if hints.expected_retry_safe == Some(true) {
        return Ok(());
    }
    Err("the tool is mutating, the request may have been processed, and nothing says a repeat is safe")
}

/// Why the layer stopped retrying a call that still failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GiveUp {
    /// Every allowed attempt failed.
    MaxAttempts,
    /// The global retry budget is spent.
    RetryBudget,
    /// No time is left within the retry deadline.
    RetryDeadline,
    /// The call's own deadline ended it.
    CallDeadline,
}

impl GiveUp {
    fn as_str(self) -> &'static str {
        match self {
            GiveUp::MaxAttempts => "max_attempts",
            GiveUp::RetryBudget => "retry_budget",
            GiveUp::RetryDeadline => "retry_deadline",
            GiveUp::CallDeadline => "call_deadline",
        }
    }
}

/// What the call went through before the layer gave up.
#[derive(Debug)]
pub(super) struct History {
    /// Attempts that ran the tool.
    pub(super) attempts: u32,
    /// Whether an attempt may have reached the tool.
    pub(super) reached: bool,
    pub(super) retried_by: Vec<RetryRecord>,
    /// An attempt was still running when the deadline ended the call.
    pub(super) cut_short: bool,
}

/// The error of a call the layer gave up on: `RETRY_EXHAUSTED`, or `TIMEOUT` when the call's
/// deadline ended it. It carries the last error's code and message in its message and
/// details, the last error as its source, and the last error's record with the attempts and
/// retries filled in.
///
/// When no attempt reached the tool (each failure said the request went unprocessed) and
/// the last failure is retriable and says when to come back (a dependency that is
/// restarting, a throttle), the call keeps the last failure's code and retry hint
/// (`UPSTREAM_UNAVAILABLE`, retriable, `retryAfterMs`): nothing ran, and the caller may send
/// the call again then. A retry hint is only ever given beside a retriable error.
pub(super) fn give_up(
    why: GiveUp,
    last: ToolError,
    call: &ToolCall,
    limits: &CallLimits,
    history: History,
) -> ToolError {
    let tool = call.tool_name();
    let n = history.attempts;
    let failed = match n {
        0 => format!("{tool} never ran"),
        1 => format!("{tool} failed once"),
        n => format!("{tool} failed {n} times"),
    };
    let running = if history.cut_short {
        " while an attempt was running"
    } else {
        ""
    };
    let last_said = format!("{}: {}", last.code(), last.message());
    let (code, message) = match why {
        GiveUp::MaxAttempts => (
            ErrorCode::RetryExhausted,
            format!("{failed}: {}", last.message()),
        ),
        GiveUp::RetryBudget => (
            ErrorCode::RetryExhausted,
            format!(
                "{failed} and the retry budget shared by all calls is spent, which happens \
                 when many calls fail at once; wait before calling again. Last error: \
                 {last_said}"
            ),
        ),
        GiveUp::RetryDeadline => (
            ErrorCode::RetryExhausted,
            format!(
                "{failed} and its retry deadline of {} ms ran out{running}. Last error: \
                 {last_said}",
                millis(limits.retry_time)
            ),
        ),
        GiveUp::CallDeadline => (
            ErrorCode::Timeout,
            format!(
                "the call's deadline (control.deadlineAtMs) passed{running}; {failed}. Last \
                 error: {last_said}"
            ),
        ),
    };
    let mut last_error = Map::new();
    last_error.insert("code".into(), json!(last.code().as_str()));
    last_error.insert("message".into(), json!(last.message()));
    if let Some(status) = last.http_status() {
        last_error.insert("httpStatus".into(), json!(status));
    }
    let details = json!({
        "reason": why.as_str(),
        "attempts": n,
        "lastError": Value::Object(last_error),
    });
    let away = !history.reached
        && last.is_retriable()
        && last.retry_after().is_some()
        && why != GiveUp::CallDeadline;
    let (code, message) = if away {
        (last.code(), format!("{tool} never ran: {}", last.message()))
    } else {
        (code, message)
    };
    let mut error = ToolError::new(code, message)
        .not_processed(n == 0 || away)
        .with_details(details);
    if let Some(after) = last.retry_after().filter(|_| error.is_retriable()) {
        error = error.with_retry_after(after);
    }
    let mut record = last.record().clone();
    record.attempts = Some(n);
    record.retried_by = history.retried_by;
    *error.record_mut() = record;
    error.with_source(last)
}
