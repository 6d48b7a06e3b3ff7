//! Waiting for what happens in the background.

use std::time::Duration;

use tokio::time::Instant;

/// Waits (real time, at most 5 s) until `done` holds.
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
