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
use crate::registry::{BreakerSettings, LayerSetting, RiskLevel, ToolRegistry, ToolSettings};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// How many breakers made on demand (for unregistered tools and namespaces) are kept at
/// most: 10 000.
const DEFAULT_MAX_BREAKERS: u32 = 10_000;

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
            settings: BreakerSettings::default(),
            read_only: BreakerSettings::default(),
            mutating: BreakerSettings::default(),
            classifier: SharedClassifier::default(),
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
/// A tool's breaker starts from the preset of its risk level, changed by
/// [`read_only`](CircuitBreakerLayerBuilder::read_only) for read-only tools (8 consecutive
/// failures, a 20 s cooldown) and by [`mutating`](CircuitBreakerLayerBuilder::mutating) for
/// `writes` and `commands` tools (a 25 % failure rate); its `policy.breaker` applies on
/// top. Unregistered tools and the dependency and global breakers, shared by several tools,
/// use the layer's [`settings`](CircuitBreakerLayerBuilder::settings) over the defaults.
///
/// ```
/// use tower_toolcall::breaker::CircuitBreakerLayer;
/// use tower_toolcall::registry::{BreakerSettings, ToolRegistry};
///
/// let layer = CircuitBreakerLayer::builder(ToolRegistry::open())
///     .settings(BreakerSettings::default().with_cooldown_ms(10_000).with_max_breakers(1_000))
///     .build()?;
/// # let _ = layer;
/// let err = CircuitBreakerLayer::builder(ToolRegistry::open())
///     .mutating(BreakerSettings::default().with_failure_rate_percent(120))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "breaker.mutating.failure_rate_percent");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[must_use]
pub struct CircuitBreakerLayerBuilder {
    registry: ToolRegistry,
    settings: BreakerSettings,
    read_only: BreakerSettings,
    mutating: BreakerSettings,
    classifier: SharedClassifier,
    sinks: EventSinks,
    /// The breakers of the layer this one replaces.
    carried: Option<Arc<Shared>>,
}

impl CircuitBreakerLayerBuilder {
    /// The layer's settings: those of unregistered tools and of the dependency and global
    /// breakers, and the layer-wide bounds (`max_breakers`, `probe_timeout_ms`). The
    /// defaults: open after 5 consecutive failures, or a failure rate of 50 % over the last
    /// 20 calls (at least 10) in 120 s; open 30 s; 1 probe at a time, closed after 2
    /// successes; probes abandoned after 30 s; at most 10 000 breakers made on demand.
    pub fn settings(mut self, settings: BreakerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Changes the preset of read-only tools.
    pub fn read_only(mut self, settings: BreakerSettings) -> Self {
        self.read_only = settings;
        self
    }

    /// Changes the preset of `writes` and `commands` tools.
    pub fn mutating(mut self, settings: BreakerSettings) -> Self {
        self.mutating = settings;
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
        self.settings.check().map_err(|e| e.within("breaker"))?;
        let config = BreakerConfig::default().with_settings(&self.settings);
        config.check()?;
        let layer_wide = self.settings.layer_wide();
        let preset = |base: BreakerConfig, settings: &BreakerSettings, field: &str| {
            settings.check_tool().map_err(|e| e.within(field))?;
            let config = base.with_settings(settings).with_settings(&layer_wide);
            config.check().map_err(|e| rename(e, field))?;
            Ok::<_, ConfigError>(config)
        };
        let read_only = preset(
            BreakerConfig::read_only(),
            &self.read_only,
            "breaker.read_only",
        )?;
        let mutating = preset(
            BreakerConfig::mutating(),
            &self.mutating,
            "breaker.mutating",
        )?;
        let max_breakers = self.settings.max_breakers.unwrap_or(DEFAULT_MAX_BREAKERS);
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
                None => &config,
                Some(RiskLevel::ReadOnly) => &read_only,
                Some(RiskLevel::Writes | RiskLevel::Commands) => &mutating,
            };
            let config = match &policy.breaker {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default => preset.clone(),
                LayerSetting::On(tool) => preset.clone().with_settings(tool),
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
                            kept(&key, &config).unwrap_or_else(|| cell(key, config.clone()))
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
                global: kept(&BreakerKey::Global, &config)
                    .unwrap_or_else(|| cell(BreakerKey::Global, config.clone())),
                on_demand: BreakerMap::new(max_breakers as usize),
                scoped_config: config,
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
            .field("settings", &self.settings)
            .field("read_only", &self.read_only)
            .field("mutating", &self.mutating)
            .field("sinks", &self.sinks)
            .finish_non_exhaustive()
    }
}

impl StackPart for CircuitBreakerLayerBuilder {
    type Layer = CircuitBreakerLayer;

    fn part(registry: &ToolRegistry) -> Self {
        CircuitBreakerLayer::builder(registry.clone())
    }

    fn build_part(self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        let sinks = shared.sinks.iter().cloned();
        let layer = sinks.fold(self, Self::on_shared_event).build()?;
        shared.breakers = Some(layer.admin().view());
        Ok(layer)
    }
}
