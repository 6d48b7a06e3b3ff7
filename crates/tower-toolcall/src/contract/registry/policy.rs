//! Per-tool policy: one section per layer, each either absent (the layer's defaults), `"off"`
//! (the layer lets the tool's calls through untouched), or a table of overrides.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::{Serialize, Serializer};

use crate::contract::envelope::DedupeMode;
pub use crate::contract::envelope::KeyScope;
use crate::contract::error::{ConfigError, ErrorCode};

/// One layer's setting for one tool.
///
/// In a file: absent (or `"on"`) for the layer's defaults, `"off"` to switch the layer off
/// for the tool, or a table of overrides.
///
/// ```
/// use tower_toolcall::registry::{LayerSetting, RetrySettings, ToolPolicy};
///
/// let policy: ToolPolicy = serde_json::from_str(
///     r#"{"retry": {"max_attempts": 2}, "loop_detect": "off"}"#,
/// ).unwrap();
/// assert_eq!(policy.retry.overrides().unwrap().max_attempts, Some(2));
/// assert!(policy.loop_detect.is_off());
/// assert!(matches!(policy.breaker, LayerSetting::Default));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum LayerSetting<T> {
    /// The layer's defaults.
    #[default]
    Default,
    /// The layer is off for this tool.
    Off,
    /// The layer's defaults with these overrides.
    On(T),
}

impl<T> LayerSetting<T> {
    /// `true` when the layer is off for the tool.
    pub fn is_off(&self) -> bool {
        matches!(self, LayerSetting::Off)
    }

    /// The overrides, when there are any.
    pub fn overrides(&self) -> Option<&T> {
        match self {
            LayerSetting::On(t) => Some(t),
            _ => None,
        }
    }

    fn is_default(&self) -> bool {
        matches!(self, LayerSetting::Default)
    }

    fn check_with(
        &self,
        field: &str,
        check: impl FnOnce(&T) -> Result<(), ConfigError>,
    ) -> Result<(), ConfigError> {
        match self {
            LayerSetting::On(t) => check(t).map_err(|e| e.within(field)),
            _ => Ok(()),
        }
    }
}

impl<T> From<T> for LayerSetting<T> {
    /// The layer's defaults with `overrides`: [`LayerSetting::On`].
    fn from(overrides: T) -> Self {
        LayerSetting::On(overrides)
    }
}

impl<T: Serialize> Serialize for LayerSetting<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LayerSetting::Default => serializer.serialize_str("on"),
            LayerSetting::Off => serializer.serialize_str("off"),
            LayerSetting::On(t) => t.serialize(serializer),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LayerSetting<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SettingVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SettingVisitor<T> {
            type Value = LayerSetting<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"on\", \"off\" or a table of overrides")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "off" => Ok(LayerSetting::Off),
                    "on" | "default" => Ok(LayerSetting::Default),
                    other => Err(E::custom(format_args!(
                        "must be \"on\", \"off\" or a table of overrides, got {other:?}"
                    ))),
                }
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(if v {
                    LayerSetting::Default
                } else {
                    LayerSetting::Off
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(LayerSetting::On)
            }
        }

        deserializer.deserialize_any(SettingVisitor(PhantomData))
    }
}

/// Declares [`ToolPolicy`] from the list of the layers tools may tune: each its field, its
/// settings type and the setter that sets it. A new layer is one line in the list.
macro_rules! tool_policy {
    ($($(#[$field_doc:meta])* $field:ident: $settings:ty => $setter:ident,)*) => {
        /// The policy of one tool: a setting for every layer and the classifier's overrides.
        ///
        /// Read from a registry file, or written in code with the `with_*` setters, which take a
        /// layer's overrides or a [`LayerSetting`]:
        ///
        /// ```
        /// use tower_toolcall::registry::{
        ///     BreakerSettings, ClassifyOverrides, LayerSetting, RetrySettings, ToolPolicy,
        ///     UnclassifiedAs,
        /// };
        ///
        /// let policy = ToolPolicy::default()
        ///     .with_retry(RetrySettings::default().with_max_attempts(3).with_base_delay_ms(50))
        ///     .with_breaker(BreakerSettings::default().with_consecutive_failures(2))
        ///     .with_loop_detect(LayerSetting::Off)
        ///     .with_classify(ClassifyOverrides::default().with_unclassified(UnclassifiedAs::Terminal));
        /// assert_eq!(policy.retry.overrides().unwrap().max_attempts, Some(3));
        /// assert!(policy.loop_detect.is_off());
        /// assert!(policy.check().is_ok());
        ///
        /// let parsed: ToolPolicy = serde_json::from_str(
        ///     r#"{"retry": {"max_attempts": 3, "base_delay_ms": 50},
        ///         "breaker": {"consecutive_failures": 2},
        ///         "loop_detect": "off",
        ///         "classify": {"unclassified": "terminal"}}"#,
        /// ).unwrap();
        /// assert_eq!(policy, parsed);
        /// ```
        #[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[non_exhaustive]
        pub struct ToolPolicy {
            $(
                $(#[$field_doc])*
                #[serde(default, skip_serializing_if = "LayerSetting::is_default")]
                pub $field: LayerSetting<$settings>,
            )*
            /// How this tool's errors are classified.
            #[serde(default, skip_serializing_if = "ClassifyOverrides::is_empty")]
            pub classify: ClassifyOverrides,
        }

        impl ToolPolicy {
            $(
                #[doc = concat!(
                    "Sets the `", stringify!($field), "` setting: [`", stringify!($settings),
                    "`], or a [`LayerSetting`]."
                )]
                pub fn $setter(mut self, setting: impl Into<LayerSetting<$settings>>) -> Self {
                    self.$field = setting.into();
                    self
                }
            )*

            /// Sets how the tool's errors are classified.
            pub fn with_classify(mut self, classify: ClassifyOverrides) -> Self {
                self.classify = classify;
                self
            }

            /// Checks every layer's settings; the error names the field below `policy`.
            pub fn check(&self) -> Result<(), ConfigError> {
                $(
                    self.$field
                        .check_with(stringify!($field), ToolSettings::check_tool)?;
                )*
                self.classify.check().map_err(|e| e.within("classify"))
            }
        }
    };
}

tool_policy! {
    /// `EnvelopeValidateLayer`: params limits and the output check. `"off"` skips the params
    /// and output checks; registration, denial and confirmation still apply.
    validate: ValidateSettings => with_validate,
    /// `LoopDetectLayer`.
    loop_detect: LoopDetectSettings => with_loop_detect,
    /// `RateLimitLayer`.
    rate_limit: RateLimitSettings => with_rate_limit,
    /// `IdempotencyLayer`.
    idempotency: IdempotencySettings => with_idempotency,
    /// `BulkheadLayer`: calls of the tool running at once, and waiting.
    bulkhead: BulkheadSettings => with_bulkhead,
    /// `RetryLayer`.
    retry: RetrySettings => with_retry,
    /// `CircuitBreakerLayer`.
    breaker: BreakerSettings => with_breaker,
    /// `TimeoutLayer` (per attempt).
    timeout: TimeoutSettings => with_timeout,
}

/// A layer's settings as a tool's policy holds them.
pub(crate) trait ToolSettings {
    /// Checks a tool's settings: the values given, and no field only the whole layer has.
    fn check_tool(&self) -> Result<(), ConfigError>;
}

/// [`ToolSettings`] for settings whose every field a tool may set: their own `check`.
macro_rules! tool_settings_checked_by_check {
    ($($settings:ty),*) => {
        $(
            impl ToolSettings for $settings {
                fn check_tool(&self) -> Result<(), ConfigError> {
                    self.check()
                }
            }
        )*
    };
}

tool_settings_checked_by_check!(
    ValidateSettings,
    IdempotencySettings,
    RetrySettings,
    TimeoutSettings,
    BulkheadSettings
);

/// By-value setters of the optional fields of an overrides table: `with_field(value)` sets
/// `field` to `Some(value)`.
macro_rules! option_setters {
    ($ty:ident { $($(#[$doc:meta])* $setter:ident => $field:ident: $value:ty,)* }) => {
        impl $ty {
            $(
                $(#[$doc])*
                pub fn $setter(mut self, $field: $value) -> Self {
                    self.$field = Some($field);
                    self
                }
            )*
        }
    };
}

/// `over(base)` for a settings table: each field left unset is taken from `base`, the tier
/// below (a tool's settings over the layer's, the layer's over the built-in defaults).
macro_rules! settings_over {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl $ty {
            /// These settings, each one left unset taken from `base`.
            pub(crate) fn over(mut self, base: &$ty) -> $ty {
                $(
                    if self.$field.is_none() {
                        self.$field = base.$field.clone();
                    }
                )*
                self
            }
        }
    };
}

/// The error for a field of a layer's settings that a tool's policy sets but that only the
/// whole layer has.
fn layer_wide<T>(field: &str, value: &Option<T>) -> Result<(), ConfigError> {
    match value {
        Some(_) => Err(layer_wide_error(field)),
        None => Ok(()),
    }
}

fn layer_wide_error(field: &str) -> ConfigError {
    ConfigError::new(
        field,
        "is set for the whole layer, in the layer's settings, not in a tool's policy; remove it here",
    )
}

fn at_least<N: PartialOrd + fmt::Display + Copy>(
    field: &str,
    value: Option<N>,
    min: N,
) -> Result<(), ConfigError> {
    match value {
        Some(v) if v < min => Err(ConfigError::new(
            field,
            format!("must be at least {min}, got {v}"),
        )),
        _ => Ok(()),
    }
}

fn at_most<N: PartialOrd + fmt::Display + Copy>(
    field: &str,
    value: Option<N>,
    max: N,
) -> Result<(), ConfigError> {
    match value {
        Some(v) if v > max => Err(ConfigError::new(
            field,
            format!("must be at most {max}, got {v}"),
        )),
        _ => Ok(()),
    }
}

/// The settings of `EnvelopeValidateLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `validate` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ValidateSettings {
    /// Largest params, in bytes of canonical JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_params_bytes: Option<usize>,
    /// Check the tool's output against its output schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_output: Option<bool>,
}

option_setters!(ValidateSettings {
    /// Sets the largest params, in bytes of canonical JSON.
    with_max_params_bytes => max_params_bytes: usize,
    /// Sets whether the tool's output is checked against its output schema.
    with_check_output => check_output: bool,
});

impl ValidateSettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("max_params_bytes", self.max_params_bytes, 2)
    }
}

/// What the loop detector does when it finds a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoopMode {
    /// Refuse the call with `LOOP_DETECTED`.
    Break,
    /// Refuse the first time with advice to change approach; break if the next call repeats.
    #[serde(alias = "chance")]
    ChanceThenBreak,
}

/// The settings of `LoopDetectLayer`: one table for every tier, the layer's own (its
/// builder's `settings`), a model's (the builder's `model`), a tool's (`policy.loop_detect`)
/// and a session's (set at run time through the layer's handle or the in-chat commands).
///
/// Every field is optional: an unset one falls back, each on its own, from the session to
/// the tool, the model, the layer and then the built-in default its doc gives. A session and
/// a model set only the first six (`enabled`, `max_repeats`, `ttl_secs`, `mode`,
/// `max_failures`, `poll_budget_secs`); a tool sets those and `poller` and `ignore_members`;
/// the fields from `cycles` on are the whole layer's, and a tool's policy that sets one is
/// refused.
///
/// A tool that writes (sending a message, filing an issue) and must not repeat gets a lower
/// `max_repeats`, so that the second identical call in a row is refused:
///
/// ```
/// use tower_toolcall::registry::{LoopDetectSettings, ToolPolicy};
///
/// let policy: ToolPolicy = serde_json::from_str(
///     r#"{"loop_detect": {"max_repeats": 2, "ignore_members": ["requestId", "sentAt"]}}"#,
/// ).unwrap();
/// let loops = policy.loop_detect.overrides().unwrap();
/// assert_eq!(loops.max_repeats, Some(2));
/// assert_eq!(loops.ignore_members.as_deref(), Some(&["requestId".to_owned(), "sentAt".to_owned()][..]));
///
/// let mut writes = LoopDetectSettings::default();
/// writes.max_repeats = Some(2);
/// assert!(ToolPolicy::default().with_loop_detect(writes).check().is_ok());
///
/// // The layer's bounds are not a tool's.
/// let mut wide = LoopDetectSettings::default();
/// wide.max_sessions = Some(10);
/// let err = ToolPolicy::default().with_loop_detect(wide).check().unwrap_err();
/// assert_eq!(err.field(), "loop_detect.max_sessions");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LoopDetectSettings {
    /// Whether calls are tracked at all (default `true`). Off, the layer keeps no history
    /// for the call and lets it through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Identical consecutive calls that make a loop (default 4: the call that would be the
    /// 4th is not run); from 2 to 1000, as the history of a session grows with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<u32>,
    /// How long a call is remembered, in seconds (default 120); at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// What happens when a loop is found (default [`LoopMode::Break`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LoopMode>,
    /// Identical calls in a row that make a loop when each earlier one failed with the same
    /// error code (default 4: the 4th identical call after three identical failures is not
    /// run); from 2 to 1000. Unlike the repeat rule, this one holds however far apart the
    /// failures came. A tool's, model's or session's value applies the rule even when the
    /// layer switches it off (`repeated_failures`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
    /// How long, in seconds, a patient poll's answer may stay the same before the poll is a
    /// loop (default 600); `0`: without end. At most 31 536 000 (a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_budget_secs: Option<u64>,
    /// Whether the tool's answers decide whether a call repeats: an identical call whose
    /// answer changed is progress. Read-only tools and tools that run commands are judged
    /// so by default; `true` makes another tool (e.g. `job.status` registered as `writes`)
    /// judged so, `false` judges such a tool on its arguments alone. Set for the layer, it
    /// applies to every tool whose policy does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poller: Option<bool>,
    /// Members ignored, at any depth, when calls and answers are compared (per-call noise:
    /// request ids, nonces, client timestamps; default `DEFAULT_IGNORED_MEMBERS` of
    /// `tower_toolcall::loop_detect`). A tool's list replaces the layer's for the tool; an
    /// empty list ignores nothing. Idempotency keys and the canonical form keep them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_members: Option<Vec<String>>,
    /// Whole layer: whether cycles of different calls (A,B,A,B,… or A,B,C,A,B,C,…) are loops
    /// too (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles: Option<bool>,
    /// Whole layer: full repetitions of a cycle that make a loop (default 3: the call that
    /// would complete the 3rd repetition is not run); from 2 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_repetitions: Option<u32>,
    /// Whole layer: the longest cycle looked for, in calls (default 5); from 2 to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cycle_length: Option<usize>,
    /// Whole layer: whether the same call failing with the same error code in a row is a
    /// loop, even below `max_repeats` (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated_failures: Option<bool>,
    /// Whole layer: the least wait of a retry with back-off, in milliseconds (default
    /// 1 000; `0`: no retry is one). An identical call after identical failures, each wait
    /// since the previous try at least 1.5 times the one before and the last at least this
    /// long, is the caller's own retry, not a loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_backoff_ms: Option<u64>,
    /// Whole layer: how far apart, on average, unchanged answers of a read must come to be a
    /// patient poll, in milliseconds (default 28 000). A read repeated faster with the same
    /// answer is a loop at `max_repeats`; a patient poll only once its answer stayed the
    /// same for `poll_budget_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patient_poll_gap_ms: Option<u64>,
    /// Whole layer: whether identical calls of read-only tools and pollers count only while
    /// their answers stay the same (default `true`). Off, every tool is judged on its
    /// arguments alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_aware_polling: Option<bool>,
    /// Whole layer: the most sessions tracked at once (default 100 000); beyond it, the
    /// least recently used session is evicted. The same bound applies to sessions with
    /// settings. At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<usize>,
    /// Whole layer: the most bytes the tracked sessions take, by their approximate size in
    /// memory, their keys and histories (default 67 108 864, 64 MiB); at least 65 536
    /// (64 KiB). Beyond it, the least recently used sessions are evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_session_bytes: Option<usize>,
}

option_setters!(LoopDetectSettings {
    /// Sets whether calls are tracked.
    with_enabled => enabled: bool,
    /// Sets the identical consecutive calls that make a loop.
    with_max_repeats => max_repeats: u32,
    /// Sets how long a call is remembered, in seconds.
    with_ttl_secs => ttl_secs: u64,
    /// Sets what happens when a loop is found.
    with_mode => mode: LoopMode,
    /// Sets the identical calls after identical failures that make a loop.
    with_max_failures => max_failures: u32,
    /// Sets how long a patient poll's answer may stay the same, in seconds (`0`: no end).
    with_poll_budget_secs => poll_budget_secs: u64,
    /// Sets whether the tool's answers decide whether a call repeats.
    with_poller => poller: bool,
    /// Sets the members ignored when calls and answers are compared.
    with_ignore_members => ignore_members: Vec<String>,
    /// Sets whether cycles of different calls are loops (whole layer only).
    with_cycles => cycles: bool,
    /// Sets the repetitions of a cycle that make a loop (whole layer only).
    with_cycle_repetitions => cycle_repetitions: u32,
    /// Sets the longest cycle looked for (whole layer only).
    with_max_cycle_length => max_cycle_length: usize,
    /// Sets whether repeated identical failures are a loop (whole layer only).
    with_repeated_failures => repeated_failures: bool,
    /// Sets the least wait of a retry with back-off, in milliseconds (whole layer only).
    with_min_backoff_ms => min_backoff_ms: u64,
    /// Sets the gap of a patient poll, in milliseconds (whole layer only).
    with_patient_poll_gap_ms => patient_poll_gap_ms: u64,
    /// Sets whether answers decide repeats of reads and pollers (whole layer only).
    with_result_aware_polling => result_aware_polling: bool,
    /// Sets the most sessions tracked at once (whole layer only).
    with_max_sessions => max_sessions: usize,
    /// Sets the most bytes the tracked sessions take (whole layer only).
    with_max_session_bytes => max_session_bytes: usize,
});

settings_over!(LoopDetectSettings {
    enabled,
    max_repeats,
    ttl_secs,
    mode,
    max_failures,
    poll_budget_secs,
    poller,
    ignore_members,
    cycles,
    cycle_repetitions,
    max_cycle_length,
    repeated_failures,
    min_backoff_ms,
    patient_poll_gap_ms,
    result_aware_polling,
    max_sessions,
    max_session_bytes,
});

impl LoopDetectSettings {
    /// The fields only the whole layer has, each with whether it is set. A new field is a
    /// compile error here until it is placed.
    pub(crate) fn layer_wide_fields(&self) -> [(&'static str, bool); 9] {
        let LoopDetectSettings {
            enabled: _,
            max_repeats: _,
            ttl_secs: _,
            mode: _,
            max_failures: _,
            poll_budget_secs: _,
            poller: _,
            ignore_members: _,
            cycles,
            cycle_repetitions,
            max_cycle_length,
            repeated_failures,
            min_backoff_ms,
            patient_poll_gap_ms,
            result_aware_polling,
            max_sessions,
            max_session_bytes,
        } = self;
        [
            ("cycles", cycles.is_some()),
            ("cycle_repetitions", cycle_repetitions.is_some()),
            ("max_cycle_length", max_cycle_length.is_some()),
            ("repeated_failures", repeated_failures.is_some()),
            ("min_backoff_ms", min_backoff_ms.is_some()),
            ("patient_poll_gap_ms", patient_poll_gap_ms.is_some()),
            ("result_aware_polling", result_aware_polling.is_some()),
            ("max_sessions", max_sessions.is_some()),
            ("max_session_bytes", max_session_bytes.is_some()),
        ]
    }
}

/// A tool's loop settings: the whole layer's fields are refused, and the lower bounds
/// checked; the layer checks the upper bounds when it is built.
impl ToolSettings for LoopDetectSettings {
    fn check_tool(&self) -> Result<(), ConfigError> {
        if let Some((field, _)) = self.layer_wide_fields().into_iter().find(|(_, set)| *set) {
            return Err(layer_wide_error(field));
        }
        at_least("max_repeats", self.max_repeats, 2)?;
        at_least("max_failures", self.max_failures, 2)?;
        at_least("ttl_secs", self.ttl_secs, 1)?;
        if let Some(index) = self
            .ignore_members
            .iter()
            .flatten()
            .position(|name| name.is_empty())
        {
            return Err(ConfigError::new(
                format!("ignore_members[{index}]"),
                "must be a member name, got an empty string",
            ));
        }
        Ok(())
    }
}

/// What a rate limit is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RateLimitKey {
    /// One quota per tool.
    Tool,
    /// One quota per tool and tenant.
    ToolTenant,
    /// One quota per tool and session.
    ToolSession,
    /// One quota per tool and actor (within its tenant): with an edge that authenticates
    /// its callers, one quota per tool and principal.
    ToolActor,
}

/// What happens to a call over the quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnLimit {
    /// Fail with `RATE_LIMITED` (retriable, with a retry-after hint).
    Reject,
    /// Wait until the quota allows the call.
    Wait,
}

/// The settings of `RateLimitLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `rate_limit` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimitSettings {
    /// Calls per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
    /// Calls allowed at once above the steady rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// What the quota is keyed by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<RateLimitKey>,
    /// What happens over the quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_limit: Option<OnLimit>,
    /// With `on_limit = "wait"`: the longest wait, in milliseconds; a call that would wait
    /// longer is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// Whole layer only: the keys each tool's in-process limiter holds at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<usize>,
    /// Whole layer only: how often every in-process limiter drops its idle keys, in
    /// milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_interval_ms: Option<u64>,
}

option_setters!(RateLimitSettings {
    /// Sets the calls per second.
    with_per_second => per_second: u32,
    /// Sets the calls allowed at once above the steady rate.
    with_burst => burst: u32,
    /// Sets what the quota is keyed by.
    with_key => key: RateLimitKey,
    /// Sets what happens over the quota.
    with_on_limit => on_limit: OnLimit,
    /// Sets the longest wait with `on_limit = "wait"`, in milliseconds.
    with_max_wait_ms => max_wait_ms: u64,
    /// Sets the keys each tool's limiter holds at most (whole layer only).
    with_max_keys => max_keys: usize,
    /// Sets how often idle keys are dropped, in milliseconds (whole layer only).
    with_sweep_interval_ms => sweep_interval_ms: u64,
});

settings_over!(RateLimitSettings {
    per_second,
    burst,
    key,
    on_limit,
    max_wait_ms,
    max_keys,
    sweep_interval_ms
});

impl RateLimitSettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("per_second", self.per_second, 1)?;
        at_least("burst", self.burst, 1)?;
        at_least("max_wait_ms", self.max_wait_ms, 1)?;
        at_least("max_keys", self.max_keys, 1)?;
        at_least("sweep_interval_ms", self.sweep_interval_ms, 1)
    }
}

impl ToolSettings for RateLimitSettings {
    fn check_tool(&self) -> Result<(), ConfigError> {
        layer_wide("max_keys", &self.max_keys)?;
        layer_wide("sweep_interval_ms", &self.sweep_interval_ms)?;
        self.check()
    }
}

/// What a reused idempotency key with other params means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParamsMismatch {
    /// Fail with `IDEMPOTENCY_KEY_REUSED` (the default).
    Conflict,
    /// Treat the call as having a key of its own.
    Independent,
}

/// What the idempotency layer does with a call when its dedupe store cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnStoreError {
    /// Refuse the call with `STORE_UNAVAILABLE`; the tool does not run (the default).
    FailClosed,
    /// Run the tool without deduplication.
    FailOpen,
}

/// The settings of `IdempotencyLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `idempotency` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct IdempotencySettings {
    /// Key scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<KeyScope>,
    /// Dedupe mode when the call does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_mode: Option<DedupeMode>,
    /// Derive a key from the params when the call has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_key: Option<bool>,
    /// How long a completed result is kept, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ttl_ms: Option<u64>,
    /// How long a failure is kept, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_ttl_ms: Option<u64>,
    /// How long a completed result answers a re-send under a derived key, in milliseconds
    /// (tools that are not read-only); `0` turns reuse off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_window_ms: Option<u64>,
    /// How long a read-only tool's completed result answers the same read under a derived
    /// key, in milliseconds; unset: the read runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_cache_ttl_ms: Option<u64>,
    /// The in-flight lease, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight_lease_ms: Option<u64>,
    /// What a reused key with other params means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_params_mismatch: Option<ParamsMismatch>,
    /// What happens to a call when the dedupe store cannot be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_error: Option<OnStoreError>,
    /// Whether a call's `transport.dedupeMode` may loosen the tool's mode (`bestEffort`
    /// under `enforced`, or `disabled`); by default it may only make it stricter, and a
    /// looser request is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers_may_loosen: Option<bool>,
}

option_setters!(IdempotencySettings {
    /// Sets the key scope.
    with_scope => scope: KeyScope,
    /// Sets the dedupe mode when the call does not say.
    with_dedupe_mode => dedupe_mode: DedupeMode,
    /// Sets whether a key is derived from the params when the call has none.
    with_derive_key => derive_key: bool,
    /// Sets how long a completed result is kept, in milliseconds.
    with_done_ttl_ms => done_ttl_ms: u64,
    /// Sets how long a failure is kept, in milliseconds.
    with_failed_ttl_ms => failed_ttl_ms: u64,
    /// Sets the re-send window of derived keys, in milliseconds (`0`: off).
    with_resend_window_ms => resend_window_ms: u64,
    /// Sets how long a read-only tool's result answers the same read, in milliseconds.
    with_read_cache_ttl_ms => read_cache_ttl_ms: u64,
    /// Sets the in-flight lease, in milliseconds.
    with_inflight_lease_ms => inflight_lease_ms: u64,
    /// Sets what a reused key with other params means.
    with_on_params_mismatch => on_params_mismatch: ParamsMismatch,
    /// Sets what happens to a call when the dedupe store cannot be used.
    with_on_store_error => on_store_error: OnStoreError,
    /// Sets whether a call's `transport.dedupeMode` may loosen the tool's mode.
    with_callers_may_loosen => callers_may_loosen: bool,
});

impl IdempotencySettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("done_ttl_ms", self.done_ttl_ms, 1)?;
        at_least("failed_ttl_ms", self.failed_ttl_ms, 1)?;
        at_least("read_cache_ttl_ms", self.read_cache_ttl_ms, 1)?;
        at_least("inflight_lease_ms", self.inflight_lease_ms, 1)
    }
}

/// How the delay before a retry is randomized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JitterKind {
    /// `random(0, backoff)`.
    Full,
    /// `backoff / 2 + random(0, backoff / 2)`.
    Equal,
    /// `random(base, previous * 3)`, capped.
    Decorrelated,
    /// `backoff ± jitter_percent`.
    Percent,
}

/// The settings of `RetryLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `retry` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RetrySettings {
    /// Attempts in all, the first included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Base of the exponential backoff, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay_ms: Option<u64>,
    /// Cap of one backoff, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    /// Time for all attempts and sleeps, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Jitter kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<JitterKind>,
    /// Spread of `percent` jitter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_percent: Option<u32>,
    /// The tool forwards the call's idempotency key to its upstream, which honours it: a
    /// call that carries a key may be retried even when the tool is mutating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwards_idempotency_key: Option<bool>,
    /// Hedging: how long an attempt runs before a second one is sent beside it, in
    /// milliseconds (at least 1). Only a call whose repeat is safe is hedged; off unless
    /// this or `hedge_percentile` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge_delay_ms: Option<u64>,
    /// Hedging: the delay is this percentile (1 to 99) of the tool's recent latencies;
    /// `hedge_delay_ms`, when set, applies until enough calls were seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge_percentile: Option<u32>,
}

option_setters!(RetrySettings {
    /// Sets the attempts in all, the first included.
    with_max_attempts => max_attempts: u32,
    /// Sets the base of the exponential backoff, in milliseconds.
    with_base_delay_ms => base_delay_ms: u64,
    /// Sets the cap of one backoff, in milliseconds.
    with_max_delay_ms => max_delay_ms: u64,
    /// Sets the time for all attempts and sleeps, in milliseconds.
    with_deadline_ms => deadline_ms: u64,
    /// Sets the jitter kind.
    with_jitter => jitter: JitterKind,
    /// Sets the spread of `percent` jitter.
    with_jitter_percent => jitter_percent: u32,
    /// Sets whether the tool forwards the call's idempotency key to an upstream that honours it.
    with_forwards_idempotency_key => forwards_idempotency_key: bool,
    /// Sets how long an attempt runs before it is hedged, in milliseconds.
    with_hedge_delay_ms => hedge_delay_ms: u64,
    /// Sets the percentile of the tool's recent latencies after which an attempt is hedged.
    with_hedge_percentile => hedge_percentile: u32,
});

impl RetrySettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("max_attempts", self.max_attempts, 1)?;
        at_least("deadline_ms", self.deadline_ms, 1)?;
        at_most("jitter_percent", self.jitter_percent, 100)?;
        at_least("hedge_delay_ms", self.hedge_delay_ms, 1)?;
        at_least("hedge_percentile", self.hedge_percentile, 1)?;
        at_most("hedge_percentile", self.hedge_percentile, 99)?;
        if let (Some(base), Some(cap)) = (self.base_delay_ms, self.max_delay_ms) {
            if cap < base {
                return Err(ConfigError::new(
                    "max_delay_ms",
                    format!("must not be below base_delay_ms ({base}), got {cap}"),
                ));
            }
        }
        Ok(())
    }
}

/// The settings of `CircuitBreakerLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `breaker` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BreakerSettings {
    /// Consecutive failures that open the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// Failure rate, in percent, that opens the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate_percent: Option<u32>,
    /// How many of the latest calls the rate is computed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_size: Option<u32>,
    /// Calls needed before the rate counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_calls: Option<u32>,
    /// The rolling window, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// How long the breaker stays open, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<u64>,
    /// Probes admitted at once when half-open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open_probes: Option<u32>,
    /// Consecutive successful probes that close the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_after_successes: Option<u32>,
    /// Whole layer only: how long a probe of a dependency or global breaker may go
    /// unanswered before it is abandoned as failed, in milliseconds (default 30 000; a
    /// tool's own breaker uses the tool's attempt timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_timeout_ms: Option<u64>,
    /// Whole layer only: how many breakers made on demand (for unregistered tools and
    /// namespaces) are kept at most (default 10 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_breakers: Option<u32>,
}

option_setters!(BreakerSettings {
    /// Sets the consecutive failures that open the breaker.
    with_consecutive_failures => consecutive_failures: u32,
    /// Sets the failure rate, in percent, that opens the breaker.
    with_failure_rate_percent => failure_rate_percent: u32,
    /// Sets how many of the latest calls the rate is computed over.
    with_sample_size => sample_size: u32,
    /// Sets the calls needed before the rate counts.
    with_min_calls => min_calls: u32,
    /// Sets the rolling window, in milliseconds.
    with_window_ms => window_ms: u64,
    /// Sets how long the breaker stays open, in milliseconds.
    with_cooldown_ms => cooldown_ms: u64,
    /// Sets the probes admitted at once when half-open.
    with_half_open_probes => half_open_probes: u32,
    /// Sets the consecutive successful probes that close the breaker.
    with_close_after_successes => close_after_successes: u32,
    /// Sets how long a probe may go unanswered, in milliseconds (whole layer only).
    with_probe_timeout_ms => probe_timeout_ms: u64,
    /// Sets how many breakers made on demand are kept (whole layer only).
    with_max_breakers => max_breakers: u32,
});

impl ToolSettings for BreakerSettings {
    fn check_tool(&self) -> Result<(), ConfigError> {
        layer_wide("probe_timeout_ms", &self.probe_timeout_ms)?;
        layer_wide("max_breakers", &self.max_breakers)?;
        self.check()
    }
}

impl BreakerSettings {
    /// Only the fields of the whole layer.
    pub(crate) fn layer_wide(&self) -> BreakerSettings {
        BreakerSettings {
            probe_timeout_ms: self.probe_timeout_ms,
            max_breakers: self.max_breakers,
            ..BreakerSettings::default()
        }
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("consecutive_failures", self.consecutive_failures, 1)?;
        at_least("failure_rate_percent", self.failure_rate_percent, 1)?;
        at_most("failure_rate_percent", self.failure_rate_percent, 100)?;
        at_least("sample_size", self.sample_size, 1)?;
        at_least("min_calls", self.min_calls, 1)?;
        at_least("window_ms", self.window_ms, 1)?;
        at_least("half_open_probes", self.half_open_probes, 1)?;
        at_least("close_after_successes", self.close_after_successes, 1)?;
        at_least("cooldown_ms", self.cooldown_ms, 1)?;
        at_least("probe_timeout_ms", self.probe_timeout_ms, 1)?;
        at_least("max_breakers", self.max_breakers, 1)?;
        if let (Some(min), Some(size)) = (self.min_calls, self.sample_size) {
            if min > size {
                return Err(ConfigError::new(
                    "min_calls",
                    format!("must not exceed sample_size ({size}), got {min}"),
                ));
            }
        }
        Ok(())
    }
}

/// The settings of `TimeoutLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `timeout` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TimeoutSettings {
    /// Time for one attempt, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// For a call whose answer streams: the longest gap between two chunks, in milliseconds;
    /// unset: the attempt timeout. The attempt timeout then bounds the wait for the first
    /// chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

option_setters!(TimeoutSettings {
    /// Sets the time for one attempt, in milliseconds.
    with_attempt_timeout_ms => attempt_timeout_ms: u64,
    /// Sets the longest gap between two chunks of a streamed answer, in milliseconds.
    with_idle_timeout_ms => idle_timeout_ms: u64,
});

settings_over!(TimeoutSettings {
    attempt_timeout_ms,
    idle_timeout_ms
});

impl TimeoutSettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("attempt_timeout_ms", self.attempt_timeout_ms, 1)?;
        at_least("idle_timeout_ms", self.idle_timeout_ms, 1)
    }
}

/// The settings of `BulkheadLayer`: the whole layer's, given to its builder's `settings`, or one
/// tool's, its policy's `bulkhead` section. Each field a tool leaves unset is the layer's; each the
/// layer leaves unset, the default its documentation gives.
///
/// ```
/// use tower_toolcall::registry::{BulkheadSettings, ToolPolicy};
///
/// let policy: ToolPolicy =
///     serde_json::from_str(r#"{"bulkhead": {"max_concurrent": 4, "max_queued": 16}}"#).unwrap();
/// let expected = BulkheadSettings::default().with_max_concurrent(4).with_max_queued(16);
/// assert_eq!(policy.bulkhead.overrides(), Some(&expected));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BulkheadSettings {
    /// Calls of the tool running at once, at least 1; unset: the tool is not limited (a tool
    /// whose policy tunes its bulkhead without it, over a layer that sets none, is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Calls of the tool waiting for a place at most, 0 for none (a call that finds every
    /// place taken is refused at once); unset: as many as `max_concurrent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u32>,
    /// The retry-after a refused call is given, in milliseconds; unset: 1 000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

option_setters!(BulkheadSettings {
    /// Sets the calls of the tool running at once.
    with_max_concurrent => max_concurrent: u32,
    /// Sets the calls of the tool waiting for a place at most.
    with_max_queued => max_queued: u32,
    /// Sets the retry-after a refused call is given, in milliseconds.
    with_retry_after_ms => retry_after_ms: u64,
});

settings_over!(BulkheadSettings {
    max_concurrent,
    max_queued,
    retry_after_ms
});

impl BulkheadSettings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        at_least("max_concurrent", self.max_concurrent, 1)?;
        at_least("retry_after_ms", self.retry_after_ms, 1)
    }
}

/// The class a tool gives errors that say nothing about themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UnclassifiedAs {
    /// Retry them.
    Retriable,
    /// Do not retry them.
    Terminal,
}

/// How one tool's errors are classified, over the defaults.
///
/// ```
/// use tower_toolcall::registry::ClassifyOverrides;
///
/// // "treat 503 as permanent for this tool"
/// let overrides: ClassifyOverrides =
///     serde_json::from_str(r#"{"terminal_http_statuses": [503]}"#).unwrap();
/// assert_eq!(overrides.terminal_http_statuses, vec![503]);
/// assert_eq!(overrides, ClassifyOverrides::default().with_terminal_http_statuses([503]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClassifyOverrides {
    /// Error codes that are retriable for this tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retriable_codes: Vec<String>,
    /// Error codes that are terminal for this tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminal_codes: Vec<String>,
    /// Upstream HTTP statuses that are retriable for this tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retriable_http_statuses: Vec<u16>,
    /// Upstream HTTP statuses that are terminal for this tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminal_http_statuses: Vec<u16>,
    /// The class of errors that say nothing; by default the tool's risk level decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unclassified: Option<UnclassifiedAs>,
}

impl ClassifyOverrides {
    /// Sets the error codes that are retriable for this tool (names such as `"TIMEOUT"`).
    pub fn with_retriable_codes<I, S>(mut self, codes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.retriable_codes = codes.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the error codes that are terminal for this tool (names such as `"CONFLICT"`).
    pub fn with_terminal_codes<I, S>(mut self, codes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.terminal_codes = codes.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the upstream HTTP statuses that are retriable for this tool.
    pub fn with_retriable_http_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.retriable_http_statuses = statuses.into_iter().collect();
        self
    }

    /// Sets the upstream HTTP statuses that are terminal for this tool.
    pub fn with_terminal_http_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.terminal_http_statuses = statuses.into_iter().collect();
        self
    }

    /// Sets the class of errors that say nothing.
    pub fn with_unclassified(mut self, unclassified: UnclassifiedAs) -> Self {
        self.unclassified = Some(unclassified);
        self
    }

    /// `true` when nothing is overridden.
    pub fn is_empty(&self) -> bool {
        *self == ClassifyOverrides::default()
    }

    fn check(&self) -> Result<(), ConfigError> {
        for (field, codes) in [
            ("retriable_codes", &self.retriable_codes),
            ("terminal_codes", &self.terminal_codes),
        ] {
            for (i, code) in codes.iter().enumerate() {
                if ErrorCode::parse(code).is_none() {
                    return Err(ConfigError::new(
                        format!("{field}[{i}]"),
                        format!("is not a known error code: {code:?}"),
                    ));
                }
            }
        }
        for (field, statuses) in [
            ("retriable_http_statuses", &self.retriable_http_statuses),
            ("terminal_http_statuses", &self.terminal_http_statuses),
        ] {
            for (i, status) in statuses.iter().enumerate() {
                if !(100..=599).contains(status) {
                    return Err(ConfigError::new(
                        format!("{field}[{i}]"),
                        format!("must be an HTTP status from 100 to 599, got {status}"),
                    ));
                }
            }
        }
        Ok(())
    }
}
