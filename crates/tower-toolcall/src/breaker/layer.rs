use std::collections::HashMap;
use std::sync::Arc;

use tower_layer::Layer;

use super::admin::{BreakerAdmin, Events};
use super::cell::BreakerCell;
use super::map::BreakerMap;
use super::service::{CircuitBreaker, Shared, ToolBreaker};
use super::state::BreakerConfig;
use crate::classify::{Classify, SharedClassifier, ToolProfile};
use crate::error::ConfigError;
use crate::event::{BreakerKey, EventSink, EventSinks};
use crate::registry::{LayerSetting, RiskLevel, ToolRegistry};
use crate::tool_table::ToolTable;

/// How many breakers made on demand (for unregistered tools and namespaces) are kept at
/// most: 10 000.
pub const DEFAULT_MAX_BREAKERS: usize = 10_000;

/// Applies [`CircuitBreaker`] to a service. See the [module docs](crate::breaker).
///
/// Clones share every breaker behind an [`Arc`]: build the layer once and use it (or its
/// clones) for every stack that should see the same breakers.
#[derive(Clone, Debug)]
pub struct CircuitBreakerLayer {
    shared: Arc<Shared>,
}

impl CircuitBreakerLayer {
    /// A layer with the default configuration and presets for the tools of `registry`.
    pub fn new(registry: ToolRegistry) -> Self {
        CircuitBreakerLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with other numbers.
    pub fn builder(registry: ToolRegistry) -> CircuitBreakerLayerBuilder {
        CircuitBreakerLayerBuilder {
            registry,
            config: BreakerConfig::default(),
            read_only: BreakerConfig::read_only(),
            mutating: BreakerConfig::mutating(),
            classifier: SharedClassifier::default(),
            max_breakers: DEFAULT_MAX_BREAKERS,
            sinks: EventSinks::default(),
            carried: None,
        }
    }

    /// The admin handle of the layer's breakers.
    pub fn admin(&self) -> BreakerAdmin {
        BreakerAdmin::new(self.shared.clone())
    }
}

impl<S> Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::new(inner, self.shared.clone())
    }
}

/// Builds a [`CircuitBreakerLayer`].
///
/// A tool's breaker starts from the preset of its risk level — [`read_only`] for read-only
/// tools, [`mutating`] for `writes` and `commands` tools — or, for unregistered tools, from
/// [`config`]; its `policy.breaker` overrides apply on top. The dependency and global
/// breakers, shared by several tools, use [`config`].
///
/// [`read_only`]: CircuitBreakerLayerBuilder::read_only
/// [`mutating`]: CircuitBreakerLayerBuilder::mutating
/// [`config`]: CircuitBreakerLayerBuilder::config
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::breaker::{BreakerConfig, CircuitBreakerLayer};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let layer = CircuitBreakerLayer::builder(ToolRegistry::open())
///     .config(BreakerConfig::default().with_cooldown(Duration::from_secs(10)))
///     .max_breakers(1_000)
///     .build()?;
/// # let _ = layer;
/// let err = CircuitBreakerLayer::builder(ToolRegistry::open())
///     .mutating(BreakerConfig::mutating().with_failure_rate_percent(120))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "breaker.mutating.failure_rate_percent");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[must_use]
pub struct CircuitBreakerLayerBuilder {
    registry: ToolRegistry,
    config: BreakerConfig,
    read_only: BreakerConfig,
    mutating: BreakerConfig,
    classifier: SharedClassifier,
    max_breakers: usize,
    sinks: EventSinks,
    /// The breakers of the layer this one replaces.
    carried: Option<Arc<Shared>>,
}

impl CircuitBreakerLayerBuilder {
    /// The configuration of unregistered tools and of the dependency and global breakers
    /// (default: [`BreakerConfig::default`]).
    pub fn config(mut self, config: BreakerConfig) -> Self {
        self.config = config;
        self
    }

    /// The preset of read-only tools (default: [`BreakerConfig::read_only`]).
    pub fn read_only(mut self, config: BreakerConfig) -> Self {
        self.read_only = config;
        self
    }

    /// The preset of `writes` and `commands` tools (default: [`BreakerConfig::mutating`]).
    pub fn mutating(mut self, config: BreakerConfig) -> Self {
        self.mutating = config;
        self
    }

    /// The classifier that decides which outcomes count as failures (default:
    /// [`DefaultClassifier`](crate::classify::DefaultClassifier)). Give the retry layer the
    /// same one.
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = SharedClassifier::new(classifier);
        self
    }

    /// The classifier, already shared.
    pub fn shared_classifier(mut self, classifier: SharedClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// How many breakers made on demand are kept at most (default
    /// [`DEFAULT_MAX_BREAKERS`]).
    pub fn max_breakers(mut self, max: usize) -> Self {
        self.max_breakers = max;
        self
    }

    /// Keeps the breakers of the layer that `previous` administers (one this layer
    /// replaces: a server that rebuilds its stack on a reload): a registered tool's breaker,
    /// its namespace's and the global one go on with their state and counts when the new
    /// layer has them with the same configuration, and the dependency and global breakers
    /// an operator holds open stay held. A tool that is gone, or whose configuration
    /// changed, starts afresh. A breaker kept tells its transitions to the listeners of the
    /// layer that made it.
    ///
    /// ```
    /// use tower_toolcall::breaker::{BreakerKey, CircuitBreakerLayer};
    /// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
    /// use tower_toolcall::BreakerState;
    ///
    /// let registry = ToolRegistry::builder()
    ///     .tool(ToolDescriptor::new("web", "search", RiskLevel::ReadOnly))
    ///     .build()?;
    /// let before = CircuitBreakerLayer::new(registry.clone());
    /// before.admin().force_open(&BreakerKey::tool("web", "search"));
    /// let after = CircuitBreakerLayer::builder(registry).carry(&before.admin()).build()?;
    /// assert_eq!(after.admin().state("web", "search"), BreakerState::ForcedOpen);
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn carry(mut self, previous: &BreakerAdmin) -> Self {
        self.carried = Some(previous.shared().clone());
        self
    }

    /// Tells `sink` every transition (more sinks can be added through the admin handle).
    pub fn on_event(self, sink: impl EventSink) -> Self {
        self.on_shared_event(Arc::new(sink))
    }

    /// Tells `sink`, shared with other layers, every transition.
    pub(crate) fn on_shared_event(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Checks the configuration, makes the breakers of the registered tools, and builds
    /// the layer.
    pub fn build(self) -> Result<CircuitBreakerLayer, ConfigError> {
        self.config.check()?;
        self.read_only
            .check()
            .map_err(|e| rename(e, "breaker.read_only"))?;
        self.mutating
            .check()
            .map_err(|e| rename(e, "breaker.mutating"))?;
        if self.max_breakers == 0 {
            return Err(ConfigError::new(
                "breaker.max_breakers",
                "must be at least 1, got 0",
            ));
        }
        let events = Arc::new(Events::new(self.sinks));
        let carried = self.carried.as_deref();
        let cell = |key: BreakerKey, config: BreakerConfig| {
            Arc::new(BreakerCell::new(key, config, events.clone()))
        };
        // A breaker of the layer replaced, when it has the same configuration.
        let kept = |key: &BreakerKey, config: &BreakerConfig| {
            let carried = carried?;
            let found = match key {
                BreakerKey::Tool { namespace, name } => carried
                    .tools
                    .registered(namespace, name)?
                    .as_ref()?
                    .own
                    .clone()?,
                BreakerKey::Dependency { namespace } => {
                    carried.dependencies.get(namespace)?.clone()
                }
                BreakerKey::Global => carried.global.clone(),
            };
            (found.config() == config).then_some(found)
        };
        let mut dependencies: HashMap<String, Arc<BreakerCell>> = HashMap::new();
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let preset = match descriptor.map(|d| d.risk) {
                None => &self.config,
                Some(RiskLevel::ReadOnly) => &self.read_only,
                Some(RiskLevel::Writes | RiskLevel::Commands) => &self.mutating,
            };
            let config = match &policy.breaker {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default => preset.clone(),
                LayerSetting::On(overrides) => preset.clone().with_overrides(overrides),
            };
            let config = match descriptor.and_then(|d| d.attempt_timeout()) {
                Some(timeout) => config.with_probe_timeout(timeout),
                None => config,
            };
            config.check().map_err(|e| rename(e, "policy.breaker"))?;
            let (own, dependency) = match descriptor {
                Some(d) => {
                    let key = BreakerKey::tool(&d.namespace, &d.name);
                    let own = kept(&key, &config).unwrap_or_else(|| cell(key, config.clone()));
                    let dependency = dependencies
                        .entry(d.namespace.clone())
                        .or_insert_with(|| {
                            let key = BreakerKey::dependency(&d.namespace);
                            kept(&key, &self.config)
                                .unwrap_or_else(|| cell(key, self.config.clone()))
                        })
                        .clone();
                    (Some(own), Some(dependency))
                }
                None => (None, None),
            };
            Ok(Some(Arc::new(ToolBreaker {
                profile: ToolProfile::new(descriptor, policy),
                classifier: self.classifier.clone(),
                config,
                own,
                dependency,
            })))
        })?;
        Ok(CircuitBreakerLayer {
            shared: Arc::new(Shared {
                tools,
                dependencies,
                global: kept(&BreakerKey::Global, &self.config)
                    .unwrap_or_else(|| cell(BreakerKey::Global, self.config.clone())),
                on_demand: BreakerMap::new(self.max_breakers),
                scoped_config: self.config,
                events,
                held: carried.map(|c| c.held.carried()).unwrap_or_default(),
            }),
        })
    }
}

/// `breaker.field` → `prefix.field`.
fn rename(error: ConfigError, prefix: &str) -> ConfigError {
    let field = error.field();
    let field = field.strip_prefix("breaker.").unwrap_or(field);
    ConfigError::new(format!("{prefix}.{field}"), error.problem())
}

impl std::fmt::Debug for CircuitBreakerLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreakerLayerBuilder")
            .field("registry", &self.registry)
            .field("config", &self.config)
            .field("read_only", &self.read_only)
            .field("mutating", &self.mutating)
            .field("max_breakers", &self.max_breakers)
            .field("sinks", &self.sinks)
            .finish_non_exhaustive()
    }
}
