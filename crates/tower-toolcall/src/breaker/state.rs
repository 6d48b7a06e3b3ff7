//! The breaker's state machine, free of locks and clocks: every step takes `now` and the
//! configuration and returns the transition it made, if any. The service around it owns the
//! lock and reads the tokio clock.

use std::time::Duration;

use tokio::time::Instant;

use super::window::{OutcomeWindow, Trip};
use crate::error::ConfigError;
use crate::event::TransitionReason;
use crate::outcome::BreakerState;
use crate::registry::BreakerSettings;

/// The numbers of one breaker, resolved from the defaults, the layer's
/// [`BreakerSettings`] and a tool's.
///
/// The defaults are those of the specification: open after 5 consecutive failures, or a
/// failure rate of 50 % or more over the last 20 calls (at least 10 of them) inside a rolling
/// 120 s window; stay open 30 s; then admit 1 probe at a time and close after 2 successful
/// ones. A probe that has not answered after 30 s (the tool's attempt timeout when it has one)
/// is abandoned and counts as failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) struct BreakerConfig {
    pub(crate) consecutive_failures: u32,
    pub(crate) failure_rate_percent: u32,
    pub(crate) sample_size: u32,
    pub(crate) min_calls: u32,
    pub(crate) window: Duration,
    pub(crate) cooldown: Duration,
    pub(crate) half_open_probes: u32,
    pub(crate) close_after_successes: u32,
    pub(crate) probe_timeout: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate_percent: 50,
            sample_size: 20,
            min_calls: 10,
            window: Duration::from_secs(120),
            cooldown: Duration::from_secs(30),
            half_open_probes: 1,
            close_after_successes: 2,
            probe_timeout: Duration::from_secs(30),
        }
    }
}

impl BreakerConfig {
    /// The preset of read-only tools: a higher threshold and a shorter cooldown (8
    /// consecutive failures, 20 s), so that a flaky read is not dampened for long.
    pub(crate) fn read_only() -> Self {
        BreakerConfig::default()
            .with_consecutive_failures(8)
            .with_cooldown(Duration::from_secs(20))
    }

    /// The preset of mutating tools (`writes`, `commands`): a lower failure-rate threshold
    /// (25 %), so that a dependency that fails writes is left alone sooner.
    pub(crate) fn mutating() -> Self {
        BreakerConfig::default().with_failure_rate_percent(25)
    }

    /// Consecutive failures that open the breaker (default 5).
    pub(crate) fn with_consecutive_failures(mut self, failures: u32) -> Self {
        self.consecutive_failures = failures;
        self
    }

    /// Failure rate, in percent, that opens the breaker (default 50).
    pub(crate) fn with_failure_rate_percent(mut self, percent: u32) -> Self {
        self.failure_rate_percent = percent;
        self
    }

    /// How many of the latest calls the rate is computed over (default 20).
    #[cfg(test)]
    pub(crate) fn with_sample_size(mut self, calls: u32) -> Self {
        self.sample_size = calls;
        self
    }

    /// Calls needed inside the window before the rate counts (default 10).
    #[cfg(test)]
    pub(crate) fn with_min_calls(mut self, calls: u32) -> Self {
        self.min_calls = calls;
        self
    }

    /// The rolling window: older outcomes do not count (default 120 s).
    #[cfg(test)]
    pub(crate) fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long the breaker stays open before it admits a probe (default 30 s).
    pub(crate) fn with_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// Probes admitted at once when half-open (default 1).
    #[cfg(test)]
    pub(crate) fn with_half_open_probes(mut self, probes: u32) -> Self {
        self.half_open_probes = probes;
        self
    }

    /// Consecutive successful probes that close the breaker (default 2).
    #[cfg(test)]
    pub(crate) fn with_close_after_successes(mut self, successes: u32) -> Self {
        self.close_after_successes = successes;
        self
    }

    /// How long a probe may go unanswered before it is abandoned as failed (default 30 s);
    /// a tool's attempt timeout takes its place for the tool's own breaker.
    pub(crate) fn with_probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// The cooldown.
    #[cfg(test)]
    pub(crate) fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// The consecutive failures that open the breaker.
    #[cfg(test)]
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The failure rate, in percent, that opens the breaker.
    #[cfg(test)]
    pub(crate) fn failure_rate_percent(&self) -> u32 {
        self.failure_rate_percent
    }

    /// The probe timeout.
    #[cfg(test)]
    pub(crate) fn probe_timeout(&self) -> Duration {
        self.probe_timeout
    }

    /// The configuration with `settings` over it.
    pub(crate) fn with_settings(mut self, settings: &BreakerSettings) -> Self {
        let ms = Duration::from_millis;
        let o = settings;
        self.consecutive_failures = o.consecutive_failures.unwrap_or(self.consecutive_failures);
        self.failure_rate_percent = o.failure_rate_percent.unwrap_or(self.failure_rate_percent);
        self.sample_size = o.sample_size.unwrap_or(self.sample_size);
        self.min_calls = o.min_calls.unwrap_or(self.min_calls);
        self.window = o.window_ms.map_or(self.window, ms);
        self.cooldown = o.cooldown_ms.map_or(self.cooldown, ms);
        self.half_open_probes = o.half_open_probes.unwrap_or(self.half_open_probes);
        self.close_after_successes = o
            .close_after_successes
            .unwrap_or(self.close_after_successes);
        self.probe_timeout = o.probe_timeout_ms.map_or(self.probe_timeout, ms);
        self
    }

    /// Checks the numbers; the error names the field below `breaker`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let positive = [
            ("consecutive_failures", self.consecutive_failures),
            ("failure_rate_percent", self.failure_rate_percent),
            ("sample_size", self.sample_size),
            ("min_calls", self.min_calls),
            ("half_open_probes", self.half_open_probes),
            ("close_after_successes", self.close_after_successes),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ConfigError::new(
                    format!("breaker.{field}"),
                    "must be at least 1, got 0",
                ));
            }
        }
        if self.failure_rate_percent > 100 {
            return Err(ConfigError::new(
                "breaker.failure_rate_percent",
                format!("must be at most 100, got {}", self.failure_rate_percent),
            ));
        }
        if self.min_calls > self.sample_size {
            return Err(ConfigError::new(
                "breaker.min_calls",
                format!(
                    "must not exceed sample_size ({}), got {}",
                    self.sample_size, self.min_calls
                ),
            ));
        }
        for (field, value) in [
            ("window", self.window),
            ("cooldown", self.cooldown),
            ("probe_timeout", self.probe_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(
                    format!("breaker.{field}"),
                    "must be longer than zero",
                ));
            }
        }
        Ok(())
    }
}

/// How a finished call counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CallOutcome {
    /// The dependency answered.
    Success,
    /// A failure that speaks of the dependency's health.
    Failure,
    /// Neither: a caller error, or a rejected call.
    Neutral,
}

/// One change of state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The state before.
    pub(crate) from: BreakerState,
    /// The state after.
    pub(crate) to: BreakerState,
    /// Why.
    pub(crate) reason: TransitionReason,
    /// When.
    pub(crate) at: Instant,
}

/// A call let through, to be handed back with its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    generation: u64,
    /// The probe's id, for a call admitted while half-open.
    probe: Option<u64>,
}

impl Ticket {
    /// The ticket of a call admitted while the breaker is closed in `generation`.
    pub(crate) fn closed(generation: u64) -> Self {
        Ticket {
            generation,
            probe: None,
        }
    }

    /// `true` for a half-open probe.
    pub(crate) fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

/// The answer to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The call may go through.
    Admitted(Ticket),
    /// The call must fail fast.
    Rejected {
        /// The state that refused it.
        state: BreakerState,
        /// When a call may be admitted again, when that is known.
        retry_after: Option<Duration>,
    },
}

#[derive(Clone, Debug)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        /// In-flight probes: (id, admitted at).
        probes: Vec<(u64, Instant)>,
        successes: u32,
    },
    ForcedOpen,
}

/// The state of one breaker.
///
/// Every transition starts a new *generation*. A call admitted in an earlier generation is
/// *late*: its outcome is counted in [`late_results`](CircuitState::late_results) but changes
/// nothing, so that results arriving after the breaker opened never extend the break.
#[derive(Clone, Debug)]
pub(crate) struct CircuitState {
    phase: Phase,
    window: OutcomeWindow,
    generation: u64,
    next_probe: u64,
    late_results: u64,
}

impl Default for CircuitState {
    fn default() -> Self {
        CircuitState::new()
    }
}

impl CircuitState {
    /// A closed breaker with an empty window.
    pub(crate) fn new() -> Self {
        CircuitState {
            phase: Phase::Closed,
            window: OutcomeWindow::new(),
            generation: 0,
            next_probe: 0,
            late_results: 0,
        }
    }

    /// The current state.
    pub(crate) fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
            Phase::ForcedOpen => BreakerState::ForcedOpen,
        }
    }

    /// The generation: it changes with every transition.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Outcomes of calls admitted before the latest transition.
    pub(crate) fn late_results(&self) -> u64 {
        self.late_results
    }

    /// Probes in flight (half-open only).
    pub(crate) fn probes_in_flight(&self) -> usize {
        match &self.phase {
            Phase::HalfOpen { probes, .. } => probes.len(),
            _ => 0,
        }
    }

    /// The sampling window.
    pub(crate) fn window(&self) -> &OutcomeWindow {
        &self.window
    }

    /// How long until an open breaker admits a probe.
    pub(crate) fn open_for(&self, now: Instant) -> Option<Duration> {
        match self.phase {
            Phase::Open { until } => Some(until.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// Applies what time alone changes: an open breaker whose cooldown passed becomes
    /// half-open; a half-open breaker whose oldest probe outlived the probe timeout reopens.
    pub(crate) fn refresh(&mut self, now: Instant, cfg: &BreakerConfig) -> Option<Transition> {
        match &self.phase {
            Phase::Open { until } if now >= *until => {
                Some(self.go(half_open(), TransitionReason::CooldownElapsed, now))
            }
            Phase::HalfOpen { probes, .. }
                if probes
                    .iter()
                    .any(|(_, at)| now.saturating_duration_since(*at) >= cfg.probe_timeout) =>
            {
                Some(self.open(TransitionReason::ProbeAbandoned, now, cfg))
            }
            _ => None,
        }
    }

    /// Lets a call through or refuses it; may first apply what time changed (see
    /// [`refresh`](CircuitState::refresh)).
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        cfg: &BreakerConfig,
    ) -> (Admission, Option<Transition>) {
        let transition = self.refresh(now, cfg);
        let admission = match &mut self.phase {
            Phase::Closed => Admission::Admitted(Ticket::closed(self.generation)),
            Phase::Open { until } => Admission::Rejected {
                state: BreakerState::Open,
                retry_after: Some(until.saturating_duration_since(now)),
            },
            Phase::HalfOpen { probes, .. } => {
                if probes.len() < usize::try_from(cfg.half_open_probes).unwrap_or(usize::MAX) {
                    let id = self.next_probe;
                    self.next_probe += 1;
                    probes.push((id, now));
                    Admission::Admitted(Ticket {
                        generation: self.generation,
                        probe: Some(id),
                    })
                } else {
                    let oldest = probes.iter().map(|(_, at)| *at).min().unwrap_or(now);
                    Admission::Rejected {
                        state: BreakerState::HalfOpen,
                        retry_after: Some(
                            (oldest + cfg.probe_timeout).saturating_duration_since(now),
                        ),
                    }
                }
            }
            Phase::ForcedOpen => Admission::Rejected {
                state: BreakerState::ForcedOpen,
                retry_after: None,
            },
        };
        (admission, transition)
    }

    /// Records the outcome of an admitted call that finished at `now`.
    pub(crate) fn record(
        &mut self,
        ticket: Ticket,
        outcome: CallOutcome,
        now: Instant,
        cfg: &BreakerConfig,
    ) -> Option<Transition> {
        if ticket.generation != self.generation {
            self.late_results += 1;
            return None;
        }
        match (&mut self.phase, outcome) {
            (Phase::Closed, CallOutcome::Success) => {
                self.window.record_success(now, cfg);
                None
            }
            (Phase::Closed, CallOutcome::Failure) => {
                let trip = self.window.record_failure(now, cfg)?;
                let reason = match trip {
                    Trip::ConsecutiveFailures(n) => TransitionReason::ConsecutiveFailures(n),
                    Trip::FailureRate { failures, calls } => {
                        TransitionReason::FailureRate { failures, calls }
                    }
                };
                Some(self.open(reason, now, cfg))
            }
            (Phase::HalfOpen { probes, successes }, outcome) => {
                let at = probes
                    .iter()
                    .position(|(id, _)| Some(*id) == ticket.probe)?;
                probes.swap_remove(at);
                match outcome {
                    CallOutcome::Success => {
                        *successes += 1;
                        let successes = *successes;
                        (successes >= cfg.close_after_successes).then(|| {
                            self.window.clear();
                            self.go(
                                Phase::Closed,
                                TransitionReason::ProbesSucceeded(successes),
                                now,
                            )
                        })
                    }
                    CallOutcome::Failure => {
                        Some(self.open(TransitionReason::ProbeFailed, now, cfg))
                    }
                    CallOutcome::Neutral => None,
                }
            }
            _ => None,
        }
    }

    /// Releases an admitted call that will never report (its caller dropped it): a probe's
    /// place is freed; nothing is counted.
    pub(crate) fn release(&mut self, ticket: Ticket) {
        if ticket.generation != self.generation {
            return;
        }
        if let (Phase::HalfOpen { probes, .. }, Some(probe)) = (&mut self.phase, ticket.probe) {
            probes.retain(|(id, _)| *id != probe);
        }
    }

    /// Holds the breaker open until [`reset`](CircuitState::reset).
    pub(crate) fn force_open(&mut self, now: Instant) -> Option<Transition> {
        if matches!(self.phase, Phase::ForcedOpen) {
            return None;
        }
        Some(self.go(Phase::ForcedOpen, TransitionReason::ForcedOpen, now))
    }

    /// Closes the breaker at once, with an empty window.
    pub(crate) fn reset(&mut self, now: Instant) -> Option<Transition> {
        self.window.clear();
        if matches!(self.phase, Phase::Closed) {
            return None;
        }
        Some(self.go(Phase::Closed, TransitionReason::Reset, now))
    }

    fn open(&mut self, reason: TransitionReason, now: Instant, cfg: &BreakerConfig) -> Transition {
        self.window.clear();
        self.go(
            Phase::Open {
                until: now + cfg.cooldown,
            },
            reason,
            now,
        )
    }

    fn go(&mut self, phase: Phase, reason: TransitionReason, now: Instant) -> Transition {
        let from = self.state();
        self.phase = phase;
        self.generation += 1;
        Transition {
            from,
            to: self.state(),
            reason,
            at: now,
        }
    }
}

fn half_open() -> Phase {
    Phase::HalfOpen {
        probes: Vec::new(),
        successes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BreakerState::{Closed, ForcedOpen, HalfOpen, Open};

    /// One step of a scenario: what happens at `t` seconds, and what must come of it.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// A call arrives; it must be admitted (`true`) or refused.
        Admit(bool),
        /// The oldest admitted call finishes with this outcome.
        Finish(CallOutcome),
        /// The oldest admitted call is dropped by its caller.
        Drop,
        ForceOpen,
        Reset,
        /// An operator looks at the breaker.
        Refresh,
    }

    use CallOutcome::{Failure as F, Neutral as N, Success as S};
    use Step::{Admit, Drop, Finish, ForceOpen, Refresh, Reset};

    struct Case {
        name: &'static str,
        cfg: BreakerConfig,
        /// (seconds since start, step, state after, reason of the transition made, if any)
        steps: Vec<(u64, Step, BreakerState, Option<&'static str>)>,
    }

    /// `n` calls admitted and finished with `outcome` at `t`, staying `state`.
    fn calls(
        t: u64,
        n: usize,
        outcome: CallOutcome,
        state: BreakerState,
    ) -> Vec<(u64, Step, BreakerState, Option<&'static str>)> {
        (0..n)
            .flat_map(|_| {
                [
                    (t, Admit(true), state, None),
                    (t, Finish(outcome), state, None),
                ]
            })
            .collect()
    }

    fn run(case: Case) {
        let start = Instant::now();
        let mut state = CircuitState::new();
        let mut admitted: Vec<Ticket> = Vec::new();
        for (i, (t, step, expected, reason)) in case.steps.into_iter().enumerate() {
            let now = start + Duration::from_secs(t);
            let transition = match step {
                Admit(expect) => {
                    let (admission, transition) = state.admit(now, &case.cfg);
                    match admission {
                        Admission::Admitted(ticket) => {
                            assert!(expect, "{}: step {i} admitted a call", case.name);
                            admitted.push(ticket);
                        }
                        Admission::Rejected { state: s, .. } => {
                            assert!(!expect, "{}: step {i} refused a call", case.name);
                            assert_eq!(s, state.state(), "{}: step {i}", case.name);
                        }
                    }
                    transition
                }
                Finish(outcome) => {
                    let ticket = admitted.remove(0);
                    state.record(ticket, outcome, now, &case.cfg)
                }
                Drop => {
                    state.release(admitted.remove(0));
                    None
                }
                ForceOpen => state.force_open(now),
                Reset => state.reset(now),
                Refresh => state.refresh(now, &case.cfg),
            };
            assert_eq!(
                state.state(),
                expected,
                "{}: state after step {i}",
                case.name
            );
            assert_eq!(
                transition.map(|t| t.reason.as_str()),
                reason,
                "{}: transition of step {i}",
                case.name
            );
        }
    }

    /// A call admitted and failed at `t` that opens the breaker by consecutive failures.
    fn tripping(t: u64) -> Vec<(u64, Step, BreakerState, Option<&'static str>)> {
        vec![
            (t, Admit(true), Closed, None),
            (t, Finish(F), Open, Some("consecutive_failures")),
        ]
    }

    fn cat<T>(parts: impl IntoIterator<Item = Vec<T>>) -> Vec<T> {
        parts.into_iter().flatten().collect()
    }

    #[test]
    fn table() {
        let cases = vec![
            Case {
                name: "five consecutive failures open it",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 4, F, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("consecutive_failures")),
                        (1, Admit(false), Open, None),
                    ],
                ]),
            },
            Case {
                name: "a success ends the run",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 4, F, Closed),
                    calls(0, 1, S, Closed),
                    calls(0, 4, F, Closed),
                ]),
            },
            Case {
                name: "neutral outcomes neither count nor end the run",
                cfg: BreakerConfig::default(),
                steps: cat([calls(0, 4, F, Closed), calls(0, 3, N, Closed), tripping(0)]),
            },
            Case {
                name: "failures older than the window do not count",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 4, F, Closed),
                    calls(121, 4, F, Closed),
                    tripping(122),
                ]),
            },
            Case {
                name: "half of ten calls failing opens it by rate",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 1, S, Closed),
                    calls(0, 1, F, Closed),
                    calls(0, 1, S, Closed),
                    calls(0, 1, F, Closed),
                    calls(0, 1, S, Closed),
                    calls(0, 1, F, Closed),
                    calls(0, 1, S, Closed),
                    calls(0, 1, F, Closed),
                    calls(0, 1, S, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("failure_rate")),
                    ],
                ]),
            },
            Case {
                name: "the rate needs the minimum of calls",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 1, S, Closed),
                    calls(0, 4, F, Closed),
                    calls(0, 1, S, Closed),
                    calls(0, 3, F, Closed),
                ]),
            },
            Case {
                name: "cooldown, then two probes close it",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 4, F, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("consecutive_failures")),
                        (29, Admit(false), Open, None),
                        (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                        (30, Admit(false), HalfOpen, None),
                        (30, Finish(S), HalfOpen, None),
                        (31, Admit(true), HalfOpen, None),
                        (31, Finish(S), Closed, Some("probes_succeeded")),
                        (31, Admit(true), Closed, None),
                    ],
                ]),
            },
            Case {
                name: "a failed probe reopens it and restarts the cooldown",
                cfg: BreakerConfig::default(),
                steps: cat([
                    calls(0, 4, F, Closed),
                    tripping(0),
                    vec![
                        (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                        (40, Finish(F), Open, Some("probe_failed")),
                        (69, Admit(false), Open, None),
                        (70, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                    ],
                ]),
            },
            Case {
                name: "a probe that never answers is abandoned after the probe timeout",
                cfg: BreakerConfig::default().with_probe_timeout(Duration::from_secs(5)),
                steps: cat([
                    calls(0, 4, F, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("consecutive_failures")),
                        (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                        (34, Admit(false), HalfOpen, None),
                        (35, Admit(false), Open, Some("probe_abandoned")),
                        // The abandoned probe answers at last: late, it changes nothing.
                        (36, Finish(S), Open, None),
                        (65, Refresh, HalfOpen, Some("cooldown_elapsed")),
                    ],
                ]),
            },
            Case {
                name: "a dropped probe frees its place",
                cfg: BreakerConfig::default().with_consecutive_failures(1),
                steps: vec![
                    (0, Admit(true), Closed, None),
                    (0, Finish(F), Open, Some("consecutive_failures")),
                    (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                    (30, Drop, HalfOpen, None),
                    (30, Admit(true), HalfOpen, None),
                    (30, Finish(N), HalfOpen, None),
                    (30, Admit(true), HalfOpen, None),
                ],
            },
            Case {
                name: "results arriving after it opened never extend the break",
                cfg: BreakerConfig::default().with_consecutive_failures(2),
                steps: vec![
                    (0, Admit(true), Closed, None),
                    (0, Admit(true), Closed, None),
                    (0, Admit(true), Closed, None),
                    (0, Finish(F), Closed, None),
                    (1, Finish(F), Open, Some("consecutive_failures")),
                    (20, Finish(F), Open, None),
                    (31, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                ],
            },
            Case {
                name: "two probes at once when configured",
                cfg: BreakerConfig::default()
                    .with_consecutive_failures(1)
                    .with_half_open_probes(2),
                steps: vec![
                    (0, Admit(true), Closed, None),
                    (0, Finish(F), Open, Some("consecutive_failures")),
                    (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                    (30, Admit(true), HalfOpen, None),
                    (30, Admit(false), HalfOpen, None),
                    (30, Finish(S), HalfOpen, None),
                    (30, Finish(S), Closed, Some("probes_succeeded")),
                ],
            },
            Case {
                name: "a shorter window forgets failures sooner",
                cfg: BreakerConfig::default().with_window(Duration::from_secs(10)),
                steps: cat([
                    calls(0, 4, F, Closed),
                    calls(10, 4, F, Closed),
                    tripping(10),
                ]),
            },
            Case {
                name: "a lower minimum of calls lets the rate count sooner",
                cfg: BreakerConfig::default().with_min_calls(4),
                steps: cat([
                    calls(0, 1, S, Closed),
                    calls(0, 1, F, Closed),
                    calls(0, 1, S, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("failure_rate")),
                    ],
                ]),
            },
            Case {
                name: "the rate is computed over the latest sample only",
                cfg: BreakerConfig::default()
                    .with_min_calls(4)
                    .with_sample_size(4),
                steps: cat([
                    calls(0, 4, S, Closed),
                    calls(0, 1, F, Closed),
                    vec![
                        (0, Admit(true), Closed, None),
                        (0, Finish(F), Open, Some("failure_rate")),
                    ],
                ]),
            },
            Case {
                name: "a shorter cooldown, then one probe closes it when configured",
                cfg: BreakerConfig::default()
                    .with_consecutive_failures(1)
                    .with_cooldown(Duration::from_secs(10))
                    .with_close_after_successes(1),
                steps: vec![
                    (0, Admit(true), Closed, None),
                    (0, Finish(F), Open, Some("consecutive_failures")),
                    (9, Admit(false), Open, None),
                    (10, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                    (10, Finish(S), Closed, Some("probes_succeeded")),
                ],
            },
            Case {
                name: "a dropped probe frees its own place only",
                cfg: BreakerConfig::default()
                    .with_consecutive_failures(1)
                    .with_half_open_probes(2),
                steps: vec![
                    (0, Admit(true), Closed, None),
                    (0, Finish(F), Open, Some("consecutive_failures")),
                    (30, Admit(true), HalfOpen, Some("cooldown_elapsed")),
                    (30, Admit(true), HalfOpen, None),
                    (30, Drop, HalfOpen, None),
                    (30, Admit(true), HalfOpen, None),
                    (30, Admit(false), HalfOpen, None),
                ],
            },
            Case {
                name: "forced open stays open until reset",
                cfg: BreakerConfig::default(),
                steps: vec![
                    (0, ForceOpen, ForcedOpen, Some("forced_open")),
                    (0, ForceOpen, ForcedOpen, None),
                    (3600, Admit(false), ForcedOpen, None),
                    (3600, Refresh, ForcedOpen, None),
                    (3600, Reset, Closed, Some("reset")),
                    (3600, Reset, Closed, None),
                    (3600, Admit(true), Closed, None),
                ],
            },
        ];
        for case in cases {
            run(case);
        }
    }

    #[test]
    fn rejection_says_when_to_come_back() {
        let cfg = BreakerConfig::default().with_consecutive_failures(1);
        let start = Instant::now();
        let mut state = CircuitState::new();
        let (Admission::Admitted(ticket), _) = state.admit(start, &cfg) else {
            panic!("a closed breaker admits");
        };
        state.record(ticket, CallOutcome::Failure, start, &cfg);
        let (admission, _) = state.admit(start + Duration::from_secs(12), &cfg);
        assert_eq!(
            admission,
            Admission::Rejected {
                state: Open,
                retry_after: Some(Duration::from_secs(18))
            }
        );
        assert_eq!(
            state.open_for(start + Duration::from_secs(12)),
            Some(Duration::from_secs(18))
        );
    }

    #[test]
    fn configuration_is_checked_field_by_field() {
        let field = |cfg: BreakerConfig| cfg.check().unwrap_err().field().to_owned();
        let d = BreakerConfig::default;
        assert_eq!(
            field(d().with_consecutive_failures(0)),
            "breaker.consecutive_failures"
        );
        assert_eq!(
            field(d().with_failure_rate_percent(101)),
            "breaker.failure_rate_percent"
        );
        assert_eq!(field(d().with_min_calls(30)), "breaker.min_calls");
        assert_eq!(field(d().with_cooldown(Duration::ZERO)), "breaker.cooldown");
        assert!(BreakerConfig::read_only().check().is_ok());
        assert!(BreakerConfig::mutating().check().is_ok());
        // The bounds themselves are allowed.
        assert!(d().with_failure_rate_percent(100).check().is_ok());
        assert!(d().with_min_calls(20).with_sample_size(20).check().is_ok());
        assert!(d()
            .with_min_calls(1)
            .with_failure_rate_percent(1)
            .check()
            .is_ok());
    }

    #[test]
    fn presets_change_only_their_own_numbers() {
        let d = BreakerConfig::default;
        assert_eq!(
            BreakerConfig::read_only(),
            d().with_consecutive_failures(8)
                .with_cooldown(Duration::from_secs(20))
        );
        assert_eq!(BreakerConfig::mutating(), d().with_failure_rate_percent(25));
        let read_only = BreakerConfig::read_only();
        assert_eq!(read_only.consecutive_failures(), 8);
        assert_eq!(read_only.cooldown(), Duration::from_secs(20));
        assert_eq!(BreakerConfig::mutating().failure_rate_percent(), 25);
        assert_eq!(
            d().with_probe_timeout(Duration::from_secs(7))
                .probe_timeout(),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn overrides_replace_only_the_numbers_they_give() {
        let some = BreakerSettings {
            consecutive_failures: Some(3),
            window_ms: Some(1_500),
            ..BreakerSettings::default()
        };
        assert_eq!(
            BreakerConfig::mutating().with_settings(&some),
            BreakerConfig::mutating()
                .with_consecutive_failures(3)
                .with_window(Duration::from_millis(1_500))
        );
        let all = BreakerSettings {
            consecutive_failures: Some(2),
            failure_rate_percent: Some(60),
            sample_size: Some(30),
            min_calls: Some(12),
            window_ms: Some(60_000),
            cooldown_ms: Some(5_000),
            half_open_probes: Some(3),
            close_after_successes: Some(4),
            probe_timeout_ms: Some(9_000),
            max_breakers: None,
        };
        assert_eq!(
            BreakerConfig::default().with_settings(&all),
            BreakerConfig {
                consecutive_failures: 2,
                failure_rate_percent: 60,
                sample_size: 30,
                min_calls: 12,
                window: Duration::from_secs(60),
                cooldown: Duration::from_secs(5),
                half_open_probes: 3,
                close_after_successes: 4,
                probe_timeout: Duration::from_secs(9),
            }
        );
    }

    #[test]
    fn counters_follow_the_transitions() {
        let cfg = BreakerConfig::default()
            .with_consecutive_failures(2)
            .with_probe_timeout(Duration::from_secs(5));
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut state = CircuitState::new();
        let admit = |state: &mut CircuitState, now| match state.admit(now, &cfg).0 {
            Admission::Admitted(ticket) => ticket,
            refused => panic!("refused: {refused:?}"),
        };
        let seen = |state: &CircuitState| {
            (
                state.generation(),
                state.late_results(),
                state.probes_in_flight(),
                state.window().consecutive_failures(),
            )
        };
        assert_eq!(seen(&state), (0, 0, 0, 0));
        let (first, second, third) = (
            admit(&mut state, t0),
            admit(&mut state, t0),
            admit(&mut state, t0),
        );
        assert!(!first.is_probe());
        state.record(first, CallOutcome::Failure, t0, &cfg);
        assert_eq!(seen(&state), (0, 0, 0, 1));
        state.record(second, CallOutcome::Failure, t0, &cfg);
        assert_eq!(state.state(), Open);
        assert_eq!(seen(&state), (1, 0, 0, 0));
        assert_eq!(state.open_for(at(10)), Some(Duration::from_secs(20)));
        // A call admitted before the breaker opened is late.
        assert_eq!(state.record(third, CallOutcome::Failure, at(1), &cfg), None);
        assert_eq!(seen(&state), (1, 1, 0, 0));

        let probe = admit(&mut state, at(30));
        assert!(probe.is_probe());
        assert_eq!(seen(&state), (2, 1, 1, 0));
        assert_eq!(state.open_for(at(32)), None);
        assert_eq!(
            state.admit(at(32), &cfg).0,
            Admission::Rejected {
                state: HalfOpen,
                retry_after: Some(Duration::from_secs(3))
            },
            "the place frees when the probe is abandoned"
        );
        state.release(probe);
        assert_eq!(seen(&state), (2, 1, 0, 0));
    }
}
