//! What a turn produced: each step's status and output, the turn trace, and a message for
//! the user.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use tower_toolcall::{BreakerState, ErrorCode};

/// The result of one turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct TurnResult {
    /// The run.
    pub run_id: String,
    /// How the turn ended.
    pub status: TurnStatus,
    /// Every step of the plan, in its order.
    pub steps: Vec<StepOutcome>,
    /// Every error-handling decision, in the order they were taken.
    pub trace: Vec<Decision>,
    /// What happened, in words fit for the user: what completed and what did not.
    pub message: String,
    /// The user approval the run executed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
    /// Events the event stream dropped because its reader was behind.
    pub events_dropped: u64,
    /// Lines of the run's audit directory lost to write errors (0 without one). A
    /// `run.json` that could not be written is a `run.auditFailed` event of the run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audit_lines_lost: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TurnResult {
    /// The outcome of step `id`.
    pub fn step(&self, id: &str) -> Option<&StepOutcome> {
        self.steps.iter().find(|s| s.id == id)
    }

    /// The output of step `id` (its own, or its default), if it has one.
    pub fn output(&self, id: &str) -> Option<&Value> {
        self.step(id).and_then(|s| s.output.as_ref())
    }
}

/// How a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum TurnStatus {
    /// Every required step produced an output.
    Completed,
    /// The turn's deadline came first: the completed results are kept, the rest skipped.
    Partial,
    /// A required step failed (or could not run); the independent steps still finished.
    Failed,
    /// The run was cancelled.
    Cancelled,
    /// The run needed a confirmation it did not get: nothing was dispatched.
    Refused,
}

/// What became of one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StepOutcome {
    /// The step's id.
    pub id: String,
    /// Its status.
    pub status: StepStatus,
    /// Its output (for a `foreach`, the array of the items' outputs), or its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Why it has no output of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    /// Calls dispatched for it, retries and alternatives included.
    pub calls: u32,
    /// The tool that produced the output, when an alternative did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// Why a step has no output of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StepError {
    /// The error code (`TIMEOUT` for a step the deadline stopped, `CANCELLED` for a
    /// cancelled one).
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

/// The status of a step at the end of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum StepStatus {
    /// Its tool (or an alternative) answered.
    Succeeded,
    /// It failed or could not run, and its default stands in for its output.
    Defaulted,
    /// Its calls failed.
    Failed,
    /// It never ran: a dependency has no output, or the turn's deadline came first.
    Skipped,
    /// The run was cancelled before it finished; a call already dispatched may have acted.
    Cancelled,
    /// The turn's deadline came while its calls ran; they may still act, their results are
    /// not awaited.
    TimedOut,
}

impl StepStatus {
    /// `true` when the step has an output its dependents can use.
    pub fn has_output(self) -> bool {
        matches!(self, StepStatus::Succeeded | StepStatus::Defaulted)
    }
}

/// One error-handling decision of the turn trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Decision {
    /// The step.
    pub step_id: String,
    /// The failed call, if a call failed (a cascade has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The tool of the failed call (`namespace::name`), or the step's tool as written.
    pub tool: String,
    /// The error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// How the failure was classified.
    pub classification: Classification,
    /// The breaker's state as the call saw it, if a breaker was in the stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_state: Option<BreakerState>,
    /// Tries of the tool so far.
    pub retry_count: u32,
    /// What the executor did.
    pub decision: Recovery,
    /// Why, in words.
    pub reason: String,
}

/// How a failure was classified, as the turn trace and the events name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum Classification {
    /// `transient`: another try may succeed.
    Transient,
    /// `permanent`: another try would fail alike.
    Permanent,
    /// `breakerOpen`: the tool's circuit breaker refused the call.
    BreakerOpen,
    /// `dependency`: a step it depends on has no result (a cascade).
    Dependency,
}

impl Classification {
    /// The name, as in the event's payload.
    pub const fn as_str(self) -> &'static str {
        match self {
            Classification::Transient => "transient",
            Classification::Permanent => "permanent",
            Classification::BreakerOpen => "breakerOpen",
            Classification::Dependency => "dependency",
        }
    }
}

impl std::fmt::Display for Classification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the executor did about a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum Recovery {
    /// Tried the same tool again.
    Retry,
    /// Tried the step's next alternative tool.
    Alternative,
    /// Used the step's default.
    Default,
    /// Skipped the step; the turn goes on.
    Skip,
    /// Failed the turn: a required step has no output.
    Escalate,
}

impl Recovery {
    /// The name, as in the event's payload.
    pub const fn as_str(self) -> &'static str {
        match self {
            Recovery::Retry => "retry",
            Recovery::Alternative => "alternative",
            Recovery::Default => "default",
            Recovery::Skip => "skip",
            Recovery::Escalate => "escalate",
        }
    }
}
