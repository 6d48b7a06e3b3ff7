use std::sync::Arc;

use tower_layer::Layer;

use super::config::{
    check_max_repeats, in_range, LoopDetectConfig, LoopSettings, ModelTier, Rules,
};
use super::config::{SessionTier, Tiers, MAX_REPEATS_LIMIT};
use super::detector::CycleLimits;
use super::handle::LoopDetectHandle;
use super::service::{LoopDetect, Monitor};
use super::tracker::Tracker;
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::registry::{LayerSetting, ToolPolicy, ToolRegistry};
use crate::shared_store::{FailurePolicy, Outages, StoreHealth, StoreListener, StoreListeners};
use crate::trace::Redactor;

/// Default of [`LoopDetectLayerBuilder::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// Default of [`LoopDetectLayerBuilder::max_session_bytes`]: 64 MiB.
pub const DEFAULT_MAX_SESSION_BYTES: usize = 64 << 20;
/// The smallest [`LoopDetectLayerBuilder::max_session_bytes`]: 64 KiB.
const MIN_MAX_SESSION_BYTES: usize = 64 << 10;
/// Default of [`LoopDetectLayerBuilder::cycle_repetitions`].
pub const DEFAULT_CYCLE_REPETITIONS: u32 = 3;
/// Default of [`LoopDetectLayerBuilder::max_cycle_length`].
pub const DEFAULT_MAX_CYCLE_LENGTH: usize = 3;
/// Default of [`LoopDetectLayerBuilder::failure_threshold`].
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// The longest cycle the builder accepts.
const MAX_CYCLE_LENGTH_LIMIT: usize = 10;
/// The most cycle repetitions the builder accepts.
const MAX_CYCLE_REPETITIONS_LIMIT: u32 = 100;

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
    /// ([`LoopDetectConfig::from_env`]).
    pub fn from_env(registry: ToolRegistry) -> Result<Self, ConfigError> {
        LoopDetectLayer::builder(registry)
            .config(LoopDetectConfig::from_env()?)
            .build()
    }

    /// A builder for a layer with other settings.
    pub fn builder(registry: ToolRegistry) -> LoopDetectLayerBuilder {
        LoopDetectLayerBuilder {
            registry,
            config: LoopDetectConfig::default(),
            models: ModelTier::default(),
            cycles: true,
            cycle_repetitions: DEFAULT_CYCLE_REPETITIONS,
            max_cycle_length: DEFAULT_MAX_CYCLE_LENGTH,
            failures: true,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            result_aware_polling: true,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
            canonical: CanonicalOptions::default(),
            redactor: Redactor::default(),
            #[cfg(feature = "redis")]
            store: None,
            on_store_failure: FailurePolicy::Open,
            store_listeners: StoreListeners::default(),
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
/// use tower_toolcall::loop_detect::{LoopDetectConfig, LoopDetectLayer, LoopSettings};
/// use tower_toolcall::registry::{LoopMode, ToolRegistry};
///
/// let layer = LoopDetectLayer::builder(ToolRegistry::open())
///     .config(LoopDetectConfig::from_env()?)
///     // This model loops easily: give it a chance, but fewer repeats.
///     .model(
///         "openai",
///         "gpt-4o-mini",
///         LoopSettings::default().with_max_repeats(3).with_mode(LoopMode::ChanceThenBreak),
///     )
///     .failure_threshold(2)
///     .max_sessions(10_000)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct LoopDetectLayerBuilder {
    registry: ToolRegistry,
    config: LoopDetectConfig,
    models: ModelTier,
    cycles: bool,
    cycle_repetitions: u32,
    max_cycle_length: usize,
    failures: bool,
    failure_threshold: u32,
    result_aware_polling: bool,
    max_sessions: usize,
    max_session_bytes: usize,
    canonical: CanonicalOptions,
    redactor: Redactor,
    #[cfg(feature = "redis")]
    store: Option<super::redis::RedisLoopStore>,
    on_store_failure: FailurePolicy,
    store_listeners: StoreListeners,
}

impl LoopDetectLayerBuilder {
    /// Keeps the sessions' histories in `store`, shared by every replica that uses it,
    /// instead of in this process. `max_sessions` and `max_session_bytes` then bound the
    /// in-process tracker only; the store's keys expire with each session's window.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn store(mut self, store: super::redis::RedisLoopStore) -> Self {
        self.store = Some(store);
        self
    }

    /// What happens to a call when the [store](Self::store) cannot answer (default
    /// [`FailurePolicy::Open`]: it runs unchecked). See [`shared_store`](crate::shared_store).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Tells `listener` when the shared store's outages begin and end, and of each check
    /// that failed (see [`StoreListener`]); listeners add up.
    pub fn on_store_event(mut self, listener: impl StoreListener) -> Self {
        self.store_listeners.push(listener);
        self
    }

    /// The server tier (default [`LoopDetectConfig::default`]).
    pub fn config(mut self, config: LoopDetectConfig) -> Self {
        self.config = config;
        self
    }

    /// Settings for calls issued by `model` of `backend`, as the call's `trace.baggage`
    /// names them (`gen_ai.system` and `gen_ai.request.model`). They beat the server tier;
    /// the tool's and the session's settings beat them.
    pub fn model(
        mut self,
        backend: impl Into<String>,
        model: impl Into<String>,
        settings: LoopSettings,
    ) -> Self {
        self.models.insert(backend.into(), model.into(), settings);
        self
    }

    /// Whether cycles of different calls (A,B,A,B,… or A,B,C,A,B,C,…) are loops too
    /// (default `true`).
    pub fn cycles(mut self, on: bool) -> Self {
        self.cycles = on;
        self
    }

    /// Full repetitions of a cycle that make a loop (default 3; from 2 to 100): the call that
    /// would complete the 3rd repetition is not run.
    pub fn cycle_repetitions(mut self, repetitions: u32) -> Self {
        self.cycle_repetitions = repetitions;
        self
    }

    /// The longest cycle looked for, in calls (default 3; from 2 to 10).
    pub fn max_cycle_length(mut self, length: usize) -> Self {
        self.max_cycle_length = length;
        self
    }

    /// Whether the same call failing with the same error code in a row is a loop, even
    /// below `max_repeats` (default `true`).
    pub fn repeated_failures(mut self, on: bool) -> Self {
        self.failures = on;
        self
    }

    /// Identical failures in a row after which the same call is not run again (default 3;
    /// from 2 to 1000).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures;
        self
    }

    /// Whether tools marked `poller` in the registry count repeats only while their result
    /// stays the same (default `true`). Off, pollers are counted like other tools.
    pub fn result_aware_polling(mut self, on: bool) -> Self {
        self.result_aware_polling = on;
        self
    }

    /// The most sessions tracked at once (default 100 000); beyond it, the least recently
    /// used session is evicted. The same bound applies to sessions with settings.
    pub fn max_sessions(mut self, sessions: usize) -> Self {
        self.max_sessions = sessions;
        self
    }

    /// The most bytes the tracked sessions take, by their approximate size in memory: their
    /// keys and their histories (default [`DEFAULT_MAX_SESSION_BYTES`], 64 MiB). Beyond it,
    /// the least recently used sessions are evicted, as beyond
    /// [`max_sessions`](Self::max_sessions).
    pub fn max_session_bytes(mut self, bytes: usize) -> Self {
        self.max_session_bytes = bytes;
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
    /// tool's overrides.
    pub fn build(self) -> Result<LoopDetectLayer, ConfigError> {
        self.check().map_err(|e| e.within("loop_detect"))?;
        check_registry(&self.registry)?;
        let rules = Rules {
            cycles: self.cycles.then_some(CycleLimits {
                repetitions: self.cycle_repetitions,
                max_length: self.max_cycle_length,
            }),
            failures: self.failures.then_some(self.failure_threshold),
            result_aware_polling: self.result_aware_polling,
        };
        let seed = {
            use std::hash::BuildHasher;
            std::hash::RandomState::new().hash_one(0u8)
        };
        #[cfg(feature = "redis")]
        let seed = self
            .store
            .as_ref()
            .map_or(seed, |store| store.signature_seed());
        let hasher = foldhash::quality::FixedState::with_seed(seed);
        let monitor = Monitor {
            registry: self.registry,
            tiers: Tiers {
                server: self.config,
                models: self.models,
                sessions: SessionTier::new(self.max_sessions),
                rules,
            },
            tracker: Tracker::new(self.max_sessions, self.max_session_bytes),
            canonical: self.canonical,
            redactor: self.redactor,
            hasher,
            #[cfg(feature = "redis")]
            store: self.store,
            outages: Outages::new(self.on_store_failure, self.store_listeners),
        };
        Ok(LoopDetectLayer {
            monitor: Arc::new(monitor),
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.config.check()?;
        self.models.check()?;
        let field = |name: &'static str| move |problem| ConfigError::new(name, problem);
        in_range(self.cycle_repetitions, 2, MAX_CYCLE_REPETITIONS_LIMIT)
            .map_err(field("cycle_repetitions"))?;
        in_range(self.max_cycle_length, 2, MAX_CYCLE_LENGTH_LIMIT)
            .map_err(field("max_cycle_length"))?;
        in_range(self.failure_threshold, 2, MAX_REPEATS_LIMIT)
            .map_err(field("failure_threshold"))?;
        if self.max_sessions == 0 {
            return Err(ConfigError::new(
                "max_sessions",
                "must be at least 1, got 0",
            ));
        }
        if self.max_session_bytes < MIN_MAX_SESSION_BYTES {
            return Err(ConfigError::new(
                "max_session_bytes",
                format!(
                    "must be at least {MIN_MAX_SESSION_BYTES} (64 KiB), got {}",
                    self.max_session_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// The registry checks its overrides' lower bounds; the upper bound of `max_repeats` is the
/// layer's, because the history of a session grows with it.
fn check_registry(registry: &ToolRegistry) -> Result<(), ConfigError> {
    let check = |policy: &ToolPolicy, prefix: &str| match &policy.loop_detect {
        LayerSetting::On(overrides) => match overrides.max_repeats {
            Some(max) => check_max_repeats(max).map_err(|problem| {
                ConfigError::new(format!("{prefix}.policy.loop_detect.max_repeats"), problem)
            }),
            None => Ok(()),
        },
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
