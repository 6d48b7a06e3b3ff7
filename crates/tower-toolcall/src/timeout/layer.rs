use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::{AttemptLimit, Timeout};
use crate::error::ConfigError;
use crate::registry::{LayerSetting, TimeoutSettings, ToolRegistry};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// The attempt timeout of tools that set none: 30 s.
const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Applies [`Timeout`] to a service. See the [module docs](crate::timeout).
///
/// Clones share the per-tool timeouts, resolved once from the registry, behind an [`Arc`].
#[derive(Clone, Debug)]
pub struct TimeoutLayer {
    limits: Arc<ToolTable<Option<AttemptLimit>>>,
}

impl TimeoutLayer {
    /// A layer with the default attempt timeout (30 s) for tools of `registry` that set none.
    pub fn new(registry: ToolRegistry) -> Self {
        TimeoutLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with another default.
    pub fn builder(registry: ToolRegistry) -> TimeoutLayerBuilder {
        TimeoutLayerBuilder {
            registry,
            settings: TimeoutSettings::default(),
            unbounded: false,
        }
    }

    /// The attempt timeout of the tool `namespace::name`, before a call's hint narrows it;
    /// `None` when its attempts are not bounded.
    pub fn attempt_timeout(&self, namespace: &str, name: &str) -> Option<Duration> {
        self.limits
            .get(namespace, name)
            .and_then(|limit| limit.attempt)
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Timeout::new(inner, self.limits.clone())
    }
}

/// Builds a [`TimeoutLayer`].
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::registry::{TimeoutSettings, ToolRegistry};
/// use tower_toolcall::TimeoutLayer;
///
/// let layer = TimeoutLayer::builder(ToolRegistry::open())
///     .settings(TimeoutSettings::default().with_attempt_timeout_ms(10_000))
///     .build()?;
/// assert_eq!(layer.attempt_timeout("any", "tool"), Some(Duration::from_secs(10)));
///
/// let err = TimeoutLayer::builder(ToolRegistry::open())
///     .settings(TimeoutSettings::default().with_attempt_timeout_ms(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "timeout.attempt_timeout_ms");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct TimeoutLayerBuilder {
    registry: ToolRegistry,
    settings: TimeoutSettings,
    unbounded: bool,
}

impl TimeoutLayerBuilder {
    /// The layer's settings: the attempt timeout of tools whose policy sets none (default
    /// 30 s). A tool's `policy.timeout` overrides them.
    pub fn settings(mut self, settings: TimeoutSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Leaves the attempts of tools whose policy sets no timeout unbounded (a call's
    /// `callHints.timeoutMs` still bounds them).
    pub fn no_default_timeout(mut self) -> Self {
        self.unbounded = true;
        self
    }

    /// Checks the configuration, resolves every tool's timeout, and builds the layer.
    pub fn build(self) -> Result<TimeoutLayer, ConfigError> {
        self.settings.check().map_err(|e| e.within("timeout"))?;
        let layer = &self.settings;
        let default = (!self.unbounded).then_some(DEFAULT_ATTEMPT_TIMEOUT);
        let limits = ToolTable::resolve(&self.registry, |_, policy| {
            let settings = match &policy.timeout {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default => layer.clone(),
                LayerSetting::On(tool) => tool.clone().over(layer),
            };
            Ok(Some(AttemptLimit {
                attempt: settings
                    .attempt_timeout_ms
                    .map(Duration::from_millis)
                    .or(default),
                idle: settings.idle_timeout_ms.map(Duration::from_millis),
            }))
        })?;
        Ok(TimeoutLayer {
            limits: Arc::new(limits),
        })
    }
}

impl StackPart for TimeoutLayerBuilder {
    type Layer = TimeoutLayer;

    fn part(registry: &ToolRegistry) -> Self {
        TimeoutLayer::builder(registry.clone())
    }

    fn build_part(self, _shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        self.build()
    }
}
