use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::Rng;
use tower_layer::Layer;

use super::backoff::SharedRng;
use super::budget::GlobalRetryBudget;
use super::hedge::LatencyWindow;
use super::policy::RetryPolicy;
use super::service::{Retry, ToolRetry};
use crate::breaker::BreakerAdmin;
use crate::breaker_view::Breakers;
use crate::classify::{Classify, SharedClassifier, ToolProfile};
use crate::error::ConfigError;
use crate::registry::{LayerSetting, RetrySettings, ToolRegistry};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// Applies [`Retry`] to a service. See the [module docs](crate::retry).
///
/// Clones share the per-tool policies, the global retry budget and the random number
/// generator of the jitter behind [`Arc`]s.
#[derive(Clone, Debug)]
pub struct RetryLayer {
    tools: Arc<ToolTable<Option<Arc<ToolRetry>>>>,
    budget: Option<GlobalRetryBudget>,
}

impl RetryLayer {
    /// A layer with the default policy for the tools of `registry`, a default global retry
    /// budget, and jitter seeded from the process's random hash keys.
    pub fn new(registry: ToolRegistry) -> Self {
        RetryLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with other numbers.
    pub fn builder(registry: ToolRegistry) -> RetryLayerBuilder {
        RetryLayerBuilder {
            registry,
            settings: RetrySettings::default(),
            classifier: SharedClassifier::default(),
            budget: Some(GlobalRetryBudget::new()),
            rng: None,
            breakers: None,
        }
    }

    /// The policy of the tool `namespace::name` (the unregistered policy for a tool the
    /// registry does not know); `None` when its policy switches the layer off.
    pub fn policy(&self, namespace: &str, name: &str) -> Option<&RetryPolicy> {
        self.tools
            .get(namespace, name)
            .as_ref()
            .map(|tool| &tool.policy)
    }

    /// How many hedges the layer sent for calls of the tool `namespace::name` (of the
    /// unregistered tools, for one the registry does not know) since it was built, by
    /// every clone; 0 when the tool's policy switches the layer off.
    pub fn hedges(&self, namespace: &str, name: &str) -> u64 {
        self.tools
            .get(namespace, name)
            .as_ref()
            .map_or(0, |tool| tool.hedges.load(Ordering::Relaxed))
    }

    /// The global retry budget, unless the layer has none.
    pub fn budget(&self) -> Option<&GlobalRetryBudget> {
        self.budget.as_ref()
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(inner, self.tools.clone())
    }
}

/// Builds a [`RetryLayer`].
///
/// Its [settings](RetryLayerBuilder::settings) are the defaults of every tool; a tool's
/// `policy.retry` overrides them, and a call's envelope may narrow them further.
///
/// ```
/// use tower_toolcall::registry::{JitterKind, RetrySettings, ToolRegistry};
/// use tower_toolcall::retry::GlobalRetryBudget;
/// use tower_toolcall::RetryLayer;
///
/// let settings = RetrySettings::default()
///     .with_max_attempts(3)
///     .with_base_delay_ms(100)
///     .with_max_delay_ms(5_000)
///     .with_jitter(JitterKind::Percent)
///     .with_jitter_percent(20);
/// let layer = RetryLayer::builder(ToolRegistry::open())
///     .settings(settings)
///     .budget(GlobalRetryBudget::new())
///     .seed(42)
///     .build()?;
/// assert_eq!(layer.policy("any", "tool").unwrap().max_attempts(), 3);
///
/// let err = RetryLayer::builder(ToolRegistry::open())
///     .settings(RetrySettings::default().with_max_attempts(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "retry.max_attempts");
/// let err = RetryLayer::builder(ToolRegistry::open())
///     .settings(RetrySettings::default().with_base_delay_ms(1_000).with_max_delay_ms(500))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "retry.max_delay_ms");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[must_use]
pub struct RetryLayerBuilder {
    registry: ToolRegistry,
    settings: RetrySettings,
    classifier: SharedClassifier,
    budget: Option<GlobalRetryBudget>,
    rng: Option<SharedRng>,
    breakers: Option<Breakers>,
}

impl RetryLayerBuilder {
    /// The layer's settings, the defaults of every tool: 4 attempts in all, a backoff of
    /// `min(4 s, 200 ms · 2^n)` with full jitter (20 % for `percent` jitter), 30 s for all
    /// attempts and sleeps, keys not forwarded. A tool's `policy.retry` overrides them.
    pub fn settings(mut self, settings: RetrySettings) -> Self {
        self.settings = settings;
        self
    }

    /// The classifier that decides which failures are retriable (default:
    /// [`DefaultClassifier`](crate::classify::DefaultClassifier)). Give the breaker the same
    /// one.
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = SharedClassifier::new(classifier);
        self
    }

    /// The classifier, already shared.
    pub fn shared_classifier(mut self, classifier: SharedClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// The global retry budget (default: [`GlobalRetryBudget::new`]). Pass a clone of one
    /// budget to several layers to share it.
    pub fn budget(mut self, budget: GlobalRetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// No global retry budget: only attempts and deadlines limit retries.
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// The random number generator of the jitter.
    pub fn rng(mut self, rng: impl Rng + Send + 'static) -> Self {
        self.rng = Some(SharedRng::new(rng));
        self
    }

    /// Seeds the jitter's generator ([`SmallRng`](rand::rngs::SmallRng)) with `seed`, so that
    /// the delays can be computed in advance.
    pub fn seed(self, seed: u64) -> Self {
        use rand::SeedableRng;
        self.rng(rand::rngs::SmallRng::seed_from_u64(seed))
    }

    /// The breakers of the [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) below: no
    /// hedge is sent while the breaker over a call is not closed, so that a hedge is never
    /// a probe of a half-open breaker. [`ToolStack`](crate::ToolStack) passes its own.
    pub fn breakers(mut self, breakers: BreakerAdmin) -> Self {
        self.breakers = Some(breakers.view());
        self
    }

    /// Checks the configuration, resolves every tool's policy, and builds the layer.
    pub fn build(self) -> Result<RetryLayer, ConfigError> {
        let layer = RetryPolicy::default().with_settings(&self.settings, "retry")?;
        let rng = self.rng.unwrap_or_else(SharedRng::from_entropy);
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let resolved = match &policy.retry {
                LayerSetting::Off => return Ok(None),
                LayerSetting::Default => layer.clone(),
                LayerSetting::On(tool) => layer.with_settings(tool, "policy.retry")?,
            };
            Ok(Some(Arc::new(ToolRetry {
                profile: ToolProfile::new(descriptor, policy),
                classifier: self.classifier.clone(),
                budget: self.budget.clone(),
                rng: rng.clone(),
                latencies: resolved.hedge_percentile.map(|_| LatencyWindow::default()),
                hedges: AtomicU64::new(0),
                breakers: self.breakers.clone(),
                policy: resolved,
            })))
        })?;
        Ok(RetryLayer {
            tools: Arc::new(tools),
            budget: self.budget,
        })
    }
}

impl std::fmt::Debug for RetryLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayerBuilder")
            .field("registry", &self.registry)
            .field("settings", &self.settings)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl StackPart for RetryLayerBuilder {
    type Layer = RetryLayer;

    fn part(registry: &ToolRegistry) -> Self {
        RetryLayer::builder(registry.clone())
    }

    fn build_part(mut self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        if self.breakers.is_none() {
            self.breakers = shared.breakers.clone();
        }
        self.build()
    }
}
