//! A run's scheduling state: the steps, the calls in flight by key, the retries and the
//! limits. It does no I/O and reads no clock: the shell ([`crate::run`]) passes the time
//! in and does what it returns — the calls to make ([`Dispatch`]), the fate of the calls in
//! flight when the run stops ([`Fate`]), and the events and records to write ([`Action`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tokio::time::{Duration, Instant};

use crate::config::{
    millis, ConfirmationPolicy, ExecutorConfig, OnDeadline, Turn, EXECUTOR_VERSION,
};
use crate::events::Emitter;
use crate::outcome::{
    Classification, Decision, Recovery, StepError, StepOutcome, StepStatus, TurnResult, TurnStatus,
};
use crate::plan::{Plan, Step, StepRetry};
use crate::reference::{resolve, Scope};
use crate::schedule::{self, after, Action, CallKey, Dispatch, Failure, Fate, Retries, RunRecord};
use crate::validate::{json_kind, CheckedPlan, CheckedStep, Items};
use tower_toolcall::classify::{ToolProfile, Verdict};
use tower_toolcall::envelope::{Iteration, RunLink, ToolCall, ToolResult};
use tower_toolcall::registry::JitterKind;
use tower_toolcall::retry::Backoff;
use tower_toolcall::trace::{EventKind, EventLevel, ExecutionEvent};
use tower_toolcall::{ErrorCode, ToolError, ToolOutput};

/// What the run's controls asked for.
#[derive(Clone, Debug, Default)]
pub(crate) struct Signals {
    pub(crate) cancel: bool,
    pub(crate) confirmed: Option<String>,
    pub(crate) refused: bool,
}

/// Where a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Start,
    AwaitConfirmation,
    Running,
    Done,
}

/// One try of one unit (the step itself, or one item of its `foreach`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    unit: usize,
    /// 0 for the step's tool, then its alternatives.
    tool: usize,
    /// Tries of this tool for this unit, 1-based.
    tries: u32,
    /// Calls of this unit so far, this one included.
    dispatch: u32,
}

/// A step's state while it runs.
#[derive(Debug, Default)]
struct StepRun {
    items: Option<Vec<Value>>,
    units: usize,
    next_unit: usize,
    redo: VecDeque<Attempt>,
    waiting_retries: usize,
    in_flight: usize,
    outputs: Vec<Value>,
    failure: Option<ToolError>,
    answered_by: Option<usize>,
    /// A call of the step was dropped by a cancellation or the deadline.
    interrupted: bool,
}

/// One step of the run: what the plan's checks found, and where it is.
#[derive(Debug)]
struct StepState {
    /// Its tools, its dependencies and its dependents, as the checks resolved them.
    checked: CheckedStep,
    waiting_on: usize,
    run: Option<StepRun>,
    status: Option<StepStatus>,
    output: Option<Value>,
    error: Option<StepError>,
    calls: u32,
    answered_by: Option<String>,
}

/// What a call in flight remembers.
#[derive(Debug)]
struct CallMeta {
    step: usize,
    attempt: Attempt,
    cancellable: bool,
    call: ToolCall,
    /// When the call was dispatched, for the audit's `durationMs`.
    pub(crate) dispatched: Option<Instant>,
}

/// The actions decided and not yet done.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    actions: Vec<Action>,
}

impl Outbox {
    fn push(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Queues the event `make` builds, if anything listens: events are not even built
    /// otherwise.
    fn emit(&mut self, emitter: &Emitter, make: impl FnOnce(&str) -> ExecutionEvent) {
        if emitter.listening() {
            self.actions
                .push(Action::Emit(Box::new(make(emitter.run_id()))));
        }
    }

    pub(crate) fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }
}

/// A run's scheduling state: what each step and call is at, and what comes next. It does no
/// I/O and reads no clock: it is told the time, and answers with the calls to make, the fate
/// of the calls in flight, and the actions for the shell to do.
#[derive(Debug)]
pub(crate) struct RunState {
    config: Arc<ExecutorConfig>,
    /// The plan as it was written, shared.
    plan: Arc<Plan>,
    turn: Turn,
    confirmation_id: Option<String>,
    pub(crate) emitter: Emitter,
    /// What was decided and is not yet done.
    pub(crate) out: Outbox,
    pub(crate) phase: Phase,
    steps: Vec<StepState>,
    outputs: HashMap<String, Value>,
    /// The variables steps captured (`captureAs`); the plan's own are read from the plan.
    captured: Map<String, Value>,
    ready: BTreeSet<usize>,
    active: BTreeSet<usize>,
    /// Steps whose next call waits for a slot of its tool's concurrency limit, by tool:
    /// each slot that frees moves the first of them back to `active`, so that scheduling
    /// does not look at every waiting step each time a call is dispatched.
    parked: HashMap<String, BTreeSet<usize>>,
    /// The record of each call in flight.
    calls: BTreeMap<CallKey, CallMeta>,
    /// The key of the next call dispatched.
    next_key: u64,
    in_flight: usize,
    tool_in_flight: HashMap<String, usize>,
    /// Tries waiting for their pause to end: the step and the attempt.
    retries: Retries<(usize, Attempt)>,
    /// When the turn's deadline comes, once the run has begun.
    pub(crate) deadline: Option<Instant>,
    stopping: Option<TurnStatus>,
    escalated: bool,
    trace: Vec<Decision>,
    status: TurnStatus,
    /// Every call dispatched, kept for a replay to compare.
    pub(crate) dispatched: Option<Vec<ToolCall>>,
    /// Where the jitter of the run's retry pauses comes from.
    pub(crate) jitter_seed: u64,
}

impl RunState {
    pub(crate) fn new(
        config: Arc<ExecutorConfig>,
        plan: CheckedPlan,
        turn: Turn,
        emitter: Emitter,
        jitter_seed: u64,
    ) -> Self {
        let CheckedPlan { plan, steps } = plan;
        let step_count = steps.len();
        let steps = steps
            .into_iter()
            .map(|checked| StepState {
                waiting_on: checked.deps.len(),
                checked,
                run: None,
                status: None,
                output: None,
                error: None,
                calls: 0,
                answered_by: None,
            })
            .collect();
        let tool_in_flight = config
            .policy
            .tool_concurrency
            .keys()
            .map(|tool| (tool.clone(), 0))
            .collect();
        RunState {
            confirmation_id: turn.confirmation_id.clone(),
            config,
            plan,
            turn,
            emitter,
            out: Outbox::default(),
            phase: Phase::Start,
            steps,
            outputs: HashMap::with_capacity(step_count),
            captured: Map::new(),
            ready: BTreeSet::new(),
            active: BTreeSet::new(),
            parked: HashMap::new(),
            calls: BTreeMap::new(),
            next_key: 0,
            in_flight: 0,
            tool_in_flight,
            retries: Retries::default(),
            deadline: None,
            stopping: None,
            escalated: false,
            trace: Vec::new(),
            status: TurnStatus::Completed,
            dispatched: None,
            jitter_seed,
        }
    }

    fn step_id(&self, i: usize) -> &str {
        &self.plan.steps[i].id
    }

    /// What references see: the outputs, the captured variables over the plan's, and the
    /// run's depth limit.
    fn scope(&self) -> Scope<'_> {
        Scope::new(&self.outputs, &self.captured)
            .with_base_vars(&self.plan.vars)
            .with_max_depth(self.config.policy.max_depth)
    }

    /// The controls' signals: a confirmation, refusal or cancellation while the run waits
    /// for confirmation, a cancellation while it runs. `Some` when they changed the run, with
    /// the fate of each call in flight.
    pub(crate) fn on_signals(
        &mut self,
        signals: Signals,
        now: Instant,
    ) -> Option<Vec<(CallKey, Fate)>> {
        if self.phase == Phase::AwaitConfirmation {
            if signals.cancel {
                self.out.emit(&self.emitter, |run| {
                    ExecutionEvent::of_run(
                        EventKind::RunCancelled,
                        run,
                        "run cancelled before it was confirmed",
                    )
                    .level(EventLevel::Warn)
                });
                self.end_unstarted(
                    TurnStatus::Cancelled,
                    ErrorCode::Cancelled,
                    "the run was cancelled",
                );
                return Some(Vec::new());
            }
            if signals.refused {
                self.end_unstarted(
                    TurnStatus::Refused,
                    ErrorCode::PolicyDenied,
                    "the run was not confirmed",
                );
                return Some(Vec::new());
            }
            if let Some(id) = signals.confirmed {
                self.out.emit(&self.emitter, |run| {
                    ExecutionEvent::of_run(EventKind::RunConfirmed, run, "run confirmed")
                        .payload(json!({"confirmationId": id}))
                });
                self.confirmation_id = Some(id);
                self.start_running();
                return Some(Vec::new());
            }
        } else if signals.cancel && self.stopping.is_none() {
            return Some(self.cancel(now));
        }
        None
    }

    /// Ends the run once nothing is in flight and nothing is left to start, or once it
    /// stops and its last call has ended.
    pub(crate) fn end_if_settled(&mut self) -> bool {
        let settled = self.calls.is_empty()
            && (self.stopping.is_some()
                || (self.ready.is_empty()
                    && self.active.is_empty()
                    && self.parked.values().all(BTreeSet::is_empty)
                    && self.retries.is_empty()));
        if settled {
            self.end_run();
        }
        settled
    }

    /// `run.started`, the deadline, and the request for confirmation if one is needed.
    pub(crate) fn begin(&mut self, now: Instant) {
        self.emitter.start_clock(now);
        let steps = self.plan.steps.len();
        self.out.emit(&self.emitter, |run| {
            ExecutionEvent::of_run(
                EventKind::RunStarted,
                run,
                format!("run of {steps} steps started"),
            )
            .payload(json!({"steps": steps}))
        });
        if let Some(ms) = self.config.policy.turn_timeout_ms {
            self.deadline = Some(after(now, Duration::from_millis(ms)));
        }
        if !self.steps.iter().any(|s| s.checked.mutating) || self.confirmation_id.is_some() {
            self.start_running();
            return;
        }
        match self.config.policy.confirmation {
            ConfirmationPolicy::NotRequired => self.start_running(),
            ConfirmationPolicy::Refuse => self.end_unstarted(
                TurnStatus::Refused,
                ErrorCode::PolicyDenied,
                "the run has steps that change things and no confirmation",
            ),
            ConfirmationPolicy::Ask => {
                let previews: Vec<Value> = self
                    .plan
                    .steps
                    .iter()
                    .zip(&self.steps)
                    .filter(|(_, state)| state.checked.mutating)
                    .map(|(s, _)| json!({"stepId": s.id, "tool": s.tool, "preview": s.preview}))
                    .collect();
                self.out.emit(&self.emitter, |run| {
                    ExecutionEvent::of_run(
                        EventKind::RunConfirmationRequested,
                        run,
                        "the run has steps that change things; confirm it to go on",
                    )
                    .payload(json!({"steps": previews}))
                });
                self.phase = Phase::AwaitConfirmation;
            }
        }
    }

    fn start_running(&mut self) {
        self.phase = Phase::Running;
        self.write_record(None);
        for (i, step) in self.steps.iter().enumerate() {
            if step.waiting_on == 0 {
                self.ready.insert(i);
            }
        }
    }

    /// Ends a run that dispatched nothing: every step skipped.
    fn end_unstarted(&mut self, status: TurnStatus, code: ErrorCode, why: &str) {
        self.status = status;
        for step in &mut self.steps {
            step.status = Some(StepStatus::Skipped);
            step.error = Some(StepError {
                code,
                message: why.to_owned(),
            });
        }
        self.stopping = Some(status);
        self.end_run();
    }

    /// Starts the steps whose dependencies have all finished, in plan order.
    pub(crate) fn start_ready(&mut self) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        let mut progressed = false;
        while let Some(i) = self.ready.pop_first() {
            progressed = true;
            let missing = self.steps[i]
                .checked
                .deps
                .iter()
                .copied()
                .find(|&d| !self.steps[d].status.is_some_and(StepStatus::has_output));
            if let Some(dep) = missing {
                let why = format!("step `{}` it depends on has no result", self.step_id(dep));
                self.cascade(i, &why);
                continue;
            }
            let mut run = StepRun::default();
            if let Some(items) = &self.steps[i].checked.items {
                let resolved = match items {
                    // Items the plan holds are read where they are, one at a time.
                    Items::Inline | Items::Var(_) => Ok(None),
                    Items::Reference(value) => {
                        // The items are a copy of an output, not args: no size limit.
                        resolve(value, &self.scope().with_max_bytes(usize::MAX))
                            .map(Some)
                            .map_err(|e| ToolError::invalid_field("foreach.items", e.to_string()))
                    }
                };
                match resolved {
                    Ok(None) => run.units = self.plan_items(i).map_or(0, <[Value]>::len),
                    Ok(Some(Value::Array(items))) => {
                        run.units = items.len();
                        run.items = Some(items);
                    }
                    Ok(Some(other)) => {
                        run.failure = Some(ToolError::invalid_field(
                            "foreach.items",
                            format_args!("must be an array, got {}", json_kind(&other)),
                        ));
                    }
                    Err(e) => run.failure = Some(e),
                }
            } else {
                run.units = 1;
            }
            run.outputs = Vec::with_capacity(run.units.min(1024));
            let units = run.units;
            let failed = run.failure.clone();
            self.steps[i].run = Some(run);
            let step = &self.plan.steps[i];
            self.out.emit(&self.emitter, |r| {
                ExecutionEvent::of_run(
                    EventKind::StepScheduled,
                    r,
                    format!("step {} scheduled", step.id),
                )
                .step(step.id.clone())
                .tool(step.tool.clone())
                .payload(json!({"units": units}))
            });
            if let Some(error) = failed {
                let recovery = self.fallback(i);
                self.record_decision(i, None, &error, Classification::Permanent, 0, recovery);
                self.finish_step(i);
            } else if units == 0 {
                self.finish_step(i);
            } else {
                self.active.insert(i);
            }
        }
        progressed
    }

    /// What a step that cannot get an output of its own does: its default, a skip, or the
    /// turn's failure.
    fn fallback(&self, i: usize) -> Recovery {
        let step = &self.plan.steps[i];
        schedule::fallback(step.default.is_some(), step.is_required())
    }

    /// A step one of whose dependencies has no output.
    fn cascade(&mut self, i: usize, why: &str) {
        let recovery = self.fallback(i);
        let step = &self.plan.steps[i];
        let decision = Decision {
            step_id: step.id.clone(),
            call_id: None,
            tool: step.tool.clone(),
            error_code: None,
            classification: Classification::Dependency,
            breaker_state: None,
            retry_count: 0,
            decision: recovery,
            reason: why.to_owned(),
        };
        self.trace.push(decision);
        let state = &mut self.steps[i];
        match recovery {
            Recovery::Default => {
                state.status = Some(StepStatus::Defaulted);
                state.output = step.default.clone();
            }
            _ => state.status = Some(StepStatus::Skipped),
        }
        state.error = Some(StepError {
            code: ErrorCode::PreconditionFailed,
            message: why.to_owned(),
        });
        if recovery == Recovery::Escalate {
            self.escalated = true;
        }
        self.step_ended(i, Some(recovery));
    }

    /// When the next retry is due; `None` when no retry waits.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.retries.next_due()
    }

    /// Moves the retries due at `now` to their steps.
    pub(crate) fn retries_due(&mut self, now: Instant) -> bool {
        let due = self.retries.take_due(now);
        let progressed = !due.is_empty();
        for (step, attempt) in due {
            if let Some(run) = &mut self.steps[step].run {
                run.waiting_retries -= 1;
                run.redo.push_back(attempt);
                self.active.insert(step);
            }
        }
        progressed
    }

    /// The next try the limits allow, in plan and item order. A step whose next try waits
    /// for its tool's limit is parked until a call of that tool ends.
    pub(crate) fn next_attempt(&mut self) -> Option<(usize, Attempt)> {
        if self.stopping.is_some() {
            return None;
        }
        let policy = &self.config.policy;
        if self.in_flight >= policy.max_concurrency {
            return None;
        }
        // Each free slot of a tool goes back to the first step waiting for it, as a scan in
        // plan order would give it.
        for (tool, waiting) in &mut self.parked {
            let cap = policy
                .tool_concurrency
                .get(tool)
                .copied()
                .unwrap_or(usize::MAX);
            let used = self.tool_in_flight.get(tool).copied().unwrap_or(0);
            for _ in used..cap {
                let Some(i) = waiting.pop_first() else {
                    break;
                };
                self.active.insert(i);
            }
        }
        let mut from = 0;
        while let Some(&i) = self.active.range(from..).next() {
            from = i + 1;
            let run = self.steps[i].run.as_ref()?;
            let limit = self.plan.steps[i]
                .foreach
                .as_ref()
                .and_then(|f| f.max_concurrency)
                .unwrap_or(usize::MAX);
            if run.in_flight >= limit {
                continue;
            }
            let attempt = match run.redo.front() {
                Some(a) => *a,
                None if run.failure.is_none() && run.next_unit < run.units => Attempt {
                    unit: run.next_unit,
                    tool: 0,
                    tries: 1,
                    dispatch: 1,
                },
                None => continue,
            };
            let tool = self.steps[i].checked.tools[attempt.tool].full();
            if let Some(&cap) = policy.tool_concurrency.get(tool) {
                if self.tool_in_flight.get(tool).copied().unwrap_or(0) >= cap {
                    self.active.remove(&i);
                    self.parked.entry(tool.to_owned()).or_default().insert(i);
                    continue;
                }
            }
            return Some((i, attempt));
        }
        None
    }

    /// Starts the try `next` once the service answered `ready`: the call to make, or `None`
    /// when the service or the making of the call failed.
    pub(crate) fn start(
        &mut self,
        (i, attempt): (usize, Attempt),
        ready: Result<(), ToolError>,
        now: Instant,
    ) -> Option<Dispatch> {
        let run = self.steps[i].run.as_mut().expect("an active step runs");
        if run.redo.front().is_some() {
            run.redo.pop_front();
        } else {
            run.next_unit += 1;
        }
        if run.redo.is_empty() && (run.failure.is_some() || run.next_unit >= run.units) {
            self.active.remove(&i);
        }
        match ready.and_then(|()| self.make_call(i, attempt)) {
            Ok(call) => Some(self.send(i, attempt, call, now)),
            Err(error) => {
                self.failed(i, attempt, None, error, now);
                self.maybe_finish_step(i);
                None
            }
        }
    }

    /// The `foreach` items of step `i` that the plan itself holds.
    fn plan_items(&self, i: usize) -> Option<&[Value]> {
        let value = match self.steps[i].checked.items.as_ref()? {
            Items::Inline => &self.plan.steps[i].foreach.as_ref()?.items,
            Items::Var(name) => self.plan.vars.get(name)?,
            Items::Reference(_) => return None,
        };
        value.as_array().map(Vec::as_slice)
    }

    /// The call of `attempt`: args resolved, checked, linked to the run.
    fn make_call(&self, i: usize, attempt: Attempt) -> Result<ToolCall, ToolError> {
        let step = &self.plan.steps[i];
        let tool = &self.steps[i].checked.tools[attempt.tool];
        let run = self.steps[i].run.as_ref().expect("a dispatched step runs");
        let max_bytes = self
            .config
            .registry
            .get(&tool.namespace, &tool.name)
            .and_then(|t| t.descriptor().policy.validate.overrides())
            .and_then(|o| o.max_params_bytes)
            .unwrap_or(self.config.policy.max_params_bytes);
        let mut scope = self.scope().with_max_bytes(max_bytes);
        let mut link;
        let item = match &run.items {
            Some(items) => items.get(attempt.unit),
            None => self.plan_items(i).and_then(|items| items.get(attempt.unit)),
        };
        if let (Some(foreach), Some(item)) = (&step.foreach, item) {
            scope = scope
                .with_item(&foreach.item_name, item)
                .with_index(&foreach.index_name, attempt.unit as u64);
            link = RunLink::new(self.emitter.run_id(), &step.id, call_id(step, attempt))
                .with_iteration(Iteration::new(
                    attempt.unit as u64,
                    &foreach.item_name,
                    item.clone(),
                ))
                .with_loop_id(format!("{}/{}", self.emitter.run_id(), step.id));
        } else {
            link = RunLink::new(self.emitter.run_id(), &step.id, call_id(step, attempt));
        }
        link = link.with_attempt(attempt.dispatch);
        let args = resolve(&step.args, &scope).map_err(|e| {
            ToolError::rejected(
                e.code(),
                format!(
                    "step `{}`: {e}; the plan must reference an existing value",
                    step.id
                ),
            )
        })?;
        if let Some(registered) = self.config.registry.get(&tool.namespace, &tool.name) {
            registered.check_params(&args)?;
        }
        let mut builder = ToolCall::builder(&tool.namespace, &tool.name)
            .session(&self.turn.session_key)
            .actor(&self.turn.actor_id)
            .params(args)
            .run_link(link);
        if let Some(tenant) = &self.turn.tenant_id {
            builder = builder.tenant(tenant);
        }
        if let Some(id) = &self.confirmation_id {
            builder = builder.confirmation_id(id);
        }
        builder.build()
    }

    fn send(&mut self, i: usize, attempt: Attempt, call: ToolCall, now: Instant) -> Dispatch {
        let tool = self.steps[i].checked.tools[attempt.tool].full();
        if let Some(n) = self.tool_in_flight.get_mut(tool) {
            *n += 1;
        }
        self.out.emit(&self.emitter, |_| {
            ExecutionEvent::new(EventKind::StepStarted, &call, "call dispatched")
        });
        if self.emitter.audit.is_some() {
            self.out.push(Action::RecordCall(call.clone()));
        }
        if let Some(dispatched) = &mut self.dispatched {
            dispatched.push(call.clone());
        }
        self.in_flight += 1;
        let state = &mut self.steps[i];
        state.calls += 1;
        let run = state.run.as_mut().expect("a dispatched step runs");
        run.in_flight += 1;
        let key = CallKey(self.next_key);
        self.next_key += 1;
        self.calls.insert(
            key,
            CallMeta {
                step: i,
                attempt,
                cancellable: self.plan.steps[i].cancellable,
                call: call.clone(),
                dispatched: self.emitter.audit.as_ref().map(|_| now),
            },
        );
        Dispatch { key, call }
    }

    fn record_result(
        &mut self,
        call: &ToolCall,
        outcome: &Result<ToolOutput, ToolError>,
        dispatched: Option<Instant>,
        now: Instant,
    ) {
        if self.emitter.audit.is_some() {
            let mut result = ToolResult::from_outcome(call, outcome.clone());
            result.duration_ms =
                millis(dispatched.map_or(Duration::ZERO, |at| now.saturating_duration_since(at)));
            self.out.push(Action::RecordResult(Box::new(result)));
        }
    }

    fn release(&mut self, meta: &CallMeta) {
        self.in_flight -= 1;
        let tool = self.steps[meta.step].checked.tools[meta.attempt.tool].full();
        if let Some(n) = self.tool_in_flight.get_mut(tool) {
            *n -= 1;
        }
        if let Some(run) = &mut self.steps[meta.step].run {
            run.in_flight -= 1;
        }
    }

    /// A call ended.
    pub(crate) fn on_finished(
        &mut self,
        key: CallKey,
        outcome: Result<ToolOutput, ToolError>,
        now: Instant,
    ) {
        let meta = self
            .calls
            .remove(&key)
            .expect("a call in flight has its record");
        self.release(&meta);
        self.record_result(&meta.call, &outcome, meta.dispatched, now);
        let i = meta.step;
        match outcome {
            Ok(output) => {
                self.out.emit(&self.emitter, |_| {
                    ExecutionEvent::new(EventKind::StepFinished, &meta.call, "call succeeded")
                });
                let foreach = self.plan.steps[i].foreach.is_some();
                let run = self.steps[i].run.as_mut().expect("a step with calls runs");
                run.answered_by = Some(meta.attempt.tool);
                if foreach {
                    let unit = meta.attempt.unit;
                    if run.outputs.len() <= unit {
                        run.outputs.resize(unit + 1, Value::Null);
                    }
                    run.outputs[unit] = output.content;
                    let (done, total) = (run.next_unit - run.in_flight, run.units);
                    let id = self.step_id(i).to_owned();
                    self.out.emit(&self.emitter, |r| {
                        ExecutionEvent::of_run(
                            EventKind::StepProgress,
                            r,
                            format!("{done} of {total} items ended"),
                        )
                        .step(id)
                        .payload(json!({"ended": done, "total": total}))
                    });
                } else {
                    run.outputs.push(output.content);
                }
            }
            Err(error) => self.failed(i, meta.attempt, Some(&meta.call), error, now),
        }
        self.maybe_finish_step(i);
    }

    /// A try failed (a call, or the making of one): retry, alternative, or the step's
    /// fallback.
    fn failed(
        &mut self,
        i: usize,
        attempt: Attempt,
        call: Option<&ToolCall>,
        error: ToolError,
        now: Instant,
    ) {
        let step = &self.plan.steps[i];
        let tool_count = self.steps[i].checked.tools.len();
        let tool = &self.steps[i].checked.tools[attempt.tool];
        let pause = step.retry.map_or(Duration::ZERO, |retry| {
            retry_pause(&retry, self.jitter_seed, &call_id(step, attempt))
        });
        let profile = match self.config.registry.get(&tool.namespace, &tool.name) {
            Some(t) => ToolProfile::new(Some(t.descriptor()), &t.descriptor().policy),
            None => ToolProfile::new(None, self.config.registry.unregistered_policy()),
        };
        let outcome = Err(error);
        let verdict = self
            .config
            .classifier
            .classify(&outcome, &profile)
            .verdict();
        let Err(error) = outcome else { unreachable!() };
        let classification = schedule::classify(
            error.code() == ErrorCode::CircuitOpen,
            verdict == Verdict::Retriable,
        );
        let failure = Failure {
            classification,
            tries: attempt.tries,
            max_tries: step.retry.map_or(1, |r| {
                r.max_attempts.min(self.config.policy.max_step_attempts)
            }),
            tool: attempt.tool,
            tools: tool_count,
        };
        let recovery = schedule::recovery(failure, self.fallback(i), self.stopping.is_some());
        if let Some(call) = call {
            let payload = json!({
                "errorCode": error.code(),
                "classification": classification,
                "breakerState": error.record().breaker_state,
                "retryCount": attempt.tries,
                "decision": recovery.map(Recovery::as_str),
            });
            let message = error.message().to_owned();
            self.out.emit(&self.emitter, |_| {
                ExecutionEvent::new(EventKind::StepFailed, call, message)
                    .level(EventLevel::Warn)
                    .payload(payload)
            });
        }
        let Some(recovery) = recovery else {
            let run = self.steps[i].run.as_mut().expect("a step with calls runs");
            run.failure.get_or_insert(error);
            return;
        };
        self.record_decision(i, call, &error, classification, attempt.tries, recovery);
        let run = self.steps[i].run.as_mut().expect("a step with calls runs");
        match recovery {
            Recovery::Retry => {
                let next = Attempt {
                    tries: attempt.tries + 1,
                    dispatch: attempt.dispatch + 1,
                    ..attempt
                };
                if pause.is_zero() {
                    run.redo.push_back(next);
                    self.active.insert(i);
                } else {
                    run.waiting_retries += 1;
                    self.retries.schedule(now, pause, (i, next));
                }
            }
            Recovery::Alternative => {
                run.redo.push_back(Attempt {
                    tool: attempt.tool + 1,
                    tries: 1,
                    dispatch: attempt.dispatch + 1,
                    ..attempt
                });
                self.active.insert(i);
            }
            Recovery::Default | Recovery::Skip | Recovery::Escalate => {
                run.failure.get_or_insert(error);
                if run.redo.is_empty() {
                    self.active.remove(&i);
                }
            }
        }
    }

    fn record_decision(
        &mut self,
        i: usize,
        call: Option<&ToolCall>,
        error: &ToolError,
        classification: Classification,
        tries: u32,
        recovery: Recovery,
    ) {
        let step = &self.plan.steps[i];
        self.trace.push(Decision {
            step_id: step.id.clone(),
            call_id: call.and_then(|c| c.run_link()).map(|l| l.call_id.clone()),
            tool: call.map_or_else(
                || step.tool.clone(),
                |c| format!("{}::{}", c.tool_namespace(), c.tool_name()),
            ),
            error_code: Some(error.code()),
            classification,
            breaker_state: error.record().breaker_state,
            retry_count: tries,
            decision: recovery,
            reason: error.message().to_owned(),
        });
    }

    fn maybe_finish_step(&mut self, i: usize) {
        let Some(run) = &self.steps[i].run else {
            return;
        };
        if self.steps[i].status.is_some() || run.in_flight > 0 {
            return;
        }
        let settled = run.redo.is_empty()
            && run.waiting_retries == 0
            && (run.failure.is_some() || run.next_unit >= run.units);
        if settled || self.stopping.is_some() {
            self.finish_step(i);
        }
    }

    /// A step whose calls have all ended.
    fn finish_step(&mut self, i: usize) {
        self.active.remove(&i);
        for waiting in self.parked.values_mut() {
            waiting.remove(&i);
        }
        let step = &self.plan.steps[i];
        let (stopped, stop_code) = self.stop_status();
        let fallback = self.fallback(i);
        let state = &mut self.steps[i];
        let run = state.run.take().unwrap_or_default();
        let mut recovery = None;
        if let Some(error) = run.failure {
            let r = fallback;
            if r == Recovery::Default {
                state.status = Some(StepStatus::Defaulted);
                state.output = step.default.clone();
            } else {
                state.status = Some(StepStatus::Failed);
            }
            state.error = Some(StepError {
                code: error.code(),
                message: error.message().to_owned(),
            });
            self.escalated |= r == Recovery::Escalate;
            recovery = Some(r);
        } else if self.stopping.is_some() && (run.interrupted || run.next_unit < run.units.max(1)) {
            state.status = Some(stopped);
            state.error = Some(StepError {
                code: stop_code,
                message: "stopped before all its calls were made".to_owned(),
            });
        } else {
            state.status = Some(StepStatus::Succeeded);
            state.output = Some(if step.foreach.is_some() {
                let mut outputs = run.outputs;
                outputs.resize(run.units, Value::Null);
                Value::Array(outputs)
            } else {
                run.outputs.into_iter().next().unwrap_or(Value::Null)
            });
            if let Some(k) = run.answered_by.filter(|&k| k > 0) {
                state.answered_by = Some(state.checked.tools[k].full().to_owned());
            }
        }
        self.step_ended(i, recovery);
    }

    fn stop_status(&self) -> (StepStatus, ErrorCode) {
        match self.stopping {
            Some(TurnStatus::Cancelled) => (StepStatus::Cancelled, ErrorCode::Cancelled),
            _ => (StepStatus::TimedOut, ErrorCode::Timeout),
        }
    }

    /// Publishes a step's end: its output, its event, and its dependents' readiness.
    fn step_ended(&mut self, i: usize, recovery: Option<Recovery>) {
        let step = &self.plan.steps[i];
        // The output is kept once, where references find it.
        if let Some(output) = self.steps[i].output.take() {
            if let Some(name) = &step.capture_as {
                self.captured.insert(name.clone(), output.clone());
            }
            self.outputs.insert(step.id.clone(), output);
        }
        let state = &self.steps[i];
        let status = state.status.expect("an ended step has a status");
        let (id, tool, calls) = (&step.id, &step.tool, state.calls);
        let error = state.error.as_ref();
        self.out.emit(&self.emitter, |run| {
            let (kind, level) = if status.has_output() {
                (EventKind::StepFinished, EventLevel::Info)
            } else if status == StepStatus::Skipped && recovery == Some(Recovery::Skip) {
                (EventKind::StepFinished, EventLevel::Warn)
            } else {
                (EventKind::StepFailed, EventLevel::Error)
            };
            let message = match error {
                Some(e) => format!("step {id} {}: {}", status_word(status), e.message),
                None => format!("step {id} {}", status_word(status)),
            };
            ExecutionEvent::of_run(kind, run, message)
                .step(id.clone())
                .tool(tool.clone())
                .level(level)
                .payload(json!({
                    "status": status,
                    "calls": calls,
                    "decision": recovery.map(Recovery::as_str),
                    "errorCode": error.map(|e| e.code),
                }))
        });
        for k in 0..self.steps[i].checked.dependents.len() {
            let d = self.steps[i].checked.dependents[k];
            let dependent = &mut self.steps[d];
            dependent.waiting_on -= 1;
            if dependent.waiting_on == 0 && dependent.status.is_none() {
                self.ready.insert(d);
            }
        }
    }

    /// The turn's deadline: completed results stay, running steps time out, the rest are
    /// skipped; running calls are left to finish (or dropped), not awaited.
    pub(crate) fn on_deadline(&mut self, now: Instant) -> Vec<(CallKey, Fate)> {
        if self.stopping == Some(TurnStatus::Partial) {
            return Vec::new();
        }
        if self.phase == Phase::AwaitConfirmation {
            self.end_unstarted(
                TurnStatus::Partial,
                ErrorCode::Timeout,
                "the turn's deadline came before the run was confirmed",
            );
            return Vec::new();
        }
        self.stopping = Some(self.stopping.unwrap_or(TurnStatus::Partial));
        let mut fates = Vec::with_capacity(self.calls.len());
        for key in self.calls_in_order() {
            let meta = self
                .calls
                .remove(&key)
                .expect("a running call has its record");
            self.release(&meta);
            let error = ToolError::new(
                ErrorCode::Timeout,
                "the turn's deadline came before the call ended; the tool may still act",
            )
            .with_details(json!({"outcomeUnknown": true}));
            self.out.emit(&self.emitter, |_| {
                ExecutionEvent::new(EventKind::StepFailed, &meta.call, error.message())
                    .level(EventLevel::Warn)
                    .payload(json!({"errorCode": ErrorCode::Timeout, "decision": "skip", "outcomeUnknown": true}))
            });
            self.record_result(&meta.call, &Err(error), meta.dispatched, now);
            let keep =
                self.config.policy.on_deadline == OnDeadline::LeaveRunning || !meta.cancellable;
            fates.push((key, if keep { Fate::Detach } else { Fate::Drop }));
        }
        self.stop_remaining(ErrorCode::Timeout, "the turn's deadline came before it ran");
        fates
    }

    /// The calls in flight, in plan, item and dispatch order (not the order they happen to
    /// sit in), so that what is done to them is the same in every run.
    fn calls_in_order(&self) -> Vec<CallKey> {
        let mut keys: Vec<_> = self
            .calls
            .iter()
            .map(|(&key, m)| ((m.step, m.attempt.unit, m.attempt.dispatch), key))
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|(_, key)| key).collect()
    }

    /// Cancellation: the running calls of cancellable steps are dropped; the others end.
    fn cancel(&mut self, now: Instant) -> Vec<(CallKey, Fate)> {
        self.stopping = Some(TurnStatus::Cancelled);
        self.out.emit(&self.emitter, |run| {
            ExecutionEvent::of_run(EventKind::RunCancelled, run, "run cancelled")
                .level(EventLevel::Warn)
        });
        let mut fates = Vec::with_capacity(self.calls.len());
        for key in self.calls_in_order() {
            if !self.calls[&key].cancellable {
                fates.push((key, Fate::Keep));
                continue;
            }
            let meta = self
                .calls
                .remove(&key)
                .expect("a running call has its record");
            fates.push((key, Fate::Drop));
            self.release(&meta);
            if let Some(run) = &mut self.steps[meta.step].run {
                run.interrupted = true;
            }
            let error = ToolError::new(
                ErrorCode::Cancelled,
                "the run was cancelled while the call ran; the tool may have acted",
            )
            .with_details(json!({"outcomeUnknown": true}));
            self.out.emit(&self.emitter, |_| {
                ExecutionEvent::new(EventKind::StepFailed, &meta.call, error.message())
                    .level(EventLevel::Warn)
                    .payload(json!({"errorCode": ErrorCode::Cancelled, "outcomeUnknown": true}))
            });
            self.record_result(&meta.call, &Err(error), meta.dispatched, now);
        }
        self.retries.clear();
        for step in self.steps.iter_mut().filter_map(|s| s.run.as_mut()) {
            step.redo.clear();
            step.waiting_retries = 0;
        }
        let idle: Vec<usize> = (0..self.steps.len())
            .filter(|&i| {
                self.steps[i].status.is_none()
                    && self.steps[i].run.as_ref().is_some_and(|r| r.in_flight == 0)
            })
            .collect();
        for i in idle {
            self.finish_step(i);
        }
        self.active.clear();
        self.parked.clear();
        self.ready.clear();
        fates
    }

    /// Every step without a status gets the status of the stop.
    fn stop_remaining(&mut self, code: ErrorCode, why: &str) {
        self.retries.clear();
        self.active.clear();
        self.parked.clear();
        self.ready.clear();
        let (stopped, _) = self.stop_status();
        for i in 0..self.steps.len() {
            if self.steps[i].status.is_some() {
                continue;
            }
            let ran = self.steps[i].run.take().is_some();
            let state = &mut self.steps[i];
            state.status = Some(if ran {
                stopped
            } else if code == ErrorCode::Cancelled {
                StepStatus::Cancelled
            } else {
                StepStatus::Skipped
            });
            state.error = Some(StepError {
                code,
                message: if ran {
                    "its calls had not all ended when the run stopped".to_owned()
                } else {
                    why.to_owned()
                },
            });
            let (id, tool, status) = (
                self.plan.steps[i].id.clone(),
                self.plan.steps[i].tool.clone(),
                state.status,
            );
            let message = format!(
                "step {id}: {}",
                state.error.as_ref().map_or("", |e| e.message.as_str())
            );
            self.out.emit(&self.emitter, |run| {
                ExecutionEvent::of_run(EventKind::StepFailed, run, message)
                    .step(id)
                    .tool(tool.clone())
                    .level(EventLevel::Warn)
                    .payload(json!({"status": status, "errorCode": code}))
            });
        }
    }

    fn end_run(&mut self) {
        if let Some(TurnStatus::Cancelled) = self.stopping {
            self.stop_remaining(ErrorCode::Cancelled, "the run was cancelled before it ran");
        }
        self.status = match self.stopping {
            Some(status) => status,
            None if self.escalated => TurnStatus::Failed,
            None => TurnStatus::Completed,
        };
        let status = self.status;
        let message = self.message();
        // Before `run.finished`, so that a failure to write it is an event of the run.
        self.write_record(Some(status));
        self.out.emit(&self.emitter, |run| {
            ExecutionEvent::of_run(EventKind::RunFinished, run, message)
                .level(if status == TurnStatus::Completed {
                    EventLevel::Info
                } else {
                    EventLevel::Warn
                })
                .payload(json!({"status": status}))
        });
        // The shell does what is decided, then ends the stream.
        self.phase = Phase::Done;
    }

    /// Asks for `run.json` to be written, when the run has an audit: the record built here,
    /// with `status` once the run has ended.
    fn write_record(&mut self, status: Option<TurnStatus>) {
        if let Some(record) = self.record(status) {
            self.out.push(Action::WriteRecord(Box::new(record)));
        }
    }

    /// The run's record, `run.json`, where the run's audit is; `None` without one. It is
    /// redacted with the executor's redactor, as the audit's lines are: the plan's args may
    /// hold secrets.
    fn record(&self, status: Option<TurnStatus>) -> Option<RunRecord> {
        self.emitter.audit.as_ref()?;
        let root = self.config.audit_dir.as_ref()?;
        let record = json!({
            "runId": self.emitter.run_id(),
            "plan": self.plan,
            "policy": self.config.policy,
            "turn": self.turn,
            "confirmationId": self.confirmation_id,
            "executorVersion": EXECUTOR_VERSION,
            // A string: a reader that holds JSON numbers as doubles would round it.
            "jitterSeed": self.jitter_seed.to_string(),
            "status": status,
        });
        Some(RunRecord {
            path: root.join(self.emitter.run_id()).join("run.json"),
            contents: self.config.redactor.redact_value(&record),
        })
    }

    /// What happened, for the user.
    fn message(&self) -> String {
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for (i, state) in self.steps.iter().enumerate() {
            let id = self.step_id(i);
            let label = match (state.status, state.error.as_ref().map(|e| e.code)) {
                (Some(StepStatus::Succeeded), _) => "completed",
                (Some(StepStatus::Defaulted), _) => "used a default for",
                (Some(StepStatus::TimedOut), _) | (_, Some(ErrorCode::Timeout)) => {
                    "did not finish before the turn's deadline"
                }
                (Some(StepStatus::Failed), _) => "failed",
                (Some(StepStatus::Cancelled), _) => "cancelled",
                _ => "skipped",
            };
            match groups.iter_mut().find(|(l, _)| *l == label) {
                Some((_, ids)) => ids.push(id),
                None => groups.push((label, vec![id])),
            }
        }
        let head = match self.status {
            TurnStatus::Completed => "The turn completed",
            TurnStatus::Partial => "The turn ran out of time",
            TurnStatus::Failed => "The turn failed: a required step has no result",
            TurnStatus::Cancelled => "The run was cancelled",
            TurnStatus::Refused => "The run was not confirmed, so nothing ran",
        };
        let body: Vec<String> = groups
            .iter()
            .map(|(label, ids)| format!("{label}: {}", ids.join(", ")))
            .collect();
        format!("{head}. {}.", body.join("; "))
    }

    pub(crate) fn into_result(mut self) -> (TurnResult, Vec<ExecutionEvent>, Vec<ToolCall>) {
        // Lines the writer could not write are counted, not dropped in silence.
        let audit_lines_lost = self.emitter.audit.take().map_or(0, |audit| {
            let stats = audit.shutdown();
            stats.failed + stats.dropped
        });
        let message = self.message();
        let steps = self
            .steps
            .iter_mut()
            .enumerate()
            .map(|(i, state)| StepOutcome {
                id: self.plan.steps[i].id.clone(),
                status: state.status.unwrap_or(StepStatus::Skipped),
                output: self.outputs.remove(&self.plan.steps[i].id),
                error: state.error.take(),
                calls: state.calls,
                answered_by: state.answered_by.take(),
            })
            .collect();
        let result = TurnResult {
            run_id: self.emitter.run_id().to_owned(),
            status: self.status,
            steps,
            trace: std::mem::take(&mut self.trace),
            message,
            confirmation_id: self.confirmation_id.clone(),
            events_dropped: self.emitter.dropped(),
            audit_lines_lost,
        };
        (
            result,
            self.emitter.kept.take().unwrap_or_default(),
            self.dispatched.take().unwrap_or_default(),
        )
    }
}

/// The id of the call of `attempt`: `<step>#<n>`, or `<step>[<item>]#<n>` in a `foreach`.
fn call_id(step: &Step, attempt: Attempt) -> String {
    if step.foreach.is_some() {
        format!("{}[{}]#{}", step.id, attempt.unit, attempt.dispatch)
    } else {
        format!("{}#{}", step.id, attempt.dispatch)
    }
}

/// The pause before the try after the failed call `call_id`: the step's backoff with its
/// jitter, drawn from the run's seed and the call's id. The same seed gives the same pauses
/// whatever order the calls end in, so a replay with the recorded seed waits what the run
/// waited.
fn retry_pause(retry: &StepRetry, seed: u64, call_id: &str) -> Duration {
    let backoff = Duration::from_millis(retry.backoff_ms);
    let digest = Sha256::new()
        .chain_update(seed.to_le_bytes())
        .chain_update(call_id.as_bytes())
        .finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    let mut rng = SmallRng::seed_from_u64(u64::from_le_bytes(bytes));
    Backoff::new(backoff, backoff, JitterKind::Percent, retry.jitter()).delay(1, None, &mut rng)
}

fn status_word(status: StepStatus) -> &'static str {
    match status {
        StepStatus::Succeeded => "succeeded",
        StepStatus::Defaulted => "used its default",
        StepStatus::Failed => "failed",
        StepStatus::Skipped => "skipped",
        StepStatus::Cancelled => "cancelled",
        StepStatus::TimedOut => "did not finish before the turn's deadline",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ExecutorBuilder;
    use crate::Executor;
    use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};

    fn state(plan: Value, builder: impl FnOnce(ExecutorBuilder) -> ExecutorBuilder) -> RunState {
        let registry = ToolRegistry::builder()
            .tool(ToolDescriptor::new("web", "fetch", RiskLevel::ReadOnly))
            .build()
            .unwrap();
        let executor = builder(Executor::builder(registry)).build().unwrap();
        let plan = Plan::from_value(plan).unwrap();
        let steps =
            crate::validate::check(&plan, &executor.config.registry, &executor.config.policy)
                .unwrap();
        let plan = CheckedPlan {
            plan: Arc::new(plan),
            steps,
        };
        let (emitter, _events) = Emitter::new("run".to_owned(), 16);
        RunState::new(
            executor.config.clone(),
            plan,
            Turn::new("s", "u"),
            emitter,
            7,
        )
    }

    /// What the shell does between two inputs: starts what is ready and makes every call
    /// the limits allow, with a service that is always ready.
    fn dispatch(state: &mut RunState, now: Instant) -> Vec<(CallKey, String)> {
        state.start_ready();
        let mut made = Vec::new();
        while let Some(next) = state.next_attempt() {
            if let Some(Dispatch { key, call }) = state.start(next, Ok(()), now) {
                made.push((key, call.run_link().unwrap().call_id.clone()));
            }
        }
        made
    }

    /// (ms, input, the calls made then by key and id, the fates returned, the next retry
    /// in ms, whether the run ended)
    type Row = (
        u64,
        Input,
        Vec<(u64, &'static str)>,
        Vec<(u64, Fate)>,
        Option<u64>,
        bool,
    );

    #[derive(Debug)]
    enum Input {
        Begin,
        Finished(u64, Result<(), u16>),
        RetriesDue,
        Cancel,
    }

    #[test]
    fn a_run_from_its_inputs() {
        use Fate::{Drop, Keep};
        use Input::{Begin, Cancel, Finished, RetriesDue};
        let mut state = state(
            json!({"steps": [
                {"id": "a", "tool": "web::fetch", "args": {"n": "{item}"}, "foreach": {"items": [1, 2, 3]}},
                {"id": "b", "tool": "web::fetch", "args": {}, "cancellable": false},
                {"id": "c", "tool": "web::fetch", "args": {"a": "$steps.a"},
                 "retry": {"maxAttempts": 2, "backoffMs": 100, "jitterPercent": 0}}
            ]}),
            |b| b.max_concurrency(2),
        );
        let start = Instant::now();
        let table: Vec<Row> = vec![
            (
                0,
                Begin,
                vec![(0, "a[0]#1"), (1, "a[1]#1")],
                vec![],
                None,
                false,
            ),
            (
                10,
                Finished(0, Ok(())),
                vec![(2, "a[2]#1")],
                vec![],
                None,
                false,
            ),
            (
                20,
                Finished(1, Ok(())),
                vec![(3, "b#1")],
                vec![],
                None,
                false,
            ),
            // `c` waits for all of `a`.
            (
                30,
                Finished(2, Ok(())),
                vec![(4, "c#1")],
                vec![],
                None,
                false,
            ),
            // A transient failure: the retry waits its pause, and no call is made.
            (40, Finished(4, Err(503)), vec![], vec![], Some(140), false),
            (139, RetriesDue, vec![], vec![], Some(140), false),
            (140, RetriesDue, vec![(5, "c#2")], vec![], None, false),
            // The cancellation drops the cancellable call and keeps the other.
            (150, Cancel, vec![], vec![(3, Keep), (5, Drop)], None, false),
            (160, Finished(3, Ok(())), vec![], vec![], None, true),
        ];
        for (i, (ms, input, calls, fates, next_retry, ended)) in table.into_iter().enumerate() {
            let now = start + Duration::from_millis(ms);
            let mut got_fates = Vec::new();
            match input {
                Begin => state.begin(now),
                Finished(key, outcome) => {
                    let outcome = outcome
                        .map(|()| ToolOutput::new(json!(key)))
                        .map_err(|status| ToolError::from_http_status(status, "busy"));
                    state.on_finished(CallKey(key), outcome, now);
                }
                RetriesDue => {
                    state.retries_due(now);
                }
                Cancel => {
                    let signals = Signals {
                        cancel: true,
                        ..Signals::default()
                    };
                    got_fates = state.on_signals(signals, now).expect("a cancellation acts");
                }
            }
            let made = dispatch(&mut state, now);
            let expected: Vec<(CallKey, String)> = calls
                .into_iter()
                .map(|(key, id)| (CallKey(key), id.to_owned()))
                .collect();
            assert_eq!(made, expected, "row {i}: calls");
            let fates: Vec<_> = fates.into_iter().map(|(k, f)| (CallKey(k), f)).collect();
            assert_eq!(got_fates, fates, "row {i}: fates");
            let next = next_retry.map(|ms| start + Duration::from_millis(ms));
            assert_eq!(state.next_retry(), next, "row {i}: next retry");
            assert_eq!(state.end_if_settled(), ended, "row {i}: ended");
        }
        assert_eq!(state.status, TurnStatus::Cancelled);
        let (result, _, _) = state.into_result();
        let statuses: Vec<_> = result.steps.iter().map(|s| s.status).collect();
        assert_eq!(
            statuses,
            [
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Cancelled
            ]
        );
    }

    #[test]
    fn what_the_deadline_does_to_the_calls_in_flight() {
        // (policy, the step is cancellable) → the call's fate
        let table = [
            (OnDeadline::LeaveRunning, true, Fate::Detach),
            (OnDeadline::LeaveRunning, false, Fate::Detach),
            (OnDeadline::Cancel, true, Fate::Drop),
            (OnDeadline::Cancel, false, Fate::Detach),
        ];
        for (policy, cancellable, fate) in table {
            let mut state = state(
                json!({"steps": [
                    {"id": "a", "tool": "web::fetch", "args": {}, "cancellable": cancellable},
                    {"id": "b", "tool": "web::fetch", "args": {}, "dependsOn": ["a"]}
                ]}),
                |b| {
                    b.turn_timeout(std::time::Duration::from_secs(1))
                        .on_deadline(policy)
                },
            );
            let now = Instant::now();
            state.begin(now);
            assert_eq!(state.deadline, Some(now + Duration::from_secs(1)));
            assert_eq!(dispatch(&mut state, now).len(), 1);
            let at = now + Duration::from_secs(1);
            let fates = state.on_deadline(at);
            assert_eq!(fates, [(CallKey(0), fate)], "{policy:?} {cancellable}");
            // Nothing more is made, nothing is left in flight, and the run ends.
            assert!(dispatch(&mut state, at).is_empty());
            assert!(state.end_if_settled());
            assert_eq!(state.status, TurnStatus::Partial);
            // A second deadline changes nothing.
            assert!(state.on_deadline(at).is_empty());
        }
    }
}
