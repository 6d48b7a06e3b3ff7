use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::config::{
    check_max_repeats, in_range, LoopDetectConfig, LoopSettings, ModelTier, Rules,
};
use super::config::{SessionTier, Tiers, MAX_REPEATS_LIMIT};
use super::detector::{CycleLimits, PollLimits};
use super::handle::LoopDetectHandle;
use super::noise::{Noise, DEFAULT_IGNORED_MEMBERS};
use super::service::{LoopDetect, Monitor, ToolLoop};
use super::store::LoopStore;
use super::tracker::Tracker;
use crate::bounds::entropy_seed;
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::event::{EventSink, EventSinks};
use crate::idempotency::IdempotencyLayer;
use crate::redact::Redactor;
use crate::registry::{LayerSetting, RiskLevel, ToolPolicy, ToolRegistry};
use crate::resend::Resends;
use crate::shared_store::{FailurePolicy, Outages, StoreHealth};
use crate::stack_part::{StackPart, StackShared};
use crate::tool_table::ToolTable;

/// Default of [`LoopDetectLayerBuilder::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// Default of [`LoopDetectLayerBuilder::max_session_bytes`]: 64 MiB.
pub const DEFAULT_MAX_SESSION_BYTES: usize = 64 << 20;
/// The smallest [`LoopDetectLayerBuilder::max_session_bytes`]: 64 KiB.
const MIN_MAX_SESSION_BYTES: usize = 64 << 10;
/// Default of [`LoopDetectLayerBuilder::cycle_repetitions`].
pub const DEFAULT_CYCLE_REPETITIONS: u32 = 3;
/// Default of [`LoopDetectLayerBuilder::max_cycle_length`]: cycles of up to 5 calls.
pub const DEFAULT_MAX_CYCLE_LENGTH: usize = 5;
/// Default of [`LoopDetectLayerBuilder::max_failures`]: the 4th identical call after three
/// identical failures is a loop, however far apart they came.
pub const DEFAULT_MAX_FAILURES: u32 = 4;
/// Default of [`LoopDetectLayerBuilder::failure_threshold`]: identical failures after which
/// the same call is not run again (`DEFAULT_MAX_FAILURES - 1`).
pub const DEFAULT_FAILURE_THRESHOLD: u32 = DEFAULT_MAX_FAILURES - 1;
/// Default of [`LoopDetectLayerBuilder::min_backoff`].
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_secs(1);
/// Default of [`LoopDetectLayerBuilder::patient_poll_gap`]: a poll every 30 s, give or take
/// the jitter of a model's turns.
pub const DEFAULT_PATIENT_POLL_GAP: Duration = Duration::from_secs(28);
/// Default of [`LoopDetectLayerBuilder::poll_budget`]: 10 minutes.
pub const DEFAULT_POLL_BUDGET: Duration = Duration::from_secs(600);

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
            max_failures: DEFAULT_MAX_FAILURES,
            failure_threshold: None,
            min_backoff: DEFAULT_MIN_BACKOFF,
            patient_poll_gap: DEFAULT_PATIENT_POLL_GAP,
            poll_budget: Some(DEFAULT_POLL_BUDGET),
            ignore_members: DEFAULT_IGNORED_MEMBERS
                .iter()
                .map(|name| (*name).to_owned())
                .collect(),
            resends: None,
            result_aware_polling: true,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
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
    max_failures: u32,
    /// Set through the older [`failure_threshold`](Self::failure_threshold).
    failure_threshold: Option<u32>,
    min_backoff: Duration,
    patient_poll_gap: Duration,
    poll_budget: Option<Duration>,
    ignore_members: Vec<String>,
    resends: Option<Resends>,
    result_aware_polling: bool,
    max_sessions: usize,
    max_session_bytes: usize,
    canonical: CanonicalOptions,
    redactor: Redactor,
    store: Option<Arc<dyn LoopStore>>,
    on_store_failure: FailurePolicy,
    sinks: EventSinks,
}

impl LoopDetectLayerBuilder {
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

    /// The longest cycle looked for, in calls (default 5; from 2 to 10): A,B,C,D,E repeated
    /// three times is a loop at its last call.
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

    /// Identical calls in a row that make a loop when each earlier one failed with the same
    /// error code (default 4; from 2 to 1000): the 4th identical call after three identical
    /// failures is not run. Unlike the repeat rule, this one holds however far apart the
    /// failures came (a failing read spaced like a patient poll is still stopped), and a
    /// tool that must not be retried blindly gets a lower number before `max_repeats`.
    /// Per tool, model and session too: `max_failures` of `policy.loop_detect` and of
    /// [`LoopSettings`].
    pub fn max_failures(mut self, calls: u32) -> Self {
        self.max_failures = calls;
        self.failure_threshold = None;
        self
    }

    /// Identical failures in a row after which the same call is not run again (default 3;
    /// from 2 to 1000): [`max_failures`](Self::max_failures) less one.
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = Some(failures);
        self
    }

    /// The least wait of a retry with back-off (default 1 s; zero: no retry is one): an
    /// identical call after identical failures, each wait since the previous try at least
    /// 1.5 times the one before and the last at least this long, is the caller's own retry,
    /// not a loop, and neither the repeat nor the failure rule counts it.
    pub fn min_backoff(mut self, wait: Duration) -> Self {
        self.min_backoff = wait;
        self
    }

    /// How far apart, on average, unchanged answers of a read must come to be a patient
    /// poll (default 28 s): a read repeated faster with the same answer is a loop at
    /// `max_repeats`; a patient poll only once its answer stayed the same for the
    /// [poll budget](Self::poll_budget).
    pub fn patient_poll_gap(mut self, gap: Duration) -> Self {
        self.patient_poll_gap = gap;
        self
    }

    /// How long a patient poll's answer may stay the same before the poll is a loop
    /// (default 10 minutes; `None`: without end). Per tool, model and session too:
    /// `poll_budget_secs` of `policy.loop_detect` and of [`LoopSettings`].
    pub fn poll_budget(mut self, budget: Option<Duration>) -> Self {
        self.poll_budget = budget;
        self
    }

    /// The members ignored, at any depth, when calls and answers are compared (default
    /// [`DEFAULT_IGNORED_MEMBERS`](super::DEFAULT_IGNORED_MEMBERS): request ids, nonces,
    /// client timestamps). A tool's `policy.loop_detect.ignore_members` replaces the list for
    /// it. Idempotency keys and the canonical form keep these members.
    pub fn ignore_members<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.ignore_members = names.into_iter().map(Into::into).collect();
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

    /// Whether identical calls of read-only tools and tools marked `poller` count only while
    /// their answers stay the same (default `true`). Off, every tool is judged on its
    /// arguments alone.
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
            failures: self.failures.then(|| {
                self.failure_threshold
                    .map_or(self.max_failures, |failures| failures.saturating_add(1))
            }),
            backoff: (!self.min_backoff.is_zero()).then_some(self.min_backoff),
            result_aware: self.result_aware_polling,
            polls: PollLimits {
                patient_gap: self.patient_poll_gap,
                budget: self.poll_budget,
            },
        };
        let default_noise = Arc::new(Noise::new(&self.ignore_members));
        let tools = ToolTable::resolve(&self.registry, |descriptor, policy| {
            let overrides = policy.loop_detect.overrides();
            Ok(ToolLoop {
                answers_decide: descriptor
                    .is_some_and(|d| matches!(d.risk, RiskLevel::ReadOnly | RiskLevel::Commands)),
                noise: match overrides.and_then(|o| o.ignore_members.as_ref()) {
                    Some(names) => Arc::new(Noise::new(names)),
                    None => default_noise.clone(),
                },
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
            store: self.store,
            outages: Outages::new(self.on_store_failure, self.sinks),
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
        match self.failure_threshold {
            Some(failures) => {
                in_range(failures, 2, MAX_REPEATS_LIMIT).map_err(field("failure_threshold"))?
            }
            None => {
                in_range(self.max_failures, 2, MAX_REPEATS_LIMIT).map_err(field("max_failures"))?
            }
        }
        if let Some(index) = self.ignore_members.iter().position(String::is_empty) {
            return Err(ConfigError::new(
                format!("ignore_members[{index}]"),
                "must be a member name, got an empty string",
            ));
        }
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
        LayerSetting::On(overrides) => {
            let bounded = [
                ("max_repeats", overrides.max_repeats),
                ("max_failures", overrides.max_failures),
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
    // The registry checks `max_failures` at least 2; its upper bound is the layer's too.
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
