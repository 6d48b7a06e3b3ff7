//! The plan of a turn: steps, as the model wrote them (camelCase JSON) or as code builds them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The plan of one agent turn: its steps, in the order the model gave them, and the
/// variables they may read (`$vars.<name>`).
///
/// ```
/// use serde_json::json;
/// use tower_toolcall_executor::{Plan, Step};
///
/// let plan = Plan::from_value(json!({
///     "steps": [
///         {"id": "flights", "tool": "travel::flights", "args": {"to": "$vars.city"}},
///         {"id": "hotels", "tool": "travel::hotels", "args": {"near": "$steps.flights.arrival"},
///          "optional": true}
///     ],
///     "vars": {"city": "Lyon"}
/// }))?;
/// assert_eq!(plan.steps().len(), 2);
///
/// let same = Plan::new()
///     .with_var("city", json!("Lyon"))
///     .with_step(Step::new("flights", "travel::flights", json!({"to": "$vars.city"})))
///     .with_step(
///         Step::new("hotels", "travel::hotels", json!({"near": "$steps.flights.arrival"}))
///             .with_optional(true),
///     );
/// assert_eq!(same, plan);
/// # Ok::<(), tower_toolcall_executor::PlanError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Plan {
    /// The steps.
    pub steps: Vec<Step>,
    /// The variables, read by `$vars.<name>`; a step's `captureAs` adds one.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub vars: Map<String, Value>,
}

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Plan::default()
    }

    /// Reads a plan from its JSON form; a malformed one is a [`PlanError`](super::PlanError) naming the member.
    pub fn from_value(value: Value) -> Result<Plan, super::PlanError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            super::PlanError::single(path, e.into_inner().to_string())
        })
    }

    /// Reads a plan from JSON text.
    pub fn from_json(text: &str) -> Result<Plan, super::PlanError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| super::PlanError::single(".", format!("is not JSON: {e}")))?;
        Plan::from_value(value)
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Adds a step.
    pub fn with_step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// Sets a variable.
    pub fn with_var(mut self, name: impl Into<String>, value: Value) -> Self {
        self.vars.insert(name.into(), value);
        self
    }
}

/// One step of a plan: a tool, its args (with references), and how to run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Step {
    /// The step's id, unique in the plan.
    pub id: String,
    /// The tool: `namespace::name` (or `namespace.name`, split at the last dot).
    pub tool: String,
    /// The args, a JSON object, with references (see [`resolve`](super::resolve)).
    #[serde(default = "empty_object")]
    pub args: Value,
    /// Run the tool once per item of an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Foreach>,
    /// Steps that must finish first, besides those the args reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// When it cannot run or fails, the turn goes on without it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
    /// The output to use when it cannot run or fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// Tools to try in order, with the same args, when the tool fails permanently or its
    /// circuit breaker is open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// Tries again after a transient failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<StepRetry>,
    /// What a failure does to the turn.
    #[serde(default, skip_serializing_if = "OnError::is_fail")]
    pub on_error: OnError,
    /// Stores the output as the variable of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_as: Option<String>,
    /// What the step does, for the person who confirms the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// Whether a running call of this step may be cancelled (default `true`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub cancellable: bool,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Step {
    /// A step `id` calling `tool` with `args`.
    pub fn new(id: impl Into<String>, tool: impl Into<String>, args: Value) -> Self {
        Step {
            id: id.into(),
            tool: tool.into(),
            args,
            foreach: None,
            depends_on: Vec::new(),
            optional: false,
            default: None,
            alternatives: Vec::new(),
            retry: None,
            on_error: OnError::Fail,
            capture_as: None,
            preview: None,
            cancellable: true,
        }
    }

    /// Sets `foreach`.
    pub fn with_foreach(mut self, foreach: Foreach) -> Self {
        self.foreach = Some(foreach);
        self
    }

    /// Adds a step to `dependsOn`.
    pub fn with_depends_on(mut self, step_id: impl Into<String>) -> Self {
        self.depends_on.push(step_id.into());
        self
    }

    /// Sets `optional`.
    pub fn with_optional(mut self, optional: bool) -> Self {
        self.optional = optional;
        self
    }

    /// Sets `default`.
    pub fn with_default(mut self, default: Value) -> Self {
        self.default = Some(default);
        self
    }

    /// Adds an alternative tool.
    pub fn with_alternative(mut self, tool: impl Into<String>) -> Self {
        self.alternatives.push(tool.into());
        self
    }

    /// Sets `retry`.
    pub fn with_retry(mut self, retry: StepRetry) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Sets `onError`.
    pub fn with_on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Sets `captureAs`.
    pub fn with_capture_as(mut self, name: impl Into<String>) -> Self {
        self.capture_as = Some(name.into());
        self
    }

    /// Sets `preview`.
    pub fn with_preview(mut self, preview: impl Into<String>) -> Self {
        self.preview = Some(preview.into());
        self
    }

    /// Sets `cancellable`.
    pub fn with_cancellable(mut self, cancellable: bool) -> Self {
        self.cancellable = cancellable;
        self
    }

    /// `true` when a failure of the step does not fail the turn: it is optional, its
    /// `onError` is `skip`, or it has a default.
    pub fn is_required(&self) -> bool {
        !self.optional && self.on_error == OnError::Fail && self.default.is_none()
    }
}

/// `foreach`: the items a step runs over, expanded one call at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Foreach {
    /// An array, or a reference to one (`$steps.search.hits`, `$vars.files`).
    pub items: Value,
    /// The name of the item in templates (default `item`).
    #[serde(default = "item_name")]
    pub item_name: String,
    /// The name of the index in templates (default `index`).
    #[serde(default = "index_name")]
    pub index_name: String,
    /// The most calls of this step at once (the run's and the tool's limits hold too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
}

fn item_name() -> String {
    "item".to_owned()
}

fn index_name() -> String {
    "index".to_owned()
}

impl Foreach {
    /// Runs over `items`, bound to `item` and `index`.
    pub fn new(items: Value) -> Self {
        Foreach {
            items,
            item_name: item_name(),
            index_name: index_name(),
            max_concurrency: None,
        }
    }

    /// Sets `itemName`.
    pub fn with_item_name(mut self, name: impl Into<String>) -> Self {
        self.item_name = name.into();
        self
    }

    /// Sets `indexName`.
    pub fn with_index_name(mut self, name: impl Into<String>) -> Self {
        self.index_name = name.into();
        self
    }

    /// Sets `maxConcurrency`.
    pub fn with_max_concurrency(mut self, limit: usize) -> Self {
        self.max_concurrency = Some(limit);
        self
    }
}

/// `retry`: how often a step is tried after a transient failure, on top of what the stack's
/// retry layer does for each call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct StepRetry {
    /// Tries in all, the first included (the executor holds it to its own limit).
    pub max_attempts: u32,
    /// The pause before each new try, in milliseconds, before jitter.
    #[serde(default)]
    pub backoff_ms: u64,
    /// The spread of the jitter on each pause, in percent of `backoffMs` either way
    /// (default [`StepRetry::DEFAULT_JITTER_PERCENT`]; 0 for exact pauses, at most 100).
    /// Also read as `jitter_percent`.
    #[serde(
        default,
        alias = "jitter_percent",
        skip_serializing_if = "Option::is_none"
    )]
    pub jitter_percent: Option<u32>,
}

impl StepRetry {
    /// The jitter of a pause when the step's `retry` does not set `jitterPercent`: ±10 %.
    pub const DEFAULT_JITTER_PERCENT: u32 = 10;

    /// `max_attempts` tries in all, `backoff` apart, ±10 % jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_toolcall_executor::StepRetry;
    ///
    /// let retry = StepRetry::new(3, Duration::from_millis(100)).with_jitter_percent(0);
    /// assert_eq!(retry.jitter(), 0);
    /// assert_eq!(StepRetry::new(3, Duration::from_millis(100)).jitter(), 10);
    /// ```
    pub fn new(max_attempts: u32, backoff: Duration) -> Self {
        StepRetry {
            max_attempts,
            backoff_ms: u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
            jitter_percent: None,
        }
    }

    /// Sets `jitterPercent`: each pause is drawn from `backoff ± backoff · percent / 100`.
    pub fn with_jitter_percent(mut self, percent: u32) -> Self {
        self.jitter_percent = Some(percent);
        self
    }

    /// The spread of the jitter in percent: `jitterPercent`, or the default.
    pub fn jitter(&self) -> u32 {
        self.jitter_percent.unwrap_or(Self::DEFAULT_JITTER_PERCENT)
    }
}

/// `onError`: what a failure of the step does to the turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum OnError {
    /// A failure the step cannot recover from fails the turn (its independent steps still
    /// finish).
    #[default]
    Fail,
    /// The step is skipped, like an optional one.
    Skip,
}

impl OnError {
    fn is_fail(&self) -> bool {
        *self == OnError::Fail
    }
}
