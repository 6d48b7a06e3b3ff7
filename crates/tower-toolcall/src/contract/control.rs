//! The operator's switches over every layer: the kill switch, breaker enforcement, key
//! derivation and shadow mode, read from the environment when the stack is built and
//! flippable at run time through a shared handle.
//!
//! | variable | values | effect |
//! |---|---|---|
//! | `TOOL_RELIABILITY_ENABLED` | `true` (default) / `false` | `false` makes every layer a pass-through: the tool sees exactly what the bare service would |
//! | `TOOL_RELIABILITY_OPEN_MODE` | `on` (default) / `off` | `off` keeps the breakers counting but never fails a call fast |
//! | `TOOL_RELIABILITY_DERIVE_IDEMPOTENCY` | `on` (default) / `off` | `off` uses only the keys callers or hooks give; none is derived from the params |
//! | `TOOL_RELIABILITY_SHADOW` | comma-separated `breaker`, `loop_detect`, `idempotency`, `rate_limit` | those layers compute, log and count their decisions but enforce none |
//! | `TOOL_RELIABILITY_ROLLOUT_PERCENT` | `0` to `100` (default `100`) | the share of sessions enforced; the others run every layer in shadow mode |
//!
//! A [`ReliabilityControl`] reaches the layers through the registry they are built from
//! ([`ToolRegistry::with_control`](crate::registry::ToolRegistry::with_control)); every
//! clone shares the same switches, so flipping one takes effect on the next call of every
//! layer. Each layer reads a switch per call with one relaxed atomic load.
//!
//! # What the switches do
//!
//! **Kill switch.** While [`is_enabled`](ReliabilityControl::is_enabled) is `false`, every
//! reliability layer — validation, loop detection, rate limit, idempotency, bulkhead, retry,
//! breaker, timeout — hands each call straight to its inner service and returns the inner
//! answer unchanged: nothing is validated, tracked, limited, stored, retried, counted or
//! timed. The
//! tool sees exactly what the bare service would, and the caller gets exactly the tool's
//! result. The [`TraceLayer`](crate::trace::TraceLayer) and the
//! [`ResultEnvelopeLayer`](crate::ResultEnvelopeLayer) go on observing and converting.
//!
//! **Breaker enforcement and breaker shadow.** With `TOOL_RELIABILITY_OPEN_MODE=off`, or
//! `breaker` in `TOOL_RELIABILITY_SHADOW` ([`breakers_fail_fast`](ReliabilityControl::breakers_fail_fast)
//! `false`), the breakers run their state machines exactly as when enforcing, half-open
//! probes included, but never fail a call: a call a breaker would have refused runs, its
//! outcome uncounted as if refused, noting `would_reject`; a failure that opens a breaker
//! notes `would_open`.
//!
//! **Key derivation.** With `TOOL_RELIABILITY_DERIVE_IDEMPOTENCY=off` the idempotency layer
//! deduplicates only calls with a caller's or a hook's key; a call with neither runs as it
//! is.
//!
//! **Shadow mode** of the other layers: the layer decides and keeps its state as when
//! enforcing, and the call runs:
//!
//! | layer | decisions noted | state kept |
//! |---|---|---|
//! | loop detection | `would_block` | the session's history, with the call remembered as refused |
//! | idempotency | `would_replay`, `would_join`, `would_conflict` | the store: the record that would have answered is left as it is; a call that finds its key free claims it and stores its result |
//! | rate limit | `would_limit`, `would_wait` | the quotas |
//!
//! **Gradual rollout.** With a [`rollout_percent`](ReliabilityControl::rollout_percent)
//! below 100, only that share of sessions is enforced; the calls of every other session run
//! the breaker, loop detection, idempotency and the rate limit in shadow mode, as if all four
//! were listed in `TOOL_RELIABILITY_SHADOW`. A stable hash of the tenant and the session key
//! decides ([`enforces`](ReliabilityControl::enforces)): a session gets the same answer on
//! every call and every replica, and a session enforced at 10 % stays enforced at 20 %.
//! Validation, retry and the timeout have no shadow mode and act on every call.
//!
//! Every decision goes into the call's record ([`CallRecord::shadow`](crate::CallRecord::shadow)),
//! in the order the layers decided, the earlier attempts' first for a retried call. The
//! `TraceLayer` logs each as an INFO event `tool_call_shadow`, counts it in
//! `tool_shadow_decisions_total{layer, decision}` and writes a `step.shadow` audit event
//! (see [`trace`](crate::trace)).
//!
//! ```
//! use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
//! use tower_toolcall::registry::ToolRegistry;
//!
//! let control = ReliabilityControl::from_lookup(|name| match name {
//!     "TOOL_RELIABILITY_SHADOW" => Some("breaker, rate_limit".to_owned()),
//!     _ => None,
//! })?;
//! assert!(control.is_enabled());
//! assert!(control.is_shadow(ShadowLayer::Breaker));
//! assert!(!control.is_shadow(ShadowLayer::Idempotency));
//!
//! let registry = ToolRegistry::open().with_control(control.clone());
//! // ... build the layers from `registry` ...
//! control.set_enabled(false); // every layer passes calls straight through from now on
//! assert!(!registry.control().is_enabled());
//! # Ok::<(), tower_toolcall::ConfigError>(())
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use crate::contract::envelope::ToolCall;
use crate::contract::error::ConfigError;
pub use crate::contract::record::ShadowLayer;

/// The variable of the kill switch.
const ENABLED_VAR: &str = "TOOL_RELIABILITY_ENABLED";
/// The variable of breaker enforcement.
const OPEN_MODE_VAR: &str = "TOOL_RELIABILITY_OPEN_MODE";
/// The variable of idempotency key derivation.
const DERIVE_IDEMPOTENCY_VAR: &str = "TOOL_RELIABILITY_DERIVE_IDEMPOTENCY";
/// The earlier name of `TOOL_RELIABILITY_DERIVE_IDEMPOTENCY`, still read (with a warning) when the
/// current name is unset.
const LEGACY_DERIVE_IDEMPOTENCY_VAR: &str = "TOOL_RELIABLE_DERIVE_IDEMPOTENCY";
/// The variable listing the layers in shadow mode.
const SHADOW_VAR: &str = "TOOL_RELIABILITY_SHADOW";
/// The variable of the share of sessions enforced, in percent.
const ROLLOUT_PERCENT_VAR: &str = "TOOL_RELIABILITY_ROLLOUT_PERCENT";

/// The shared switches over every layer. Cheap to clone: clones share the switches.
///
/// [`ReliabilityControl::new`] has everything on and enforced, the same as the default of
/// every registry; [`ReliabilityControl::from_env`] reads the variables listed in the
/// [module documentation](self).
#[derive(Clone)]
pub struct ReliabilityControl {
    switches: Arc<Switches>,
}

struct Switches {
    enabled: AtomicBool,
    breaker_enforced: AtomicBool,
    derive_idempotency_keys: AtomicBool,
    shadow: AtomicU8,
    rollout_percent: AtomicU8,
}

impl Default for ReliabilityControl {
    fn default() -> Self {
        ReliabilityControl::new()
    }
}

impl fmt::Debug for ReliabilityControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shadow: Vec<_> = ShadowLayer::ALL
            .into_iter()
            .filter(|l| self.is_shadow(*l))
            .map(ShadowLayer::as_str)
            .collect();
        f.debug_struct("ReliabilityControl")
            .field("enabled", &self.is_enabled())
            .field("breaker_enforced", &self.is_breaker_enforced())
            .field("derive_idempotency_keys", &self.derives_idempotency_keys())
            .field("shadow", &shadow)
            .field("rollout_percent", &self.rollout_percent())
            .finish()
    }
}

impl ReliabilityControl {
    /// Every layer on and enforcing.
    pub fn new() -> Self {
        ReliabilityControl {
            switches: Arc::new(Switches {
                enabled: AtomicBool::new(true),
                breaker_enforced: AtomicBool::new(true),
                derive_idempotency_keys: AtomicBool::new(true),
                shadow: AtomicU8::new(0),
                rollout_percent: AtomicU8::new(100),
            }),
        }
    }

    /// The switches as the process environment sets them; an unset variable keeps its
    /// default, a value that is not understood is refused naming the variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        ReliabilityControl::from_lookup(|name| std::env::var(name).ok())
    }

    /// The switches as `lookup` gives the variables (for configuration sources other than
    /// the process environment, and for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let control = ReliabilityControl::new();
        if let Some(value) = lookup(ENABLED_VAR) {
            control.set_enabled(parse_switch(ENABLED_VAR, &value)?);
        }
        if let Some(value) = lookup(OPEN_MODE_VAR) {
            control.set_breaker_enforced(parse_switch(OPEN_MODE_VAR, &value)?);
        }
        if let Some((name, value)) = derive_idempotency_setting(&lookup) {
            control.set_derive_idempotency_keys(parse_switch(name, &value)?);
        }
        if let Some(value) = lookup(SHADOW_VAR) {
            for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let layer = ShadowLayer::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
                    ConfigError::new(
                        SHADOW_VAR,
                        format!(
                            "lists {name:?}; name layers among `breaker`, `loop_detect`, \
                             `idempotency` and `rate_limit`, separated by commas"
                        ),
                    )
                })?;
                control.set_shadow(layer, true);
            }
        }
        if let Some(value) = lookup(ROLLOUT_PERCENT_VAR) {
            control.switches.rollout_percent.store(
                parse_percent(ROLLOUT_PERCENT_VAR, &value)?,
                Ordering::Relaxed,
            );
        }
        Ok(control)
    }

    /// Whether the layers do their work; `false` makes every one a pass-through.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.switches.enabled.load(Ordering::Relaxed)
    }

    /// Turns every layer on or into a pass-through, from the next call on.
    pub fn set_enabled(&self, enabled: bool) {
        self.switches.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether open breakers fail calls fast (`TOOL_RELIABILITY_OPEN_MODE`). A breaker in
    /// shadow mode never does, whatever this says.
    #[inline]
    pub fn is_breaker_enforced(&self) -> bool {
        self.switches.breaker_enforced.load(Ordering::Relaxed)
    }

    /// Whether open breakers fail calls fast: breaker enforcement is on and the breaker is
    /// not in shadow mode. When they do not, a breaker keeps its state machine as it would
    /// but lets every call through, noting `would_reject` and `would_open` in the records.
    ///
    /// ```
    /// use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
    ///
    /// let control = ReliabilityControl::new();
    /// assert!(control.breakers_fail_fast());
    /// control.set_shadow(ShadowLayer::Breaker, true);
    /// assert!(!control.breakers_fail_fast());
    /// control.set_shadow(ShadowLayer::Breaker, false);
    /// control.set_breaker_enforced(false);
    /// assert!(!control.breakers_fail_fast());
    /// ```
    #[inline]
    pub fn breakers_fail_fast(&self) -> bool {
        self.is_breaker_enforced() && !self.is_shadow(ShadowLayer::Breaker)
    }

    /// Turns breaker enforcement on or off, from the next call on.
    pub fn set_breaker_enforced(&self, enforced: bool) {
        self.switches
            .breaker_enforced
            .store(enforced, Ordering::Relaxed);
    }

    /// Whether the idempotency layer derives a key for calls that carry none
    /// (`TOOL_RELIABILITY_DERIVE_IDEMPOTENCY`).
    #[inline]
    pub fn derives_idempotency_keys(&self) -> bool {
        self.switches
            .derive_idempotency_keys
            .load(Ordering::Relaxed)
    }

    /// Turns key derivation on or off, from the next call on.
    pub fn set_derive_idempotency_keys(&self, derive: bool) {
        self.switches
            .derive_idempotency_keys
            .store(derive, Ordering::Relaxed);
    }

    /// Whether `layer` is in shadow mode.
    #[inline]
    pub fn is_shadow(&self, layer: ShadowLayer) -> bool {
        self.switches.shadow.load(Ordering::Relaxed) & bit(layer) != 0
    }

    /// Whether `layer` is in shadow mode for `call`: the layer is in shadow mode, or the
    /// call's session is outside the rollout ([`enforces`](Self::enforces)). Every layer
    /// with a shadow mode asks this before it enforces a decision.
    ///
    /// ```
    /// use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
    /// use tower_toolcall::ToolCall;
    ///
    /// let call = ToolCall::builder("web", "search").session("s-1").actor("u").build()?;
    /// let control = ReliabilityControl::new();
    /// assert!(!control.shadows(ShadowLayer::LoopDetect, &call));
    /// control.set_rollout_percent(0)?;
    /// assert!(control.shadows(ShadowLayer::LoopDetect, &call));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn shadows(&self, layer: ShadowLayer, call: &ToolCall) -> bool {
        self.is_shadow(layer) || !self.enforces(call)
    }

    /// Whether an open breaker fails `call` fast: [`breakers_fail_fast`](Self::breakers_fail_fast)
    /// and the call's session is inside the rollout.
    #[inline]
    pub fn breakers_fail_fast_for(&self, call: &ToolCall) -> bool {
        self.enforces_layer(ShadowLayer::Breaker, call)
    }

    /// Whether `layer` enforces its decisions on `call`: it is not in shadow mode for the
    /// call ([`shadows`](Self::shadows)), and for the breaker, breaker enforcement is on.
    #[inline]
    pub(crate) fn enforces_layer(&self, layer: ShadowLayer, call: &ToolCall) -> bool {
        let enforced = layer != ShadowLayer::Breaker || self.is_breaker_enforced();
        enforced && !self.shadows(layer, call)
    }

    /// The share of sessions enforced, from 0 to 100 (`TOOL_RELIABILITY_ROLLOUT_PERCENT`,
    /// 100 by default).
    #[inline]
    pub fn rollout_percent(&self) -> u8 {
        self.switches.rollout_percent.load(Ordering::Relaxed)
    }

    /// Enforces `percent` of the sessions from the next call on, the others running every
    /// layer in shadow mode. A percentage above 100 is refused and changes nothing.
    ///
    /// ```
    /// use tower_toolcall::control::ReliabilityControl;
    ///
    /// let control = ReliabilityControl::new();
    /// assert_eq!(control.rollout_percent(), 100);
    /// control.set_rollout_percent(10)?;
    /// assert_eq!(control.rollout_percent(), 10);
    /// assert!(control.set_rollout_percent(101).is_err());
    /// assert_eq!(control.rollout_percent(), 10);
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn set_rollout_percent(&self, percent: u8) -> Result<(), ConfigError> {
        if percent > 100 {
            return Err(ConfigError::new(
                "rollout_percent",
                format!("is {percent}; give a whole number from 0 to 100"),
            ));
        }
        self.switches
            .rollout_percent
            .store(percent, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `call` is enforced under the rollout: always at 100 %, never at 0 %, and in
    /// between for the sessions a stable hash of the tenant and session key puts inside the
    /// share ([`enforces_session`](Self::enforces_session)).
    #[inline]
    pub fn enforces(&self, call: &ToolCall) -> bool {
        self.enforces_session(call.tenant_id(), call.session_key())
    }

    /// Whether the session `session` of `tenant` is enforced under the rollout. The answer
    /// is the same for every call of the session, on every replica; raising the percentage
    /// only adds sessions.
    ///
    /// ```
    /// use tower_toolcall::control::ReliabilityControl;
    ///
    /// let control = ReliabilityControl::new();
    /// control.set_rollout_percent(10)?;
    /// let enforced = (0..1000)
    ///     .filter(|i| control.enforces_session(Some("acme"), &format!("session-{i}")))
    ///     .count();
    /// assert!((50..=150).contains(&enforced));
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn enforces_session(&self, tenant: Option<&str>, session: &str) -> bool {
        match self.rollout_percent() {
            0 => false,
            100.. => true,
            percent => rollout_bucket(tenant, session) < percent,
        }
    }

    /// Puts `layer` in or out of shadow mode, from the next call on.
    pub fn set_shadow(&self, layer: ShadowLayer, shadow: bool) {
        if shadow {
            self.switches.shadow.fetch_or(bit(layer), Ordering::Relaxed);
        } else {
            self.switches
                .shadow
                .fetch_and(!bit(layer), Ordering::Relaxed);
        }
    }
}

/// The bit of `layer` among the shadow switches.
const fn bit(layer: ShadowLayer) -> u8 {
    1 << layer as u8
}

/// The session's bucket in `0..100`: a rollout of `p` percent enforces the buckets below `p`.
///
/// FNV-1a over the tenant and the session key, then the finalizer of MurmurHash3: the same
/// on every platform, replica and release, unlike the standard library's hashers.
fn rollout_bucket(tenant: Option<&str>, session: &str) -> u8 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(PRIME);
        }
    };
    // A call without a tenant and one whose tenant is empty are different sessions.
    match tenant {
        Some(tenant) => {
            feed(&[1]);
            feed(tenant.as_bytes());
        }
        None => feed(&[0]),
    }
    feed(&[0xff]);
    feed(session.as_bytes());
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    (hash % 100) as u8
}

/// A whole number from 0 to 100.
fn parse_percent(variable: &str, value: &str) -> Result<u8, ConfigError> {
    let trimmed = value.trim();
    let trimmed = trimmed.strip_suffix('%').unwrap_or(trimmed).trim_end();
    match trimmed.parse::<u8>() {
        Ok(percent) if percent <= 100 => Ok(percent),
        _ => Err(ConfigError::new(
            variable,
            format!(
                "is {value:?}; set it to a whole number from 0 to 100, the percentage of \
                 sessions enforced (100, the default, enforces every session)"
            ),
        )),
    }
}

/// The variable that sets key derivation and its value: the current name, else the earlier
/// one, which is noted at WARN so that deployments move to the current name.
fn derive_idempotency_setting(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Option<(&'static str, String)> {
    if let Some(value) = lookup(DERIVE_IDEMPOTENCY_VAR) {
        return Some((DERIVE_IDEMPOTENCY_VAR, value));
    }
    let value = lookup(LEGACY_DERIVE_IDEMPOTENCY_VAR)?;
    tracing::warn!(
        variable = LEGACY_DERIVE_IDEMPOTENCY_VAR,
        replacement = DERIVE_IDEMPOTENCY_VAR,
        "`{LEGACY_DERIVE_IDEMPOTENCY_VAR}` is an earlier name: set `{DERIVE_IDEMPOTENCY_VAR}` instead"
    );
    Some((LEGACY_DERIVE_IDEMPOTENCY_VAR, value))
}

/// `true` / `false`, `on` / `off`, `1` / `0`, `yes` / `no`, in any case.
fn parse_switch(variable: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "1" | "yes" | "enabled" => Ok(true),
        "false" | "off" | "0" | "no" | "disabled" => Ok(false),
        _ => Err(ConfigError::new(
            variable,
            format!("is {value:?}; set it to `true` or `false` (or `on` / `off`)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn unset_variables_keep_everything_on() {
        let control = ReliabilityControl::from_lookup(|_| None).unwrap();
        assert!(control.is_enabled());
        assert!(control.is_breaker_enforced());
        assert!(control.derives_idempotency_keys());
        assert!(ShadowLayer::ALL.iter().all(|l| !control.is_shadow(*l)));
    }

    #[test]
    fn the_seed_variables_turn_their_switches_off() {
        let control = ReliabilityControl::from_lookup(lookup(&[
            ("TOOL_RELIABILITY_ENABLED", "false"),
            ("TOOL_RELIABILITY_OPEN_MODE", "off"),
            ("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY", "OFF"),
            ("TOOL_RELIABILITY_SHADOW", " loop_detect ,Idempotency,"),
        ]))
        .unwrap();
        assert!(!control.is_enabled());
        assert!(!control.is_breaker_enforced());
        assert!(!control.derives_idempotency_keys());
        assert!(control.is_shadow(ShadowLayer::LoopDetect));
        assert!(control.is_shadow(ShadowLayer::Idempotency));
        assert!(!control.is_shadow(ShadowLayer::Breaker));
        assert!(!control.is_shadow(ShadowLayer::RateLimit));
    }

    #[test]
    fn the_earlier_name_of_key_derivation_is_read_when_the_current_one_is_unset() {
        let legacy = lookup(&[("TOOL_RELIABLE_DERIVE_IDEMPOTENCY", "off")]);
        let control = ReliabilityControl::from_lookup(legacy).unwrap();
        assert!(!control.derives_idempotency_keys());

        let both = lookup(&[
            ("TOOL_RELIABLE_DERIVE_IDEMPOTENCY", "off"),
            ("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY", "on"),
        ]);
        let control = ReliabilityControl::from_lookup(both).unwrap();
        assert!(control.derives_idempotency_keys(), "the current name wins");

        let bad = lookup(&[("TOOL_RELIABLE_DERIVE_IDEMPOTENCY", "maybe")]);
        let error = ReliabilityControl::from_lookup(bad).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("TOOL_RELIABLE_DERIVE_IDEMPOTENCY"),
            "the error names the variable that was set: {error}"
        );
    }

    #[test]
    fn clones_share_the_switches() {
        let control = ReliabilityControl::new();
        let clone = control.clone();
        clone.set_enabled(false);
        clone.set_shadow(ShadowLayer::RateLimit, true);
        assert!(!control.is_enabled());
        assert!(control.is_shadow(ShadowLayer::RateLimit));
        clone.set_shadow(ShadowLayer::RateLimit, false);
        assert!(!control.is_shadow(ShadowLayer::RateLimit));
    }

    #[test]
    fn the_rollout_hash_is_the_same_everywhere() {
        // Fixed values: a release that changed them would move sessions in or out of a
        // rollout under way, differently on replicas of different releases.
        assert_eq!(rollout_bucket(None, "sess-1"), 2);
        assert_eq!(rollout_bucket(Some("acme"), "sess-1"), 52);
        assert_eq!(rollout_bucket(Some(""), ""), 84);
        assert_eq!(rollout_bucket(None, ""), 16);
        assert_eq!(rollout_bucket(Some("acme"), "session-0"), 97);
    }

    #[test]
    fn the_rollout_ends_enforce_all_or_nothing() {
        let control = ReliabilityControl::new();
        let sessions = || (0..200).map(|i| format!("s-{i}"));
        assert!(sessions().all(|s| control.enforces_session(None, &s)));
        control.set_rollout_percent(0).unwrap();
        assert!(sessions().all(|s| !control.enforces_session(None, &s)));
        assert!(
            format!("{control:?}").contains("rollout_percent: 0"),
            "{control:?}"
        );
    }

    #[test]
    fn values_not_understood_name_the_variable() {
        let err = ReliabilityControl::from_lookup(lookup(&[("TOOL_RELIABILITY_ENABLED", "nope")]))
            .unwrap_err();
        assert_eq!(err.field(), "TOOL_RELIABILITY_ENABLED");
        assert!(err.to_string().contains("\"nope\""), "{err}");

        let err = ReliabilityControl::from_lookup(lookup(&[("TOOL_RELIABILITY_SHADOW", "retry")]))
            .unwrap_err();
        assert_eq!(err.field(), "TOOL_RELIABILITY_SHADOW");
        assert!(err.to_string().contains("loop_detect"), "{err}");
    }
}
