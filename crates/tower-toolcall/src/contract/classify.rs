//! One classifier of call outcomes, shared by every layer.
//!
//! [`RetryLayer`](crate::RetryLayer) asks it whether another attempt may succeed,
//! [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) whether an outcome speaks of the
//! dependency's health, and tracing whether to report a failure. They all ask the same
//! [`Classify`] implementation, so that a tool's errors mean one thing everywhere. A layer that
//! classifies a failure writes the verdict into the error's [class](ErrorClass), so that the
//! trace, the idempotency record and the [`ToolResult`](crate::ToolResult) envelope say what
//! the classifier decided for that tool; an error no layer classified is reported with the
//! [`DefaultClassifier`]'s verdict for a tool nothing is known about.
//!
//! An outcome gets a [`Verdict`] and a reason code:
//!
//! - [`Verdict::Success`]: the tool answered.
//! - [`Verdict::Retriable`]: a transient failure; another attempt may succeed.
//! - [`Verdict::Terminal`]: another attempt fails the same way.
//! - [`Verdict::Ignored`]: not an outcome of the tool at all, but a layer that rejected the
//!   call (`CIRCUIT_OPEN`, `LOOP_DETECTED`, an idempotency conflict, a cancellation, or any
//!   [rejected](ToolError::is_rejected) call: a layer's rejection made by
//!   [`ToolError::rejected`], or a hook's denial). It is neither retried nor counted by a
//!   breaker. A tool's own "not processed" errors (connection refused, 429, 503) are outcomes
//!   of the tool: they are classified like any other error.
//!
//! [`DefaultClassifier`] decides an error, in this order:
//!
//! 1. the ignored codes ([`IGNORED_CODES`]) and [rejected](ToolError::is_rejected) calls → ignored;
//! 2. the tool's overrides from the registry ([`ClassifyOverrides`](crate::registry::ClassifyOverrides)): HTTP statuses first, then
//!    error codes ("treat 503 as terminal for this tool");
//! 3. the error's own [`ErrorClass`], when it is retriable or terminal (the constructors of
//!    [`ToolError`] set it from the default lists);
//! 4. for an unclassified error with an HTTP status, the default lists
//!    [`RETRIABLE_HTTP_STATUSES`] and [`TERMINAL_HTTP_STATUSES`];
//! 5. what is left: the tool's `classify.unclassified` override, else retriable for read-only
//!    or idempotent tools and terminal for mutating ones.
//!
//! A breaker counts only failures that speak of the dependency's health: every retriable
//! failure, and terminal failures that are not the caller's fault. Caller faults are the
//! codes in [`CALLER_FAULT_CODES`] and upstream 4xx answers other than 408 and 429. A
//! throttle ([`is_throttle`]: HTTP 429, or `RATE_LIMITED` from the tool) is retriable, its
//! `Retry-After` honoured, but says nothing about the dependency's health: a tool that is
//! merely rate limited is not reported as down. An error that says itself whether it
//! speaks of the dependency's health ([`ToolError::with_health_failure`]: an MCP result
//! with `isError`, a failure an adapter counted on its own breaker) is taken at its word.
//!
//! A custom classifier is any [`Classify`] implementation, closures included; it may fall
//! back on [`DefaultClassifier`]:
//!
//! ```
//! use tower_toolcall::classify::{Classification, Classify, DefaultClassifier, Verdict};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolPolicy};
//! use tower_toolcall::classify::ToolProfile;
//! use tower_toolcall::{ToolError, ToolOutput};
//!
//! // A tool whose "ok" answers can carry an error flag.
//! let classifier = |outcome: &Result<ToolOutput, ToolError>, tool: &ToolProfile| match outcome {
//!     Ok(out) if out.content["status"] == "busy" => Classification::retriable("TOOL_BUSY"),
//!     _ => DefaultClassifier.classify(outcome, tool),
//! };
//! let tool = ToolProfile::new(
//!     Some(&ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)),
//!     &ToolPolicy::default(),
//! );
//! let busy = Ok(ToolOutput::new(serde_json::json!({"status": "busy"})));
//! assert_eq!(classifier.classify(&busy, &tool).verdict(), Verdict::Retriable);
//! let down = Err(ToolError::from_http_status(503, "backend down"));
//! assert_eq!(classifier.classify(&down, &tool).reason(), "UPSTREAM_UNAVAILABLE");
//! ```

use std::fmt;
use std::sync::Arc;

use crate::contract::error::{ErrorClass, ErrorCode, ToolError};
use crate::contract::outcome::ToolOutput;
use crate::contract::registry::{RiskLevel, ToolDescriptor, ToolPolicy, UnclassifiedAs};

/// Upstream HTTP statuses that are retriable unless the error or the tool says otherwise.
pub const RETRIABLE_HTTP_STATUSES: [u16; 6] = [408, 429, 500, 502, 503, 504];

/// Upstream HTTP statuses that are terminal unless the error or the tool says otherwise.
pub const TERMINAL_HTTP_STATUSES: [u16; 6] = [400, 401, 403, 404, 413, 422];

/// Codes of errors that a layer answers with instead of calling the tool; they are neither
/// retried nor counted by a breaker.
pub const IGNORED_CODES: [ErrorCode; 5] = [
    ErrorCode::CircuitOpen,
    ErrorCode::LoopDetected,
    ErrorCode::IdempotencyInFlight,
    ErrorCode::IdempotencyKeyReused,
    ErrorCode::Cancelled,
];

/// Codes that say the call itself was wrong, not the dependency: a breaker does not count
/// them.
pub const CALLER_FAULT_CODES: [ErrorCode; 6] = [
    ErrorCode::ValidationError,
    ErrorCode::PolicyDenied,
    ErrorCode::NotFound,
    ErrorCode::Conflict,
    ErrorCode::PreconditionFailed,
    ErrorCode::PayloadTooLarge,
];

/// The reason code of a success.
pub const SUCCESS_REASON: &str = "OK";

/// What an outcome means for the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// The tool answered.
    Success,
    /// A transient failure: another attempt may succeed.
    Retriable,
    /// A permanent failure: another attempt fails the same way.
    Terminal,
    /// Not an outcome of the tool: the call was rejected. Neither retried nor counted.
    Ignored,
}

/// Which rule of the classifier decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Basis {
    /// The outcome is a success.
    Success,
    /// An ignored code, or a [rejected](ToolError::is_rejected) call.
    Rejected,
    /// The tool's `classify` overrides in the registry.
    ToolOverride,
    /// The error's own class.
    ErrorClass,
    /// The default lists of HTTP statuses.
    DefaultList,
    /// The error said nothing; the tool's risk level (or its `unclassified` override) decided.
    Unclassified,
    /// A custom classifier.
    Custom,
}

/// The verdict on one outcome, its reason code, and whether it counts against the
/// dependency's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    verdict: Verdict,
    reason: &'static str,
    health_failure: bool,
    basis: Basis,
}

impl Classification {
    /// A success.
    pub const fn success() -> Self {
        Classification {
            verdict: Verdict::Success,
            reason: SUCCESS_REASON,
            health_failure: false,
            basis: Basis::Success,
        }
    }

    /// A retriable failure with `reason`; it counts against the dependency's health.
    pub const fn retriable(reason: &'static str) -> Self {
        Classification {
            verdict: Verdict::Retriable,
            reason,
            health_failure: true,
            basis: Basis::Custom,
        }
    }

    /// A terminal failure with `reason`; by default it does not count against the
    /// dependency's health (see [`with_health_failure`](Classification::with_health_failure)).
    pub const fn terminal(reason: &'static str) -> Self {
        Classification {
            verdict: Verdict::Terminal,
            reason,
            health_failure: false,
            basis: Basis::Custom,
        }
    }

    /// An outcome that is not the tool's: neither retried nor counted.
    pub const fn ignored(reason: &'static str) -> Self {
        Classification {
            verdict: Verdict::Ignored,
            reason,
            health_failure: false,
            basis: Basis::Custom,
        }
    }

    /// Says whether a failure counts against the dependency's health (a breaker counts it).
    /// Successes and ignored outcomes never do.
    pub const fn with_health_failure(mut self, counts: bool) -> Self {
        self.health_failure =
            counts && matches!(self.verdict, Verdict::Retriable | Verdict::Terminal);
        self
    }

    const fn by(mut self, basis: Basis) -> Self {
        self.basis = basis;
        self
    }

    /// The verdict.
    pub const fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The reason code: [`SUCCESS_REASON`] for a success, the error code otherwise (or what a
    /// custom classifier chose).
    pub const fn reason(&self) -> &'static str {
        self.reason
    }

    /// `true` when a breaker counts the outcome as a failure of the dependency.
    pub const fn is_health_failure(&self) -> bool {
        self.health_failure
    }

    /// Which rule decided.
    pub const fn basis(&self) -> Basis {
        self.basis
    }

    /// `true` for [`Verdict::Retriable`].
    pub const fn is_retriable(&self) -> bool {
        matches!(self.verdict, Verdict::Retriable)
    }

    /// `error` with its [class](ErrorClass) set to this verdict on it, so that the layers
    /// outside, the trace, the idempotency record and the result envelope all read what the
    /// classifier decided. The verdict on a success or an ignored outcome leaves the error as
    /// it is.
    pub(crate) fn settle(&self, error: ToolError) -> ToolError {
        match self.verdict {
            Verdict::Retriable => error.with_class(ErrorClass::Retriable),
            Verdict::Terminal => error.with_class(ErrorClass::Terminal),
            Verdict::Success | Verdict::Ignored => error,
        }
    }
}

/// What the classifier knows about a tool: its risk, whether it is idempotent, and its
/// `classify` overrides, compiled once when a layer is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolProfile {
    risk: Option<RiskLevel>,
    idempotent: bool,
    retriable_codes: Vec<ErrorCode>,
    terminal_codes: Vec<ErrorCode>,
    retriable_statuses: Vec<u16>,
    terminal_statuses: Vec<u16>,
    unclassified: Verdict,
}

impl ToolProfile {
    /// The profile of a registered tool (`Some(descriptor)`) or of an unregistered one
    /// (`None`), with `policy`'s `classify` overrides.
    ///
    /// Nothing vouches for an unregistered tool: it is treated as mutating and not
    /// idempotent.
    pub fn new(descriptor: Option<&ToolDescriptor>, policy: &ToolPolicy) -> Self {
        let overrides = &policy.classify;
        let risk = descriptor.map(|d| d.risk);
        let idempotent = descriptor.is_some_and(|d| d.idempotent);
        let codes = |list: &[String]| list.iter().filter_map(|c| ErrorCode::parse(c)).collect();
        let unclassified = match overrides.unclassified {
            Some(UnclassifiedAs::Retriable) => Verdict::Retriable,
            Some(UnclassifiedAs::Terminal) => Verdict::Terminal,
            None if idempotent || risk == Some(RiskLevel::ReadOnly) => Verdict::Retriable,
            None => Verdict::Terminal,
        };
        ToolProfile {
            risk,
            idempotent,
            retriable_codes: codes(&overrides.retriable_codes),
            terminal_codes: codes(&overrides.terminal_codes),
            retriable_statuses: overrides.retriable_http_statuses.clone(),
            terminal_statuses: overrides.terminal_http_statuses.clone(),
            unclassified,
        }
    }

    /// The tool's risk level; `None` for an unregistered tool.
    pub fn risk(&self) -> Option<RiskLevel> {
        self.risk
    }

    /// `true` unless the tool is registered as read-only.
    pub fn is_mutating(&self) -> bool {
        self.risk.is_none_or(RiskLevel::is_mutating)
    }

    /// `true` when the tool is registered as idempotent.
    pub fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    /// The verdict on errors that say nothing about themselves.
    pub fn unclassified(&self) -> Verdict {
        self.unclassified
    }

    fn overridden(&self, error: &ToolError) -> Option<Verdict> {
        if let Some(status) = error.http_status() {
            if self.terminal_statuses.contains(&status) {
                return Some(Verdict::Terminal);
            }
            if self.retriable_statuses.contains(&status) {
                return Some(Verdict::Retriable);
            }
        }
        if self.terminal_codes.contains(&error.code()) {
            return Some(Verdict::Terminal);
        }
        if self.retriable_codes.contains(&error.code()) {
            return Some(Verdict::Retriable);
        }
        None
    }
}

/// Classifies the outcome of a call of a tool.
///
/// Implemented by [`DefaultClassifier`] and by every
/// `Fn(&Result<ToolOutput, ToolError>, &ToolProfile) -> Classification`.
pub trait Classify: Send + Sync + 'static {
    /// The verdict on `outcome` of a call of the tool described by `tool`.
    fn classify(
        &self,
        outcome: &Result<ToolOutput, ToolError>,
        tool: &ToolProfile,
    ) -> Classification;
}

impl<F> Classify for F
where
    F: Fn(&Result<ToolOutput, ToolError>, &ToolProfile) -> Classification + Send + Sync + 'static,
{
    fn classify(
        &self,
        outcome: &Result<ToolOutput, ToolError>,
        tool: &ToolProfile,
    ) -> Classification {
        self(outcome, tool)
    }
}

/// The classifier of the [module docs](self): default lists, error classes, per-tool
/// overrides, and the tool's risk level for errors that say nothing.
///
/// ```
/// use tower_toolcall::classify::{Classify, DefaultClassifier, ToolProfile, Verdict};
/// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolPolicy};
/// use tower_toolcall::{ErrorCode, ToolError};
///
/// let write = ToolDescriptor::new("vault", "createFile", RiskLevel::Writes);
/// let tool = ToolProfile::new(Some(&write), &ToolPolicy::default());
/// let unknown = Err(ToolError::new(ErrorCode::InternalError, "disk on fire"));
/// // An error that says nothing is terminal for a mutating tool...
/// assert_eq!(DefaultClassifier.classify(&unknown, &tool).verdict(), Verdict::Terminal);
/// // ...but it still speaks of the dependency's health.
/// assert!(DefaultClassifier.classify(&unknown, &tool).is_health_failure());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(
        &self,
        outcome: &Result<ToolOutput, ToolError>,
        tool: &ToolProfile,
    ) -> Classification {
        match outcome {
            Ok(_) => Classification::success(),
            Err(error) => classify_error(error, tool),
        }
    }
}

fn classify_error(error: &ToolError, tool: &ToolProfile) -> Classification {
    let reason = error.code().as_str();
    if IGNORED_CODES.contains(&error.code()) || error.is_rejected() {
        return Classification::ignored(reason).by(Basis::Rejected);
    }
    let (verdict, basis) = if let Some(verdict) = tool.overridden(error) {
        (verdict, Basis::ToolOverride)
    } else {
        match error.class() {
            ErrorClass::Retriable => (Verdict::Retriable, Basis::ErrorClass),
            ErrorClass::Terminal => (Verdict::Terminal, Basis::ErrorClass),
            ErrorClass::Unclassified => match error.http_status() {
                Some(s) if RETRIABLE_HTTP_STATUSES.contains(&s) => {
                    (Verdict::Retriable, Basis::DefaultList)
                }
                Some(s) if TERMINAL_HTTP_STATUSES.contains(&s) => {
                    (Verdict::Terminal, Basis::DefaultList)
                }
                _ => (tool.unclassified, Basis::Unclassified),
            },
        }
    };
    let classification = match verdict {
        Verdict::Retriable => Classification::retriable(reason),
        _ => Classification::terminal(reason),
    };
    classification
        .with_health_failure(
            error
                .health_failure()
                .unwrap_or_else(|| !is_caller_fault(error) && !is_throttle(error)),
        )
        .by(basis)
}

/// Whether a later attempt may succeed after the call failed with `error`, as the classifier
/// decided.
///
/// The layers that classify (retry, breaker) write their verdict into the error's class; an
/// error that no layer classified gets the [`DefaultClassifier`]'s verdict for a tool nothing
/// is known about. An error that is not the tool's outcome (the call was rejected) keeps
/// its own class.
pub(crate) fn decided_retriable(error: &ToolError) -> bool {
    let unknown_tool = ToolProfile::new(None, &ToolPolicy::default());
    match classify_error(error, &unknown_tool).verdict() {
        Verdict::Retriable => true,
        Verdict::Terminal => false,
        Verdict::Success | Verdict::Ignored => error.is_retriable(),
    }
}

/// `true` when `error` says the call was wrong rather than the dependency unwell.
pub fn is_caller_fault(error: &ToolError) -> bool {
    CALLER_FAULT_CODES.contains(&error.code())
        || matches!(error.http_status(), Some(s @ 400..=499) if s != 408 && s != 429)
}

/// `true` when `error` is a throttle: the dependency answered HTTP 429 or `RATE_LIMITED`. It
/// asks the caller to slow down; it does not say that the dependency is unwell.
pub fn is_throttle(error: &ToolError) -> bool {
    error.code() == ErrorCode::RateLimited || error.http_status() == Some(429)
}

/// A classifier shared by the clones of a layer; cheap to clone.
#[derive(Clone)]
pub struct SharedClassifier(Arc<dyn Classify>);

impl SharedClassifier {
    /// Shares `classifier`.
    pub fn new(classifier: impl Classify) -> Self {
        SharedClassifier(Arc::new(classifier))
    }

    /// Classifies `outcome` of a call of `tool`.
    pub fn classify(
        &self,
        outcome: &Result<ToolOutput, ToolError>,
        tool: &ToolProfile,
    ) -> Classification {
        self.0.classify(outcome, tool)
    }

    /// Classifies a failure, handing the error back with the verdict
    /// [settled](Classification::settle) in it.
    pub(crate) fn classify_error(
        &self,
        error: ToolError,
        tool: &ToolProfile,
    ) -> (Classification, ToolError) {
        let (classification, outcome) = self.classify_outcome(Err(error), tool);
        match outcome {
            Err(error) => (classification, error),
            Ok(_) => unreachable!("the outcome is the error it was made from"),
        }
    }

    /// Classifies `outcome`, handing it back with the verdict on a failure
    /// [settled](Classification::settle) in the error.
    pub(crate) fn classify_outcome(
        &self,
        outcome: Result<ToolOutput, ToolError>,
        tool: &ToolProfile,
    ) -> (Classification, Result<ToolOutput, ToolError>) {
        let classification = self.classify(&outcome, tool);
        (
            classification,
            outcome.map_err(|error| classification.settle(error)),
        )
    }
}

impl Default for SharedClassifier {
    fn default() -> Self {
        SharedClassifier::new(DefaultClassifier)
    }
}

impl fmt::Debug for SharedClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedClassifier").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::registry::ClassifyOverrides;

    fn profile(risk: RiskLevel, idempotent: bool, classify: ClassifyOverrides) -> ToolProfile {
        let descriptor = ToolDescriptor::new("ns", "tool", risk).with_idempotent(idempotent);
        let policy = ToolPolicy {
            classify,
            ..ToolPolicy::default()
        };
        ToolProfile::new(Some(&descriptor), &policy)
    }

    fn verdict(error: ToolError, tool: &ToolProfile) -> (Verdict, Basis, bool) {
        let c = DefaultClassifier.classify(&Err(error), tool);
        (c.verdict(), c.basis(), c.is_health_failure())
    }

    #[test]
    fn default_lists_decide_http_statuses() {
        let tool = profile(RiskLevel::Writes, false, ClassifyOverrides::default());
        for status in RETRIABLE_HTTP_STATUSES {
            let (v, _, health) = verdict(ToolError::from_http_status(status, "x"), &tool);
            assert_eq!(v, Verdict::Retriable, "{status}");
            // A throttle asks the caller to slow down; it says nothing of health.
            assert_eq!(health, status != 429, "{status} speaks of health");
        }
        for status in TERMINAL_HTTP_STATUSES {
            let (v, _, health) = verdict(ToolError::from_http_status(status, "x"), &tool);
            assert_eq!(v, Verdict::Terminal, "{status}");
            assert!(!health, "{status} is the caller's fault");
        }
    }

    #[test]
    fn unclassified_status_uses_the_default_lists() {
        let tool = profile(RiskLevel::Writes, false, ClassifyOverrides::default());
        let err = ToolError::new(ErrorCode::UpstreamError, "x").with_http_status(503);
        assert_eq!(
            verdict(err, &tool),
            (Verdict::Retriable, Basis::DefaultList, true)
        );
    }

    #[test]
    fn unknown_errors_follow_the_risk_level() {
        let unknown = || ToolError::new(ErrorCode::InternalError, "?");
        let read = profile(RiskLevel::ReadOnly, false, ClassifyOverrides::default());
        let write = profile(RiskLevel::Writes, false, ClassifyOverrides::default());
        let idempotent_write = profile(RiskLevel::Commands, true, ClassifyOverrides::default());
        assert_eq!(
            verdict(unknown(), &read),
            (Verdict::Retriable, Basis::Unclassified, true)
        );
        assert_eq!(
            verdict(unknown(), &write),
            (Verdict::Terminal, Basis::Unclassified, true)
        );
        assert_eq!(verdict(unknown(), &idempotent_write).0, Verdict::Retriable);
        let unregistered = ToolProfile::new(None, &ToolPolicy::default());
        assert!(unregistered.is_mutating());
        assert_eq!(verdict(unknown(), &unregistered).0, Verdict::Terminal);
    }

    #[test]
    fn tool_overrides_win() {
        let tool = profile(
            RiskLevel::ReadOnly,
            false,
            ClassifyOverrides {
                terminal_http_statuses: vec![503],
                retriable_codes: vec!["NOT_FOUND".into()],
                unclassified: Some(UnclassifiedAs::Terminal),
                ..ClassifyOverrides::default()
            },
        );
        assert_eq!(
            verdict(ToolError::from_http_status(503, "x"), &tool),
            (Verdict::Terminal, Basis::ToolOverride, true)
        );
        assert_eq!(
            verdict(ToolError::new(ErrorCode::NotFound, "x"), &tool),
            (Verdict::Retriable, Basis::ToolOverride, false)
        );
        assert_eq!(
            verdict(ToolError::new(ErrorCode::InternalError, "x"), &tool).0,
            Verdict::Terminal
        );
    }

    #[test]
    fn refused_calls_are_ignored() {
        let tool = profile(RiskLevel::ReadOnly, false, ClassifyOverrides::default());
        for code in IGNORED_CODES {
            assert_eq!(
                verdict(ToolError::new(code, "x"), &tool),
                (Verdict::Ignored, Basis::Rejected, false)
            );
        }
        let throttled_by_layer = ToolError::rejected(ErrorCode::RateLimited, "slow down");
        assert_eq!(verdict(throttled_by_layer, &tool).0, Verdict::Ignored);
        let throttled_upstream = ToolError::from_http_status(429, "slow down");
        assert_eq!(verdict(throttled_upstream, &tool).0, Verdict::Retriable);
    }

    #[test]
    fn throttles_are_retriable_but_not_health_failures() {
        let tool = profile(RiskLevel::Writes, false, ClassifyOverrides::default());
        for throttle in [
            ToolError::from_http_status(429, "slow down"),
            ToolError::new(ErrorCode::RateLimited, "quota spent"),
        ] {
            assert!(is_throttle(&throttle));
            let (verdict, _, health) = verdict(throttle, &tool);
            assert_eq!((verdict, health), (Verdict::Retriable, false));
        }
        let down = ToolError::from_http_status(503, "down");
        assert!(!is_throttle(&down));
        assert!(verdict(down, &tool).2);
    }

    #[test]
    fn successes_are_successes() {
        let tool = profile(RiskLevel::ReadOnly, false, ClassifyOverrides::default());
        let c = DefaultClassifier.classify(&Ok(ToolOutput::default()), &tool);
        assert_eq!(c, Classification::success());
        assert_eq!(c.reason(), SUCCESS_REASON);
        assert!(!Classification::success()
            .with_health_failure(true)
            .is_health_failure());
    }
}
