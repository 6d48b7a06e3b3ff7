//! What an [`ExecutionEvent`](super::ExecutionEvent) tells, and how loud it is.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an [`ExecutionEvent`](super::ExecutionEvent) tells: its `type` member.
///
/// ```
/// use tower_toolcall::trace::EventKind;
///
/// assert_eq!(EventKind::RunConfirmationRequested.as_str(), "run.confirmationRequested");
/// assert_eq!(serde_json::to_value(EventKind::StepCached)?, "step.cached");
/// assert_eq!(serde_json::from_str::<EventKind>("\"a.kind.of.tomorrow\"")?, EventKind::Unknown);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EventKind {
    /// `run.started`: a run began, or the trace layer received a call.
    #[serde(rename = "run.started")]
    RunStarted,
    /// `run.confirmationRequested`: a run waits for its user's confirmation.
    #[serde(rename = "run.confirmationRequested")]
    RunConfirmationRequested,
    /// `run.confirmed`: its user confirmed the run.
    #[serde(rename = "run.confirmed")]
    RunConfirmed,
    /// `run.cancelled`: the run (or the call) was dropped before it ended.
    #[serde(rename = "run.cancelled")]
    RunCancelled,
    /// `run.finished`: the run (or the call) ended.
    #[serde(rename = "run.finished")]
    RunFinished,
    /// `run.failed`: the call failed.
    #[serde(rename = "run.failed")]
    RunFailed,
    /// `run.blocked`: a layer refused the call.
    #[serde(rename = "run.blocked")]
    RunBlocked,
    /// `run.auditFailed`: a file of the run's audit could not be written.
    #[serde(rename = "run.auditFailed")]
    RunAuditFailed,
    /// `step.scheduled`: a step of a plan may start.
    #[serde(rename = "step.scheduled")]
    StepScheduled,
    /// `step.started`: an attempt of a step began.
    #[serde(rename = "step.started")]
    StepStarted,
    /// `step.progress`: a step reported progress.
    #[serde(rename = "step.progress")]
    StepProgress,
    /// `step.finished`: an attempt succeeded.
    #[serde(rename = "step.finished")]
    StepFinished,
    /// `step.failed`: an attempt failed.
    #[serde(rename = "step.failed")]
    StepFailed,
    /// `step.shadow`: a layer in shadow mode decided what it did not enforce.
    #[serde(rename = "step.shadow")]
    StepShadow,
    /// `step.refused`: a layer refused the call before the tool ran.
    #[serde(rename = "step.refused")]
    StepRefused,
    /// `step.cached`: an idempotency record answered the call.
    #[serde(rename = "step.cached")]
    StepCached,
    /// `admin.change`: an operator's change (see
    /// [`ExecutionEvent::admin`](super::ExecutionEvent::admin)).
    #[serde(rename = "admin.change")]
    AdminChange,
    /// `auth.refused`: an edge refused a request's credentials.
    #[serde(rename = "auth.refused")]
    AuthRefused,
    /// `auth.denied`: a caller asked for a tool it may not call.
    #[serde(rename = "auth.denied")]
    AuthDenied,
    /// A kind this version does not know, read from a newer one's audit.
    #[serde(rename = "unknown", other)]
    Unknown,
}

impl EventKind {
    /// The name in the `type` member.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run.started",
            EventKind::RunConfirmationRequested => "run.confirmationRequested",
            EventKind::RunConfirmed => "run.confirmed",
            EventKind::RunCancelled => "run.cancelled",
            EventKind::RunFinished => "run.finished",
            EventKind::RunFailed => "run.failed",
            EventKind::RunBlocked => "run.blocked",
            EventKind::RunAuditFailed => "run.auditFailed",
            EventKind::StepScheduled => "step.scheduled",
            EventKind::StepStarted => "step.started",
            EventKind::StepProgress => "step.progress",
            EventKind::StepFinished => "step.finished",
            EventKind::StepFailed => "step.failed",
            EventKind::StepShadow => "step.shadow",
            EventKind::StepRefused => "step.refused",
            EventKind::StepCached => "step.cached",
            EventKind::AdminChange => "admin.change",
            EventKind::AuthRefused => "auth.refused",
            EventKind::AuthDenied => "auth.denied",
            EventKind::Unknown => "unknown",
        }
    }
}

/// How loud an [`ExecutionEvent`](super::ExecutionEvent) is: its `level` member.
///
/// ```
/// use tower_toolcall::trace::EventLevel;
///
/// assert_eq!(EventLevel::default(), EventLevel::Info);
/// assert_eq!(serde_json::to_value(EventLevel::Warn)?, "warn");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EventLevel {
    /// Something happened as it should.
    #[default]
    Info,
    /// Something a person may want to look at.
    Warn,
    /// Something failed.
    Error,
}

impl EventLevel {
    /// The name in the `level` member.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventLevel::Info => "info",
            EventLevel::Warn => "warn",
            EventLevel::Error => "error",
        }
    }
}

/// Written as [`as_str`](EventKind::as_str) names them, compared with names alike.
macro_rules! named {
    ($type:ty) => {
        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl AsRef<str> for $type {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl PartialEq<str> for $type {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $type {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

named!(EventKind);
named!(EventLevel);
