//! Time functions shared by the layers. Every clock reading is `tokio::time::Instant`, so that
//! paused tokio time governs the layers in tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
