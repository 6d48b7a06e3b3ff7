//! The executor and its settings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use tower_service::Service;

use super::plan::Plan;
use super::run::Run;
use super::validate::{self, CheckedPlan, PlanError};
use tower_toolcall::canonical::{CanonicalOptions, MAX_SUPPORTED_DEPTH};
use tower_toolcall::classify::SharedClassifier;
use tower_toolcall::envelope::ToolCall;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{AuditLog, Redactor};
use tower_toolcall::validate::DEFAULT_MAX_PARAMS_BYTES;
use tower_toolcall::ToolOutput;
use tower_toolcall::{ConfigError, ToolError};

/// The version of the executor, as `run.json` records it.
pub const EXECUTOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs the plans of agent turns over a `Service<ToolCall>`, normally the [`ToolStack`](tower_toolcall::ToolStack).
///
/// Cheap to clone; build it once, start a [`Run`] per turn.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall_executor::{Executor, Plan, Turn, TurnStatus};
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
    /// What the run's audit lines and `run.json` redact.
    pub(crate) redactor: Redactor,
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
    /// The turn's deadline, from its start, in milliseconds
    /// ([`RunPolicy::DEFAULT_TURN_TIMEOUT_MS`] unless set; `None` only in a run recorded
    /// without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_timeout_ms: Option<u64>,
    /// What becomes of the calls still running at the deadline.
    pub on_deadline: OnDeadline,
    /// What a run with mutating steps and no confirmation does.
    pub confirmation: ConfirmationPolicy,
    /// The most tries of a step's tool that a step's `retry` may ask for.
    pub max_step_attempts: u32,
    /// The longest pause a step's `retry.backoffMs` may ask for, in milliseconds; a plan
    /// asking for more is refused.
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// The largest args a step's references may build, in bytes of compact JSON (the
    /// envelope's params limit by default; a tool's `policy.validate.max_params_bytes`
    /// overrides it for that tool).
    #[serde(default = "default_max_params_bytes")]
    pub max_params_bytes: usize,
    /// The deepest nesting of a plan's args, defaults, variables and `foreach` items, and of
    /// the args references build (the envelope's depth limit, 64, by default).
    #[serde(default = "default_max_depth")]
    pub max_depth: usize,
}

impl RunPolicy {
    /// The turn's deadline when none is set: 5 minutes, so that no plan parks a run
    /// forever.
    pub const DEFAULT_TURN_TIMEOUT_MS: u64 = 5 * 60 * 1000;
    /// The longest retry pause a plan may ask for when the executor sets no other:
    /// 1 minute.
    pub const DEFAULT_MAX_BACKOFF_MS: u64 = 60 * 1000;
}

fn default_max_backoff_ms() -> u64 {
    RunPolicy::DEFAULT_MAX_BACKOFF_MS
}

fn default_max_params_bytes() -> usize {
    DEFAULT_MAX_PARAMS_BYTES
}

fn default_max_depth() -> usize {
    CanonicalOptions::default().max_depth()
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
    redactor: Redactor,
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
                turn_timeout_ms: Some(RunPolicy::DEFAULT_TURN_TIMEOUT_MS),
                on_deadline: OnDeadline::LeaveRunning,
                confirmation: ConfirmationPolicy::Ask,
                max_step_attempts: 5,
                max_backoff_ms: RunPolicy::DEFAULT_MAX_BACKOFF_MS,
                max_params_bytes: DEFAULT_MAX_PARAMS_BYTES,
                max_depth: default_max_depth(),
            },
            event_capacity: 1024,
            audit_dir: None,
            audit_queue_capacity: 8192,
            redactor: Redactor::default(),
            jitter_seed: None,
        }
    }

    /// The settings a run records in `run.json`.
    pub fn policy(&self) -> &RunPolicy {
        &self.config.policy
    }

    /// Checks `plan` as [`start`](Executor::start) does, without running anything.
    pub fn check(&self, plan: &Plan) -> Result<(), PlanError> {
        validate::check(plan, &self.config.registry, &self.config.policy).map(drop)
    }

    /// Checks `plan` and prepares its run over `service`; nothing is dispatched until the
    /// run is driven by [`Run::finish`]. A plan that fails a check is refused with every
    /// problem listed, and so is a turn whose `runId` is not a safe name
    /// ([`Turn::with_run_id`]) or, with an audit directory, already has a record there.
    ///
    /// The run holds a copy of the plan; [`start_shared`](Executor::start_shared) shares
    /// one instead.
    pub fn start<S>(&self, service: S, plan: &Plan, turn: Turn) -> Result<Run<S>, PlanError>
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
        S::Future: Send + 'static,
    {
        self.start_seeded(service, plan, turn, None)
    }

    /// [`start`](Executor::start) with a plan the caller shares, not copied: for a plan
    /// with a large `foreach` array.
    pub fn start_shared<S>(
        &self,
        service: S,
        plan: Arc<Plan>,
        turn: Turn,
    ) -> Result<Run<S>, PlanError>
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
        S::Future: Send + 'static,
    {
        let steps = validate::check(&plan, &self.config.registry, &self.config.policy)?;
        self.launch(service, CheckedPlan { plan, steps }, turn, None)
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
        // Checked before it is copied: a plan nested too deep is refused, never walked.
        let steps = validate::check(plan, &self.config.registry, &self.config.policy)?;
        let plan = Arc::new(plan.clone());
        self.launch(service, CheckedPlan { plan, steps }, turn, jitter_seed)
    }

    /// The run of a checked plan: its id checked, its audit opened.
    fn launch<S>(
        &self,
        service: S,
        checked: CheckedPlan,
        turn: Turn,
        jitter_seed: Option<u64>,
    ) -> Result<Run<S>, PlanError>
    where
        S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
        S::Future: Send + 'static,
    {
        let mut turn = turn;
        if let Some(id) = &turn.run_id {
            check_run_id(id).map_err(|problem| PlanError::single("runId", problem))?;
        }
        let run_id = turn
            .run_id
            .get_or_insert_with(|| ulid::Ulid::generate().to_string())
            .clone();
        let audit = match &self.config.audit_dir {
            Some(root) => Some(open_audit(root, &run_id, &self.config)?),
            None => None,
        };
        let jitter_seed = jitter_seed
            .or(self.config.jitter_seed)
            .unwrap_or_else(entropy_seed);
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

    /// The turn's deadline, from the start of its run (default
    /// [`RunPolicy::DEFAULT_TURN_TIMEOUT_MS`], 5 minutes). At the deadline, completed results
    /// are kept and the rest is skipped.
    pub fn turn_timeout(mut self, timeout: Duration) -> Self {
        self.policy.turn_timeout_ms = Some(millis(timeout));
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

    /// The longest pause a step's `retry.backoffMs` may ask for (default
    /// [`RunPolicy::DEFAULT_MAX_BACKOFF_MS`], 1 minute); a plan asking for more is refused
    /// with the step's field named.
    pub fn max_backoff(mut self, backoff: Duration) -> Self {
        self.policy.max_backoff_ms = millis(backoff);
        self
    }

    /// The largest args a step's references may build, in bytes of compact JSON (default
    /// [`DEFAULT_MAX_PARAMS_BYTES`], the envelope's limit). Resolution stops with a
    /// `PAYLOAD_TOO_LARGE` failure of the call as soon as it would pass it. A tool's
    /// `policy.validate.max_params_bytes` overrides it for that tool.
    pub fn max_params_bytes(mut self, bytes: usize) -> Self {
        self.policy.max_params_bytes = bytes;
        self
    }

    /// The deepest nesting of a plan's args, defaults, variables and `foreach` items, and of
    /// the args its references build (default 64, the envelope's limit; at most
    /// [`MAX_SUPPORTED_DEPTH`]). A plan nested deeper is refused before anything runs.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.policy.max_depth = depth;
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

    /// Redacts secrets with `redactor` in each run's audit: the lines of `calls.jsonl`,
    /// `results.jsonl` and `events.jsonl`, and `run.json` (default: the core's
    /// [`Redactor::default`]). [`replay`](super::replay) compares params as the audit wrote
    /// them, redacted by its executor's redactor: replay a run with the one it ran with.
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
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
        if self.policy.max_params_bytes < 2 {
            return Err(ConfigError::new(
                "executor.max_params_bytes",
                format!(
                    "must be at least 2 (the size of `{{}}`), got {}",
                    self.policy.max_params_bytes
                ),
            ));
        }
        if !(1..=MAX_SUPPORTED_DEPTH).contains(&self.policy.max_depth) {
            return Err(ConfigError::new(
                "executor.max_depth",
                format!(
                    "must be from 1 to {MAX_SUPPORTED_DEPTH}, got {}",
                    self.policy.max_depth
                ),
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
                redactor: self.redactor,
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
    /// The run's id; a fresh ULID when absent. It names the run's audit folder, so it must
    /// be a safe name (see [`Turn::with_run_id`]): reading a turn refuses any other, and so
    /// does [`Executor::start`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "run_id_from_str"
    )]
    pub run_id: Option<String>,
    /// The user approval given with the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
}

impl Turn {
    /// The longest run id, in bytes.
    pub const MAX_RUN_ID_BYTES: usize = 128;

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

    /// Sets the run's id: 1 to [`Turn::MAX_RUN_ID_BYTES`] bytes of ASCII letters, digits,
    /// `.`, `_` and `-`, and neither `.` nor `..`, since it names the run's folder in the
    /// audit directory. [`Executor::start`] refuses any other, naming `runId`.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall_executor::{Executor, Plan, Turn};
    /// use tower_toolcall::registry::ToolRegistry;
    /// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
    ///
    /// let executor = Executor::builder(ToolRegistry::open()).build()?;
    /// let plan = Plan::from_value(json!({"steps": [{"id": "a", "tool": "web::search"}]}))?;
    /// let tool = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!(1))) });
    /// let err = executor.start(tool, &plan, Turn::new("s", "u").with_run_id("../x")).unwrap_err();
    /// assert_eq!(err.problems()[0].field, "runId");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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

/// Checks that `id` is a run id that names a folder inside the audit directory and nothing
/// else: ASCII letters, digits, `.`, `_`, `-`, not `.` or `..`, not empty, not too long.
pub(crate) fn check_run_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty; leave it out for a fresh id".to_owned());
    }
    if id.len() > Turn::MAX_RUN_ID_BYTES {
        return Err(format!(
            "must be at most {} bytes, got {}; use a shorter id",
            Turn::MAX_RUN_ID_BYTES,
            id.len()
        ));
    }
    if id == "." || id == ".." {
        return Err(format!("must not be `{id}`; use a name such as a ULID"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "`{}` may hold only ASCII letters, digits, `.`, `_` and `-`; use a name such as \
             a ULID",
            id.escape_debug()
        ));
    }
    Ok(())
}

/// `runId` as a turn is read: a safe name, or refused with the reason.
fn run_id_from_str<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    use serde::de::Error;
    let id = Option::<String>::deserialize(deserializer)?;
    if let Some(id) = &id {
        check_run_id(id).map_err(|problem| D::Error::custom(format!("runId {problem}")))?;
    }
    Ok(id)
}

/// Opens the audit of run `run_id` in a folder of its own under `root`, with the executor's
/// queue capacity and redactor: a run id that already has a folder there is refused, so that
/// no run appends to another's record.
fn open_audit(
    root: &std::path::Path,
    run_id: &str,
    config: &ExecutorConfig,
) -> Result<AuditLog, PlanError> {
    let unusable = |e: &dyn std::fmt::Display| {
        PlanError::single(
            "auditDir",
            format!("cannot hold the run's audit: {e}; fix the executor's audit_dir"),
        )
    };
    std::fs::create_dir_all(root).map_err(|e| unusable(&e))?;
    let dir = root.join(run_id);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(PlanError::single(
                "runId",
                format!(
                    "`{run_id}` already has a record in the audit directory; give the run a \
                     fresh id (a replay needs an executor without this audit directory)"
                ),
            ))
        }
        Err(e) => return Err(unusable(&e)),
    }
    // Lossless: a replay reads the record back, so no line of it may be dropped.
    AuditLog::builder(dir)
        .queue_capacity(config.audit_queue_capacity)
        .redactor(config.redactor.clone())
        .build()
        .map(|audit| audit.lossless())
        .map_err(|e| unusable(&e))
}

pub(crate) use tower_toolcall::time::millis;

/// A seed for the jitter of a run whose seed nobody chose.
fn entropy_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}
