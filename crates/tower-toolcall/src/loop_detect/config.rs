//! The configuration tiers of loop detection and how one call's settings are resolved from
//! them. Every tier speaks [`LoopDetectSettings`]:
//!
//! - **server**: the layer's own, given to its builder, in code or from the environment
//!   ([`LoopDetectSettings::from_env`]);
//! - **model**: per (backend, model), given to the layer's builder;
//! - **tool**: `policy.loop_detect` in the [registry](crate::registry);
//! - **session**: set and unset at run time through the
//!   [`LoopDetectHandle`](super::LoopDetectHandle).
//!
//! Each setting is resolved on its own: session, then tool, then model, then server, then
//! the built-in default.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashlink::LruCache;

use super::detector::{CycleLimits, Limits, PollLimits};
use super::noise::DEFAULT_IGNORED_MEMBERS;
use crate::envelope::ToolCall;
use crate::error::ConfigError;
use crate::registry::{LoopDetectSettings, LoopMode};

/// Built-in default of `max_repeats`.
const DEFAULT_MAX_REPEATS: u32 = 4;
/// Built-in default of `ttl_secs`.
const DEFAULT_TTL_SECS: u64 = 120;
/// The largest `max_repeats` (and `max_failures`) accepted anywhere: the history of a
/// session grows with it.
const MAX_REPEATS_LIMIT: u32 = 1000;
/// The longest poll budget accepted, in seconds: a year. Longer is without end in
/// practice; say `0` for that.
const MAX_POLL_BUDGET_SECS: u64 = 365 * 24 * 60 * 60;
/// The most cycle repetitions accepted.
const MAX_CYCLE_REPETITIONS_LIMIT: u32 = 100;
/// The longest cycle accepted.
const MAX_CYCLE_LENGTH_LIMIT: usize = 10;
/// The smallest `max_session_bytes`: 64 KiB.
const MIN_MAX_SESSION_BYTES: usize = 64 << 10;
/// Built-in default of `max_sessions`.
pub(super) const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// Built-in default of `max_session_bytes`: 64 MiB.
pub(super) const DEFAULT_MAX_SESSION_BYTES: usize = 64 << 20;

/// `TOOL_LOOP_DETECTION_ENABLED`: `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
const ENV_ENABLED: &str = "TOOL_LOOP_DETECTION_ENABLED";
/// `TOOL_LOOP_MAX_REPEATS`: a whole number from 2 to 1000.
const ENV_MAX_REPEATS: &str = "TOOL_LOOP_MAX_REPEATS";
/// `TOOL_LOOP_TTL_SECONDS`: a whole number of seconds, at least 1.
const ENV_TTL_SECONDS: &str = "TOOL_LOOP_TTL_SECONDS";
/// `TOOL_LOOP_MODE`: `break`, `chance` or `chance_then_break`.
const ENV_MODE: &str = "TOOL_LOOP_MODE";

/// Reading the server tier from the environment, and checking the settings of each tier.
///
/// ```
/// use tower_toolcall::loop_detect::LoopDetectSettings;
/// use tower_toolcall::registry::LoopMode;
///
/// let mut settings = LoopDetectSettings::default();
/// settings.max_repeats = Some(3);
/// settings.mode = Some(LoopMode::ChanceThenBreak);
///
/// // From the environment; here from a map instead of the process environment.
/// let env = [("TOOL_LOOP_MAX_REPEATS", "6"), ("TOOL_LOOP_MODE", "chance")];
/// let settings = LoopDetectSettings::from_env_with(|name| {
///     env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
/// })?;
/// assert_eq!(settings.max_repeats, Some(6));
/// assert_eq!(settings.mode, Some(LoopMode::ChanceThenBreak));
/// assert_eq!(settings.ttl_secs, None, "unset: the built-in default, 120");
///
/// let err = LoopDetectSettings::from_env_with(|name| {
///     (name == "TOOL_LOOP_TTL_SECONDS").then(|| "two minutes".to_owned())
/// }).unwrap_err();
/// assert_eq!(err.field(), "TOOL_LOOP_TTL_SECONDS");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
impl LoopDetectSettings {
    /// The settings the environment variables `TOOL_LOOP_DETECTION_ENABLED`, `TOOL_LOOP_MAX_REPEATS`,
    /// `TOOL_LOOP_TTL_SECONDS` and `TOOL_LOOP_MODE` give (`enabled`, `max_repeats`, `ttl_secs` and
    /// `mode`), for the layer's builder. Unset or empty variables leave their setting unset
    /// (the built-in default); a bad value is a [`ConfigError`] naming the variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        LoopDetectSettings::from_env_with(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => Some(raw.to_string_lossy().into_owned()),
        })
    }

    /// Like [`from_env`](LoopDetectSettings::from_env), reading each variable with `lookup`
    /// (which returns `None` for an unset variable) instead of the process environment.
    pub fn from_env_with(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut settings = LoopDetectSettings::default();
        let mut read = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if let Some(value) = read(ENV_ENABLED) {
            settings.enabled =
                Some(parse_bool(&value).map_err(|p| ConfigError::new(ENV_ENABLED, p))?);
        }
        if let Some(value) = read(ENV_MAX_REPEATS) {
            settings.max_repeats =
                Some(parse_max_repeats(&value).map_err(|p| ConfigError::new(ENV_MAX_REPEATS, p))?);
        }
        if let Some(value) = read(ENV_TTL_SECONDS) {
            settings.ttl_secs =
                Some(parse_ttl_secs(&value).map_err(|p| ConfigError::new(ENV_TTL_SECONDS, p))?);
        }
        if let Some(value) = read(ENV_MODE) {
            settings.mode = Some(parse_mode(&value).map_err(|p| ConfigError::new(ENV_MODE, p))?);
        }
        Ok(settings)
    }

    /// Checks every value given, at any tier; the error names the field.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let field = |name: &'static str| move |problem| ConfigError::new(name, problem);
        if let Some(max) = self.max_repeats {
            check_max_repeats(max).map_err(field("max_repeats"))?;
        }
        if let Some(ttl) = self.ttl_secs {
            check_ttl_secs(ttl).map_err(field("ttl_secs"))?;
        }
        if let Some(max) = self.max_failures {
            check_max_repeats(max).map_err(field("max_failures"))?;
        }
        if let Some(budget) = self.poll_budget_secs {
            check_poll_budget_secs(budget).map_err(field("poll_budget_secs"))?;
        }
        if let Some(index) = self
            .ignore_members
            .iter()
            .flatten()
            .position(String::is_empty)
        {
            return Err(ConfigError::new(
                format!("ignore_members[{index}]"),
                "must be a member name, got an empty string",
            ));
        }
        if let Some(repetitions) = self.cycle_repetitions {
            in_range(repetitions, 2, MAX_CYCLE_REPETITIONS_LIMIT)
                .map_err(field("cycle_repetitions"))?;
        }
        if let Some(length) = self.max_cycle_length {
            in_range(length, 2, MAX_CYCLE_LENGTH_LIMIT).map_err(field("max_cycle_length"))?;
        }
        if self.max_sessions == Some(0) {
            return Err(ConfigError::new(
                "max_sessions",
                "must be at least 1, got 0",
            ));
        }
        if let Some(bytes) = self.max_session_bytes {
            if bytes < MIN_MAX_SESSION_BYTES {
                return Err(ConfigError::new(
                    "max_session_bytes",
                    format!("must be at least {MIN_MAX_SESSION_BYTES} (64 KiB), got {bytes}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks a session's settings: only the six that [`LoopSettingKey`] names, each in
    /// range; the error names the field.
    pub(crate) fn check_session(&self) -> Result<(), ConfigError> {
        self.check_per_call("a session")?;
        self.check()
    }

    /// Checks a model's settings, as a session's.
    fn check_model(&self) -> Result<(), ConfigError> {
        self.check_per_call("a model")?;
        self.check()
    }

    /// Refuses, naming it, a field other than the six that `who` sets.
    fn check_per_call(&self, who: &str) -> Result<(), ConfigError> {
        let per_tool = [
            ("poller", self.poller.is_some()),
            ("ignore_members", self.ignore_members.is_some()),
        ];
        let mut others = per_tool.into_iter().chain(self.layer_wide_fields());
        match others.find(|(_, set)| *set) {
            Some((name, _)) => Err(ConfigError::new(
                name,
                format!(
                    "is not set by {who}; {who} sets only enabled, max_repeats, ttl_secs, mode, \
                     max_failures and poll_budget_secs"
                ),
            )),
            None => Ok(()),
        }
    }

    /// `true` when no setting is given.
    pub fn is_empty(&self) -> bool {
        *self == LoopDetectSettings::default()
    }

    /// These settings without `key`.
    pub(crate) fn without(mut self, key: LoopSettingKey) -> LoopDetectSettings {
        match key {
            LoopSettingKey::Detection => self.enabled = None,
            LoopSettingKey::MaxRepeats => self.max_repeats = None,
            LoopSettingKey::Ttl => self.ttl_secs = None,
            LoopSettingKey::Mode => self.mode = None,
            LoopSettingKey::MaxFailures => self.max_failures = None,
            LoopSettingKey::PollBudget => self.poll_budget_secs = None,
        }
        self
    }

    /// The built-in defaults, every field given but `poller`, which the tool's risk level
    /// decides.
    fn built_in() -> LoopDetectSettings {
        LoopDetectSettings {
            enabled: Some(true),
            max_repeats: Some(DEFAULT_MAX_REPEATS),
            ttl_secs: Some(DEFAULT_TTL_SECS),
            mode: Some(LoopMode::Break),
            max_failures: Some(4),
            poll_budget_secs: Some(600),
            poller: None,
            ignore_members: Some(
                DEFAULT_IGNORED_MEMBERS
                    .iter()
                    .map(|name| (*name).to_owned())
                    .collect(),
            ),
            cycles: Some(true),
            cycle_repetitions: Some(3),
            max_cycle_length: Some(5),
            repeated_failures: Some(true),
            min_backoff_ms: Some(1_000),
            // A poll every 30 s, give or take the jitter of a model's turns.
            patient_poll_gap_ms: Some(28_000),
            result_aware_polling: Some(true),
            max_sessions: Some(DEFAULT_MAX_SESSIONS),
            max_session_bytes: Some(DEFAULT_MAX_SESSION_BYTES),
        }
    }
}

/// One setting, by the name the in-chat commands use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LoopSettingKey {
    /// `tool-loop-detection`: [`LoopDetectSettings::enabled`].
    Detection,
    /// `tool-loop-max-repeats`: [`LoopDetectSettings::max_repeats`].
    MaxRepeats,
    /// `tool-loop-ttl`: [`LoopDetectSettings::ttl_secs`].
    Ttl,
    /// `tool-loop-mode`: [`LoopDetectSettings::mode`].
    Mode,
    /// `tool-loop-max-failures`: [`LoopDetectSettings::max_failures`].
    MaxFailures,
    /// `tool-loop-poll-budget-seconds`: [`LoopDetectSettings::poll_budget_secs`].
    PollBudget,
}

impl LoopSettingKey {
    /// Every key.
    pub const ALL: [LoopSettingKey; 6] = [
        LoopSettingKey::Detection,
        LoopSettingKey::MaxRepeats,
        LoopSettingKey::Ttl,
        LoopSettingKey::Mode,
        LoopSettingKey::MaxFailures,
        LoopSettingKey::PollBudget,
    ];

    /// The member of [`LoopDetectSettings`] it names, as they serialize, e.g. `max_repeats`.
    pub const fn member(self) -> &'static str {
        match self {
            LoopSettingKey::Detection => "enabled",
            LoopSettingKey::MaxRepeats => "max_repeats",
            LoopSettingKey::Ttl => "ttl_secs",
            LoopSettingKey::Mode => "mode",
            LoopSettingKey::MaxFailures => "max_failures",
            LoopSettingKey::PollBudget => "poll_budget_secs",
        }
    }

    /// The name in commands, e.g. `tool-loop-max-repeats`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LoopSettingKey::Detection => "tool-loop-detection",
            LoopSettingKey::MaxRepeats => "tool-loop-max-repeats",
            LoopSettingKey::Ttl => "tool-loop-ttl",
            LoopSettingKey::Mode => "tool-loop-mode",
            LoopSettingKey::MaxFailures => "tool-loop-max-failures",
            LoopSettingKey::PollBudget => "tool-loop-poll-budget-seconds",
        }
    }

    /// The key named `name` in a command; `None` for another name.
    pub fn parse(name: &str) -> Option<LoopSettingKey> {
        LoopSettingKey::ALL
            .into_iter()
            .find(|key| key.as_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for LoopSettingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks that `value` is from `min` to `max`.
pub(super) fn in_range<N: PartialOrd + fmt::Display>(
    value: N,
    min: N,
    max: N,
) -> Result<(), String> {
    if value < min || value > max {
        Err(format!(
            "must be a whole number from {min} to {max}, got {value}"
        ))
    } else {
        Ok(())
    }
}

pub(super) fn check_max_repeats(max: u32) -> Result<(), String> {
    in_range(max, 2, MAX_REPEATS_LIMIT)
}

pub(super) fn check_ttl_secs(ttl: u64) -> Result<(), String> {
    if ttl >= 1 {
        Ok(())
    } else {
        Err("must be a whole number of seconds, at least 1, got 0".to_owned())
    }
}

/// `true`/`false`, `1`/`0`, `yes`/`no` or `on`/`off`, in any case.
pub(super) fn parse_bool(value: &str) -> Result<bool, String> {
    let value = value.trim();
    let is = |words: [&str; 4]| words.iter().any(|w| w.eq_ignore_ascii_case(value));
    if is(["true", "1", "yes", "on"]) {
        Ok(true)
    } else if is(["false", "0", "no", "off"]) {
        Ok(false)
    } else {
        Err(format!("must be true or false, got {value:?}"))
    }
}

pub(super) fn parse_max_repeats(value: &str) -> Result<u32, String> {
    let trimmed = value.trim();
    let max = trimmed.parse::<u32>().map_err(|_| {
        format!("must be a whole number from 2 to {MAX_REPEATS_LIMIT}, got {trimmed:?}")
    })?;
    check_max_repeats(max).map(|()| max)
}

pub(super) fn check_poll_budget_secs(budget: u64) -> Result<(), String> {
    if budget <= MAX_POLL_BUDGET_SECS {
        Ok(())
    } else {
        Err(poll_budget_problem(budget))
    }
}

fn poll_budget_problem(got: impl fmt::Debug) -> String {
    format!(
        "must be a whole number of seconds from 0 (no end) to {MAX_POLL_BUDGET_SECS}, got {got:?}"
    )
}

pub(super) fn parse_poll_budget_secs(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let budget = trimmed
        .parse::<u64>()
        .map_err(|_| poll_budget_problem(trimmed))?;
    check_poll_budget_secs(budget).map(|()| budget)
}

pub(super) fn parse_ttl_secs(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let ttl = trimmed
        .parse::<u64>()
        .map_err(|_| format!("must be a whole number of seconds, at least 1, got {trimmed:?}"))?;
    check_ttl_secs(ttl).map(|()| ttl)
}

/// `break`, `chance` or `chance_then_break`, in any case.
pub(super) fn parse_mode(value: &str) -> Result<LoopMode, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("break") {
        Ok(LoopMode::Break)
    } else if value.eq_ignore_ascii_case("chance")
        || value.eq_ignore_ascii_case("chance_then_break")
    {
        Ok(LoopMode::ChanceThenBreak)
    } else {
        Err(format!(
            "must be break, chance or chance_then_break, got {value:?}"
        ))
    }
}

/// The `trace.baggage` member that names the model's backend (OpenTelemetry GenAI).
pub const BAGGAGE_BACKEND: &str = "gen_ai.system";
/// The `trace.baggage` member that names the model (OpenTelemetry GenAI).
pub const BAGGAGE_MODEL: &str = "gen_ai.request.model";

/// The model tier: settings per backend and model.
#[derive(Clone, Debug, Default)]
pub(super) struct ModelTier {
    by_backend: HashMap<String, HashMap<String, LoopDetectSettings>>,
}

impl ModelTier {
    pub(super) fn insert(&mut self, backend: String, model: String, settings: LoopDetectSettings) {
        self.by_backend
            .entry(backend)
            .or_default()
            .insert(model, settings);
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (backend, models) in &self.by_backend {
            for (model, settings) in models {
                settings
                    .check_model()
                    .map_err(|e| e.within(&format!("models[{backend}/{model}]")))?;
            }
        }
        Ok(())
    }

    /// Each model's settings over `server`'s.
    fn over(mut self, server: &LoopDetectSettings) -> ModelTier {
        for models in self.by_backend.values_mut() {
            for settings in models.values_mut() {
                *settings = std::mem::take(settings).over(server);
            }
        }
        self
    }

    /// The settings for the backend and model named in the call's baggage.
    fn for_call(&self, call: &ToolCall) -> Option<&LoopDetectSettings> {
        if self.by_backend.is_empty() {
            return None;
        }
        let (backend, model) = backend_and_model(call);
        self.by_backend.get(backend?)?.get(model?)
    }
}

/// The backend and model a call was issued by, from `trace.baggage`.
pub(super) fn backend_and_model(call: &ToolCall) -> (Option<&str>, Option<&str>) {
    match &call.trace().baggage {
        Some(baggage) => (
            baggage.get(BAGGAGE_BACKEND).map(String::as_str),
            baggage.get(BAGGAGE_MODEL).map(String::as_str),
        ),
        None => (None, None),
    }
}

/// The session tier: settings per session key, set and unset at run time.
///
/// At most `capacity` sessions keep settings; beyond that, those used least recently are
/// dropped.
#[derive(Debug)]
pub(super) struct SessionTier {
    settings: Mutex<LruCache<Arc<str>, LoopDetectSettings, RandomState>>,
    /// How many sessions have settings, readable without the lock.
    len: AtomicUsize,
}

impl SessionTier {
    pub(super) fn new(capacity: usize) -> Self {
        SessionTier {
            settings: Mutex::new(LruCache::with_hasher(capacity, RandomState::new())),
            len: AtomicUsize::new(0),
        }
    }

    pub(super) fn get(&self, session: &str) -> Option<LoopDetectSettings> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().get_mut(session).cloned()
    }

    /// Replaces the session's settings; empty settings remove them.
    pub(super) fn update(
        &self,
        session: &str,
        update: impl FnOnce(LoopDetectSettings) -> LoopDetectSettings,
    ) {
        let mut map = self.lock();
        let current = map.get_mut(session).cloned().unwrap_or_default();
        let next = update(current);
        if next.is_empty() {
            map.remove(session);
        } else if let Some(slot) = map.get_mut(session) {
            *slot = next;
        } else {
            map.insert(Arc::from(session), next);
        }
        self.len.store(map.len(), Ordering::Release);
    }

    /// Sets `set` and removes `unset` in the session's settings.
    pub(super) fn change(&self, session: &str, set: LoopDetectSettings, unset: &[LoopSettingKey]) {
        self.update(session, |current| {
            unset.iter().fold(set.over(&current), |s, k| s.without(*k))
        });
    }

    /// Drops the session's settings.
    pub(super) fn clear(&self, session: &str) {
        self.update(session, |_| LoopDetectSettings::default());
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, LruCache<Arc<str>, LoopDetectSettings, RandomState>> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The rules beyond identical repeats, and their thresholds (layer-wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    pub(super) cycles: Option<CycleLimits>,
    /// The least wait of a retry with back-off.
    pub(super) backoff: Option<Duration>,
    /// Whether read-only tools and pollers are judged with their answers.
    pub(super) result_aware: bool,
    /// How far apart unchanged answers make a patient poll.
    pub(super) patient_gap: Duration,
}

/// The layer's settings, each unset one taken from the built-in defaults.
#[derive(Clone, Debug)]
pub(super) struct Resolved {
    settings: LoopDetectSettings,
}

impl Resolved {
    /// `settings` (checked) over the built-in defaults.
    pub(super) fn new(settings: LoopDetectSettings) -> Self {
        Resolved {
            settings: settings.over(&LoopDetectSettings::built_in()),
        }
    }

    pub(super) fn max_sessions(&self) -> usize {
        self.settings.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS)
    }

    pub(super) fn max_session_bytes(&self) -> usize {
        self.settings
            .max_session_bytes
            .unwrap_or(DEFAULT_MAX_SESSION_BYTES)
    }

    /// The members ignored unless a tool says otherwise.
    pub(super) fn ignore_members(&self) -> &[String] {
        self.settings.ignore_members.as_deref().unwrap_or_default()
    }

    /// The tiers, with the model tier `models` and sessions bounded as the layer's.
    pub(super) fn tiers(&self, models: ModelTier) -> Tiers {
        let layer = &self.settings;
        let rules = Rules {
            cycles: layer.cycles.unwrap_or(true).then(|| CycleLimits {
                repetitions: layer.cycle_repetitions.unwrap_or(3),
                max_length: layer.max_cycle_length.unwrap_or(5),
            }),
            backoff: layer
                .min_backoff_ms
                .map(Duration::from_millis)
                .filter(|wait| !wait.is_zero()),
            result_aware: layer.result_aware_polling.unwrap_or(true),
            patient_gap: Duration::from_millis(layer.patient_poll_gap_ms.unwrap_or(28_000)),
        };
        // The server tier of the settings a model, tool or session sets too. Switched off
        // for the layer, the failure rule applies only where a tier below sets it.
        let server = LoopDetectSettings {
            enabled: layer.enabled,
            max_repeats: layer.max_repeats,
            ttl_secs: layer.ttl_secs,
            mode: layer.mode,
            max_failures: layer
                .max_failures
                .filter(|_| layer.repeated_failures != Some(false)),
            poll_budget_secs: layer.poll_budget_secs,
            poller: layer.poller,
            ..LoopDetectSettings::default()
        };
        Tiers {
            models: models.over(&server),
            server,
            sessions: SessionTier::new(self.max_sessions()),
            rules,
        }
    }
}

/// The tiers, and the resolution of one call's limits.
#[derive(Debug)]
pub(super) struct Tiers {
    /// The layer's settings of the fields the other tiers set too, over the built-in
    /// defaults (`max_failures` unset when the layer switches that rule off).
    server: LoopDetectSettings,
    /// Each model's settings over the server's.
    models: ModelTier,
    pub(super) sessions: SessionTier,
    rules: Rules,
}

impl Tiers {
    /// The window of the server tier.
    pub(super) fn server_ttl(&self) -> Duration {
        Duration::from_secs(self.server.ttl_secs.unwrap_or(DEFAULT_TTL_SECS))
    }

    /// The limits for `call`, whose tool has the settings `tool`; `None` when detection is
    /// off for it.
    pub(super) fn limits(
        &self,
        call: &ToolCall,
        tool: &LoopDetectSettings,
        answers_decide: bool,
    ) -> Option<Limits> {
        let session = self.sessions.get(call.session_key()).unwrap_or_default();
        let (enabled, limits) = self
            .below_session(call, tool, answers_decide)
            .under(&session);
        enabled.then_some(limits)
    }

    /// What the tiers below the session decide for `call`, whose tool has the settings
    /// `tool` and whose answers decide whether it repeats (`answers_decide`) or not: the
    /// tool, model and server tiers.
    pub(super) fn below_session(
        &self,
        call: &ToolCall,
        tool: &LoopDetectSettings,
        answers_decide: bool,
    ) -> BelowSession {
        // Field by field, so that a call copies no list (a tool's `ignore_members`).
        let below = self.models.for_call(call).unwrap_or(&self.server);
        BelowSession {
            enabled: tool.enabled.or(below.enabled).unwrap_or(true),
            limits: Limits {
                max_repeats: tool
                    .max_repeats
                    .or(below.max_repeats)
                    .unwrap_or(DEFAULT_MAX_REPEATS),
                ttl: Duration::from_secs(
                    tool.ttl_secs.or(below.ttl_secs).unwrap_or(DEFAULT_TTL_SECS),
                ),
                mode: tool.mode.or(below.mode).unwrap_or(LoopMode::Break),
                result_aware: self.rules.result_aware
                    && tool.poller.or(below.poller).unwrap_or(answers_decide),
                cycles: self.rules.cycles,
                failures: tool.max_failures.or(below.max_failures),
                backoff: self.rules.backoff,
                polls: PollLimits {
                    patient_gap: self.rules.patient_gap,
                    budget: tool
                        .poll_budget_secs
                        .or(below.poll_budget_secs)
                        .and_then(poll_budget),
                },
            },
        }
    }
}

/// The poll budget of `secs` seconds; `0`: without end.
fn poll_budget(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// A call's settings before its session's own: each session setting, when set, wins.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BelowSession {
    pub(crate) enabled: bool,
    pub(crate) limits: Limits,
}

impl BelowSession {
    /// Whether calls are tracked, and the limits, under `session`'s settings.
    pub(crate) fn under(self, session: &LoopDetectSettings) -> (bool, Limits) {
        let limits = Limits {
            max_repeats: session.max_repeats.unwrap_or(self.limits.max_repeats),
            ttl: session
                .ttl_secs
                .map_or(self.limits.ttl, Duration::from_secs),
            mode: session.mode.unwrap_or(self.limits.mode),
            failures: session.max_failures.or(self.limits.failures),
            polls: PollLimits {
                budget: session
                    .poll_budget_secs
                    .map_or(self.limits.polls.budget, poll_budget),
                ..self.limits.polls
            },
            ..self.limits
        };
        (session.enabled.unwrap_or(self.enabled), limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<LoopDetectSettings, ConfigError> {
        LoopDetectSettings::from_env_with(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// Settings with the six a session sets.
    fn six(
        enabled: Option<bool>,
        max_repeats: Option<u32>,
        ttl_secs: Option<u64>,
        mode: Option<LoopMode>,
        max_failures: Option<u32>,
        poll_budget_secs: Option<u64>,
    ) -> LoopDetectSettings {
        LoopDetectSettings {
            enabled,
            max_repeats,
            ttl_secs,
            mode,
            max_failures,
            poll_budget_secs,
            ..LoopDetectSettings::default()
        }
    }

    /// Settings with `max_failures` and `poll_budget_secs` only.
    fn failures_and_budget(
        max_failures: Option<u32>,
        poll_budget_secs: Option<u64>,
    ) -> LoopDetectSettings {
        six(None, None, None, None, max_failures, poll_budget_secs)
    }

    #[test]
    fn env_values_are_read_and_checked() {
        assert_eq!(env(&[]).unwrap(), LoopDetectSettings::default());
        let config = env(&[
            (ENV_ENABLED, "false"),
            (ENV_MAX_REPEATS, " 7 "),
            (ENV_TTL_SECONDS, "30"),
            (ENV_MODE, "chance_then_break"),
        ])
        .unwrap();
        assert_eq!(config.enabled, Some(false));
        assert_eq!(config.max_repeats, Some(7));
        assert_eq!(config.ttl_secs, Some(30));
        assert_eq!(config.mode, Some(LoopMode::ChanceThenBreak));
        assert_eq!(
            env(&[(ENV_MODE, "")]).unwrap(),
            LoopDetectSettings::default()
        );

        let bad = [
            (ENV_ENABLED, "maybe", "must be true or false, got \"maybe\""),
            (
                ENV_MAX_REPEATS,
                "four",
                "must be a whole number from 2 to 1000, got \"four\"",
            ),
            (
                ENV_MAX_REPEATS,
                "1",
                "must be a whole number from 2 to 1000, got 1",
            ),
            (
                ENV_MAX_REPEATS,
                "-3",
                "must be a whole number from 2 to 1000, got \"-3\"",
            ),
            (
                ENV_TTL_SECONDS,
                "0",
                "must be a whole number of seconds, at least 1, got 0",
            ),
            (
                ENV_TTL_SECONDS,
                "1.5",
                "must be a whole number of seconds, at least 1, got \"1.5\"",
            ),
            (
                ENV_MODE,
                "stop",
                "must be break, chance or chance_then_break, got \"stop\"",
            ),
        ];
        for (name, value, problem) in bad {
            let err = env(&[(name, value)]).unwrap_err();
            assert_eq!(err.field(), name, "{name}={value}");
            assert_eq!(err.problem(), problem, "{name}={value}");
        }
    }

    #[test]
    fn settings_merge_and_unset_one_key_at_a_time() {
        let a = LoopDetectSettings {
            enabled: Some(true),
            max_repeats: Some(3),
            ..LoopDetectSettings::default()
        };
        let b = LoopDetectSettings {
            max_repeats: Some(6),
            mode: Some(LoopMode::Break),
            ..LoopDetectSettings::default()
        };
        let merged = b.over(&a);
        assert_eq!(
            merged,
            six(Some(true), Some(6), None, Some(LoopMode::Break), None, None)
        );
        let unset = merged
            .without(LoopSettingKey::MaxRepeats)
            .without(LoopSettingKey::Detection);
        assert_eq!(unset.max_repeats, None);
        assert_eq!(unset.enabled, None);
        assert_eq!(unset.mode, Some(LoopMode::Break));
        assert!(unset.without(LoopSettingKey::Mode).is_empty());
    }

    #[test]
    fn the_session_tier_is_bounded() {
        let tier = SessionTier::new(2);
        let set = |s: LoopDetectSettings| {
            move |_| LoopDetectSettings {
                max_repeats: Some(5),
                ..s
            }
        };
        tier.update("a", set(LoopDetectSettings::default()));
        tier.update("b", set(LoopDetectSettings::default()));
        assert!(tier.get("a").is_some(), "reading a makes b the oldest");
        tier.update("c", set(LoopDetectSettings::default()));
        assert_eq!(tier.len(), 2);
        assert!(tier.get("b").is_none());
        assert!(tier.get("a").is_some() && tier.get("c").is_some());
        tier.update("a", |s| s.without(LoopSettingKey::MaxRepeats));
        assert_eq!(tier.len(), 1, "empty settings are removed");
    }

    /// The tiers of a layer with `server` as its settings, `model` for openai/gpt-4o and
    /// `session` for the session `s`.
    fn tiers_with(
        server: LoopDetectSettings,
        model: LoopDetectSettings,
        session: LoopDetectSettings,
    ) -> Tiers {
        let mut models = ModelTier::default();
        models.insert("openai".into(), "gpt-4o".into(), model);
        let tiers = Resolved::new(server).tiers(models);
        tiers.sessions.update("s", |_| session);
        tiers
    }

    /// The layer's defaults for the new settings: the 4th identical call after three
    /// failures, a poll budget of 10 minutes.
    fn tiers(model: LoopDetectSettings, session: LoopDetectSettings) -> Tiers {
        tiers_with(LoopDetectSettings::default(), model, session)
    }

    fn call() -> ToolCall {
        ToolCall::builder("app", "search")
            .session("s")
            .actor("a")
            .baggage(BAGGAGE_BACKEND, "openai")
            .baggage(BAGGAGE_MODEL, "gpt-4o")
            .build()
            .unwrap()
    }

    #[test]
    fn failures_and_poll_budget_resolve_session_then_tool_then_model_then_server() {
        let call = call();
        let none = LoopDetectSettings::default();
        let at = failures_and_budget;
        let secs = |s: u64| Some(Duration::from_secs(s));
        // (session, tool, model) -> (failures, poll budget)
        let cases = [
            (
                none.clone(),
                none.clone(),
                none.clone(),
                (Some(4), secs(600)),
            ),
            (
                none.clone(),
                none.clone(),
                at(Some(5), Some(300)),
                (Some(5), secs(300)),
            ),
            (
                none.clone(),
                at(Some(3), Some(60)),
                at(Some(5), Some(300)),
                (Some(3), secs(60)),
            ),
            (
                at(Some(2), Some(30)),
                at(Some(3), Some(60)),
                at(Some(5), Some(300)),
                (Some(2), secs(30)),
            ),
            // Each setting on its own: the session sets one, the tool the other.
            (
                at(Some(2), None),
                at(None, Some(60)),
                at(Some(5), Some(300)),
                (Some(2), secs(60)),
            ),
            (
                at(None, Some(30)),
                none.clone(),
                at(Some(5), None),
                (Some(5), secs(30)),
            ),
            // `0` is a budget without end, at every tier.
            (
                none.clone(),
                none.clone(),
                at(None, Some(0)),
                (Some(4), None),
            ),
            (
                at(None, Some(0)),
                at(None, Some(60)),
                none.clone(),
                (Some(4), None),
            ),
            (
                at(None, Some(45)),
                at(None, Some(0)),
                none.clone(),
                (Some(4), secs(45)),
            ),
        ];
        for (index, (session, tool, model, (failures, budget))) in cases.into_iter().enumerate() {
            let limits = tiers(model, session).limits(&call, &tool, true).unwrap();
            assert_eq!(limits.failures, failures, "case {index}");
            assert_eq!(limits.polls.budget, budget, "case {index}");
            assert_eq!(limits.polls.patient_gap, Duration::from_secs(28));
            assert_eq!(limits.max_repeats, DEFAULT_MAX_REPEATS, "case {index}");
        }
    }

    /// One field set at each tier, another value at each: the highest tier that sets it
    /// wins, field by field, and the built-in default when none does.
    #[test]
    fn each_setting_resolves_session_then_tool_then_model_then_server_then_default() {
        let call = call();
        let none = LoopDetectSettings::default();
        // max_repeats: every tier sets it; ttl_secs: all but the session; mode: the model
        // and the server; max_failures: the server only; poll_budget_secs: nobody.
        let server = six(
            Some(true),
            Some(9),
            Some(90),
            Some(LoopMode::Break),
            Some(8),
            None,
        );
        let model = six(
            None,
            Some(7),
            Some(70),
            Some(LoopMode::ChanceThenBreak),
            None,
            None,
        );
        let tool = six(None, Some(5), Some(50), None, None, None);
        let session = six(None, Some(3), None, None, None, None);
        let limits = tiers_with(server.clone(), model.clone(), session)
            .limits(&call, &tool, false)
            .unwrap();
        assert_eq!(limits.max_repeats, 3, "the session's");
        assert_eq!(limits.ttl, Duration::from_secs(50), "the tool's");
        assert_eq!(limits.mode, LoopMode::ChanceThenBreak, "the model's");
        assert_eq!(limits.failures, Some(8), "the server's");
        assert_eq!(
            limits.polls.budget,
            Some(Duration::from_secs(600)),
            "the built-in default"
        );
        // One tier less each time: the next one decides.
        let limits = tiers_with(server.clone(), model.clone(), none.clone())
            .limits(&call, &tool, false)
            .unwrap();
        assert_eq!(
            (limits.max_repeats, limits.ttl),
            (5, Duration::from_secs(50))
        );
        let limits = tiers_with(server.clone(), model, none.clone())
            .limits(&call, &none, false)
            .unwrap();
        assert_eq!(
            (limits.max_repeats, limits.ttl),
            (7, Duration::from_secs(70))
        );
        let limits = tiers_with(server, none.clone(), none.clone())
            .limits(&call, &none, false)
            .unwrap();
        assert_eq!(
            (limits.max_repeats, limits.ttl, limits.mode),
            (9, Duration::from_secs(90), LoopMode::Break)
        );
        let limits = tiers(none.clone(), none.clone())
            .limits(&call, &none, false)
            .unwrap();
        assert_eq!(
            (limits.max_repeats, limits.ttl, limits.failures),
            (4, Duration::from_secs(120), Some(4))
        );
        // `enabled` too: the server off, the model on, the tool off, the session on.
        let off = six(Some(false), None, None, None, None, None);
        let on = six(Some(true), None, None, None, None, None);
        let tiered = |server: &LoopDetectSettings,
                      model: &LoopDetectSettings,
                      tool: &LoopDetectSettings,
                      session: &LoopDetectSettings| {
            tiers_with(server.clone(), model.clone(), session.clone())
                .limits(&call, tool, false)
                .is_some()
        };
        assert!(!tiered(&off, &none, &none, &none));
        assert!(tiered(&off, &on, &none, &none));
        assert!(!tiered(&off, &on, &off, &none));
        assert!(tiered(&off, &on, &off, &on));
    }

    #[test]
    fn bad_failures_and_poll_budgets_are_refused_naming_the_field() {
        let cases = [
            (
                failures_and_budget(Some(1), None),
                "max_failures",
                "must be a whole number from 2 to 1000, got 1",
            ),
            (
                failures_and_budget(Some(1001), None),
                "max_failures",
                "must be a whole number from 2 to 1000, got 1001",
            ),
            (
                failures_and_budget(None, Some(MAX_POLL_BUDGET_SECS + 1)),
                "poll_budget_secs",
                "must be a whole number of seconds from 0 (no end) to 31536000, got 31536001",
            ),
        ];
        for (settings, field, problem) in cases {
            let err = settings.check().unwrap_err();
            assert_eq!((err.field(), err.problem()), (field, problem));
        }
        let fine = failures_and_budget(Some(2), Some(MAX_POLL_BUDGET_SECS));
        assert!(fine.check().is_ok());
        assert!(failures_and_budget(None, Some(0)).check().is_ok());
    }

    #[test]
    fn a_session_or_a_model_sets_only_the_six() {
        let mut settings = LoopDetectSettings {
            max_repeats: Some(3),
            ..LoopDetectSettings::default()
        };
        assert!(settings.check_session().is_ok());
        settings.poller = Some(true);
        let err = settings.check_session().unwrap_err();
        assert_eq!(err.field(), "poller");
        assert_eq!(
            err.problem(),
            "is not set by a session; a session sets only enabled, max_repeats, ttl_secs, \
             mode, max_failures and poll_budget_secs"
        );
        let err = LoopDetectSettings {
            max_session_bytes: Some(1 << 20),
            ..LoopDetectSettings::default()
        }
        .check_model()
        .unwrap_err();
        assert_eq!(err.field(), "max_session_bytes");
    }
}
