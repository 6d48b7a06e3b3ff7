//! The sampling window of a closed breaker: the run of consecutive failures and the outcomes
//! of the latest calls, each with its time, so that failures older than the rolling window do
//! not count.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::state::BreakerConfig;

/// Why the window says the breaker must open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trip {
    /// This many consecutive failures inside the window.
    ConsecutiveFailures(u32),
    /// `failures` of the last `calls` calls inside the window failed.
    FailureRate {
        /// Failed calls.
        failures: u32,
        /// Calls counted.
        calls: u32,
    },
}

/// The outcomes of the latest calls of a closed breaker.
#[derive(Clone, Debug, Default)]
pub(crate) struct OutcomeWindow {
    /// The latest calls, oldest first: (finished at, failed). At most `sample_size` of them.
    recent: VecDeque<(Instant, bool)>,
    /// When each failure of the current run of consecutive failures happened, oldest first.
    run: VecDeque<Instant>,
}

impl OutcomeWindow {
    /// An empty window.
    pub(crate) fn new() -> Self {
        OutcomeWindow::default()
    }

    /// Records a success at `now`: the run of failures ends.
    pub(crate) fn record_success(&mut self, now: Instant, cfg: &BreakerConfig) {
        self.push(now, false, cfg);
        self.run.clear();
    }

    /// Records a failure at `now`, and says whether the breaker must open.
    pub(crate) fn record_failure(&mut self, now: Instant, cfg: &BreakerConfig) -> Option<Trip> {
        self.push(now, true, cfg);
        let cutoff = now.checked_sub(cfg.window);
        let inside = |at: &Instant| cutoff.is_none_or(|cutoff| *at > cutoff);
        while self.run.front().is_some_and(|at| !inside(at)) {
            self.run.pop_front();
        }
        self.run.push_back(now);
        let run = count(self.run.len());
        if run >= cfg.consecutive_failures {
            return Some(Trip::ConsecutiveFailures(run));
        }
        let (calls, failures) = self.counts(now, cfg);
        let rate_reached =
            u64::from(failures) * 100 >= u64::from(cfg.failure_rate_percent) * u64::from(calls);
        (calls >= cfg.min_calls && rate_reached).then_some(Trip::FailureRate { failures, calls })
    }

    /// Forgets every outcome.
    pub(crate) fn clear(&mut self) {
        self.recent.clear();
        self.run.clear();
    }

    /// Consecutive failures in the current run (old ones included until the next failure
    /// drops them).
    pub(crate) fn consecutive_failures(&self) -> u32 {
        count(self.run.len())
    }

    /// Calls and failures among the latest calls inside the window at `now`.
    pub(crate) fn counts(&self, now: Instant, cfg: &BreakerConfig) -> (u32, u32) {
        let cutoff = now.checked_sub(cfg.window);
        self.recent
            .iter()
            .filter(|(at, _)| cutoff.is_none_or(|cutoff| *at > cutoff))
            .fold((0, 0), |(calls, failures), (_, failed)| {
                (calls + 1, failures + u32::from(*failed))
            })
    }

    fn push(&mut self, now: Instant, failed: bool, cfg: &BreakerConfig) {
        let size = usize::try_from(cfg.sample_size).unwrap_or(usize::MAX);
        while self.recent.len() >= size {
            self.recent.pop_front();
        }
        self.recent.push_back((now, failed));
    }
}

fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
