//! What layers report as it happens, in one type, told to the sinks each layer is given.
//!
//! A [`LayerEvent`] is a breaker's transition, a shared store's outage, the idempotency
//! layer's settings of a tool, or a call's end and what the layers did with it on the way
//! (retries, an answer from an idempotency record, a loop stopped, a rate limit, a decision
//! of a layer in shadow mode). A layer tells its events to the [`EventSink`]s given to its
//! builder's `on_event`; [`ToolStackBuilder::on_event`](crate::ToolStackBuilder::on_event)
//! gives one sink to every layer of a stack. Metrics (`ToolMetrics`, feature `metrics`) is one
//! such sink: no layer knows another, or the metrics, to report what it did.
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use tower_toolcall::event::{LayerEvent, StoreEvent};
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::RateLimitLayer;
//!
//! let outages = Arc::new(AtomicU64::new(0));
//! let seen = outages.clone();
//! let layer = RateLimitLayer::builder(ToolRegistry::open())
//!     .on_event(move |event: &LayerEvent<'_>| {
//!         if let LayerEvent::Store { event: StoreEvent::OutageBegan, .. } = event {
//!             seen.fetch_add(1, Ordering::Relaxed);
//!         }
//!     })
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), tower_toolcall::ConfigError>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::contract::envelope::{BreakerScope, ToolCall};
use crate::contract::error::{ConfigError, ToolError};
use crate::contract::outcome::{BreakerState, ToolOutput};
use crate::contract::registry::KeyScope;

/// What a layer reports, as it happens.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum LayerEvent<'a> {
    /// A call ended, after `elapsed`, with `outcome`: told by the trace layer, whose sinks
    /// read in the outcome's record what the layers did with the call.
    CallFinished {
        /// The call.
        call: &'a ToolCall,
        /// How it ended.
        outcome: &'a Result<ToolOutput, ToolError>,
        /// How long it took, every layer inside the trace layer included.
        elapsed: Duration,
    },
    /// A circuit breaker changed state.
    BreakerTransition(&'a TransitionEvent),
    /// Something happened to the shared store of `layer` (`rate_limit` or `loop_detect`).
    Store {
        /// The layer whose store it is.
        layer: &'static str,
        /// What happened.
        event: StoreEvent,
    },
    /// How long the idempotency layer keeps the records of a tool (`None`: of every
    /// unregistered tool), told once for each tool when the layer is built.
    DedupeSettings {
        /// `namespace::name`, or `None` for the unregistered tools.
        tool: Option<&'a str>,
        /// Whose calls share a key.
        scope: KeyScope,
        /// How long a completed record is kept.
        done_ttl: Duration,
        /// How long a failed record is kept.
        failed_ttl: Duration,
        /// The in-flight lease.
        inflight_lease: Duration,
    },
}

/// Hears what layers report. Called on the task of the call (or the transition) concerned,
/// with no lock held: keep it short. Implemented by every `Fn(&LayerEvent<'_>)`.
pub trait EventSink: Send + Sync + 'static {
    /// Called once per event.
    fn on_event(&self, event: &LayerEvent<'_>);
}

impl<F> EventSink for F
where
    F: Fn(&LayerEvent<'_>) + Send + Sync + 'static,
{
    fn on_event(&self, event: &LayerEvent<'_>) {
        self(event)
    }
}

/// The sinks a layer's builder collects.
#[derive(Clone, Default)]
pub(crate) struct EventSinks(Vec<Arc<dyn EventSink>>);

impl EventSinks {
    pub(crate) fn push(&mut self, sink: Arc<dyn EventSink>) {
        self.0.push(sink);
    }

    /// `true` when nobody listens.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tells every sink `event`.
    pub(crate) fn emit(&self, event: &LayerEvent<'_>) {
        for sink in &self.0 {
            sink.on_event(event);
        }
    }
}

impl fmt::Debug for EventSinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} sink(s)", self.0.len())
    }
}

/// Which breaker: a tool's own, the one of a dependency (a tool namespace), or the global one.
///
/// It serializes as an object tagged by its scope (`{"scope": "tool", "namespace": "web",
/// "name": "search"}`, `{"scope": "dependency", "namespace": "web"}`, `{"scope": "global"}`)
/// and parses from the short form `tool:web::search`, `dependency:web` or `global` (a bare
/// `web::search` is a tool), which [`BreakerKey::short`] writes.
///
/// ```
/// use tower_toolcall::breaker::BreakerKey;
///
/// let key: BreakerKey = "tool:web::search".parse()?;
/// assert_eq!(key, BreakerKey::tool("web", "search"));
/// assert_eq!(key.short(), "tool:web::search");
/// assert_eq!("dependency:web".parse::<BreakerKey>()?, BreakerKey::dependency("web"));
/// assert_eq!(
///     serde_json::to_value(&key)?,
///     serde_json::json!({"scope": "tool", "namespace": "web", "name": "search"})
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BreakerKey {
    /// The breaker of one tool (scope `tool`, the default).
    Tool {
        /// The tool's namespace.
        namespace: String,
        /// The tool's name.
        name: String,
    },
    /// The breaker shared by the tools of a namespace (scope `dependency`).
    Dependency {
        /// The namespace.
        namespace: String,
    },
    /// The breaker shared by every tool (scope `global`).
    Global,
}

impl BreakerKey {
    /// The key of the tool `namespace::name`.
    pub fn tool(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        BreakerKey::Tool {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of the dependency `namespace`.
    pub fn dependency(namespace: impl Into<String>) -> Self {
        BreakerKey::Dependency {
            namespace: namespace.into(),
        }
    }

    /// The scope of the breaker.
    pub fn scope(&self) -> BreakerScope {
        match self {
            BreakerKey::Tool { .. } => BreakerScope::Tool,
            BreakerKey::Dependency { .. } => BreakerScope::Dependency,
            BreakerKey::Global => BreakerScope::Global,
        }
    }
}

impl BreakerKey {
    /// The short form that [`FromStr`](std::str::FromStr) parses: `tool:web::search`,
    /// `dependency:web` or `global`.
    pub fn short(&self) -> String {
        match self {
            BreakerKey::Tool { namespace, name } => format!("tool:{namespace}::{name}"),
            BreakerKey::Dependency { namespace } => format!("dependency:{namespace}"),
            BreakerKey::Global => "global".to_owned(),
        }
    }
}

impl std::str::FromStr for BreakerKey {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ConfigError::new(
                "breaker.key",
                format!(
                    "must be `tool:<namespace>::<name>`, `dependency:<namespace>` or `global`, \
                     got {s:?}"
                ),
            )
        };
        if s == "global" {
            return Ok(BreakerKey::Global);
        }
        if let Some(namespace) = s.strip_prefix("dependency:") {
            return if namespace.is_empty() {
                Err(bad())
            } else {
                Ok(BreakerKey::dependency(namespace))
            };
        }
        let tool = s.strip_prefix("tool:").unwrap_or(s);
        match tool.rsplit_once("::") {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                Ok(BreakerKey::tool(namespace, name))
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for BreakerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerKey::Tool { namespace, name } => write!(f, "tool {namespace}::{name}"),
            BreakerKey::Dependency { namespace } => write!(f, "dependency {namespace}"),
            BreakerKey::Global => f.write_str("global"),
        }
    }
}

/// Why a breaker changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionReason {
    /// This many consecutive failures inside the window.
    ConsecutiveFailures(u32),
    /// This share of the latest calls failed.
    FailureRate {
        /// Failed calls.
        failures: u32,
        /// Calls counted.
        calls: u32,
    },
    /// The cooldown passed: probes may test the dependency.
    CooldownElapsed,
    /// A probe failed.
    ProbeFailed,
    /// A probe did not answer within the probe timeout.
    ProbeAbandoned,
    /// Enough consecutive probes succeeded.
    ProbesSucceeded(u32),
    /// An operator forced the breaker open.
    ForcedOpen,
    /// An operator reset the breaker.
    Reset,
}

impl TransitionReason {
    /// A short name for logs and metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            TransitionReason::ConsecutiveFailures(_) => "consecutive_failures",
            TransitionReason::FailureRate { .. } => "failure_rate",
            TransitionReason::CooldownElapsed => "cooldown_elapsed",
            TransitionReason::ProbeFailed => "probe_failed",
            TransitionReason::ProbeAbandoned => "probe_abandoned",
            TransitionReason::ProbesSucceeded(_) => "probes_succeeded",
            TransitionReason::ForcedOpen => "forced_open",
            TransitionReason::Reset => "reset",
        }
    }
}

/// One transition of one breaker, as sinks get it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransitionEvent {
    /// Which breaker.
    pub key: BreakerKey,
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
    /// Why.
    pub reason: TransitionReason,
    /// When, on the tokio clock.
    pub at: Instant,
}

/// What a layer does with a call when its shared store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// The call proceeds unchecked (the default): an outage of the store costs the fleet its
    /// shared limits for its duration, not its tools.
    #[default]
    Open,
    /// The call is refused with `STORE_UNAVAILABLE` (retriable): nothing runs that the
    /// shared state could not vouch for.
    Closed,
}

/// What happened to a layer's shared store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreEvent {
    /// The store stopped answering: an outage begins (told before the check's failure).
    OutageBegan,
    /// A check failed, and the call was let through ([`FailurePolicy::Open`]) or refused
    /// ([`FailurePolicy::Closed`]).
    CheckFailed(FailurePolicy),
    /// The store answers again: the outage is over.
    OutageEnded,
}
