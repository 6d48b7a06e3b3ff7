//! Time functions shared by the layers. Every clock reading is `tokio::time::Instant`, so that
//! paused tokio time governs the layers in tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::contract::envelope::ToolCall;
use crate::contract::error::ConfigError;

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The wall clock, in Unix milliseconds.
pub(crate) fn unix_now_ms() -> u64 {
    millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// The instant of the call's `control.deadlineAtMs` (Unix milliseconds) on the tokio clock,
/// seen from `now`; a deadline in the past is `now`.
pub(crate) fn call_deadline(call: &ToolCall, now: Instant) -> Option<Instant> {
    let at = call.control().deadline_at_ms?;
    Some(now + Duration::from_millis(at.saturating_sub(unix_now_ms())))
}

/// Refuses a configured duration under one millisecond, the resolution of records.
pub(crate) fn at_least_a_millisecond(field: &str, value: Duration) -> Result<(), ConfigError> {
    if value < Duration::from_millis(1) {
        return Err(ConfigError::new(
            field,
            format!("must be at least 1 ms, got {} µs", value.as_micros()),
        ));
    }
    Ok(())
}
