//! Hedging: when a second attempt is sent beside a slow one, and after how long.

use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Sleep;

use super::policy::RetryPolicy;

/// How many of a tool's latest latencies its window keeps.
const WINDOW: usize = 128;

/// How many latencies the window needs before its percentile decides the delay.
pub(super) const MIN_SAMPLES: usize = 16;

/// The shortest delay a percentile gives: a hedge never goes out at once.
const SHORTEST: Duration = Duration::from_millis(1);

/// The latest latencies of one tool's answered calls (the time from the first attempt's
/// start to the answer), in microseconds: a ring of [`WINDOW`] entries.
#[derive(Debug, Default)]
pub(super) struct LatencyWindow {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    micros: Vec<u64>,
    /// Where the next latency goes once the ring is full.
    next: usize,
}

impl LatencyWindow {
    pub(super) fn record(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.micros.len() < WINDOW {
            ring.micros.push(micros);
        } else {
            let next = ring.next;
            ring.micros[next] = micros;
            ring.next = (next + 1) % WINDOW;
        }
    }

    /// The `percentile` (1 to 99, nearest rank) of the latencies, once there are
    /// [`MIN_SAMPLES`] of them.
    pub(super) fn percentile(&self, percentile: u32) -> Option<Duration> {
        let mut copy = [0u64; WINDOW];
        let n = {
            let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            copy[..ring.micros.len()].copy_from_slice(&ring.micros);
            ring.micros.len()
        };
        if n < MIN_SAMPLES {
            return None;
        }
        let rank = (n * percentile as usize).div_ceil(100).clamp(1, n);
        let (_, nth, _) = copy[..n].select_nth_unstable(rank - 1);
        Some(Duration::from_micros(*nth))
    }
}

/// How long an attempt of a tool with `policy` runs before it is hedged: the percentile of
/// its recent latencies when the policy names one and the window has enough of them (at
/// least 1 ms), the policy's fixed delay otherwise; `None`: no hedge.
pub(super) fn hedge_delay(
    policy: &RetryPolicy,
    latencies: Option<&LatencyWindow>,
) -> Option<Duration> {
    let from_window = policy
        .hedge_percentile
        .zip(latencies)
        .and_then(|(p, window)| window.percentile(p))
        .map(|d| d.max(SHORTEST));
    from_window.or(policy.hedge_delay)
}

/// Where a call's hedge stands.
#[derive(Debug)]
pub(super) enum Hedging {
    /// Not yet considered for the attempt in flight.
    Unarmed,
    /// Waiting for the attempt to have run `delay`.
    Armed {
        sleep: Pin<Box<Sleep>>,
        delay: Duration,
    },
    /// The delay passed; waiting for the service to be ready to send it.
    Due { delay: Duration },
    /// Sent as attempt `attempt + 1` after attempt `attempt` had run `delay`.
    Sent { attempt: u32, delay: Duration },
    /// The call is not hedged: hedging is off, a repeat is not safe, or the hedge was
    /// refused.
    Never,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentile_is_the_nearest_rank_of_the_latest_latencies() {
        let window = LatencyWindow::default();
        for ms in 1..=15 {
            window.record(Duration::from_millis(ms));
        }
        assert_eq!(window.percentile(50), None, "too few latencies");
        for ms in 16..=100 {
            window.record(Duration::from_millis(ms));
        }
        assert_eq!(window.percentile(90), Some(Duration::from_millis(90)));
        assert_eq!(window.percentile(1), Some(Duration::from_millis(1)));
        // 128 more of 5 ms push every older one out.
        for _ in 0..WINDOW {
            window.record(Duration::from_millis(5));
        }
        assert_eq!(window.percentile(99), Some(Duration::from_millis(5)));
    }

    #[test]
    fn the_delay_is_the_percentile_once_known_and_the_fixed_delay_before() {
        let policy = RetryPolicy {
            hedge_delay: Some(Duration::from_millis(40)),
            hedge_percentile: Some(50),
            ..RetryPolicy::default()
        };
        let window = LatencyWindow::default();
        assert_eq!(
            hedge_delay(&policy, Some(&window)),
            Some(Duration::from_millis(40))
        );
        for _ in 0..MIN_SAMPLES {
            window.record(Duration::from_micros(10));
        }
        assert_eq!(hedge_delay(&policy, Some(&window)), Some(SHORTEST));
        assert_eq!(hedge_delay(&RetryPolicy::default(), Some(&window)), None);
    }
}
