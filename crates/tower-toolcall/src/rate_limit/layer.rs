use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::limiter::{LimitSettings, Sweeper, TokioClock, ToolLimit};
use super::service::{Limits, RateLimit};
use super::store::RateLimitStore;
use crate::error::ConfigError;
use crate::event::{EventSink, EventSinks};
use crate::registry::{LayerSetting, OnLimit, RateLimitKey, RateLimitSettings, ToolRegistry};
use crate::shared_store::{FailurePolicy, Outages, StoreHealth};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// The longest a call waits for its quota with `on_limit = "wait"`: 10 s.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);
/// The keys a tool's limiter holds at most: 10 000.
const DEFAULT_MAX_KEYS: usize = 10_000;
/// How often every limiter drops its idle keys: every minute.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Applies [`RateLimit`] to a service. See the [module docs](crate::rate_limit).
///
/// Clones share the quotas behind an [`Arc`]: every stack built with clones of one layer
/// draws on the same quotas.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limits: Arc<Limits>,
}

impl RateLimitLayer {
    /// A layer that limits the tools of `registry` whose policy sets a rate, and no other.
    pub fn new(registry: ToolRegistry) -> Self {
        RateLimitLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with a default rate and other settings.
    pub fn builder(registry: ToolRegistry) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            registry,
            settings: RateLimitSettings::default(),
            store: None,
            on_store_failure: FailurePolicy::Open,
            sinks: EventSinks::default(),
        }
    }

    /// How the layer's shared [store](RateLimitLayerBuilder::store) has fared: always
    /// available without one.
    pub fn store_health(&self) -> StoreHealth {
        self.limits.outages.health()
    }

    /// How many keys the limiter of the tool `namespace::name` tracks now (that of every
    /// unregistered tool for one the registry does not know); 0 when it is not limited.
    pub fn tracked_keys(&self, namespace: &str, name: &str) -> usize {
        self.limits
            .tools
            .get(namespace, name)
            .as_ref()
            .map_or(0, |limit| limit.len())
    }

    /// Drops every key whose quota is full again, now.
    pub fn sweep(&self) {
        for limit in self.limits.all() {
            limit.sweep();
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.limits.clone())
    }
}

/// Builds a [`RateLimitLayer`]. Its [settings](RateLimitLayerBuilder::settings) are the
/// defaults of every tool; a tool's `policy.rate_limit` overrides them.
///
/// ```
/// use tower_toolcall::registry::{OnLimit, RateLimitKey, RateLimitSettings, ToolRegistry};
/// use tower_toolcall::RateLimitLayer;
///
/// let settings = RateLimitSettings::default()
///     .with_per_second(20)
///     .with_burst(5)
///     .with_key(RateLimitKey::ToolSession)
///     .with_on_limit(OnLimit::Wait)
///     .with_max_wait_ms(2_000);
/// let layer = RateLimitLayer::builder(ToolRegistry::open()).settings(settings).build()?;
/// # let _ = layer;
/// let err = RateLimitLayer::builder(ToolRegistry::open())
///     .settings(RateLimitSettings::default().with_per_second(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "rate_limit.per_second");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct RateLimitLayerBuilder {
    registry: ToolRegistry,
    settings: RateLimitSettings,
    store: Option<Arc<dyn RateLimitStore>>,
    on_store_failure: FailurePolicy,
    sinks: EventSinks,
}

impl RateLimitLayerBuilder {
    /// Keeps the quotas in `store` (a `RedisRateLimitStore` of `tower-toolcall-redis` to
    /// share them between replicas) instead of in this process. Each check is then one call
    /// to the store; `max_keys` and the sweep concern the in-process limiter only.
    pub fn store(mut self, store: Arc<dyn RateLimitStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// What happens to a call when the [store](Self::store) cannot answer (default
    /// [`FailurePolicy::Open`]: it proceeds unchecked). See
    /// [`shared_store`](crate::shared_store).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Tells `sink` when the shared store's outages begin and end, and of each check that
    /// failed ([`LayerEvent::Store`](crate::event::LayerEvent::Store)); sinks add up.
    pub fn on_event(self, sink: impl EventSink) -> Self {
        self.on_shared_event(Arc::new(sink))
    }

    /// Tells `sink`, shared with other layers, what [`on_event`](Self::on_event) tells.
    pub(crate) fn on_shared_event(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// The layer's settings, the defaults of every tool: no rate (only tools whose policy
    /// sets one are limited), a burst of the rate per second, one quota per tool, calls
    /// over it rejected, waits of at most 10 s with `on_limit = "wait"`; and the whole
    /// layer's bounds: 10 000 keys per tool's limiter (a new key beyond them takes the place
    /// of the least recently used one; allow for the callers active at once, since a key
    /// that makes room while its quota is not full again starts over with a full burst),
    /// idle keys dropped every 60 s. See the [module docs](crate::rate_limit).
    pub fn settings(mut self, settings: RateLimitSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Checks the configuration, makes the limiter of every limited tool, and builds the
    /// layer.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        self.settings.check().map_err(|e| e.within("rate_limit"))?;
        let layer = &self.settings;
        let max_keys = layer.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
        let sweep_interval = layer
            .sweep_interval_ms
            .map_or(DEFAULT_SWEEP_INTERVAL, Duration::from_millis);
        let clock = TokioClock::new();
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let tool = match &policy.rate_limit {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default if layer.per_second.is_none() => return Ok(None),
                LayerSetting::Default => layer.clone(),
                LayerSetting::On(tool) => tool.clone().over(layer),
            };
            let per_second = tool.per_second.ok_or_else(|| {
                ConfigError::new(
                    "policy.rate_limit.per_second",
                    "is required: the layer sets no default rate",
                )
            })?;
            let settings = LimitSettings {
                per_second,
                burst: tool.burst.unwrap_or(per_second),
                key: tool.key.unwrap_or(RateLimitKey::Tool),
                on_limit: tool.on_limit.unwrap_or(OnLimit::Reject),
                max_wait: tool
                    .max_wait_ms
                    .map_or(DEFAULT_MAX_WAIT, Duration::from_millis),
            };
            Ok(Some(Arc::new(ToolLimit::new(
                settings,
                clock,
                max_keys,
                descriptor.is_none() || self.store.is_some(),
            ))))
        })?;
        Ok(RateLimitLayer {
            limits: Arc::new(Limits {
                tools,
                sweeper: Sweeper::new(clock, sweep_interval),
                store: self.store,
                outages: Outages::new(self.on_store_failure, self.sinks),
            }),
        })
    }
}

impl StackPart for RateLimitLayerBuilder {
    type Layer = RateLimitLayer;

    fn part(registry: &ToolRegistry) -> Self {
        RateLimitLayer::builder(registry.clone())
    }

    fn build_part(self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        let sinks = shared.sinks.iter().cloned();
        sinks.fold(self, Self::on_shared_event).build()
    }
}
