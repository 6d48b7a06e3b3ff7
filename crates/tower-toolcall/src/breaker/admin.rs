//! The operator's side of the breakers: look at them, hold them open, reset them, and hear
//! about every transition.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::service::Shared;
use super::state::Transition;
use crate::event::{BreakerKey, EventSink, EventSinks, LayerEvent, TransitionEvent};
use crate::outcome::BreakerState;

/// Counts of what a breaker saw since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BreakerStats {
    /// Calls that succeeded.
    pub successes: u64,
    /// Calls that failed in a way that speaks of the dependency's health.
    pub failures: u64,
    /// Calls that finished with an outcome that does not count (caller errors, refusals).
    pub neutral: u64,
    /// Calls refused with `CIRCUIT_OPEN`.
    pub rejected: u64,
    /// Outcomes of calls admitted before the latest transition: counted, never acted on.
    pub late: u64,
}

/// What one breaker looks like now.
///
/// It serializes in camelCase, `retry_after` as `retryAfterMs` in milliseconds.
///
/// ```
/// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
/// use tower_toolcall::breaker::BreakerKey;
///
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let breakers = stack.breakers().unwrap();
/// breakers.force_open(&BreakerKey::tool("web", "search"));
/// let status = serde_json::to_value(&breakers.snapshot()[0])?;
/// assert_eq!(status["key"]["scope"], "tool");
/// assert_eq!(status["state"], "forced_open");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct BreakerStatus {
    /// Which breaker.
    pub key: BreakerKey,
    /// Its state.
    pub state: BreakerState,
    /// How long until an open breaker admits a probe.
    #[serde(rename = "retryAfterMs", serialize_with = "optional_millis")]
    pub retry_after: Option<Duration>,
    /// The current run of consecutive failures (closed only).
    pub consecutive_failures: u32,
    /// Calls inside the rolling window (closed only).
    pub window_calls: u32,
    /// Failures among them.
    pub window_failures: u32,
    /// Probes in flight (half-open only).
    pub probes_in_flight: usize,
    /// Counts since the breaker was created.
    pub stats: BreakerStats,
}

/// The event sinks of a layer's breakers; every transition is also logged here.
#[derive(Default)]
pub(crate) struct Events {
    sinks: RwLock<EventSinks>,
}

impl Events {
    pub(crate) fn new(sinks: EventSinks) -> Self {
        Events {
            sinks: RwLock::new(sinks),
        }
    }

    pub(crate) fn add(&self, sink: Arc<dyn EventSink>) {
        self.sinks
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sink);
    }

    /// Logs `transition` of `key` and tells every sink. Called with no lock held.
    pub(crate) fn emit(&self, key: &BreakerKey, transition: Transition) {
        let event = TransitionEvent {
            key: key.clone(),
            from: transition.from,
            to: transition.to,
            reason: transition.reason,
            at: transition.at,
        };
        macro_rules! log_transition {
            ($level:ident, $message:literal) => {
                tracing::$level!(
                    event = "tool_call_circuit_state",
                    breaker = %key,
                    from = transition.from.as_str(),
                    state = transition.to.as_str(),
                    reason = transition.reason.as_str(),
                    $message
                )
            };
        }
        if matches!(transition.to, BreakerState::Open | BreakerState::ForcedOpen) {
            log_transition!(
                warn,
                "circuit breaker opened: calls fail fast until it recovers"
            );
        } else {
            log_transition!(info, "circuit breaker changed state");
        }
        let sinks = self
            .sinks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        sinks.emit(&LayerEvent::BreakerTransition(&event));
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sinks = self.sinks.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Events").field("sinks", &*sinks).finish()
    }
}

/// A handle on the breakers of a [`CircuitBreakerLayer`](super::CircuitBreakerLayer): made
/// by [`admin`](super::CircuitBreakerLayer::admin), cheap to clone, shared with every service
/// the layer made.
///
/// ```
/// use tower_toolcall::breaker::{BreakerKey, CircuitBreakerLayer};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::BreakerState;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = CircuitBreakerLayer::new(ToolRegistry::open());
/// let admin = layer.admin();
/// admin.on_event(|event: &tower_toolcall::event::LayerEvent<'_>| {
///     if let tower_toolcall::event::LayerEvent::BreakerTransition(change) = event {
///         println!("{} is now {}", change.key, change.to.as_str());
///     }
/// });
/// let key = BreakerKey::tool("agents.tools.web", "search");
/// admin.force_open(&key);
/// assert_eq!(admin.state("agents.tools.web", "search"), BreakerState::ForcedOpen);
/// admin.reset(&key);
/// assert_eq!(admin.state("agents.tools.web", "search"), BreakerState::Closed);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct BreakerAdmin {
    shared: Arc<Shared>,
}

impl BreakerAdmin {
    /// The breakers it administers.
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(super) fn new(shared: Arc<Shared>) -> Self {
        BreakerAdmin { shared }
    }

    /// The breakers, as the retry layer asks them whether a hedge may go.
    pub(crate) fn view(&self) -> crate::breaker_view::Breakers {
        crate::breaker_view::Breakers(self.shared.clone())
    }

    /// The state of the tool `namespace::name`'s own breaker; `Closed` when it has none yet.
    pub fn state(&self, namespace: &str, name: &str) -> BreakerState {
        self.status(&BreakerKey::tool(namespace, name))
            .map_or(BreakerState::Closed, |status| status.state)
    }

    /// The status of one breaker; `None` when it does not exist (no call has needed it yet,
    /// or its tool's policy switches the layer off).
    pub fn status(&self, key: &BreakerKey) -> Option<BreakerStatus> {
        self.shared.find(key).map(|cell| cell.status())
    }

    /// The status of every breaker, ordered by key.
    pub fn snapshot(&self) -> Vec<BreakerStatus> {
        let mut all: Vec<BreakerStatus> = self
            .shared
            .cells()
            .iter()
            .map(|cell| cell.status())
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }

    /// Holds a breaker open until it is reset; creates it when no call has needed it yet.
    ///
    /// `false` when the breaker could not be kept: it is one made on demand (of a tool the
    /// registry does not have, or of a namespace) and the map of those is full of breakers
    /// forced open or in use. A forced-open breaker is never evicted to make room.
    ///
    /// A dependency or the global breaker held open stops every call under it (of its
    /// namespace, or every call), whatever breaker the call's scope picks, until it is reset.
    pub fn force_open(&self, key: &BreakerKey) -> bool {
        self.shared.find_or_create(key).force_open();
        self.shared.held.hold(key);
        self.shared.find(key).is_some()
    }

    /// Closes a breaker at once, with an empty window. `false` when it does not exist.
    pub fn reset(&self, key: &BreakerKey) -> bool {
        self.shared.held.release(Some(key));
        self.shared.find(key).map(|cell| cell.reset()).is_some()
    }

    /// Closes every breaker.
    pub fn reset_all(&self) {
        self.shared.held.release(None);
        for cell in self.shared.cells() {
            cell.reset();
        }
    }

    /// Tells `sink` every transition of every breaker of the layer.
    pub fn on_event(&self, sink: impl EventSink) {
        self.shared.events.add(Arc::new(sink));
    }
}

fn optional_millis<S: Serializer>(after: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match after {
        Some(after) => s.serialize_some(&crate::time::millis(*after)),
        None => s.serialize_none(),
    }
}
