use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::limiter::{LimitSettings, Sweeper, TokioClock, ToolLimit};
use super::service::{Limits, RateLimit};
use super::store::RateLimitStore;
use crate::error::ConfigError;
use crate::event::{EventSink, EventSinks};
use crate::registry::{LayerSetting, OnLimit, RateLimitKey, ToolRegistry};
use crate::shared_store::{FailurePolicy, Outages, StoreHealth};
use crate::tool_table::ToolTable;

/// The longest a call waits for its quota with `on_limit = "wait"`: 10 s.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);
/// The keys a tool's limiter holds at most: 10 000.
pub const DEFAULT_MAX_KEYS: usize = 10_000;
/// How often every limiter drops its idle keys: every minute.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

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
            per_second: None,
            burst: None,
            key: RateLimitKey::Tool,
            on_limit: OnLimit::Reject,
            max_wait: DEFAULT_MAX_WAIT,
            max_keys: DEFAULT_MAX_KEYS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
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

/// Builds a [`RateLimitLayer`]. The settings here are the defaults of every tool; a tool's
/// `policy.rate_limit` overrides them.
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::registry::{OnLimit, RateLimitKey, ToolRegistry};
/// use tower_toolcall::RateLimitLayer;
///
/// let layer = RateLimitLayer::builder(ToolRegistry::open())
///     .per_second(20)
///     .burst(5)
///     .key(RateLimitKey::ToolSession)
///     .on_limit(OnLimit::Wait)
///     .max_wait(Duration::from_secs(2))
///     .build()?;
/// # let _ = layer;
/// let err = RateLimitLayer::builder(ToolRegistry::open()).per_second(0).build().unwrap_err();
/// assert_eq!(err.field(), "rate_limit.per_second");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct RateLimitLayerBuilder {
    registry: ToolRegistry,
    per_second: Option<u32>,
    burst: Option<u32>,
    key: RateLimitKey,
    on_limit: OnLimit,
    max_wait: Duration,
    max_keys: usize,
    sweep_interval: Duration,
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

    /// The rate of tools whose policy sets none (default: such tools are not limited).
    pub fn per_second(mut self, per_second: u32) -> Self {
        self.per_second = Some(per_second);
        self
    }

    /// Calls allowed at once (default: the rate per second).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// What quotas are kept per (default [`RateLimitKey::Tool`]).
    pub fn key(mut self, key: RateLimitKey) -> Self {
        self.key = key;
        self
    }

    /// What happens to a call over its quota (default [`OnLimit::Reject`]).
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// The longest a call waits with [`OnLimit::Wait`] (default [`DEFAULT_MAX_WAIT`]).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The keys each tool's limiter holds at most (default [`DEFAULT_MAX_KEYS`]): a new key
    /// beyond them takes the place of the least recently used one, so the number of keys
    /// never exceeds it (see the [module docs](crate::rate_limit)). Allow for the callers
    /// active at once: a key that makes room while its quota is not full again starts over
    /// with a full burst.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How often every limiter drops its idle keys (default [`DEFAULT_SWEEP_INTERVAL`]).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Checks the configuration, makes the limiter of every limited tool, and builds the
    /// layer.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        let at_least_one = [
            ("per_second", self.per_second.map(u64::from)),
            ("burst", self.burst.map(u64::from)),
            ("max_keys", Some(self.max_keys as u64)),
        ];
        for (field, value) in at_least_one {
            if value == Some(0) {
                return Err(ConfigError::new(
                    format!("rate_limit.{field}"),
                    "must be at least 1, got 0",
                ));
            }
        }
        for (field, value) in [
            ("max_wait", self.max_wait),
            ("sweep_interval", self.sweep_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(
                    format!("rate_limit.{field}"),
                    "must be longer than zero",
                ));
            }
        }
        let clock = TokioClock::new();
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let overrides = match &policy.rate_limit {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default if self.per_second.is_none() => return Ok(None),
                LayerSetting::Default => None,
                LayerSetting::On(overrides) => Some(overrides),
            };
            let per_second = overrides
                .and_then(|o| o.per_second)
                .or(self.per_second)
                .ok_or_else(|| {
                    ConfigError::new(
                        "policy.rate_limit.per_second",
                        "is required: the layer sets no default rate",
                    )
                })?;
            let settings = LimitSettings {
                per_second,
                burst: overrides
                    .and_then(|o| o.burst)
                    .or(self.burst)
                    .unwrap_or(per_second),
                key: overrides.and_then(|o| o.key).unwrap_or(self.key),
                on_limit: overrides.and_then(|o| o.on_limit).unwrap_or(self.on_limit),
                max_wait: overrides
                    .and_then(|o| o.max_wait_ms)
                    .map_or(self.max_wait, Duration::from_millis),
            };
            Ok(Some(Arc::new(ToolLimit::new(
                settings,
                clock,
                self.max_keys,
                descriptor.is_none() || self.store.is_some(),
            ))))
        })?;
        Ok(RateLimitLayer {
            limits: Arc::new(Limits {
                tools,
                sweeper: Sweeper::new(clock, self.sweep_interval),
                store: self.store,
                outages: Outages::new(self.on_store_failure, self.sinks),
            }),
        })
    }
}
