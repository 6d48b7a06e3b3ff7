//! Durations as records count them: whole milliseconds. Every layer, store and adapter
//! converts with these, so that a record, an audit line and a store agree to the
//! millisecond. (Every clock reading of the layers is `tokio::time::Instant`, so that paused
//! tokio time governs them in tests; only [`unix_now_ms`] reads the wall clock.)
//!
//! ```
//! use std::time::Duration;
//! use tower_toolcall::time::{at_least_a_millisecond, millis};
//!
//! assert_eq!(millis(Duration::from_micros(2_999)), 2);
//! assert_eq!(millis(Duration::MAX), u64::MAX);
//! let error = at_least_a_millisecond("ttl", Duration::from_micros(500)).unwrap_err();
//! assert_eq!(error.to_string(), "invalid configuration: `ttl` must be at least 1 ms, got 500 µs");
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::contract::error::ConfigError;

/// A duration in whole milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The wall clock, in Unix milliseconds.
pub fn unix_now_ms() -> u64 {
    millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Refuses a configured duration under one millisecond, the resolution of records.
pub fn at_least_a_millisecond(field: &str, value: Duration) -> Result<(), ConfigError> {
    if value < Duration::from_millis(1) {
        return Err(ConfigError::new(
            field,
            format!("must be at least 1 ms, got {} µs", value.as_micros()),
        ));
    }
    Ok(())
}
