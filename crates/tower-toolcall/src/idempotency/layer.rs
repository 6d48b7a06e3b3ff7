use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::{Counters, Idempotency, IdempotencyStats, Settings, Shared};
use super::store::{DedupeStore, InMemoryDedupeStore};
use crate::canonical::CanonicalOptions;
use crate::envelope::{DedupeMode, ToolCall};
use crate::error::{ConfigError, ToolError};
use crate::event::{EventSink, EventSinks, LayerEvent};
use crate::registry::{IdempotencySettings, KeyScope, OnStoreError, ParamsMismatch, ToolRegistry};
use crate::stack_part::{StackPart, StackShared};
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
            settings: IdempotencySettings::default(),
            builtin: Settings {
                mode: DedupeMode::Enforced,
                scope: KeyScope::Session,
                derive_keys: true,
                done_ttl: Duration::from_secs(24 * 60 * 60),
                failed_ttl: Duration::from_secs(5 * 60),
                inflight_lease: Duration::from_secs(2 * 60),
                on_params_mismatch: ParamsMismatch::Conflict,
                on_store_error: OnStoreError::FailClosed,
                resend_window: Duration::from_secs(30),
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
/// Its [settings](IdempotencyLayerBuilder::settings) are the defaults of every tool; a
/// tool's `policy.idempotency` overrides them.
///
/// ```
/// use std::sync::Arc;
/// use tower_toolcall::idempotency::{IdempotencyLayer, InMemoryDedupeStore};
/// use tower_toolcall::registry::{IdempotencySettings, OnStoreError, ToolRegistry};
/// use tower_toolcall::DedupeMode;
///
/// let settings = IdempotencySettings::default()
///     .with_dedupe_mode(DedupeMode::BestEffort)
///     .with_done_ttl_ms(3_600_000)
///     .with_inflight_lease_ms(30_000)
///     .with_on_store_error(OnStoreError::FailOpen);
/// let layer = IdempotencyLayer::builder(ToolRegistry::open(), Arc::new(InMemoryDedupeStore::new()))
///     .settings(settings)
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
    settings: IdempotencySettings,
    /// The built-in defaults, under the settings.
    builtin: Settings,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("store", &self.store)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The layer's settings, the defaults of every tool: mode `enforced` for calls that do
    /// not say (a call may ask for less only with `callers_may_loosen`), keys scoped to the
    /// session, a key derived for calls without one; a result under a caller's or a hook's
    /// key kept 24 h, a failure (and a cancelled record) 5 min; a completed result answers
    /// the same call re-sent under a derived key for 30 s (`0`: reuse off, a derived key
    /// only joins a call in flight), and a read-only tool's never (set `read_cache_ttl_ms`
    /// for reads whose answer may be that old); an in-flight lease of 2 min, renewed every
    /// half lease; a reused key with other params refused (`IDEMPOTENCY_KEY_REUSED`), a call
    /// refused when the store cannot be used (`STORE_UNAVAILABLE`).
    pub fn settings(mut self, settings: IdempotencySettings) -> Self {
        self.settings = settings;
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
        self.settings.check().map_err(|e| e.within("idempotency"))?;
        let defaults = self.builtin.with_settings(&self.settings);
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            Ok(defaults.for_tool(descriptor, &policy.idempotency))
        })?;
        let layer = IdempotencyLayer {
            shared: Arc::new(Shared {
                tools,
                store: self.store,
                canonical: self.canonical,
                defaults,
                counters: Counters::default(),
                live: Default::default(),
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

impl StackPart for IdempotencyLayerBuilder {
    type Layer = IdempotencyLayer;

    fn part(registry: &ToolRegistry) -> Self {
        IdempotencyLayer::builder(registry.clone(), Arc::new(InMemoryDedupeStore::new()))
    }

    fn build_part(self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        let builder = match &shared.canonical {
            Some(options) => self.canonical_options(options.clone()),
            None => self,
        };
        let sinks = shared.sinks.iter().cloned();
        let layer = sinks.fold(builder, Self::on_shared_event).build()?;
        // A re-send this layer answers is never a repeat for the loop detector outside it.
        shared.resends = Some(layer.resends());
        Ok(layer)
    }
}
