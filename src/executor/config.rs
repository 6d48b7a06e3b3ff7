//! The executor and its settings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_service::Service;

use super::plan::Plan;
use super::run::Run;
use super::validate::{self, PlanError};
use crate::classify::SharedClassifier;
use crate::envelope::ToolCall;
use crate::error::{ConfigError, ToolError};
use crate::outcome::ToolOutput;
use crate::registry::ToolRegistry;
use crate::trace::AuditLog;

/// Runs the plans of agent turns over a `Service<ToolCall>`, normally the [`ToolStack`](crate::ToolStack).
///
/// Cheap to clone; build it once, start a [`Run`] per turn.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall::executor::{Executor, Plan, Turn, TurnStatus};
/// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let registry = ToolRegistry::builder()
///     .tool(ToolDescriptor::new("travel", "flights", RiskLevel::ReadOnly))
///     .tool(ToolDescriptor::new("travel", "hotels", RiskLevel::ReadOnly))
///     .build()?;
/// let executor = Executor::builder(registry)
///     .max_concurrency(4)
///     .turn_timeout(Duration::from_secs(30))
///     .build()?;
/// let tools = tool_fn(|call: ToolCall| async move {
///     Ok(ToolOutput::new(match call.tool_name() {
///         "flights" => json!({"arrival": "LYS"}),
///         _ => json!({"hotels": ["Bellecour"], "near": call.params().as_map()["near"]}),
///     }))
/// });
/// let plan = Plan::from_value(json!({"steps": [
///     {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}},
///     {"id": "hotels", "tool": "travel::hotels", "args": {"near": "$steps.flights.arrival"}}
/// ]}))?;
/// let result = executor.start(tools, &plan, Turn::new("sess-1", "user-1"))?.finish().await;
/// assert_eq!(result.status, TurnStatus::Completed);
/// assert_eq!(result.output("hotels").unwrap()["near"], "LYS");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Executor {
    pub(crate) config: Arc<ExecutorConfig>,
}

#[derive(Debug)]
pub(crate) struct ExecutorConfig {
    pub(crate) registry: ToolRegistry,
    pub(crate) classifier: SharedClassifier,
    pub(crate) policy: RunPolicy,
    pub(crate) event_capacity: usize,
    pub(crate) audit_dir: Option<PathBuf>,
    pub(crate) audit_queue_capacity: usize,
    pub(crate) jitter_seed: Option<u64>,
}

/// The settings of a run that decide its behaviour, as `run.json` records them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunPolicy {
    /// Calls in flight at once, run-wide.
    pub max_concurrency: usize,
    /// Calls in flight at once per tool (`namespace::name`).
    #[serde(default)]
    pub tool_concurrency: HashMap<String, usize>,
    /// The turn's deadline, from its start, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_timeout_ms: Option<u64>,
    /// What becomes of the calls still running at the deadline.
    pub on_deadline: OnDeadline,
    /// What a run with mutating steps and no confirmation does.
    pub confirmation: ConfirmationPolicy,
    /// The most tries of a step's tool that a step's `retry` may ask for.
    pub max_step_attempts: u32,
}

/// What becomes of the calls still running when the turn's deadline comes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum OnDeadline {
    /// They run to their end on the runtime; their results are not awaited (the default).
    #[default]
    LeaveRunning,
    /// The cancellable ones are dropped; the others run to their end, not awaited.
    Cancel,
}

/// What a run whose plan has mutating steps does when the turn brings no confirmation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum ConfirmationPolicy {
    /// Emits `run.confirmationRequested` and waits for
    /// [`RunControls::confirm`](super::RunControls::confirm) (the default).
    #[default]
    Ask,
    /// Refuses the run: nothing is dispatched.
    Refuse,
    /// Runs without one.
    NotRequired,
}

/// Builds an [`Executor`]; made by [`Executor::builder`].
#[derive(Debug)]
#[must_use]
pub struct ExecutorBuilder {
    registry: ToolRegistry,
    classifier: SharedClassifier,
    policy: RunPolicy,
    event_capacity: usize,
    audit_dir: Option<PathBuf>,
    /// Lines the audit's writer may be behind before the run waits for it.
    pub(super) audit_queue_capacity: usize,
    jitter_seed: Option<u64>,
}

impl Executor {
    /// A builder for an executor of the tools of `registry`.
    pub fn builder(registry: ToolRegistry) -> ExecutorBuilder {
        ExecutorBuilder {
            registry,
            classifier: SharedClassifier::default(),
            policy: RunPolicy {
                max_concurrency: 8,
                tool_concurrency: HashMap::new(),
                turn_timeout_ms: None,
                on_deadline: OnDeadline::LeaveRunning,
                confirmation: ConfirmationPolicy::Ask,
                max_step_attempts: 5,
            },
            event_capacity: 1024,
            audit_dir: None,
            audit_queue_capacity: 8192,
            jitter_seed: None,
        }
    }

    /// The settings a run records in `run.json`.
    pub fn policy(&self) -> &RunPolicy {
        &self.config.policy
    }

    /// Checks `plan` as [`start`](Executor::start) does, without running anything.
    pub fn check(&self, plan: &Plan) -> Result<(), PlanError> {
        validate::check(plan, &self.config.registry).map(drop)
    }

    /// Checks `plan` and prepares its run over `service`; nothing is dispatched until the
    /// run is driven by [`Run::finish`]. A plan that fails a check is refused with every
    /// problem listed.
    pub fn start<S>(&self, service: S, plan: &Plan, turn: Turn) -> Result<Run<S>, PlanError>
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
        S::Future: Send + 'static,
    {
        self.start_seeded(service, plan, turn, None)
    }

    /// [`start`](Executor::start), drawing the run's jitter from `jitter_seed` when given
    /// (a replay passes the recorded one), else from the executor's seed or a fresh one.
    pub(crate) fn start_seeded<S>(
        &self,
        service: S,
        plan: &Plan,
        turn: Turn,
        jitter_seed: Option<u64>,
    ) -> Result<Run<S>, PlanError>
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
        S::Future: Send + 'static,
    {
        let checked = validate::check(plan, &self.config.registry)?;
        let mut turn = turn;
        let run_id = turn
            .run_id
            .get_or_insert_with(|| ulid::Ulid::generate().to_string())
            .clone();
        let audit = match &self.config.audit_dir {
            Some(root) => Some(
                AuditLog::builder(root.join(&run_id))
                    .queue_capacity(self.config.audit_queue_capacity)
                    .build()
                    .map_err(|e| {
                        PlanError::single(
                            "auditDir",
                            format!(
                                "cannot hold the run's audit: {e}; fix the executor's audit_dir"
                            ),
                        )
                    })?,
            ),
            None => None,
        };
        let jitter_seed = jitter_seed
            .or(self.config.jitter_seed)
            .unwrap_or_else(crate::retry::entropy_seed);
        Ok(Run::new(
            self.config.clone(),
            service,
            checked,
            turn,
            audit,
            jitter_seed,
        ))
    }
}

impl ExecutorBuilder {
    /// Calls in flight at once, run-wide (default 8).
    pub fn max_concurrency(mut self, limit: usize) -> Self {
        self.policy.max_concurrency = limit;
        self
    }

    /// Calls of `tool` (`namespace::name`) in flight at once.
    pub fn tool_concurrency(mut self, tool: impl Into<String>, limit: usize) -> Self {
        self.policy.tool_concurrency.insert(tool.into(), limit);
        self
    }

    /// The turn's deadline, from the start of its run (none by default).
    pub fn turn_timeout(mut self, timeout: Duration) -> Self {
        self.policy.turn_timeout_ms = Some(crate::time::millis(timeout));
        self
    }

    /// What becomes of the calls running at the deadline (default: left running).
    pub fn on_deadline(mut self, on_deadline: OnDeadline) -> Self {
        self.policy.on_deadline = on_deadline;
        self
    }

    /// What a run with mutating steps and no confirmation does (default: ask).
    pub fn confirmation(mut self, policy: ConfirmationPolicy) -> Self {
        self.policy.confirmation = policy;
        self
    }

    /// The most tries of a tool a step's `retry` may ask for (default 5).
    pub fn max_step_attempts(mut self, attempts: u32) -> Self {
        self.policy.max_step_attempts = attempts;
        self
    }

    /// The classifier that tells transient failures from permanent ones (default: the
    /// crate's).
    pub fn classifier(mut self, classifier: SharedClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Events the stream holds for a slow reader before it drops new ones (default 1024).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// Writes each run's audit into `<dir>/<runId>/`: `run.json`, `calls.jsonl`,
    /// `results.jsonl` and `events.jsonl`.
    pub fn audit_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.audit_dir = Some(dir.into());
        self
    }

    /// Draws the jitter of every run's retry pauses from `seed` instead of a fresh seed per
    /// run, so that runs wait the same pauses. Each run records its seed in `run.json`, and
    /// [`replay`](super::replay) waits the recorded pauses whatever this is.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// Sets every setting of `policy` at once (a replay uses the recorded one).
    pub fn policy(mut self, policy: RunPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Checks the settings; an error names the one that is wrong.
    pub fn build(self) -> Result<Executor, ConfigError> {
        if self.policy.max_concurrency == 0 {
            return Err(ConfigError::new(
                "executor.max_concurrency",
                "must be at least 1, got 0",
            ));
        }
        if let Some((tool, _)) = self.policy.tool_concurrency.iter().find(|(_, n)| **n == 0) {
            return Err(ConfigError::new(
                format!("executor.tool_concurrency.{tool}"),
                "must be at least 1, got 0",
            ));
        }
        if self.policy.max_step_attempts == 0 {
            return Err(ConfigError::new(
                "executor.max_step_attempts",
                "must be at least 1, got 0",
            ));
        }
        if self.event_capacity == 0 {
            return Err(ConfigError::new(
                "executor.event_capacity",
                "must be at least 1, got 0",
            ));
        }
        Ok(Executor {
            config: Arc::new(ExecutorConfig {
                registry: self.registry,
                classifier: self.classifier,
                policy: self.policy,
                event_capacity: self.event_capacity,
                audit_dir: self.audit_dir,
                audit_queue_capacity: self.audit_queue_capacity,
                jitter_seed: self.jitter_seed,
            }),
        })
    }
}

/// Who the turn runs for, and under which approval: what every call of the run carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Turn {
    /// `target.sessionKey` of every call.
    pub session_key: String,
    /// `target.actorId` of every call.
    pub actor_id: String,
    /// `target.tenantId` of every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// The run's id; a fresh ULID when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The user approval given with the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
}

impl Turn {
    /// A turn of `session_key` on behalf of `actor_id`.
    pub fn new(session_key: impl Into<String>, actor_id: impl Into<String>) -> Self {
        Turn {
            session_key: session_key.into(),
            actor_id: actor_id.into(),
            tenant_id: None,
            run_id: None,
            confirmation_id: None,
        }
    }

    /// Sets the tenant.
    pub fn with_tenant_id(mut self, tenant_id: impl Into<String>) -> Self {
        self.tenant_id = Some(tenant_id.into());
        self
    }

    /// Sets the run's id.
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// Sets the user approval the run executes under.
    pub fn with_confirmation_id(mut self, confirmation_id: impl Into<String>) -> Self {
        self.confirmation_id = Some(confirmation_id.into());
        self
    }
}
