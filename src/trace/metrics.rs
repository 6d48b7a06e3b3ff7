//! Metrics of every call through the [`metrics`] facade (feature `metrics`).
//!
//! | series | kind | labels |
//! |---|---|---|
//! | `{prefix}tool_calls_total` | counter | `tool`, `status` |
//! | `{prefix}tool_call_duration_ms` | histogram | `tool`, `status` |
//! | `{prefix}tool_retry_attempts_total` | counter | `tool`, `reason` (the error code retried) |
//! | `{prefix}tool_idempotency_hits_total` | counter | `tool`, `state` (`inflight` or `completed`) |
//! | `{prefix}tool_loop_detections_total` | counter | `tool`, `action` (`break` or `chance`) |
//! | `{prefix}tool_rate_limited_total` | counter | `tool` |
//! | `{prefix}tool_shadow_decisions_total` | counter | `layer` (`breaker`, `loop_detect`, `idempotency`, `rate_limit`), `decision` (`would_open`, `would_reject`, `would_block`, `would_replay`, `would_join`, `would_conflict`, `would_limit`, `would_wait`) |
//! | `{prefix}tool_circuit_breaker_state` | gauge (1 for the current state) | `tool`, `state` |
//! | `{prefix}tool_circuit_breaker_transitions_total` | counter | `tool`, `from_state`, `to_state` |
//!
//! The prefix is `toolcall_` by default. Labels are bounded: `tool` is `namespace::name` of a
//! registered tool and `unregistered` for any other, whatever names callers send; the other
//! labels take values from fixed sets. The breaker series come from a
//! [listener](ToolMetrics::breaker_listener) given to the `CircuitBreakerLayer`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::SharedString;

use crate::breaker::{BreakerKey, TransitionEvent, TransitionListener};
use crate::envelope::{ResultStatus, ToolCall};
use crate::error::{ConfigError, ErrorCode, ToolError};
use crate::outcome::{MatchedOn, ToolOutput};
use crate::registry::ToolRegistry;
use crate::tool_table::ToolTable;

/// The label of every tool the registry does not know.
pub const UNREGISTERED: &str = "unregistered";

/// Records the metrics of calls; give it to [`TraceLayer::metrics`](super::TraceLayer::metrics).
/// Cheap to clone.
///
/// ```
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::trace::{ToolMetrics, TraceLayer};
/// use tower_toolcall::CircuitBreakerLayer;
///
/// let registry = ToolRegistry::open();
/// let metrics = ToolMetrics::builder(&registry).prefix("gateway_").build()?;
/// let trace = TraceLayer::new().metrics(metrics.clone());
/// let breaker = CircuitBreakerLayer::builder(registry)
///     .on_transition(metrics.breaker_listener())
///     .build()?;
/// # let _ = (trace, breaker);
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ToolMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    tools: ToolTable<SharedString>,
    calls_total: SharedString,
    call_duration_ms: SharedString,
    retry_attempts_total: SharedString,
    idempotency_hits_total: SharedString,
    loop_detections_total: SharedString,
    rate_limited_total: SharedString,
    shadow_decisions_total: SharedString,
    breaker_state: SharedString,
    breaker_transitions_total: SharedString,
}

impl fmt::Debug for ToolMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolMetrics")
            .field("calls_total", &&*self.inner.calls_total)
            .finish_non_exhaustive()
    }
}

impl ToolMetrics {
    /// Metrics with the prefix `toolcall_`, labelling the tools of `registry`.
    pub fn new(registry: &ToolRegistry) -> Self {
        ToolMetrics::builder(registry)
            .build()
            .expect("the default prefix is valid")
    }

    /// A builder for metrics with another prefix.
    pub fn builder(registry: &ToolRegistry) -> ToolMetricsBuilder {
        ToolMetricsBuilder {
            registry: registry.clone(),
            prefix: "toolcall_".to_owned(),
        }
    }

    /// A listener to give to `CircuitBreakerLayer::builder(..).on_transition(..)`: it keeps
    /// the breaker state gauge and counts transitions.
    pub fn breaker_listener(&self) -> impl TransitionListener {
        let metrics = self.clone();
        move |event: &TransitionEvent| metrics.record_transition(event)
    }

    fn tool_label(&self, namespace: &str, name: &str) -> SharedString {
        self.inner
            .tools
            .registered(namespace, name)
            .cloned()
            .unwrap_or(SharedString::const_str(UNREGISTERED))
    }

    fn record_transition(&self, event: &TransitionEvent) {
        let tool = match &event.key {
            BreakerKey::Tool { namespace, name } => self.tool_label(namespace, name),
            BreakerKey::Dependency { .. } => SharedString::const_str("dependency"),
            _ => SharedString::const_str("global"),
        };
        let i = &self.inner;
        metrics::counter!(
            i.breaker_transitions_total.clone(),
            "tool" => tool.clone(),
            "from_state" => event.from.as_str(),
            "to_state" => event.to.as_str()
        )
        .increment(1);
        metrics::gauge!(i.breaker_state.clone(), "tool" => tool.clone(), "state" => event.from.as_str())
            .set(0.0);
        metrics::gauge!(i.breaker_state.clone(), "tool" => tool, "state" => event.to.as_str())
            .set(1.0);
    }

    /// Records one finished call.
    pub(super) fn record_call(
        &self,
        call: &ToolCall,
        outcome: &Result<ToolOutput, ToolError>,
        elapsed: Duration,
    ) {
        let i = &self.inner;
        let tool = i.tools.for_call(call).clone();
        let (status, record) = match outcome {
            Ok(output) => (ResultStatus::Success, output.record()),
            Err(error) => (ResultStatus::of_error(error), error.record()),
        };
        metrics::counter!(i.calls_total.clone(), "tool" => tool.clone(), "status" => status.as_str())
            .increment(1);
        metrics::histogram!(
            i.call_duration_ms.clone(),
            "tool" => tool.clone(),
            "status" => status.as_str()
        )
        .record(elapsed.as_secs_f64() * 1000.0);
        for retried in &record.retried_by {
            let reason = ErrorCode::parse(&retried.reason_code).map_or("other", ErrorCode::as_str);
            metrics::counter!(
                i.retry_attempts_total.clone(),
                "tool" => tool.clone(),
                "reason" => reason
            )
            .increment(1);
        }
        if let Some(cache) = &record.cache {
            let state = match cache.matched_on {
                MatchedOn::Inflight => "inflight",
                MatchedOn::Completed => "completed",
            };
            metrics::counter!(
                i.idempotency_hits_total.clone(),
                "tool" => tool.clone(),
                "state" => state
            )
            .increment(1);
        }
        for decision in &record.shadow {
            metrics::counter!(
                i.shadow_decisions_total.clone(),
                "layer" => decision.layer.as_str(),
                "decision" => decision.verdict.as_str()
            )
            .increment(1);
        }
        if let Err(error) = outcome {
            match error.code() {
                ErrorCode::LoopDetected => {
                    let chance = error
                        .details()
                        .and_then(|d| d.get("action"))
                        .is_some_and(|a| a == "chance");
                    let action = if chance { "chance" } else { "break" };
                    metrics::counter!(
                        i.loop_detections_total.clone(),
                        "tool" => tool,
                        "action" => action
                    )
                    .increment(1);
                }
                ErrorCode::RateLimited => {
                    metrics::counter!(i.rate_limited_total.clone(), "tool" => tool).increment(1);
                }
                _ => {}
            }
        }
    }
}

/// Builds [`ToolMetrics`].
#[derive(Debug)]
#[must_use]
pub struct ToolMetricsBuilder {
    registry: ToolRegistry,
    prefix: String,
}

impl ToolMetricsBuilder {
    /// The prefix of every series (default `toolcall_`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Checks the prefix (letters, digits, `_` and `:`, not starting with a digit, as
    /// Prometheus names go) and builds the metrics.
    pub fn build(self) -> Result<ToolMetrics, ConfigError> {
        let valid = self
            .prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !self.prefix.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(ConfigError::new(
                "metrics.prefix",
                format!(
                    "must hold only letters, digits, `_` and `:` and not start with a digit, \
                     got {:?}",
                    self.prefix
                ),
            ));
        }
        let tools = ToolTable::resolve(&self.registry, |descriptor, _| {
            Ok(match descriptor {
                Some(d) => SharedString::from_shared(Arc::from(d.full_name())),
                None => SharedString::const_str(UNREGISTERED),
            })
        })?;
        let name =
            |series: &str| SharedString::from_shared(Arc::from(format!("{}{series}", self.prefix)));
        Ok(ToolMetrics {
            inner: Arc::new(Inner {
                tools,
                calls_total: name("tool_calls_total"),
                call_duration_ms: name("tool_call_duration_ms"),
                retry_attempts_total: name("tool_retry_attempts_total"),
                idempotency_hits_total: name("tool_idempotency_hits_total"),
                loop_detections_total: name("tool_loop_detections_total"),
                rate_limited_total: name("tool_rate_limited_total"),
                shadow_decisions_total: name("tool_shadow_decisions_total"),
                breaker_state: name("tool_circuit_breaker_state"),
                breaker_transitions_total: name("tool_circuit_breaker_transitions_total"),
            }),
        })
    }
}
