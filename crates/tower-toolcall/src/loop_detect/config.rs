//! The configuration tiers of loop detection and how one call's settings are resolved from
//! them.
//!
//! - **server**: [`LoopDetectConfig`], from code or from the environment;
//! - **model**: [`LoopSettings`] per (backend, model), given to the layer's builder;
//! - **tool**: `policy.loop_detect` in the [registry](crate::registry);
//! - **session**: [`LoopSettings`] set and unset at run time through the
//!   [`LoopDetectHandle`](super::LoopDetectHandle).
//!
//! Each setting is resolved on its own: session, then tool, then model, then server.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashlink::LruCache;
use serde::{Deserialize, Serialize};

use super::detector::{CycleLimits, Limits, PollLimits};
use crate::envelope::ToolCall;
use crate::error::ConfigError;
use crate::registry::{LoopDetectOverrides, LoopMode};

/// Default of [`LoopDetectConfig::max_repeats`]: 4 identical calls make a loop.
pub const DEFAULT_MAX_REPEATS: u32 = 4;
/// Default of [`LoopDetectConfig::ttl_secs`]: calls are remembered for 120 s.
pub const DEFAULT_TTL_SECS: u64 = 120;
/// The largest `max_repeats` accepted anywhere: the history of a session grows with it.
pub const MAX_REPEATS_LIMIT: u32 = 1000;
/// The longest poll budget a model or session sets, in seconds: a year. Longer is without
/// end in practice; say `0` for that.
pub const MAX_POLL_BUDGET_SECS: u64 = 365 * 24 * 60 * 60;

/// `TOOL_LOOP_DETECTION_ENABLED`: `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
pub const ENV_ENABLED: &str = "TOOL_LOOP_DETECTION_ENABLED";
/// `TOOL_LOOP_MAX_REPEATS`: a whole number from 2 to [`MAX_REPEATS_LIMIT`].
pub const ENV_MAX_REPEATS: &str = "TOOL_LOOP_MAX_REPEATS";
/// `TOOL_LOOP_TTL_SECONDS`: a whole number of seconds, at least 1.
pub const ENV_TTL_SECONDS: &str = "TOOL_LOOP_TTL_SECONDS";
/// `TOOL_LOOP_MODE`: `break`, `chance` or `chance_then_break`.
pub const ENV_MODE: &str = "TOOL_LOOP_MODE";

/// The server tier: the settings every call gets unless a model, tool or session says
/// otherwise.
///
/// Defaults: enabled, `max_repeats` 4, a window of 120 s, mode `break`.
///
/// ```
/// use tower_toolcall::loop_detect::LoopDetectConfig;
/// use tower_toolcall::registry::LoopMode;
///
/// let config = LoopDetectConfig::default().with_max_repeats(3).with_mode(LoopMode::ChanceThenBreak);
/// assert_eq!(config.max_repeats(), 3);
/// assert_eq!(config.ttl_secs(), 120);
///
/// // From the environment; here from a map instead of the process environment.
/// let env = [("TOOL_LOOP_MAX_REPEATS", "6"), ("TOOL_LOOP_MODE", "chance")];
/// let config = LoopDetectConfig::from_env_with(|name| {
///     env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
/// })?;
/// assert_eq!(config.max_repeats(), 6);
/// assert_eq!(config.mode(), LoopMode::ChanceThenBreak);
///
/// let err = LoopDetectConfig::from_env_with(|name| {
///     (name == "TOOL_LOOP_TTL_SECONDS").then(|| "two minutes".to_owned())
/// }).unwrap_err();
/// assert_eq!(err.field(), "TOOL_LOOP_TTL_SECONDS");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopDetectConfig {
    enabled: bool,
    max_repeats: u32,
    ttl_secs: u64,
    mode: LoopMode,
}

impl Default for LoopDetectConfig {
    fn default() -> Self {
        LoopDetectConfig {
            enabled: true,
            max_repeats: DEFAULT_MAX_REPEATS,
            ttl_secs: DEFAULT_TTL_SECS,
            mode: LoopMode::Break,
        }
    }
}

impl LoopDetectConfig {
    /// Whether calls are tracked at all (default `true`). Disabled, the layer keeps no
    /// history and lets every call through.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Identical consecutive calls that make a loop (default 4): the call that would be the
    /// 4th is not run. From 2 to [`MAX_REPEATS_LIMIT`].
    pub fn with_max_repeats(mut self, max_repeats: u32) -> Self {
        self.max_repeats = max_repeats;
        self
    }

    /// How long a call is remembered, in seconds (default 120); at least 1.
    pub fn with_ttl_secs(mut self, ttl_secs: u64) -> Self {
        self.ttl_secs = ttl_secs;
        self
    }

    /// What happens when a loop is found (default [`LoopMode::Break`]).
    pub fn with_mode(mut self, mode: LoopMode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether calls are tracked.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Identical consecutive calls that make a loop.
    pub fn max_repeats(&self) -> u32 {
        self.max_repeats
    }

    /// The window, in seconds.
    pub fn ttl_secs(&self) -> u64 {
        self.ttl_secs
    }

    /// What happens when a loop is found.
    pub fn mode(&self) -> LoopMode {
        self.mode
    }

    /// The defaults, overridden by the environment variables [`ENV_ENABLED`],
    /// [`ENV_MAX_REPEATS`], [`ENV_TTL_SECONDS`] and [`ENV_MODE`]. Unset or empty variables
    /// keep the default; a bad value is a [`ConfigError`] naming the variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        LoopDetectConfig::from_env_with(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => Some(raw.to_string_lossy().into_owned()),
        })
    }

    /// Like [`from_env`](LoopDetectConfig::from_env), reading each variable with `lookup`
    /// (which returns `None` for an unset variable) instead of the process environment.
    pub fn from_env_with(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = LoopDetectConfig::default();
        let mut read = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if let Some(value) = read(ENV_ENABLED) {
            config.enabled = parse_bool(&value).map_err(|p| ConfigError::new(ENV_ENABLED, p))?;
        }
        if let Some(value) = read(ENV_MAX_REPEATS) {
            config.max_repeats =
                parse_max_repeats(&value).map_err(|p| ConfigError::new(ENV_MAX_REPEATS, p))?;
        }
        if let Some(value) = read(ENV_TTL_SECONDS) {
            config.ttl_secs =
                parse_ttl_secs(&value).map_err(|p| ConfigError::new(ENV_TTL_SECONDS, p))?;
        }
        if let Some(value) = read(ENV_MODE) {
            config.mode = parse_mode(&value).map_err(|p| ConfigError::new(ENV_MODE, p))?;
        }
        Ok(config)
    }

    /// Checks the values; the error names the field (`max_repeats` or `ttl_secs`).
    pub fn check(&self) -> Result<(), ConfigError> {
        check_max_repeats(self.max_repeats).map_err(|p| ConfigError::new("max_repeats", p))?;
        check_ttl_secs(self.ttl_secs).map_err(|p| ConfigError::new("ttl_secs", p))
    }
}

/// Settings of the model or session tier: each one that is `None` falls back to the next
/// tier.
///
/// ```
/// use tower_toolcall::loop_detect::LoopSettings;
/// use tower_toolcall::registry::LoopMode;
///
/// let strict = LoopSettings::default().with_max_repeats(3).with_mode(LoopMode::Break);
/// assert!(strict.check().is_ok());
/// let bad = LoopSettings::default().with_max_repeats(1);
/// assert_eq!(bad.check().unwrap_err().field(), "max_repeats");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LoopSettings {
    /// Whether calls are tracked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Identical consecutive calls that make a loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<u32>,
    /// The window, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// What happens when a loop is found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LoopMode>,
    /// Identical calls in a row that make a loop when each earlier one failed with the same
    /// error code (from 2 to 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
    /// How long, in seconds, a patient poll's answer may stay the same before the poll is a
    /// loop (at most [`MAX_POLL_BUDGET_SECS`]); `0`: without end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_budget_secs: Option<u64>,
}

impl LoopSettings {
    /// Sets whether calls are tracked.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = Some(enabled);
        self
    }

    /// Sets the identical consecutive calls that make a loop.
    pub fn with_max_repeats(mut self, max_repeats: u32) -> Self {
        self.max_repeats = Some(max_repeats);
        self
    }

    /// Sets the window, in seconds.
    pub fn with_ttl_secs(mut self, ttl_secs: u64) -> Self {
        self.ttl_secs = Some(ttl_secs);
        self
    }

    /// Sets what happens when a loop is found.
    pub fn with_mode(mut self, mode: LoopMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Sets the identical calls after identical failures that make a loop.
    pub fn with_max_failures(mut self, max_failures: u32) -> Self {
        self.max_failures = Some(max_failures);
        self
    }

    /// Sets how long a patient poll's answer may stay the same, in seconds (`0`: no end).
    pub fn with_poll_budget_secs(mut self, poll_budget_secs: u64) -> Self {
        self.poll_budget_secs = Some(poll_budget_secs);
        self
    }

    /// `true` when no setting is given.
    pub fn is_empty(&self) -> bool {
        *self == LoopSettings::default()
    }

    /// Checks the values that are given; the error names the field.
    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(max) = self.max_repeats {
            check_max_repeats(max).map_err(|p| ConfigError::new("max_repeats", p))?;
        }
        if let Some(ttl) = self.ttl_secs {
            check_ttl_secs(ttl).map_err(|p| ConfigError::new("ttl_secs", p))?;
        }
        if let Some(max) = self.max_failures {
            check_max_repeats(max).map_err(|p| ConfigError::new("max_failures", p))?;
        }
        if let Some(budget) = self.poll_budget_secs {
            check_poll_budget_secs(budget).map_err(|p| ConfigError::new("poll_budget_secs", p))?;
        }
        Ok(())
    }

    /// These settings with every setting given in `newer` replacing this one's.
    pub fn merged(self, newer: LoopSettings) -> LoopSettings {
        LoopSettings {
            enabled: newer.enabled.or(self.enabled),
            max_repeats: newer.max_repeats.or(self.max_repeats),
            ttl_secs: newer.ttl_secs.or(self.ttl_secs),
            mode: newer.mode.or(self.mode),
            max_failures: newer.max_failures.or(self.max_failures),
            poll_budget_secs: newer.poll_budget_secs.or(self.poll_budget_secs),
        }
    }

    /// These settings without `key`.
    pub fn without(mut self, key: LoopSettingKey) -> LoopSettings {
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
}

/// One setting, by the name the in-chat commands use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LoopSettingKey {
    /// `tool-loop-detection`: [`LoopSettings::enabled`].
    Detection,
    /// `tool-loop-max-repeats`: [`LoopSettings::max_repeats`].
    MaxRepeats,
    /// `tool-loop-ttl`: [`LoopSettings::ttl_secs`].
    Ttl,
    /// `tool-loop-mode`: [`LoopSettings::mode`].
    Mode,
    /// `tool-loop-max-failures`: [`LoopSettings::max_failures`].
    MaxFailures,
    /// `tool-loop-poll-budget-seconds`: [`LoopSettings::poll_budget_secs`].
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

    /// The member of [`LoopSettings`] it names, as they serialize, e.g. `max_repeats`.
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
    by_backend: HashMap<String, HashMap<String, LoopSettings>>,
}

impl ModelTier {
    pub(super) fn insert(&mut self, backend: String, model: String, settings: LoopSettings) {
        self.by_backend
            .entry(backend)
            .or_default()
            .insert(model, settings);
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (backend, models) in &self.by_backend {
            for (model, settings) in models {
                settings
                    .check()
                    .map_err(|e| e.within(&format!("models[{backend}/{model}]")))?;
            }
        }
        Ok(())
    }

    /// The settings for the backend and model named in the call's baggage.
    fn for_call(&self, call: &ToolCall) -> Option<&LoopSettings> {
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
    settings: Mutex<LruCache<Arc<str>, LoopSettings, RandomState>>,
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

    pub(super) fn get(&self, session: &str) -> Option<LoopSettings> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().get_mut(session).copied()
    }

    /// Replaces the session's settings; empty settings remove them.
    pub(super) fn update(&self, session: &str, update: impl FnOnce(LoopSettings) -> LoopSettings) {
        let mut map = self.lock();
        let current = map.get_mut(session).copied().unwrap_or_default();
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
    pub(super) fn change(&self, session: &str, set: LoopSettings, unset: &[LoopSettingKey]) {
        self.update(session, |current| {
            unset.iter().fold(current.merged(set), |s, k| s.without(*k))
        });
    }

    /// Drops the session's settings.
    pub(super) fn clear(&self, session: &str) {
        self.update(session, |_| LoopSettings::default());
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Arc<str>, LoopSettings, RandomState>> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The rules beyond identical repeats, and their thresholds (layer-wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    pub(super) cycles: Option<CycleLimits>,
    /// Identical calls after identical failures that make a loop.
    pub(super) failures: Option<u32>,
    /// The least wait of a retry with back-off.
    pub(super) backoff: Option<Duration>,
    /// Whether read-only tools and pollers are judged with their answers.
    pub(super) result_aware: bool,
    /// How unchanged answers are judged, unless the tool says otherwise.
    pub(super) polls: PollLimits,
}

static NO_OVERRIDES: LoopDetectOverrides = LoopDetectOverrides {
    max_repeats: None,
    ttl_secs: None,
    mode: None,
    poller: None,
    max_failures: None,
    poll_budget_secs: None,
    ignore_members: None,
};

/// The tiers, and the resolution of one call's limits.
#[derive(Debug)]
pub(super) struct Tiers {
    pub(super) server: LoopDetectConfig,
    pub(super) models: ModelTier,
    pub(super) sessions: SessionTier,
    pub(super) rules: Rules,
}

impl Tiers {
    /// The limits for `call`, whose tool has `tool` overrides; `None` when detection is off
    /// for it.
    pub(super) fn limits(
        &self,
        call: &ToolCall,
        tool: Option<&LoopDetectOverrides>,
        answers_decide: bool,
    ) -> Option<Limits> {
        let session = self.sessions.get(call.session_key()).unwrap_or_default();
        let (enabled, limits) = self
            .below_session(call, tool, answers_decide)
            .under(&session);
        enabled.then_some(limits)
    }

    /// What the tiers below the session decide for `call`, whose tool's answers decide
    /// whether it repeats (`answers_decide`) or not:
    /// the tool, model and server tiers.
    pub(super) fn below_session(
        &self,
        call: &ToolCall,
        tool: Option<&LoopDetectOverrides>,
        answers_decide: bool,
    ) -> BelowSession {
        let model = self.models.for_call(call).copied().unwrap_or_default();
        let tool = tool.unwrap_or(&NO_OVERRIDES);
        let server = &self.server;
        let enabled = model.enabled.unwrap_or(server.enabled);
        let max_repeats = tool
            .max_repeats
            .or(model.max_repeats)
            .unwrap_or(server.max_repeats);
        let ttl_secs = tool.ttl_secs.or(model.ttl_secs).unwrap_or(server.ttl_secs);
        let mode = tool.mode.or(model.mode).unwrap_or(server.mode);
        BelowSession {
            enabled,
            limits: Limits {
                max_repeats,
                ttl: Duration::from_secs(ttl_secs),
                mode,
                result_aware: self.rules.result_aware && tool.poller.unwrap_or(answers_decide),
                cycles: self.rules.cycles,
                failures: tool
                    .max_failures
                    .or(model.max_failures)
                    .or(self.rules.failures),
                backoff: self.rules.backoff,
                polls: PollLimits {
                    budget: tool
                        .poll_budget_secs
                        .or(model.poll_budget_secs)
                        .map_or(self.rules.polls.budget, poll_budget),
                    ..self.rules.polls
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
    pub(crate) fn under(self, session: &LoopSettings) -> (bool, Limits) {
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

    fn env(vars: &[(&str, &str)]) -> Result<LoopDetectConfig, ConfigError> {
        LoopDetectConfig::from_env_with(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn env_values_are_read_and_checked() {
        assert_eq!(env(&[]).unwrap(), LoopDetectConfig::default());
        let config = env(&[
            (ENV_ENABLED, "false"),
            (ENV_MAX_REPEATS, " 7 "),
            (ENV_TTL_SECONDS, "30"),
            (ENV_MODE, "chance_then_break"),
        ])
        .unwrap();
        assert!(!config.is_enabled());
        assert_eq!(config.max_repeats(), 7);
        assert_eq!(config.ttl_secs(), 30);
        assert_eq!(config.mode(), LoopMode::ChanceThenBreak);
        assert_eq!(env(&[(ENV_MODE, "")]).unwrap(), LoopDetectConfig::default());

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
        let a = LoopSettings {
            enabled: Some(true),
            max_repeats: Some(3),
            ..LoopSettings::default()
        };
        let b = LoopSettings {
            max_repeats: Some(6),
            mode: Some(LoopMode::Break),
            ..LoopSettings::default()
        };
        let merged = a.merged(b);
        assert_eq!(
            merged,
            LoopSettings {
                enabled: Some(true),
                max_repeats: Some(6),
                ttl_secs: None,
                mode: Some(LoopMode::Break),
                max_failures: None,
                poll_budget_secs: None,
            }
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
        let set = |s: LoopSettings| {
            move |_| LoopSettings {
                max_repeats: Some(5),
                ..s
            }
        };
        tier.update("a", set(LoopSettings::default()));
        tier.update("b", set(LoopSettings::default()));
        assert!(tier.get("a").is_some(), "reading a makes b the oldest");
        tier.update("c", set(LoopSettings::default()));
        assert_eq!(tier.len(), 2);
        assert!(tier.get("b").is_none());
        assert!(tier.get("a").is_some() && tier.get("c").is_some());
        tier.update("a", |s| s.without(LoopSettingKey::MaxRepeats));
        assert_eq!(tier.len(), 1, "empty settings are removed");
    }

    /// The layer's defaults for the new settings: the 4th identical call after three
    /// failures, a poll budget of 10 minutes.
    fn tiers(model: LoopSettings, session: LoopSettings) -> Tiers {
        let mut models = ModelTier::default();
        models.insert("openai".into(), "gpt-4o".into(), model);
        let sessions = SessionTier::new(8);
        sessions.update("s", |_| session);
        Tiers {
            server: LoopDetectConfig::default(),
            models,
            sessions,
            rules: Rules {
                cycles: None,
                failures: Some(4),
                backoff: None,
                result_aware: true,
                polls: PollLimits {
                    patient_gap: Duration::from_secs(28),
                    budget: Some(Duration::from_secs(600)),
                },
            },
        }
    }

    #[test]
    fn failures_and_poll_budget_resolve_session_then_tool_then_model_then_server() {
        let call = ToolCall::builder("app", "search")
            .session("s")
            .actor("a")
            .baggage(BAGGAGE_BACKEND, "openai")
            .baggage(BAGGAGE_MODEL, "gpt-4o")
            .build()
            .unwrap();
        let none = LoopSettings::default();
        let no_tool = LoopDetectOverrides::default();
        let secs = |s: u64| Some(Duration::from_secs(s));
        // (session, tool, model) -> (failures, poll budget)
        let cases = [
            (none, no_tool.clone(), none, (Some(4), secs(600))),
            (
                none,
                no_tool.clone(),
                none.with_max_failures(5).with_poll_budget_secs(300),
                (Some(5), secs(300)),
            ),
            (
                none,
                no_tool
                    .clone()
                    .with_max_failures(3)
                    .with_poll_budget_secs(60),
                none.with_max_failures(5).with_poll_budget_secs(300),
                (Some(3), secs(60)),
            ),
            (
                none.with_max_failures(2).with_poll_budget_secs(30),
                no_tool
                    .clone()
                    .with_max_failures(3)
                    .with_poll_budget_secs(60),
                none.with_max_failures(5).with_poll_budget_secs(300),
                (Some(2), secs(30)),
            ),
            // Each setting on its own: the session sets one, the tool the other.
            (
                none.with_max_failures(2),
                no_tool.clone().with_poll_budget_secs(60),
                none.with_max_failures(5).with_poll_budget_secs(300),
                (Some(2), secs(60)),
            ),
            (
                none.with_poll_budget_secs(30),
                no_tool.clone(),
                none.with_max_failures(5),
                (Some(5), secs(30)),
            ),
            // `0` is a budget without end, at every tier.
            (
                none,
                no_tool.clone(),
                none.with_poll_budget_secs(0),
                (Some(4), None),
            ),
            (
                none.with_poll_budget_secs(0),
                no_tool.clone().with_poll_budget_secs(60),
                none,
                (Some(4), None),
            ),
            (
                none.with_poll_budget_secs(45),
                no_tool.clone().with_poll_budget_secs(0),
                none,
                (Some(4), secs(45)),
            ),
        ];
        for (index, (session, tool, model, (failures, budget))) in cases.into_iter().enumerate() {
            let limits = tiers(model, session)
                .limits(&call, Some(&tool), true)
                .unwrap();
            assert_eq!(limits.failures, failures, "case {index}");
            assert_eq!(limits.polls.budget, budget, "case {index}");
            assert_eq!(limits.polls.patient_gap, Duration::from_secs(28));
            assert_eq!(limits.max_repeats, DEFAULT_MAX_REPEATS, "case {index}");
        }
    }

    #[test]
    fn bad_failures_and_poll_budgets_are_refused_naming_the_field() {
        let cases = [
            (
                LoopSettings::default().with_max_failures(1),
                "max_failures",
                "must be a whole number from 2 to 1000, got 1",
            ),
            (
                LoopSettings::default().with_max_failures(1001),
                "max_failures",
                "must be a whole number from 2 to 1000, got 1001",
            ),
            (
                LoopSettings::default().with_poll_budget_secs(MAX_POLL_BUDGET_SECS + 1),
                "poll_budget_secs",
                "must be a whole number of seconds from 0 (no end) to 31536000, got 31536001",
            ),
        ];
        for (settings, field, problem) in cases {
            let err = settings.check().unwrap_err();
            assert_eq!((err.field(), err.problem()), (field, problem));
        }
        let fine = LoopSettings::default()
            .with_max_failures(2)
            .with_poll_budget_secs(MAX_POLL_BUDGET_SECS);
        assert!(fine.check().is_ok());
        assert!(LoopSettings::default()
            .with_poll_budget_secs(0)
            .check()
            .is_ok());
    }
}
