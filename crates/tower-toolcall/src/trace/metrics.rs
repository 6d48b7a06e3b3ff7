//! Metrics of every call through the [`metrics`] facade (feature `metrics`).
//!
//! | series | kind | labels |
//! |---|---|---|
//! | `{prefix}tool_calls_total` | counter | `tool`, `status` |
//! | `{prefix}tool_call_duration_seconds` | histogram, in seconds ([buckets](DURATION_BUCKETS)) | `tool`, `status` |
//! | `{prefix}tool_retry_attempts_total` | counter | `tool`, `reason` (the error code retried) |
//! | `{prefix}tool_hedges_total` | counter | `tool`, `won_by` (`hedge`, `attempt`: the attempt it hedged or a later retry, `none`: the call failed) |
//! | `{prefix}tool_idempotency_hits_total` | counter | `tool`, `state` (`inflight` or `completed`) |
//! | `{prefix}tool_loop_detections_total` | counter | `tool`, `action` (`break` or `chance`) |
//! | `{prefix}tool_rate_limited_total` | counter | `tool` |
//! | `{prefix}tool_bulkhead_in_use` | gauge: calls holding a place of the tool | `tool` |
//! | `{prefix}tool_bulkhead_queued` | gauge: calls waiting for a place of the tool | `tool` |
//! | `{prefix}tool_bulkhead_refused_total` | counter: calls the tool's full bulkhead refused | `tool` |
//! | `{prefix}namespace_bulkhead_in_use` | gauge: calls holding a place of the namespace | `namespace` |
//! | `{prefix}namespace_bulkhead_queued` | gauge: calls waiting for a place of the namespace | `namespace` |
//! | `{prefix}namespace_bulkhead_refused_total` | counter: calls the namespace's full bulkhead refused | `namespace` |
//! | `{prefix}tool_shadow_decisions_total` | counter | `layer` (`breaker`, `loop_detect`, `idempotency`, `rate_limit`), `decision` (`would_open`, `would_reject`, `would_block`, `would_replay`, `would_join`, `would_conflict`, `would_limit`, `would_wait`) |
//! | `{prefix}tool_circuit_breaker_state` | gauge (1 for the current state) | `tool`, `state` |
//! | `{prefix}tool_circuit_breaker_transitions_total` | counter | `tool`, `from_state`, `to_state` |
//! | `{prefix}tool_dedupe_cache_size` | gauge | none: the store is shared by every tool |
//! | `{prefix}tool_dedupe_ttl_seconds` | gauge | `tool`, `state` (`completed`, `failed`, `inflight`), `scope` (`session` or `global`) |
//! | `{prefix}shared_store_outages_total` | counter | `store` (`rate_limit` or `loop_detect`) |
//! | `{prefix}shared_store_failed_checks_total` | counter | `store`, `policy` (`open`: the call proceeded unchecked, or `closed`: it was refused) |
//!
//! Names follow the Prometheus and OpenTelemetry conventions: durations are in seconds, the
//! base unit, and say so in a `_seconds` suffix; counters end in `_total`.
//! [`ToolMetrics::describe`] gives every series its unit and help text. The `metrics` facade
//! carries no histogram buckets: give [`DURATION_BUCKETS`] to the exporter (with
//! `metrics-exporter-prometheus`, `PrometheusBuilder::set_buckets_for_metric(
//! Matcher::Suffix("_duration_seconds".into()), &DURATION_BUCKETS)`), so that the duration is
//! exposed as a histogram and not as a summary.
//!
//! [`ToolMetrics`] is an [`EventSink`]: it counts what the layers it is given to report
//! ([`LayerEvent`]). Give it to a whole stack with
//! [`ToolStackBuilder::on_event`](crate::ToolStackBuilder::on_event), or to each layer's
//! `on_event`: the call series come from the trace layer, the breaker series from the
//! circuit breaker, the shared-store series from the rate-limit and loop-detection layers,
//! and the dedupe TTL gauges from the idempotency layer when it is built. The store's size is
//! set when the application calls [`ToolMetrics::record_dedupe_size`], say before each scrape.
//!
//! The bulkhead's gauges cost its calls nothing: they are read from the layer's own counts
//! when the application calls [`ToolMetrics::record_bulkheads`] before each scrape, for the
//! tools and namespaces with a limit. Its refusals are counted from the trace layer's report
//! of each call, as the other call series are (a bulkhead's refusal is not counted in
//! `tool_rate_limited_total`).
//!
//! The prefix is `toolcall_` by default. Labels are bounded: `tool` is `namespace::name` of a
//! registered tool and `unregistered` for any other, whatever names callers send; the other
//! labels take values from fixed sets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::SharedString;

use crate::bulkhead::BulkheadLayer;
use crate::envelope::{ResultStatus, ToolCall};
use crate::error::{ConfigError, ErrorCode, ToolError};
use crate::event::{BreakerKey, EventSink, FailurePolicy, LayerEvent, StoreEvent, TransitionEvent};
use crate::outcome::{MatchedOn, ShortCircuit, ToolOutput};
use crate::registry::{KeyScope, ToolRegistry};
use crate::tool_table::ToolTable;

/// The label of every tool the registry does not know.
pub const UNREGISTERED: &str = "unregistered";

/// The bucket bounds, in seconds, for `tool_call_duration_seconds`: those OpenTelemetry's
/// semantic conventions advise for request durations (`http.server.request.duration`), from
/// 5 ms to 10 s.
///
/// ```
/// use tower_toolcall::trace::DURATION_BUCKETS;
///
/// assert!(DURATION_BUCKETS.windows(2).all(|w| w[0] < w[1]));
/// assert_eq!(DURATION_BUCKETS.last(), Some(&10.0));
/// ```
pub const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Records the metrics of calls: an [`EventSink`] to give to [`TraceLayer::on_event`](super::TraceLayer::on_event)
/// and the other layers' `on_event`.
/// Cheap to clone.
///
/// ```
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::trace::{ToolMetrics, TraceLayer};
/// use tower_toolcall::CircuitBreakerLayer;
///
/// let registry = ToolRegistry::open();
/// let metrics = ToolMetrics::builder(&registry).prefix("gateway_").build()?;
/// let trace = TraceLayer::new().on_event(metrics.clone());
/// let breaker = CircuitBreakerLayer::builder(registry)
///     .on_event(metrics.clone())
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
    /// The label of each registered namespace's dependency breaker (`dependency:<namespace>`).
    dependencies: std::collections::HashMap<String, SharedString>,
    /// The label of each registered namespace.
    namespaces: std::collections::HashMap<String, SharedString>,
    calls_total: SharedString,
    call_duration_seconds: SharedString,
    retry_attempts_total: SharedString,
    hedges_total: SharedString,
    idempotency_hits_total: SharedString,
    loop_detections_total: SharedString,
    rate_limited_total: SharedString,
    bulkhead_in_use: SharedString,
    bulkhead_queued: SharedString,
    bulkhead_refused_total: SharedString,
    namespace_bulkhead_in_use: SharedString,
    namespace_bulkhead_queued: SharedString,
    namespace_bulkhead_refused_total: SharedString,
    shadow_decisions_total: SharedString,
    breaker_state: SharedString,
    breaker_transitions_total: SharedString,
    dedupe_cache_size: SharedString,
    dedupe_ttl_seconds: SharedString,
    store_outages_total: SharedString,
    store_failed_checks_total: SharedString,
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

    /// Gives every series its unit and help text, for exporters that show them (the
    /// Prometheus `# HELP` lines). Call it once, after the recorder is installed.
    ///
    /// ```
    /// # use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::trace::ToolMetrics;
    ///
    /// ToolMetrics::new(&ToolRegistry::open()).describe();
    /// ```
    pub fn describe(&self) {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        let i = &self.inner;
        describe_counter!(
            i.calls_total.clone(),
            Unit::Count,
            "Tool calls, by how they ended."
        );
        describe_histogram!(
            i.call_duration_seconds.clone(),
            Unit::Seconds,
            "How long tool calls took, every layer included."
        );
        describe_counter!(
            i.retry_attempts_total.clone(),
            Unit::Count,
            "Attempts retried, by the error code retried."
        );
        describe_counter!(
            i.hedges_total.clone(),
            Unit::Count,
            "Hedges sent beside slow attempts, by which attempt answered the call."
        );
        describe_counter!(
            i.idempotency_hits_total.clone(),
            Unit::Count,
            "Calls answered by the idempotency cache or joined to a call in flight."
        );
        describe_counter!(
            i.loop_detections_total.clone(),
            Unit::Count,
            "Calls stopped or warned by loop detection."
        );
        describe_counter!(
            i.rate_limited_total.clone(),
            Unit::Count,
            "Calls refused by a rate limit."
        );
        describe_gauge!(
            i.bulkhead_in_use.clone(),
            Unit::Count,
            "Calls holding a place in their tool's bulkhead."
        );
        describe_gauge!(
            i.bulkhead_queued.clone(),
            Unit::Count,
            "Calls waiting for a place in their tool's bulkhead."
        );
        describe_counter!(
            i.bulkhead_refused_total.clone(),
            Unit::Count,
            "Calls refused because their tool's bulkhead and its queue were full."
        );
        describe_gauge!(
            i.namespace_bulkhead_in_use.clone(),
            Unit::Count,
            "Calls holding a place in their namespace's bulkhead."
        );
        describe_gauge!(
            i.namespace_bulkhead_queued.clone(),
            Unit::Count,
            "Calls waiting for a place in their namespace's bulkhead."
        );
        describe_counter!(
            i.namespace_bulkhead_refused_total.clone(),
            Unit::Count,
            "Calls refused because their namespace's bulkhead and its queue were full."
        );
        describe_counter!(
            i.shadow_decisions_total.clone(),
            Unit::Count,
            "Decisions a layer in shadow mode reported without enforcing them."
        );
        describe_gauge!(
            i.breaker_state.clone(),
            "1 for the current state of each tool's circuit breaker, 0 for the others."
        );
        describe_counter!(
            i.breaker_transitions_total.clone(),
            Unit::Count,
            "Circuit breaker transitions."
        );
        describe_gauge!(
            i.dedupe_cache_size.clone(),
            Unit::Count,
            "Records held by the dedupe store."
        );
        describe_gauge!(
            i.dedupe_ttl_seconds.clone(),
            Unit::Seconds,
            "How long the dedupe store keeps each kind of record, per tool and key scope."
        );
        describe_counter!(
            i.store_outages_total.clone(),
            Unit::Count,
            "Outages of a shared store: runs of failed checks between two that succeeded."
        );
        describe_counter!(
            i.store_failed_checks_total.clone(),
            Unit::Count,
            "Checks a shared store could not answer, by what the failure policy did with the call."
        );
    }

    fn record_store_event(&self, store: &'static str, event: StoreEvent) {
        let i = &self.inner;
        match event {
            StoreEvent::OutageBegan => {
                metrics::counter!(i.store_outages_total.clone(), "store" => store).increment(1);
            }
            StoreEvent::CheckFailed(policy) => {
                let policy = match policy {
                    FailurePolicy::Open => "open",
                    FailurePolicy::Closed => "closed",
                };
                metrics::counter!(
                    i.store_failed_checks_total.clone(),
                    "store" => store,
                    "policy" => policy
                )
                .increment(1);
            }
            StoreEvent::OutageEnded => {}
        }
    }

    /// Sets the dedupe store's size gauge to `records`, what
    /// `DedupeStore::size` answered.
    ///
    /// ```
    /// # use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::trace::ToolMetrics;
    /// use tower_toolcall::ToolStack;
    ///
    /// # tokio_test::block_on(async {
    /// let registry = ToolRegistry::open();
    /// let metrics = ToolMetrics::new(&registry);
    /// let stack = ToolStack::builder(registry).on_event(metrics.clone()).build()?;
    /// // before each scrape:
    /// metrics.record_dedupe_size(stack.dedupe_store().unwrap().size().await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn record_dedupe_size(&self, records: u64) {
        metrics::gauge!(self.inner.dedupe_cache_size.clone()).set(records as f64);
    }

    /// Sets the bulkhead's gauges to what `layer` holds now: the calls in use and queued of
    /// each tool and namespace it limits. Call it before each scrape; it costs the calls
    /// nothing.
    ///
    /// ```
    /// # use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::registry::BulkheadSettings;
    /// use tower_toolcall::trace::ToolMetrics;
    /// use tower_toolcall::ToolStack;
    ///
    /// let registry = ToolRegistry::open();
    /// let metrics = ToolMetrics::new(&registry);
    /// let stack = ToolStack::builder(registry)
    ///     .on_event(metrics.clone())
    ///     .bulkhead(|b| b.settings(BulkheadSettings::default().with_max_concurrent(8)))
    ///     .build()?;
    /// // before each scrape:
    /// metrics.record_bulkheads(stack.bulkheads().unwrap());
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn record_bulkheads(&self, layer: &BulkheadLayer) {
        let i = &self.inner;
        for (tool, in_use, queued) in layer.tools_in_use() {
            let tool = match tool {
                Some((namespace, name)) => self.tool_label(namespace, name),
                None => SharedString::const_str(UNREGISTERED),
            };
            metrics::gauge!(i.bulkhead_in_use.clone(), "tool" => tool.clone()).set(in_use as f64);
            metrics::gauge!(i.bulkhead_queued.clone(), "tool" => tool).set(queued as f64);
        }
        for (namespace, in_use, queued) in layer.namespaces_in_use() {
            let namespace = SharedString::from_shared(Arc::from(namespace));
            metrics::gauge!(i.namespace_bulkhead_in_use.clone(), "namespace" => namespace.clone())
                .set(in_use as f64);
            metrics::gauge!(i.namespace_bulkhead_queued.clone(), "namespace" => namespace)
                .set(queued as f64);
        }
    }

    /// Counts a call the bulkhead refused: by its tool's limit, or by its namespace's.
    fn record_bulkhead_refusal(&self, call: &ToolCall, tool: SharedString, error: &ToolError) {
        let i = &self.inner;
        let by_namespace = error
            .details()
            .and_then(|d| d.get("limit"))
            .is_some_and(|limit| limit == "namespace");
        if !by_namespace {
            metrics::counter!(i.bulkhead_refused_total.clone(), "tool" => tool).increment(1);
            return;
        }
        // Only registered tools share a namespace's places: the label stays bounded.
        let Some(namespace) = i.namespaces.get(call.tool_namespace()) else {
            return;
        };
        metrics::counter!(
            i.namespace_bulkhead_refused_total.clone(),
            "namespace" => namespace.clone()
        )
        .increment(1);
    }

    /// Sets the dedupe TTL gauges of `tool` (`None`: the unregistered tools): how long it
    /// keeps a completed record, a failed one, and the lease of one in flight, labelled with
    /// the tool's key scope.
    fn record_dedupe_ttls(
        &self,
        tool: Option<&str>,
        scope: KeyScope,
        ttls: [(&'static str, Duration); 3],
    ) {
        let gauge = &self.inner.dedupe_ttl_seconds;
        let tool = match tool {
            Some(full_name) => SharedString::from_shared(Arc::from(full_name)),
            None => SharedString::const_str(UNREGISTERED),
        };
        let scope = match scope {
            KeyScope::Global => "global",
            KeyScope::Actor => "actor",
            _ => "session",
        };
        for (state, ttl) in ttls {
            metrics::gauge!(
                gauge.clone(),
                "tool" => tool.clone(),
                "state" => state,
                "scope" => scope
            )
            .set(ttl.as_secs_f64());
        }
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
            // A registered namespace by its name; any other under one label, which keeps
            // the labels bounded.
            BreakerKey::Dependency { namespace } => self
                .inner
                .dependencies
                .get(namespace)
                .cloned()
                .unwrap_or(SharedString::const_str("dependency:unregistered")),
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
    fn record_call(
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
            i.call_duration_seconds.clone(),
            "tool" => tool.clone(),
            "status" => status.as_str()
        )
        .record(elapsed.as_secs_f64());
        for retried in &record.retried_by {
            let reason = ErrorCode::parse(&retried.reason_code).map_or("other", ErrorCode::as_str);
            metrics::counter!(
                i.retry_attempts_total.clone(),
                "tool" => tool.clone(),
                "reason" => reason
            )
            .increment(1);
        }
        if let Some(hedge) = &record.hedge {
            let won_by = match hedge.winner {
                None => "none",
                Some(_) if hedge.hedge_won() => "hedge",
                Some(_) => "attempt",
            };
            metrics::counter!(
                i.hedges_total.clone(),
                "tool" => tool.clone(),
                "won_by" => won_by
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
                ErrorCode::RateLimited
                    if record.short_circuit == Some(ShortCircuit::BulkheadFull) =>
                {
                    self.record_bulkhead_refusal(call, tool, error);
                }
                ErrorCode::RateLimited => {
                    metrics::counter!(i.rate_limited_total.clone(), "tool" => tool).increment(1);
                }
                _ => {}
            }
        }
    }
}

/// Metrics hear every event: give them to [`ToolStackBuilder::on_event`](crate::ToolStackBuilder::on_event)
/// (or to each layer's `on_event`).
impl EventSink for ToolMetrics {
    fn on_event(&self, event: &LayerEvent<'_>) {
        match *event {
            LayerEvent::CallFinished {
                call,
                outcome,
                elapsed,
            } => self.record_call(call, outcome, elapsed),
            LayerEvent::BreakerTransition(transition) => self.record_transition(transition),
            LayerEvent::Store { layer, event } => self.record_store_event(layer, event),
            LayerEvent::DedupeSettings {
                tool,
                scope,
                done_ttl,
                failed_ttl,
                inflight_lease,
            } => self.record_dedupe_ttls(
                tool,
                scope,
                [
                    ("completed", done_ttl),
                    ("failed", failed_ttl),
                    ("inflight", inflight_lease),
                ],
            ),
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
        let dependencies = self
            .registry
            .tools()
            .map(|tool| {
                let namespace = tool.descriptor().namespace.clone();
                let label = SharedString::from_shared(Arc::from(format!("dependency:{namespace}")));
                (namespace, label)
            })
            .collect();
        let namespaces = self
            .registry
            .tools()
            .map(|tool| {
                let namespace = tool.descriptor().namespace.clone();
                let label = SharedString::from_shared(Arc::from(namespace.as_str()));
                (namespace, label)
            })
            .collect();
        let name =
            |series: &str| SharedString::from_shared(Arc::from(format!("{}{series}", self.prefix)));
        Ok(ToolMetrics {
            inner: Arc::new(Inner {
                tools,
                dependencies,
                namespaces,
                calls_total: name("tool_calls_total"),
                call_duration_seconds: name("tool_call_duration_seconds"),
                retry_attempts_total: name("tool_retry_attempts_total"),
                hedges_total: name("tool_hedges_total"),
                idempotency_hits_total: name("tool_idempotency_hits_total"),
                loop_detections_total: name("tool_loop_detections_total"),
                rate_limited_total: name("tool_rate_limited_total"),
                bulkhead_in_use: name("tool_bulkhead_in_use"),
                bulkhead_queued: name("tool_bulkhead_queued"),
                bulkhead_refused_total: name("tool_bulkhead_refused_total"),
                namespace_bulkhead_in_use: name("namespace_bulkhead_in_use"),
                namespace_bulkhead_queued: name("namespace_bulkhead_queued"),
                namespace_bulkhead_refused_total: name("namespace_bulkhead_refused_total"),
                shadow_decisions_total: name("tool_shadow_decisions_total"),
                breaker_state: name("tool_circuit_breaker_state"),
                breaker_transitions_total: name("tool_circuit_breaker_transitions_total"),
                dedupe_cache_size: name("tool_dedupe_cache_size"),
                dedupe_ttl_seconds: name("tool_dedupe_ttl_seconds"),
                store_outages_total: name("shared_store_outages_total"),
                store_failed_checks_total: name("shared_store_failed_checks_total"),
            }),
        })
    }
}
