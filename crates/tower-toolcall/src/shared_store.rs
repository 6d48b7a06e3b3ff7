//! Stores that replicas share (rate-limit quotas, loop-detection state): what a layer does
//! when its store cannot be reached, and what it counts meanwhile.
//!
//! Every call to a shared store is bounded by the store's operation timeout, so an
//! unreachable server never holds a call up for longer. When a check fails, the layer
//! follows its [`FailurePolicy`]: [`Open`](FailurePolicy::Open) (the default for rate limits
//! and loop detection) lets the call proceed unchecked, [`Closed`](FailurePolicy::Closed)
//! refuses it with `STORE_UNAVAILABLE`. Either way the failure is counted in the layer's
//! [`StoreHealth`] and told to its [event sinks](crate::event) (with the `metrics` feature,
//! `ToolMetrics` counts outages and failed checks per store and policy), and
//! one warning is logged when an outage begins — not one per call — and one line when the
//! store answers again. Recovery needs nothing: the next check that
//! succeeds ends the outage.
//!
//! With Redis, an outage is known to every store of the process on that server (rate
//! limits, loop detection, idempotency, the fleet) as soon as one operation times out or
//! cannot reach it: from then on their operations fail at once, each by its own policy,
//! until a background `PING` every 200 ms is answered. A server that hangs costs a call at
//! most one operation timeout, however many stores the call passes.
//!
//! ```
//! use tower_toolcall::shared_store::FailurePolicy;
//!
//! assert_eq!(FailurePolicy::default(), FailurePolicy::Open);
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{ErrorCode, ToolError};
use crate::event::{EventSinks, LayerEvent};
pub use crate::event::{FailurePolicy, StoreEvent};

/// Why a store (of dedupe records, quotas or loop histories) could not do what it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached, or answered with an error.
    Unavailable(String),
    /// The store did not answer within its operation timeout.
    Timeout(Duration),
    /// The store is full and every record in it is in flight, so none can be evicted.
    CapacityExhausted {
        /// The store's capacity.
        capacity: usize,
    },
    /// The store answered with something it should not have, or holds a record it cannot
    /// read back.
    Corrupt(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(problem) => write!(f, "the store is unavailable: {problem}"),
            StoreError::Timeout(after) => write!(
                f,
                "the store did not answer within {} ms",
                after.as_millis()
            ),
            StoreError::CapacityExhausted { capacity } => write!(
                f,
                "the store holds {capacity} records, all in flight, and evicts none of them"
            ),
            StoreError::Corrupt(problem) => {
                write!(f, "the store answered what it cannot read back: {problem}")
            }
        }
    }
}

/// The answer of a store, on its way: what [`DedupeStore`](crate::idempotency::DedupeStore),
/// [`RateLimitStore`](crate::rate_limit::RateLimitStore) and
/// [`LoopStore`](crate::loop_detect::store::LoopStore) return.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

impl std::error::Error for StoreError {}

/// How a layer's shared store has fared; read with the layer's `store_health()`.
///
/// ```
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::RateLimitLayer;
///
/// let layer = RateLimitLayer::new(ToolRegistry::open());
/// let health = layer.store_health();
/// assert!(health.available);
/// assert_eq!(health.outages, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreHealth {
    /// `false` from the first failed check of an outage to the next check that succeeds.
    pub available: bool,
    /// Outages seen: runs of failed checks between two that succeeded.
    pub outages: u64,
    /// Checks that failed, each one a call let through or refused by the failure policy.
    pub failed_checks: u64,
}

/// A layer's failure policy and the count of its store's outages.
#[derive(Debug, Default)]
pub(crate) struct Outages {
    policy: FailurePolicy,
    down: AtomicBool,
    outages: AtomicU64,
    failed_checks: AtomicU64,
    sinks: EventSinks,
}

impl Outages {
    pub(crate) fn new(policy: FailurePolicy, sinks: EventSinks) -> Self {
        Outages {
            policy,
            sinks,
            ..Outages::default()
        }
    }

    fn tell(&self, layer: &'static str, event: StoreEvent) {
        self.sinks.emit(&LayerEvent::Store { layer, event });
    }

    /// A check by `layer` succeeded: ends the outage, if one was going on.
    pub(crate) fn succeeded(&self, layer: &'static str) {
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(layer, "the shared store answers again: sharing resumes");
            self.tell(layer, StoreEvent::OutageEnded);
        }
    }

    /// A check by `layer` failed with `error`: counts it, logs the start of an outage once,
    /// and says whether the call proceeds (`Ok`) or with which error it is refused.
    pub(crate) fn failed(&self, layer: &'static str, error: &StoreError) -> Result<(), ToolError> {
        self.failed_checks.fetch_add(1, Ordering::Relaxed);
        self.unreachable(layer, error);
        self.tell(layer, StoreEvent::CheckFailed(self.policy));
        match self.policy {
            FailurePolicy::Open => Ok(()),
            FailurePolicy::Closed => Err(ToolError::rejected(
                ErrorCode::StoreUnavailable,
                format!(
                    "{layer} could not check the call ({error}): it was not called; retry later"
                ),
            )),
        }
    }

    /// A write by `layer` that decides nothing (how a call already decided ended) failed
    /// with `error`: no check failed, but an outage begins if none was going on.
    pub(crate) fn unreachable(&self, layer: &'static str, error: &StoreError) {
        if !self.down.swap(true, Ordering::Relaxed) {
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                layer,
                %error,
                policy = ?self.policy,
                "the shared store is unreachable: calls are {} until it answers again",
                match self.policy {
                    FailurePolicy::Open => "let through unchecked",
                    FailurePolicy::Closed => "refused",
                }
            );
            self.tell(layer, StoreEvent::OutageBegan);
        }
    }

    pub(crate) fn health(&self) -> StoreHealth {
        StoreHealth {
            available: !self.down.load(Ordering::Relaxed),
            outages: self.outages.load(Ordering::Relaxed),
            failed_checks: self.failed_checks.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn an_outage_is_told_once_and_each_failed_check_with_its_policy() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let seen = events.clone();
        let mut sinks = EventSinks::default();
        sinks.push(Arc::new(move |event: &LayerEvent<'_>| {
            if let LayerEvent::Store { layer, event } = *event {
                seen.lock().unwrap().push((layer, event));
            }
        }));
        let outages = Outages::new(FailurePolicy::Closed, sinks);
        let down = StoreError::Timeout(Duration::from_millis(5));

        // A failed write of a decided call begins an outage, but is no failed check.
        outages.unreachable("loop_detect", &down);
        let error = outages.failed("loop_detect", &down).unwrap_err();
        assert_eq!(error.code(), ErrorCode::StoreUnavailable);
        outages.succeeded("loop_detect");
        outages.succeeded("loop_detect");
        assert!(outages.failed("loop_detect", &down).is_err());

        let health = outages.health();
        assert_eq!(
            (health.available, health.outages, health.failed_checks),
            (false, 2, 2)
        );
        let closed = StoreEvent::CheckFailed(FailurePolicy::Closed);
        assert_eq!(
            *events.lock().unwrap(),
            [
                ("loop_detect", StoreEvent::OutageBegan),
                ("loop_detect", closed),
                ("loop_detect", StoreEvent::OutageEnded),
                ("loop_detect", StoreEvent::OutageBegan),
                ("loop_detect", closed),
            ]
        );
    }
}
