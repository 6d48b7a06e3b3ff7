use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::{Counters, Idempotency, IdempotencyStats, Settings, Shared};
use super::store::{at_least_a_millisecond, DedupeStore, InMemoryDedupeStore};
use super::{DEFAULT_DONE_TTL, DEFAULT_FAILED_TTL, DEFAULT_INFLIGHT_LEASE, DEFAULT_RESEND_WINDOW};
use crate::canonical::CanonicalOptions;
use crate::envelope::{DedupeMode, ToolCall};
use crate::error::{ConfigError, ToolError};
use crate::event::{EventSink, EventSinks, LayerEvent};
use crate::registry::{KeyScope, OnStoreError, ParamsMismatch, ToolRegistry};
use crate::tool_table::ToolTable;

/// Applies [`Idempotency`] to a service. See the [module docs](super).
///
/// Clones share one store, one registry and one set of counters behind an [`Arc`].
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// A layer with the defaults and a fresh [`InMemoryDedupeStore`].
    pub fn in_memory(registry: ToolRegistry) -> Self {
        IdempotencyLayer::new(registry, Arc::new(InMemoryDedupeStore::new()))
    }

    /// A layer with the defaults, keeping records in `store` and resolving each tool's
    /// policy in `registry`.
    pub fn new(registry: ToolRegistry, store: Arc<dyn DedupeStore>) -> Self {
        IdempotencyLayer::builder(registry, store)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with other defaults.
    pub fn builder(registry: ToolRegistry, store: Arc<dyn DedupeStore>) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder {
            registry,
            store,
            sinks: EventSinks::default(),
            canonical: CanonicalOptions::default(),
            defaults: Settings {
                mode: DedupeMode::Enforced,
                scope: KeyScope::Session,
                derive_keys: true,
                done_ttl: DEFAULT_DONE_TTL,
                failed_ttl: DEFAULT_FAILED_TTL,
                inflight_lease: DEFAULT_INFLIGHT_LEASE,
                on_params_mismatch: ParamsMismatch::Conflict,
                on_store_error: OnStoreError::FailClosed,
                resend_window: DEFAULT_RESEND_WINDOW,
                read_cache_ttl: None,
                read_only: false,
                repeat_is_safe: false,
                callers_may_loosen: false,
            },
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn DedupeStore> {
        &self.shared.store
    }

    /// The store key `call` is deduplicated under, or `None` when the layer lets it through
    /// (the layer is off for its tool, its dedupe mode is `disabled`, or it has no key and
    /// derivation is off). Errors are those the call itself would get (params nested too
    /// deep).
    pub fn store_key(&self, call: &ToolCall) -> Result<Option<String>, ToolError> {
        let Some(settings) = self.shared.tools.for_call(call) else {
            return Ok(None);
        };
        Ok(self
            .shared
            .plan(call, settings, false)?
            .map(|plan| plan.claim.key.to_string()))
    }

    /// The layer, as a loop layer in front of it asks which calls it answers from a record.
    pub(crate) fn resends(&self) -> crate::resend::Resends {
        crate::resend::Resends(self.shared.clone())
    }

    /// What the layer has done so far, over all its services.
    pub fn stats(&self) -> IdempotencyStats {
        self.shared.counters.snapshot()
    }
}

impl Clone for IdempotencyLayer {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: self.shared.clone(),
        }
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.shared.store)
            .field("defaults", &self.shared.defaults)
            .finish()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.shared.clone())
    }
}

/// Builds an [`IdempotencyLayer`]; made by [`IdempotencyLayer::builder`].
///
/// Every setting is a default that a tool's `policy.idempotency` overrides.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_toolcall::idempotency::{IdempotencyLayer, InMemoryDedupeStore};
/// use tower_toolcall::registry::{OnStoreError, ToolRegistry};
/// use tower_toolcall::DedupeMode;
///
/// let layer = IdempotencyLayer::builder(ToolRegistry::open(), Arc::new(InMemoryDedupeStore::new()))
///     .dedupe_mode(DedupeMode::BestEffort)
///     .done_ttl(Duration::from_secs(3600))
///     .inflight_lease(Duration::from_secs(30))
///     .on_store_error(OnStoreError::FailOpen)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[must_use]
pub struct IdempotencyLayerBuilder {
    registry: ToolRegistry,
    store: Arc<dyn DedupeStore>,
    sinks: EventSinks,
    canonical: CanonicalOptions,
    defaults: Settings,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("store", &self.store)
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The dedupe mode of calls that do not say and whose tool's policy does not either
    /// (default `enforced`).
    pub fn dedupe_mode(mut self, mode: DedupeMode) -> Self {
        self.defaults.mode = mode;
        self
    }

    /// Whether a call's `transport.dedupeMode` may ask for less deduplication than its
    /// tool's mode (default `false`): `bestEffort` under `enforced`, or `disabled`. When it
    /// may not, such a request is ignored and the tool's mode applies; a stricter request is
    /// always followed.
    pub fn callers_may_loosen(mut self, allowed: bool) -> Self {
        self.defaults.callers_may_loosen = allowed;
        self
    }

    /// Whose calls share a key (default: the session's).
    pub fn scope(mut self, scope: KeyScope) -> Self {
        self.defaults.scope = scope;
        self
    }

    /// Whether a call without a key gets one derived from its tool, params, session and
    /// actor (default `true`).
    pub fn derive_keys(mut self, derive: bool) -> Self {
        self.defaults.derive_keys = derive;
        self
    }

    /// How long a successful result under a caller's or a hook's key is kept (default 24 h).
    /// A derived key keeps its result for the [re-send window](Self::resend_window) instead.
    pub fn done_ttl(mut self, ttl: Duration) -> Self {
        self.defaults.done_ttl = ttl;
        self
    }

    /// How long a failure is kept (default 5 min); also how long a cancelled record stays
    /// visible.
    pub fn failed_ttl(mut self, ttl: Duration) -> Self {
        self.defaults.failed_ttl = ttl;
        self
    }

    /// How long a completed result answers the same call re-sent under a derived key
    /// (default 30 s), for tools that are not read-only. Zero turns reuse off: a derived key
    /// then only joins a call still in flight. A read-only tool reuses a result only within
    /// its [read cache TTL](Self::read_cache_ttl).
    pub fn resend_window(mut self, window: Duration) -> Self {
        self.defaults.resend_window = window;
        self
    }

    /// How long a read-only tool's completed result answers the same read under a derived
    /// key (default: never, the read runs again once the first has finished). Set it for
    /// reads whose answer may be that old.
    pub fn read_cache_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.defaults.read_cache_ttl = ttl;
        self
    }

    /// The in-flight lease (default 2 min), renewed every half lease while the tool runs.
    pub fn inflight_lease(mut self, lease: Duration) -> Self {
        self.defaults.inflight_lease = lease;
        self
    }

    /// What a reused key with other params means (default: `IDEMPOTENCY_KEY_REUSED`).
    pub fn on_params_mismatch(mut self, mismatch: ParamsMismatch) -> Self {
        self.defaults.on_params_mismatch = mismatch;
        self
    }

    /// What happens to a call when the store cannot be used (default: fail closed with
    /// `STORE_UNAVAILABLE`).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.defaults.on_store_error = on_error;
        self
    }

    /// The canonical options of derived keys and params digests. Keep the default to share
    /// the canonical form cached in the params with the other layers.
    pub fn canonical_options(mut self, options: CanonicalOptions) -> Self {
        self.canonical = options;
        self
    }

    /// Keeps records in `store` instead, with the settings made so far.
    pub fn store(mut self, store: Arc<dyn DedupeStore>) -> Self {
        self.store = store;
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        at_least_a_millisecond("idempotency.done_ttl", self.defaults.done_ttl)?;
        at_least_a_millisecond("idempotency.failed_ttl", self.defaults.failed_ttl)?;
        at_least_a_millisecond("idempotency.inflight_lease", self.defaults.inflight_lease)?;
        let defaults = &self.defaults;
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            Ok(defaults.for_tool(descriptor, &policy.idempotency))
        })?;
        let layer = IdempotencyLayer {
            shared: Arc::new(Shared {
                tools,
                store: self.store,
                canonical: self.canonical,
                defaults: self.defaults,
                counters: Counters::default(),
            }),
        };
        layer.tell_settings(&self.sinks);
        Ok(layer)
    }

    /// Tells `sink`, once the layer is built, how long it keeps each tool's records
    /// ([`LayerEvent::DedupeSettings`]).
    pub fn on_event(self, sink: impl EventSink) -> Self {
        self.on_shared_event(Arc::new(sink))
    }

    /// Tells `sink`, shared with other layers, what [`on_event`](Self::on_event) tells.
    pub(crate) fn on_shared_event(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }
}

impl IdempotencyLayer {
    /// Tells `sinks` the key scope and TTLs of each tool the layer deduplicates (`None` for
    /// the unregistered ones).
    fn tell_settings(&self, sinks: &EventSinks) {
        if sinks.is_empty() {
            return;
        }
        let tools = &self.shared.tools;
        let named = tools.iter().filter_map(|(namespace, name, settings)| {
            Some((Some(format!("{namespace}::{name}")), settings.as_ref()?))
        });
        let unregistered = tools.get_unregistered().as_ref().map(|s| (None, s));
        for (tool, settings) in named.chain(unregistered) {
            sinks.emit(&LayerEvent::DedupeSettings {
                tool: tool.as_deref(),
                scope: settings.scope,
                done_ttl: settings.done_ttl,
                failed_ttl: settings.failed_ttl,
                inflight_lease: settings.inflight_lease,
            });
        }
    }
}
