//! Reading a run back from its audit directory, and replaying it against its recorded
//! results.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tower_service::Service;

use super::config::{check_run_id, Executor, RunPolicy, Turn};
use super::outcome::{TurnResult, TurnStatus};
use super::plan::Plan;
use super::validate::PlanError;
use tower_toolcall::envelope::{ResultStatus, ToolCall, ToolResult};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{ExecutionEvent, Redactor};
use tower_toolcall::ToolOutput;
use tower_toolcall::{ConfigError, ErrorClass, ErrorCode, ToolError};

/// A run as its audit directory recorded it: the plan, the policy, the confirmation, and the
/// calls, results and events in the order they were written.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RecordedRun {
    /// The run's id.
    pub run_id: String,
    /// The plan.
    pub plan: Plan,
    /// The settings the run ran with.
    pub policy: RunPolicy,
    /// Who the turn ran for.
    pub turn: Turn,
    /// The user approval the run executed under.
    pub confirmation_id: Option<String>,
    /// How the run ended, if it did.
    pub status: Option<TurnStatus>,
    /// The seed of the jitter of the run's retry pauses (`None` in a record without one).
    pub jitter_seed: Option<u64>,
    /// The calls, in the order they were dispatched.
    pub calls: Vec<ToolCall>,
    /// The results, in the order they came.
    pub results: Vec<ToolResult>,
    /// The events, in the order they were emitted.
    pub events: Vec<ExecutionEvent>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunFile {
    run_id: String,
    plan: Plan,
    policy: RunPolicy,
    turn: Turn,
    #[serde(default)]
    confirmation_id: Option<String>,
    #[serde(default)]
    status: Option<TurnStatus>,
    #[serde(default, deserialize_with = "seed_from_decimal")]
    jitter_seed: Option<u64>,
}

/// `jitterSeed` is a u64 written as a decimal string, so that readers that hold JSON
/// numbers as doubles keep every digit.
fn seed_from_decimal<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|_| {
        D::Error::custom(format!(
            "jitterSeed must be a whole number from 0 to 2^64-1 written as a string, not {text:?}"
        ))
    })
}

impl RecordedRun {
    /// An executor of `registry` with the recorded policy, to replay the run as it ran.
    pub fn executor(&self, registry: ToolRegistry) -> Result<Executor, ConfigError> {
        Executor::builder(registry)
            .policy(self.policy.clone())
            .event_capacity(1 << 16)
            .build()
    }
}

/// Reads a run back from its audit directory (`<audit_dir>/<runId>`).
///
/// A missing or malformed file is an error naming the file and the line.
pub fn reconstruct(dir: impl AsRef<Path>) -> Result<RecordedRun, ConfigError> {
    let dir = dir.as_ref();
    let read = |name: &str| {
        fs::read_to_string(dir.join(name)).map_err(|e| {
            ConfigError::new(name, format!("cannot be read from {}: {e}", dir.display()))
        })
    };
    let text = read("run.json")?;
    let run: RunFile = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(
        &text,
    ))
    .map_err(|e| {
        let problem = match e.path().to_string() {
            path if path == "." => e.inner().to_string(),
            path => format!("{path}: {}", e.inner()),
        };
        ConfigError::new("run.json", format!("is not a run record: {problem}"))
    })?;
    check_run_id(&run.run_id)
        .map_err(|problem| ConfigError::new("run.json", format!("runId {problem}")))?;
    let calls = lines(&read("calls.jsonl")?, "calls.jsonl", |line| {
        let call = line.get("call").cloned().ok_or("has no `call`")?;
        ToolCall::from_value(call).map_err(|e| e.message().to_owned())
    })?;
    let results = lines(&read("results.jsonl")?, "results.jsonl", |line| {
        let result = line.get("result").cloned().ok_or("has no `result`")?;
        serde_json::from_value(result).map_err(|e| e.to_string())
    })?;
    let events = lines(&read("events.jsonl")?, "events.jsonl", |line| {
        serde_json::from_value(line).map_err(|e| e.to_string())
    })?;
    Ok(RecordedRun {
        run_id: run.run_id,
        plan: run.plan,
        policy: run.policy,
        turn: run.turn,
        confirmation_id: run.confirmation_id,
        status: run.status,
        jitter_seed: run.jitter_seed,
        calls,
        results,
        events,
    })
}

fn lines<T>(
    text: &str,
    file: &str,
    parse: impl Fn(Value) -> Result<T, String>,
) -> Result<Vec<T>, ConfigError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let value: Result<Value, String> =
                serde_json::from_str(line).map_err(|e| e.to_string());
            value
                .and_then(&parse)
                .map_err(|problem| ConfigError::new(format!("{file}:{}", n + 1), problem))
        })
        .collect()
}

/// Where a replay first differs from the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Divergence {
    /// `calls` (a different call, args or order), `results` (a call the recording has no
    /// result for: the recorded run stopped while it ran) or `events`.
    pub stream: &'static str,
    /// The position in that stream, from 0.
    pub index: usize,
    /// What the recording has there (`None` past its end).
    pub recorded: Option<String>,
    /// What the replay has there (`None` past its end).
    pub replayed: Option<String>,
}

/// The outcome of a replay.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The turn's result in the replay.
    pub result: TurnResult,
    /// The first difference from the recording, if any.
    pub divergence: Option<Divergence>,
    /// The replay's events.
    pub events: Vec<ExecutionEvent>,
    /// The replay's calls.
    pub calls: Vec<ToolCall>,
}

/// Runs a recorded run again against its recorded results, calling no tool, and reports the
/// first divergence: a different call, different args, or a different order of calls or
/// events.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall_executor::{reconstruct, replay, Executor, Plan, Turn};
/// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let registry = ToolRegistry::builder()
///     .tool(ToolDescriptor::new("web", "search", RiskLevel::ReadOnly))
///     .build()?;
/// let root = std::env::temp_dir().join(format!("turn-audit-{}", std::process::id()));
/// let executor = Executor::builder(registry.clone()).audit_dir(&root).build()?;
/// let plan = Plan::from_value(json!({"steps": [
///     {"id": "a", "tool": "web::search", "args": {"q": "tower"}},
///     {"id": "b", "tool": "web::search", "args": {"q": "$steps.a.next"}}
/// ]}))?;
/// let tool = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!({"next": "retry"}))) });
/// let turn = Turn::new("sess-1", "user-1").with_run_id("run-1");
/// executor.start(tool, &plan, turn)?.finish().await;
///
/// let recorded = reconstruct(root.join("run-1"))?;
/// assert_eq!(recorded.calls.len(), 2);
/// let report = replay(&recorded, &recorded.executor(registry)?).await?;
/// assert_eq!(report.divergence, None);
/// # std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// Each call is answered with the result recorded for its `callId`, after the recorded
/// duration, and each retry waits the pause the run waited (its jitter is drawn from the
/// recorded seed, [`RecordedRun::jitter_seed`]). A call that the turn's deadline or a
/// cancellation left unfinished never answers (the replay's own deadline or cancellation
/// ends it, as in the run). A call the recording has without a result (a run that stopped
/// with calls in flight) fails with `NOT_FOUND` at once and is the report's divergence
/// (stream `results`), so such a replay ends rather than waits. A call the recording does
/// not have fails with `NOT_FOUND`.
///
/// The replay's run has the recorded run id: with an executor whose audit directory holds
/// the recording, it is refused (`runId`), never appended to the record. Run it with paused time (a current-thread runtime with
/// `start_paused`), so that the recorded durations take no time and order the completions
/// as they were. With an `executor` of another policy, the report says whether that policy
/// would have behaved the same.
///
/// A recorded plan that the executor's checks refuse (its registry lacks a tool, say) is a
/// [`PlanError`]. Params are compared as the audit wrote them: redacted by the executor's
/// redactor ([`ExecutorBuilder::redactor`](super::ExecutorBuilder::redactor), the default
/// [`Redactor`](tower_toolcall::trace::Redactor) unless set), which is the one the run ran
/// with when the replay's executor is built as the run's was.
pub async fn replay(
    recorded: &RecordedRun,
    executor: &Executor,
) -> Result<ReplayReport, PlanError> {
    let tool = RecordedTool::new(recorded);
    let missing = tool.missing.clone();
    let asked = recorded
        .events
        .iter()
        .any(|e| e.kind == "run.confirmationRequested");
    let mut turn = recorded.turn.clone();
    turn.run_id = Some(recorded.run_id.clone());
    if asked {
        turn.confirmation_id = None;
    } else {
        turn.confirmation_id.clone_from(&recorded.confirmation_id);
    }
    let mut run = executor.start_seeded(tool, &recorded.plan, turn, recorded.jitter_seed)?;
    run.keep_record();
    let controls = run.controls();
    if asked {
        match &recorded.confirmation_id {
            Some(id) if recorded.events.iter().any(|e| e.kind == "run.confirmed") => {
                controls.confirm(id.clone())
            }
            _ if recorded.status == Some(TurnStatus::Refused) => controls.refuse(),
            _ => {}
        }
    }
    let cancel_at = recorded
        .events
        .iter()
        .find(|e| e.kind == "run.cancelled")
        .and_then(|e| e.elapsed_ms);
    let finish = run.finish_kept();
    let (result, events, calls) = match cancel_at {
        Some(ms) => {
            let canceller = async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                controls.cancel();
            };
            let (out, ()) = futures_util::future::join(finish, canceller).await;
            out
        }
        None => finish.await,
    };
    let redactor = &executor.config.redactor;
    let calls_divergence = first_divergence(
        "calls",
        recorded.calls.iter().map(|c| describe_call(c, redactor)),
        calls.iter().map(|c| describe_call(c, redactor)),
    );
    // The first call the replay made whose result the recording lacks.
    let missing = missing.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let without_result = calls
        .iter()
        .position(|c| c.run_link().is_some_and(|l| missing.contains(&l.call_id)))
        .map(|index| Divergence {
            stream: "results",
            index,
            recorded: None,
            replayed: Some(describe_call(&calls[index], redactor)),
        });
    let divergence = match (calls_divergence, without_result) {
        (Some(c), Some(r)) if r.index < c.index => Some(r),
        (Some(c), _) => Some(c),
        (None, r) => r,
    }
    .or_else(|| {
        first_divergence(
            "events",
            recorded.events.iter().map(describe_event),
            events.iter().map(describe_event),
        )
    });
    Ok(ReplayReport {
        result,
        divergence,
        events,
        calls,
    })
}

/// A call as the comparison sees it; params redacted as `calls.jsonl` has them (three
/// levels down: `line.call.payload.params`).
fn describe_call(call: &ToolCall, redactor: &Redactor) -> String {
    let link = call.run_link();
    format!(
        "{} {} {}::{} {}",
        link.map_or("-", |l| l.step_id.as_str()),
        link.map_or("-", |l| l.call_id.as_str()),
        call.tool_namespace(),
        call.tool_name(),
        redactor.redact_value_within(call.params().as_value(), 3)
    )
}

fn describe_event(event: &ExecutionEvent) -> String {
    format!(
        "{} {} {}",
        event.kind,
        event.step_id.as_deref().unwrap_or("-"),
        event.call_id.as_deref().unwrap_or("-")
    )
}

fn first_divergence(
    stream: &'static str,
    recorded: impl Iterator<Item = String>,
    replayed: impl Iterator<Item = String>,
) -> Option<Divergence> {
    let mut recorded = recorded.fuse();
    let mut replayed = replayed.fuse();
    for index in 0.. {
        match (recorded.next(), replayed.next()) {
            (None, None) => return None,
            (a, b) if a == b => {}
            (recorded, replayed) => {
                return Some(Divergence {
                    stream,
                    index,
                    recorded,
                    replayed,
                })
            }
        }
    }
    None
}

/// What the recording says of a call.
#[derive(Clone)]
enum Answer {
    /// The outcome and how long it took.
    Ended(Result<ToolOutput, ToolError>, Duration),
    /// Left running by the deadline or a cancellation: its outcome is unknown.
    Unfinished,
    /// No result at all: the run stopped while the call ran.
    Missing,
}

/// Answers calls from a recording.
#[derive(Clone)]
struct RecordedTool {
    answers: Arc<HashMap<String, Answer>>,
    /// The calls asked for whose result the recording lacks.
    missing: Arc<Mutex<Vec<String>>>,
}

impl RecordedTool {
    fn new(recorded: &RecordedRun) -> Self {
        let by_request: HashMap<&str, &ToolResult> = recorded
            .results
            .iter()
            .map(|r| (r.request_id.as_str(), r))
            .collect();
        let answers = recorded
            .calls
            .iter()
            .filter_map(|call| {
                let link = call.run_link()?;
                let answer = match by_request.get(call.request_id()) {
                    None => Answer::Missing,
                    Some(r) if outcome_unknown(r) => Answer::Unfinished,
                    Some(r) => Answer::Ended(outcome_of(r), Duration::from_millis(r.duration_ms)),
                };
                Some((link.call_id.clone(), answer))
            })
            .collect();
        RecordedTool {
            answers: Arc::new(answers),
            missing: Arc::default(),
        }
    }
}

fn outcome_unknown(result: &ToolResult) -> bool {
    result
        .error
        .as_ref()
        .and_then(|e| e.details.as_ref())
        .is_some_and(|d| d["outcomeUnknown"] == Value::Bool(true))
}

fn outcome_of(result: &ToolResult) -> Result<ToolOutput, ToolError> {
    if result.status == ResultStatus::Success {
        return Ok(result
            .output
            .clone()
            .unwrap_or_else(|| ToolOutput::new(Value::Null)));
    }
    let (code, message, class, breaker) = match &result.error {
        Some(e) => (
            e.code,
            e.message.clone(),
            if e.retriable {
                ErrorClass::Retriable
            } else if e.terminal {
                ErrorClass::Terminal
            } else {
                ErrorClass::Unclassified
            },
            e.breaker_state,
        ),
        None => (
            ErrorCode::InternalError,
            "recorded without an error".to_owned(),
            ErrorClass::Unclassified,
            None,
        ),
    };
    let mut error = ToolError::new(code, message).with_class(class);
    error.record_mut().breaker_state = breaker;
    Err(error)
}

impl Service<ToolCall> for RecordedTool {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = tower_toolcall::BoxToolFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let call_id = call
            .run_link()
            .map(|l| l.call_id.clone())
            .unwrap_or_default();
        match self.answers.get(&call_id).cloned() {
            Some(Answer::Ended(outcome, took)) => Box::pin(async move {
                tokio::time::sleep(took).await;
                outcome
            }),
            Some(Answer::Unfinished) => Box::pin(std::future::pending()),
            Some(Answer::Missing) => {
                let error = ToolError::new(
                    ErrorCode::NotFound,
                    format!(
                        "call `{call_id}` has no result in the recording: the recorded run \
                         stopped while it ran"
                    ),
                )
                .with_class(ErrorClass::Terminal);
                self.missing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(call_id);
                Box::pin(std::future::ready(Err(error)))
            }
            None => Box::pin(std::future::ready(Err(ToolError::new(
                ErrorCode::NotFound,
                format!("call `{call_id}` is not in the recording"),
            )))),
        }
    }
}
