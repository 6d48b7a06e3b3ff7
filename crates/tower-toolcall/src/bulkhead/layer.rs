use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::places::{Limits, Places, Scope};
use super::service::Bulkhead;
use crate::error::ConfigError;
use crate::registry::{BulkheadSettings, LayerSetting, ToolPolicy, ToolRegistry};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// The retry-after of a refused call: 1 s.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Applies [`Bulkhead`] to a service. See the [module docs](crate::bulkhead).
///
/// Clones share every tool's (and namespace's) places behind an [`Arc`]: every stack built
/// with clones of one layer counts the same running and waiting calls.
#[derive(Clone, Debug)]
pub struct BulkheadLayer {
    limits: Arc<ToolTable<Option<Limits>>>,
    /// The places of each limited namespace, by its name.
    namespaces: Arc<BTreeMap<String, Arc<Places>>>,
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
            namespaces: BTreeMap::new(),
            carried: None,
        }
    }

    fn tool(&self, namespace: &str, name: &str) -> Option<&Places> {
        self.limits
            .get(namespace, name)
            .as_ref()
            .and_then(|limits| limits.tool.as_deref())
    }

    fn namespace(&self, namespace: &str) -> Option<&Places> {
        self.namespaces.get(namespace).map(|places| &**places)
    }

    /// How many calls of the tool `namespace::name` (or of the unregistered tools, for one
    /// the registry does not know) hold a place now; 0 when it is not limited.
    pub fn in_use(&self, namespace: &str, name: &str) -> usize {
        self.tool(namespace, name).map_or(0, Places::in_use)
    }

    /// How many calls of the tool wait for a place now.
    pub fn queued(&self, namespace: &str, name: &str) -> usize {
        self.tool(namespace, name).map_or(0, Places::queued)
    }

    /// How many calls of the tool were refused since the layer was built, because every
    /// place of the tool was taken and its queue was full (those its namespace's limit
    /// refused are counted by [`namespace_refused`](BulkheadLayer::namespace_refused)).
    pub fn refused(&self, namespace: &str, name: &str) -> u64 {
        self.tool(namespace, name).map_or(0, Places::refused)
    }

    /// The places of the tool (calls running at once) and the calls that may wait, when it
    /// is limited.
    pub fn limits(&self, namespace: &str, name: &str) -> Option<(usize, usize)> {
        self.tool(namespace, name)
            .map(|places| (places.max_concurrent, places.max_queued))
    }

    /// How many calls of the tools of `namespace` hold a place of the namespace now; 0 when
    /// it is not limited.
    pub fn namespace_in_use(&self, namespace: &str) -> usize {
        self.namespace(namespace).map_or(0, Places::in_use)
    }

    /// How many calls of the tools of `namespace` wait for a place of the namespace now.
    pub fn namespace_queued(&self, namespace: &str) -> usize {
        self.namespace(namespace).map_or(0, Places::queued)
    }

    /// How many calls of the tools of `namespace` were refused since the layer was built,
    /// because every place of the namespace was taken and its queue was full.
    pub fn namespace_refused(&self, namespace: &str) -> u64 {
        self.namespace(namespace).map_or(0, Places::refused)
    }

    /// The places of `namespace` and the calls that may wait for them, when it is limited.
    pub fn namespace_limits(&self, namespace: &str) -> Option<(usize, usize)> {
        self.namespace(namespace)
            .map(|places| (places.max_concurrent, places.max_queued))
    }

    /// `(namespace, name, in use, queued)` of every registered tool with places of its own,
    /// and `(None, …)` for the unregistered tools' when they have some.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn tools_in_use(
        &self,
    ) -> impl Iterator<Item = (Option<(&str, &str)>, usize, usize)> {
        let registered = self
            .limits
            .iter()
            .map(|(namespace, name, limits)| (Some((namespace, name)), limits));
        let unregistered = std::iter::once((None, self.limits.get_unregistered()));
        registered.chain(unregistered).filter_map(|(tool, limits)| {
            let places = limits.as_ref()?.tool.as_ref()?;
            Some((tool, places.in_use(), places.queued()))
        })
    }

    /// `(namespace, in use, queued)` of every limited namespace.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn namespaces_in_use(&self) -> impl Iterator<Item = (&str, usize, usize)> {
        self.namespaces
            .iter()
            .map(|(namespace, places)| (namespace.as_str(), places.in_use(), places.queued()))
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::new(inner, self.limits.clone())
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
    namespaces: BTreeMap<String, BulkheadSettings>,
    /// The layer this one replaces, whose places it keeps where its limits are the same.
    carried: Option<BulkheadLayer>,
}

impl BulkheadLayerBuilder {
    /// The layer's settings, the defaults of every tool: no `max_concurrent` (only tools
    /// whose policy sets one are limited), as many calls waiting as there are places, a
    /// retry-after of 1 s for refused calls. See the [module docs](crate::bulkhead).
    pub fn settings(mut self, settings: BulkheadSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Limits the calls of every registered tool of `namespace` together, beside each tool's
    /// own limit: `max_concurrent` places (required) that the namespace's tools share, and
    /// `max_queued` calls waiting for one (by default as many as `max_concurrent`; 0 for
    /// none). A call takes its tool's place first, then its namespace's. `retry_after_ms`
    /// unset is the layer's. Set again, a namespace's limit replaces the one before.
    ///
    /// ```
    /// use tower_toolcall::registry::{BulkheadSettings, RiskLevel, ToolDescriptor, ToolRegistry};
    /// use tower_toolcall::BulkheadLayer;
    ///
    /// let registry = ToolRegistry::builder()
    ///     .tool(ToolDescriptor::new("github", "search", RiskLevel::ReadOnly))
    ///     .build()?;
    /// // Every tool of `github` together: 4 calls at once, none waiting.
    /// let layer = BulkheadLayer::builder(registry)
    ///     .namespace("github", BulkheadSettings::default().with_max_concurrent(4).with_max_queued(0))
    ///     .build()?;
    /// assert_eq!(layer.namespace_limits("github"), Some((4, 0)));
    /// assert_eq!(layer.limits("github", "search"), None, "no limit of its own");
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>, settings: BulkheadSettings) -> Self {
        self.namespaces.insert(namespace.into(), settings);
        self
    }

    /// Keeps the places of `previous` (a layer this one replaces: a server that rebuilds its
    /// stack on a reload) for each tool and namespace the new layer limits alike (the same
    /// `max_concurrent`, `max_queued` and retry-after): the calls still running on the old
    /// stack keep holding their places, so that the limit holds across the change, and the
    /// calls waiting there keep their turn. A tool or namespace that is gone, or whose limits
    /// changed, starts with free places.
    ///
    /// ```
    /// use tower_toolcall::registry::{BulkheadSettings, ToolRegistry};
    /// use tower_toolcall::BulkheadLayer;
    ///
    /// let settings = BulkheadSettings::default().with_max_concurrent(8);
    /// let before = BulkheadLayer::builder(ToolRegistry::open()).settings(settings.clone()).build()?;
    /// let after = BulkheadLayer::builder(ToolRegistry::open())
    ///     .settings(settings)
    ///     .carry(&before)
    ///     .build()?;
    /// assert_eq!(after.limits("any", "tool"), Some((8, 8)));
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn carry(mut self, previous: &BulkheadLayer) -> Self {
        self.carried = Some(previous.clone());
        self
    }

    /// Checks the configuration, makes the places of every limited tool and namespace, and
    /// builds the layer.
    pub fn build(self) -> Result<BulkheadLayer, ConfigError> {
        self.settings.check().map_err(|e| e.within("bulkhead"))?;
        let layer = &self.settings;
        let layer_retry_after = layer
            .retry_after_ms
            .map_or(DEFAULT_RETRY_AFTER, Duration::from_millis);
        let mut namespaces = BTreeMap::new();
        for (namespace, settings) in &self.namespaces {
            let within = |e: ConfigError| e.within(&format!("bulkhead.namespaces[{namespace}]"));
            settings.check().map_err(within)?;
            let Some(max_concurrent) = settings.max_concurrent else {
                return Err(within(ConfigError::new(
                    "max_concurrent",
                    "is required: the calls of the namespace's tools at once",
                )));
            };
            let places = Places::new(
                Scope::Namespace,
                max_concurrent as usize,
                settings.max_queued.unwrap_or(max_concurrent) as usize,
                settings
                    .retry_after_ms
                    .map_or(layer_retry_after, Duration::from_millis),
            );
            let before = self
                .carried
                .as_ref()
                .and_then(|previous| previous.namespaces.get(namespace));
            namespaces.insert(namespace.clone(), kept_or_new(before, places));
        }
        let limits = ToolTable::resolve(&self.registry, |descriptor, policy| {
            // The unregistered tools share no namespace's places, whatever their namespace.
            let namespace = descriptor
                .and_then(|d| namespaces.get(&d.namespace))
                .cloned();
            let before = self.carried.as_ref().and_then(|previous| {
                let limits = match descriptor {
                    Some(d) => previous.limits.registered(&d.namespace, &d.name)?,
                    None => previous.limits.get_unregistered(),
                };
                limits.as_ref()?.tool.as_ref()
            });
            let tool = tool_places(layer, policy)?.map(|places| kept_or_new(before, places));
            Ok((tool.is_some() || namespace.is_some()).then_some(Limits { tool, namespace }))
        })?;
        Ok(BulkheadLayer {
            limits: Arc::new(limits),
            namespaces: Arc::new(namespaces),
        })
    }
}

/// `before`, the places a replaced layer had, when `places` are alike; else `places`.
fn kept_or_new(before: Option<&Arc<Places>>, places: Places) -> Arc<Places> {
    match before {
        Some(before) if before.is_like(&places) => before.clone(),
        _ => Arc::new(places),
    }
}

/// The places of a tool whose `policy` is over the `layer`'s settings, when it is limited.
fn tool_places(
    layer: &BulkheadSettings,
    policy: &ToolPolicy,
) -> Result<Option<Places>, ConfigError> {
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
    Ok(Some(Places::new(
        Scope::Tool,
        max_concurrent as usize,
        max_queued as usize,
        retry_after,
    )))
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
