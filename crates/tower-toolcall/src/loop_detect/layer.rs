use std::sync::Arc;

use tower_layer::Layer;

use super::config::{check_max_repeats, ModelTier, Resolved};
use super::handle::LoopDetectHandle;
use super::noise::Noise;
use super::service::{LoopDetect, Monitor, ToolLoop};
use super::store::LoopStore;
use super::tracker::Tracker;
use crate::bounds::entropy_seed;
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::event::{EventSink, EventSinks};
use crate::idempotency::IdempotencyLayer;
use crate::redact::Redactor;
use crate::registry::{LayerSetting, LoopDetectSettings, RiskLevel, ToolPolicy, ToolRegistry};
use crate::resend::Resends;
use crate::shared_store::{FailurePolicy, Outages, StoreHealth};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// Applies [`LoopDetect`] to a service. See the [module docs](crate::loop_detect).
///
/// Clones of the layer, and every service it makes, share one state behind an [`Arc`]: the
/// tracked sessions, the session settings and the configuration. A session's calls are
/// counted together whichever clone they pass through.
#[derive(Clone, Debug)]
pub struct LoopDetectLayer {
    monitor: Arc<Monitor>,
}

impl LoopDetectLayer {
    /// A layer with the default settings (not read from the environment), resolving each
    /// tool's policy in `registry`.
    pub fn new(registry: ToolRegistry) -> Self {
        LoopDetectLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A layer whose server tier comes from the environment
    /// ([`LoopDetectSettings::from_env`]).
    pub fn from_env(registry: ToolRegistry) -> Result<Self, ConfigError> {
        LoopDetectLayer::builder(registry)
            .settings(LoopDetectSettings::from_env()?)
            .build()
    }

    /// A builder for a layer with other settings.
    pub fn builder(registry: ToolRegistry) -> LoopDetectLayerBuilder {
        LoopDetectLayerBuilder {
            registry,
            settings: LoopDetectSettings::default(),
            models: ModelTier::default(),
            resends: None,
            canonical: CanonicalOptions::default(),
            redactor: Redactor::default(),
            store: None,
            on_store_failure: FailurePolicy::Open,
            sinks: EventSinks::default(),
        }
    }

    /// How the layer's shared store has fared: always available without one.
    pub fn store_health(&self) -> StoreHealth {
        self.monitor.outages.health()
    }

    /// A handle to set and unset session settings at run time and to look at what the
    /// layer tracks.
    pub fn handle(&self) -> LoopDetectHandle {
        LoopDetectHandle::new(self.monitor.clone())
    }
}

impl<S> Layer<S> for LoopDetectLayer {
    type Service = LoopDetect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoopDetect::new(inner, self.monitor.clone())
    }
}

/// Builds a [`LoopDetectLayer`].
///
/// ```
/// use tower_toolcall::loop_detect::{LoopDetectLayer, LoopDetectSettings};
/// use tower_toolcall::registry::{LoopMode, ToolRegistry};
///
/// let mut settings = LoopDetectSettings::from_env()?;
/// settings.max_failures = Some(3);
/// settings.max_sessions = Some(10_000);
/// // This model loops easily: give it a chance, but fewer repeats.
/// let mut loopy = LoopDetectSettings::default();
/// loopy.max_repeats = Some(3);
/// loopy.mode = Some(LoopMode::ChanceThenBreak);
/// let layer = LoopDetectLayer::builder(ToolRegistry::open())
///     .settings(settings)
///     .model("openai", "gpt-4o-mini", loopy)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct LoopDetectLayerBuilder {
    registry: ToolRegistry,
    settings: LoopDetectSettings,
    models: ModelTier,
    resends: Option<Resends>,
    canonical: CanonicalOptions,
    redactor: Redactor,
    store: Option<Arc<dyn LoopStore>>,
    on_store_failure: FailurePolicy,
    sinks: EventSinks,
}

impl LoopDetectLayerBuilder {
    /// The layer's settings, its server tier (default: every field unset, each taking the
    /// built-in default its doc gives). They replace those given before.
    pub fn settings(mut self, settings: LoopDetectSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Settings for calls issued by `model` of `backend`, as the call's `trace.baggage`
    /// names them (`gen_ai.system` and `gen_ai.request.model`): the six a session sets too
    /// (`enabled`, `max_repeats`, `ttl_secs`, `mode`, `max_failures`, `poll_budget_secs`).
    /// They beat the layer's settings; the tool's and the session's beat them.
    pub fn model(
        mut self,
        backend: impl Into<String>,
        model: impl Into<String>,
        settings: LoopDetectSettings,
    ) -> Self {
        self.models.insert(backend.into(), model.into(), settings);
        self
    }

    /// Keeps the sessions' histories in `store`, shared by every replica that uses it,
    /// instead of in this process. `max_sessions` and `max_session_bytes` then bound the
    /// in-process tracker only; the store's keys expire with each session's window.
    pub fn store(mut self, store: Arc<dyn LoopStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// What happens to a call when the [store](Self::store) cannot answer (default
    /// [`FailurePolicy::Open`]: it runs unchecked). See [`shared_store`](crate::shared_store).
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

    /// Tells the layer which calls `idempotency`, behind it in the stack, answers from its
    /// record: such a re-send (the same caller key as an earlier call of the session, or
    /// the same derived key within its re-send window or while the earlier call runs) is
    /// let through to get the recorded answer, and never counted as a repeat. The stack
    /// builder does this itself.
    pub fn resends_answered_by(mut self, idempotency: &IdempotencyLayer) -> Self {
        self.resends = Some(idempotency.resends());
        self
    }

    /// How params are canonicalized into signatures. Keep the default unless the
    /// idempotency layer uses other options: the canonical form is cached in the params
    /// and shared with the layers that use the same options.
    pub fn canonical_options(mut self, options: CanonicalOptions) -> Self {
        self.canonical = options;
        self
    }

    /// What is cut out of the params before they are logged (default
    /// [`Redactor::default`]).
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Checks the configuration and builds the layer. Errors name the field, below
    /// `loop_detect` for the layer's settings and below `tools[namespace::name]` for a
    /// tool's.
    pub fn build(self) -> Result<LoopDetectLayer, ConfigError> {
        self.settings
            .check()
            .and_then(|()| self.models.check())
            .map_err(|e| e.within("loop_detect"))?;
        check_registry(&self.registry)?;
        let layer = Resolved::new(self.settings);
        let default_noise = Arc::new(Noise::new(layer.ignore_members()));
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let own = policy.loop_detect.overrides();
            Ok(ToolLoop {
                answers_decide: descriptor
                    .is_some_and(|d| matches!(d.risk, RiskLevel::ReadOnly | RiskLevel::Commands)),
                noise: match own.and_then(|o| o.ignore_members.as_ref()) {
                    Some(names) => Arc::new(Noise::new(names)),
                    None => default_noise.clone(),
                },
                // The members it ignores are in `noise`.
                settings: own.map_or_else(LoopDetectSettings::default, |own| LoopDetectSettings {
                    ignore_members: None,
                    ..own.clone()
                }),
            })
        })?;
        let seed = match &self.store {
            Some(store) => store.signature_seed(),
            None => entropy_seed(),
        };
        let hasher = foldhash::quality::FixedState::with_seed(seed);
        let monitor = Monitor {
            registry: self.registry,
            tools,
            resends: self.resends,
            tiers: layer.tiers(self.models),
            tracker: Tracker::new(layer.max_sessions(), layer.max_session_bytes()),
            canonical: self.canonical,
            redactor: self.redactor,
            hasher,
            store: self.store,
            outages: Outages::new(self.on_store_failure, self.sinks),
        };
        Ok(LoopDetectLayer {
            monitor: Arc::new(monitor),
        })
    }
}

/// The registry checks its tools' lower bounds; the upper bounds of `max_repeats` and
/// `max_failures` are the layer's, because the history of a session grows with them.
fn check_registry(registry: &ToolRegistry) -> Result<(), ConfigError> {
    let check = |policy: &ToolPolicy, prefix: &str| match &policy.loop_detect {
        LayerSetting::On(own) => {
            let bounded = [
                ("max_repeats", own.max_repeats),
                ("max_failures", own.max_failures),
            ];
            for (name, value) in bounded {
                if let Some(max) = value {
                    check_max_repeats(max).map_err(|problem| {
                        ConfigError::new(format!("{prefix}.policy.loop_detect.{name}"), problem)
                    })?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    };
    check(registry.unregistered_policy(), "unregistered")?;
    for tool in registry.tools() {
        check(
            &tool.descriptor().policy,
            &format!("tools[{}]", tool.full_name()),
        )?;
    }
    Ok(())
}

impl StackPart for LoopDetectLayerBuilder {
    type Layer = LoopDetectLayer;

    fn part(registry: &ToolRegistry) -> Self {
        LoopDetectLayer::builder(registry.clone())
    }

    fn build_part(mut self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        if let Some(redactor) = &shared.redactor {
            self = self.redactor(redactor.clone());
        }
        if let Some(options) = &shared.canonical {
            self = self.canonical_options(options.clone());
        }
        if let Some(resends) = &shared.resends {
            self.resends = Some(resends.clone());
        }
        let sinks = shared.sinks.iter().cloned();
        sinks.fold(self, Self::on_shared_event).build()
    }
}
