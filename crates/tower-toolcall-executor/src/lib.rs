//! The executor of an agent turn for [`tower-toolcall`](tower_toolcall): it takes the
//! model's plan of tool calls and dispatches it over any `Service<ToolCall>`, normally the
//! [`ToolStack`](tower_toolcall::ToolStack).
//!
//! This crate holds plans ([`Plan`]), their checks and references, the scheduler of a run
//! ([`Run`]), its events ([`EventStream`]), the audit directory of each run and its replay
//! ([`reconstruct`], [`replay`]). It depends on the core alone: calls go through the
//! service it is given, and events and audit lines are written through the core's
//! [`AuditLog`](tower_toolcall::trace::AuditLog) as
//! [`ExecutionEvent`](tower_toolcall::trace::ExecutionEvent)s.
//!
//! ```
//! use serde_json::json;
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
//! use tower_toolcall_executor::{Executor, Plan, StepStatus, Turn, TurnStatus};
//!
//! # tokio_test::block_on(async {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("geo", "city", RiskLevel::ReadOnly))
//!     .tool(ToolDescriptor::new("geo", "weather", RiskLevel::ReadOnly))
//!     .build()?;
//! // Any `Service<ToolCall>`: here a function; in production, the `ToolStack` around the tools.
//! let tools = tool_fn(|call: ToolCall| async move {
//!     Ok(ToolOutput::new(match call.tool_name() {
//!         "city" => json!({"name": "Lyon"}),
//!         _ => json!({"city": call.params().as_map()["city"], "sky": "clear"}),
//!     }))
//! });
//! // The second step reads the first one's output.
//! let plan = Plan::from_json(r#"{"steps": [
//!     {"id": "where", "tool": "geo::city", "args": {}},
//!     {"id": "sky", "tool": "geo::weather", "args": {"city": "$steps.where.name"}}
//! ]}"#)?;
//! let executor = Executor::builder(registry).build()?;
//! let result = executor.start(tools, &plan, Turn::new("sess-1", "user-1"))?.finish().await;
//! assert_eq!(result.status, TurnStatus::Completed);
//! assert_eq!(result.step("sky").unwrap().status, StepStatus::Succeeded);
//! assert_eq!(result.output("sky").unwrap()["city"], "Lyon");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! - **Plan** ([`Plan`], [`Step`]): each step names a tool and its args; args reference
//!   earlier outputs (`$steps.<id>.path`), variables (`$vars.<name>`) and, in a `foreach`,
//!   the item and its index (`{item.field}`, `{index}`). The plan is checked before anything
//!   runs — unknown tools, static args against the tool's schema, missing references,
//!   dependency cycles, `foreach` over a non-array, step ids no reference can name, values
//!   nested deeper than the envelope's depth limit, retry pauses over
//!   [`ExecutorBuilder::max_backoff`] — and every problem is reported in one [`PlanError`].
//!   No check recurses once per step or per level, so a hostile plan (a chain of 100,000
//!   steps, args 5,000 levels deep) is refused or run, never a crash. Resolution
//!   ([`resolve`]) is pure; the resolved args are what is sent, hashed and logged. It counts
//!   what it builds against the params limit ([`ExecutorBuilder::max_params_bytes`]) and
//!   stops before it passes it, so references that copy an output many times fail the call
//!   with `PAYLOAD_TOO_LARGE` instead of taking the memory.
//! - **Scheduling**: independent steps run side by side and dependent ones after, up to a
//!   run-wide and a per-tool limit; a `foreach` expands one call at a time, so that a
//!   100,000-item array never becomes 100,000 calls in memory. Each call carries a
//!   [`RunLink`](tower_toolcall::envelope::RunLink): `runId`, `stepId`, `callId`, the attempt, the
//!   iteration and the `loopId`.
//! - **Failures** (seed 004): a transient failure is retried when the step's `retry` allows,
//!   after its `backoffMs` with ±10 % jitter ([`StepRetry::jitter`]) drawn from a seed chosen
//!   per run ([`ExecutorBuilder::jitter_seed`]) and recorded in `run.json`;
//!   a permanent one, an exhausted retry or an open breaker tries the step's `alternatives`
//!   in order, then uses its `default`, skips it when it is optional, or fails the turn when
//!   it is required. Dependents of a step without output are skipped (or use their default)
//!   transitively, while independent steps still finish. Every decision goes to the turn
//!   trace ([`TurnResult::trace`]) and the event stream.
//! - **The turn's deadline** ([`ExecutorBuilder::turn_timeout`], 5 minutes by default):
//!   completed results are kept, running steps become `timedOut`
//!   (their calls are left to finish, not awaited, unless [`OnDeadline::Cancel`]), the rest
//!   are skipped, and [`TurnResult::message`] says what did not finish.
//! - **Confirmation**: a run with mutating steps and no confirmation asks for one
//!   (`run.confirmationRequested`) and waits for [`RunControls::confirm`], or refuses; the
//!   confirmation id goes into every call and into `run.json`.
//! - **Cancellation**: [`RunControls::cancel`] stops scheduling and drops the running calls
//!   of cancellable steps, marked `cancelled` (their tools may have acted).
//! - **Events**: an [`EventStream`] of [`ExecutionEvent`](tower_toolcall::trace::ExecutionEvent)s;
//!   every call has `step.started` before dispatch and `step.finished` or `step.failed`
//!   after. The stream is bounded: a slow reader loses events (counted), never slows a tool.
//! - **Audit and replay**: with [`ExecutorBuilder::audit_dir`], each run leaves `run.json`,
//!   `calls.jsonl`, `results.jsonl` and `events.jsonl` (written losslessly: when the writer
//!   is behind, the run waits for it), every one redacted with the executor's redactor
//!   ([`ExecutorBuilder::redactor`]); [`reconstruct`] reads them back and [`replay`] runs
//!   the plan again against the recorded results and retry pauses, calling no tool, and
//!   reports the first divergence. The run id names the run's folder, so it is a safe name
//!   ([`Turn::with_run_id`]), and a run id that already has a folder is refused: no run
//!   (and no replay) appends to another's record.
//!   A write that fails is reported, never dropped: a `run.json` that cannot be written is a
//!   `run.auditFailed` event, and lines lost are counted in [`TurnResult::audit_lines_lost`].
//!
//! See [`Executor`] for another example.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod events;
mod outcome;
mod plan;
mod reference;
mod replay;
mod run;
mod schedule;
#[cfg(test)]
mod tests;
mod validate;

pub use config::{
    ConfirmationPolicy, Executor, ExecutorBuilder, OnDeadline, RunPolicy, Turn, EXECUTOR_VERSION,
};
pub use events::EventStream;
pub use outcome::{
    Classification, Decision, Recovery, StepError, StepOutcome, StepStatus, TurnResult, TurnStatus,
};
pub use plan::{Foreach, OnError, Plan, Step, StepRetry};
pub use reference::{resolve, ResolveError, Scope};
pub use replay::{reconstruct, replay, Divergence, RecordedRun, ReplayReport};
pub use run::{Run, RunControls};
pub use validate::{PlanError, PlanProblem};

/// The examples of the crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
