//! One breaker as the services share it: the pure [`CircuitState`] behind a lock, the tokio
//! clock, counts, and a lock-free view of the state so that a closed breaker admits a call
//! without taking the lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::admin::{BreakerStats, BreakerStatus, Events};
use super::state::{Admission, BreakerConfig, CallOutcome, CircuitState, Ticket, Transition};
use crate::event::BreakerKey;
use crate::outcome::BreakerState;

/// The phase bits of [`BreakerCell::view`]; the generation is in the bits above.
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const PHASE_BITS: u32 = 2;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;

pub(crate) struct BreakerCell {
    key: BreakerKey,
    config: BreakerConfig,
    state: Mutex<CellState>,
    /// `generation << 2 | phase`, written under the lock after every transition.
    view: AtomicU64,
    /// While open: when the cooldown ends, in nanoseconds since `origin`. Written under the
    /// lock before `view`, so that an open breaker refuses calls without taking the lock.
    open_until: AtomicU64,
    origin: Instant,
    /// Calls refused, counted outside the lock.
    rejected: AtomicU64,
    events: Arc<Events>,
}

/// What recording an outcome did to a breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The state the outcome left the breaker in.
    pub(crate) state: BreakerState,
    /// The outcome opened the breaker.
    pub(crate) opened: bool,
}

struct CellState {
    machine: CircuitState,
    stats: BreakerStats,
    last_used: Option<Instant>,
}

impl BreakerCell {
    pub(crate) fn new(key: BreakerKey, config: BreakerConfig, events: Arc<Events>) -> Self {
        BreakerCell {
            key,
            config,
            state: Mutex::new(CellState {
                machine: CircuitState::new(),
                stats: BreakerStats::default(),
                last_used: None,
            }),
            view: AtomicU64::new(view_of(&CircuitState::new())),
            open_until: AtomicU64::new(0),
            origin: Instant::now(),
            rejected: AtomicU64::new(0),
            events,
        }
    }

    /// The configuration it was made with.
    pub(crate) fn config(&self) -> &BreakerConfig {
        &self.config
    }

    pub(crate) fn key(&self) -> &BreakerKey {
        &self.key
    }

    /// Whether the breaker is closed, read from the lock-free view: an open breaker whose
    /// cooldown has passed is not closed (its next call is a probe).
    pub(crate) fn is_closed(&self) -> bool {
        self.view.load(Ordering::Acquire) & PHASE_MASK == CLOSED
    }

    /// Lets a call through or refuses it.
    ///
    /// A closed breaker answers from its lock-free view: a call that races a transition is
    /// admitted in the generation it saw, and its outcome is then late (counted, never acted
    /// on), as if it had been admitted just before. An open breaker whose cooldown has not
    /// passed refuses without the lock too; everything else goes through the state machine.
    pub(crate) fn admit(&self) -> Admission {
        let view = self.view.load(Ordering::Acquire);
        if view & PHASE_MASK == CLOSED {
            return Admission::Admitted(Ticket::closed(view >> PHASE_BITS));
        }
        let now = Instant::now();
        if view & PHASE_MASK == OPEN {
            let left = self
                .open_until
                .load(Ordering::Acquire)
                .saturating_sub(self.since_origin(now));
            if left > 0 {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Admission::Rejected {
                    state: BreakerState::Open,
                    retry_after: Some(Duration::from_nanos(left)),
                };
            }
        }
        let mut state = self.lock();
        let (admission, transition) = state.machine.admit(now, &self.config);
        if matches!(admission, Admission::Rejected { .. }) {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        state.last_used = Some(now);
        self.after(state, transition);
        admission
    }

    /// Records the outcome of an admitted call; returns the state it leaves the breaker in,
    /// and whether this outcome opened it.
    pub(crate) fn record(&self, ticket: Ticket, outcome: CallOutcome) -> Recorded {
        let now = Instant::now();
        let mut state = self.lock();
        let transition = state.machine.record(ticket, outcome, now, &self.config);
        match outcome {
            CallOutcome::Success => state.stats.successes += 1,
            CallOutcome::Failure => state.stats.failures += 1,
            CallOutcome::Neutral => state.stats.neutral += 1,
        }
        state.last_used = Some(now);
        let recorded = Recorded {
            state: state.machine.state(),
            opened: transition.is_some_and(|t| t.to == BreakerState::Open),
        };
        self.after(state, transition);
        recorded
    }

    /// Releases a call whose caller dropped it before it finished.
    pub(crate) fn release(&self, ticket: Ticket) {
        self.lock().machine.release(ticket);
    }

    pub(crate) fn force_open(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        let transition = state.machine.force_open(now);
        self.after(state, transition);
    }

    pub(crate) fn reset(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        let transition = state.machine.reset(now);
        self.after(state, transition);
    }

    /// The status now, after applying what time alone changed.
    pub(crate) fn status(&self) -> BreakerStatus {
        let now = Instant::now();
        let mut state = self.lock();
        let transition = state.machine.refresh(now, &self.config);
        let machine = &state.machine;
        let (window_calls, window_failures) = machine.window().counts(now, &self.config);
        let status = BreakerStatus {
            key: self.key.clone(),
            state: machine.state(),
            retry_after: machine.open_for(now),
            consecutive_failures: machine.window().consecutive_failures(),
            window_calls,
            window_failures,
            probes_in_flight: machine.probes_in_flight(),
            stats: BreakerStats {
                late: machine.late_results(),
                rejected: self.rejected.load(Ordering::Relaxed),
                ..state.stats
            },
        };
        self.after(state, transition);
        status
    }

    /// When the breaker was last used, and its state: what eviction looks at.
    pub(crate) fn idle_since(&self) -> (Option<Instant>, BreakerState) {
        let state = self.lock();
        (state.last_used, state.machine.state())
    }

    fn lock(&self) -> MutexGuard<'_, CellState> {
        // The state machine keeps its invariants on every path, so a panic elsewhere while
        // the lock was held leaves a usable state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes the state's view, releases the lock, then tells the listeners.
    fn after(&self, state: MutexGuard<'_, CellState>, transition: Option<Transition>) {
        if let Some(transition) = &transition {
            if let Some(left) = state.machine.open_for(transition.at) {
                let until = self.since_origin(transition.at).saturating_add(nanos(left));
                self.open_until.store(until, Ordering::Release);
            }
            self.view.store(view_of(&state.machine), Ordering::Release);
        }
        drop(state);
        if let Some(transition) = transition {
            self.events.emit(&self.key, transition);
        }
    }
}

impl BreakerCell {
    fn since_origin(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.origin))
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn view_of(machine: &CircuitState) -> u64 {
    let phase = match machine.state() {
        BreakerState::Closed => CLOSED,
        BreakerState::Open => OPEN,
        BreakerState::HalfOpen => 2,
        BreakerState::ForcedOpen => 3,
    };
    machine.generation() << PHASE_BITS | phase
}

impl std::fmt::Debug for BreakerCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerCell")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
