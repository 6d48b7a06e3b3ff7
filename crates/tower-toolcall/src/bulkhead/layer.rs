use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::places::ToolPlaces;
use super::service::Bulkhead;
use crate::error::ConfigError;
use crate::registry::{BulkheadSettings, LayerSetting, ToolRegistry};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// The retry-after of a refused call: 1 s.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Applies [`Bulkhead`] to a service. See the [module docs](crate::bulkhead).
///
/// Clones share every tool's places behind an [`Arc`]: every stack built with clones of one
/// layer counts the same running and waiting calls.
#[derive(Clone, Debug)]
pub struct BulkheadLayer {
    places: Arc<ToolTable<Option<Arc<ToolPlaces>>>>,
}

impl BulkheadLayer {
    /// A layer that limits the tools of `registry` whose policy sets `max_concurrent`, and
    /// no other.
    pub fn new(registry: ToolRegistry) -> Self {
        BulkheadLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with default settings for every tool.
    pub fn builder(registry: ToolRegistry) -> BulkheadLayerBuilder {
        BulkheadLayerBuilder {
            registry,
            settings: BulkheadSettings::default(),
        }
    }

    fn tool(&self, namespace: &str, name: &str) -> Option<&ToolPlaces> {
        self.places.get(namespace, name).as_deref()
    }

    /// How many calls of the tool `namespace::name` (or of the unregistered tools, for one
    /// the registry does not know) hold a place now; 0 when it is not limited.
    pub fn in_use(&self, namespace: &str, name: &str) -> usize {
        self.tool(namespace, name).map_or(0, ToolPlaces::in_use)
    }

    /// How many calls of the tool wait for a place now.
    pub fn queued(&self, namespace: &str, name: &str) -> usize {
        self.tool(namespace, name).map_or(0, ToolPlaces::queued)
    }

    /// How many calls of the tool were refused since the layer was built, because every
    /// place was taken and the queue was full.
    pub fn refused(&self, namespace: &str, name: &str) -> u64 {
        self.tool(namespace, name).map_or(0, ToolPlaces::refused)
    }

    /// The places of the tool (calls running at once) and the calls that may wait, when it
    /// is limited.
    pub fn limits(&self, namespace: &str, name: &str) -> Option<(usize, usize)> {
        self.tool(namespace, name)
            .map(|places| (places.max_concurrent, places.max_queued))
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::new(inner, self.places.clone())
    }
}

/// Builds a [`BulkheadLayer`]. Its [settings](BulkheadLayerBuilder::settings) are the
/// defaults of every tool; a tool's `policy.bulkhead` overrides them.
///
/// ```
/// use tower_toolcall::registry::{BulkheadSettings, ToolRegistry};
/// use tower_toolcall::BulkheadLayer;
///
/// // Every tool: 8 calls at once, 32 more waiting.
/// let settings = BulkheadSettings::default().with_max_concurrent(8).with_max_queued(32);
/// let layer = BulkheadLayer::builder(ToolRegistry::open()).settings(settings).build()?;
/// assert_eq!(layer.limits("any", "tool"), Some((8, 32)));
///
/// let err = BulkheadLayer::builder(ToolRegistry::open())
///     .settings(BulkheadSettings::default().with_max_concurrent(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "bulkhead.max_concurrent");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct BulkheadLayerBuilder {
    registry: ToolRegistry,
    settings: BulkheadSettings,
}

impl BulkheadLayerBuilder {
    /// The layer's settings, the defaults of every tool: no `max_concurrent` (only tools
    /// whose policy sets one are limited), as many calls waiting as there are places, a
    /// retry-after of 1 s for refused calls. See the [module docs](crate::bulkhead).
    pub fn settings(mut self, settings: BulkheadSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Checks the configuration, makes the places of every limited tool, and builds the
    /// layer.
    pub fn build(self) -> Result<BulkheadLayer, ConfigError> {
        self.settings.check().map_err(|e| e.within("bulkhead"))?;
        let layer = &self.settings;
        let places = ToolTable::resolve(&self.registry, |_, policy| {
            let settings = match &policy.bulkhead {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default => layer.clone(),
                LayerSetting::On(tool) => tool.clone().over(layer),
            };
            let Some(max_concurrent) = settings.max_concurrent else {
                if matches!(policy.bulkhead, LayerSetting::On(_)) {
                    // A tool that tunes its bulkhead means to be limited.
                    return Err(ConfigError::new(
                        "policy.bulkhead.max_concurrent",
                        "is required: the layer sets no default",
                    ));
                }
                return Ok(None);
            };
            let max_queued = settings.max_queued.unwrap_or(max_concurrent);
            let retry_after = settings
                .retry_after_ms
                .map_or(DEFAULT_RETRY_AFTER, Duration::from_millis);
            Ok(Some(Arc::new(ToolPlaces::new(
                max_concurrent as usize,
                max_queued as usize,
                retry_after,
            ))))
        })?;
        Ok(BulkheadLayer {
            places: Arc::new(places),
        })
    }
}

impl StackPart for BulkheadLayerBuilder {
    type Layer = BulkheadLayer;

    fn part(registry: &ToolRegistry) -> Self {
        BulkheadLayer::builder(registry.clone())
    }

    fn build_part(self, _shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        self.build()
    }
}
