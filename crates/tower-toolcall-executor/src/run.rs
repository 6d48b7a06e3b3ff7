//! One run of a plan: its controls, and the async shell that drives its scheduling state.
//!
//! The state ([`crate::schedule`]) decides and does no I/O; the shell, one future driven by
//! [`Run::finish`], owns the service, the calls' futures and the timers. Each pass it reads
//! the clock once and tells the state the controls' signals, the turn's deadline, the calls
//! that ended and the retries that are due; it makes the calls the state starts, drops or
//! detaches the calls the state names when the run stops, and then does the state's actions
//! (events, audit lines, and `run.json` as the state built it), reporting every write that
//! fails. `run.json` is written off the run's thread, and the run waits for it: nothing is
//! decided or done until it is written, as if the write were one step. Steps are started
//! and calls dispatched in plan order (and item order), so that the same completions give
//! the same run.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use futures_util::stream::{FuturesUnordered, Stream};
use futures_util::task::AtomicWaker;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use super::config::{ExecutorConfig, Turn};
use super::events::{Emitter, EventStream};
use super::outcome::TurnResult;
use super::schedule::{Action, CallKey, Dispatch, Fate, Phase, RunRecord, RunState, Signals};
use super::validate::CheckedPlan;
use tower_toolcall::envelope::ToolCall;
use tower_toolcall::trace::{AuditLog, EventKind, EventLevel, ExecutionEvent};
use tower_toolcall::{ToolError, ToolOutput};

/// One run of a plan, made by [`Executor::start`](super::Executor::start).
///
/// Take its [`events`](Run::events) and [`controls`](Run::controls) first, then drive it
/// with [`finish`](Run::finish).
pub struct Run<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    shell: Shell<S>,
    events: Option<EventStream>,
    controls: RunControls,
}

impl<S> fmt::Debug for Run<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("run_id", &self.shell.state.emitter.run_id())
            .finish_non_exhaustive()
    }
}

/// Cancels a run, or answers its request for confirmation. Cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use futures_util::StreamExt;
/// use serde_json::json;
/// use tower_toolcall_executor::{Executor, Plan, StepStatus, Turn, TurnStatus};
/// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let registry = ToolRegistry::builder()
///     .tool(ToolDescriptor::new("vault", "write", RiskLevel::Writes))
///     .build()?;
/// let tool = tool_fn(|_call: ToolCall| async {
///     tokio::time::sleep(Duration::from_secs(3600)).await;
///     Ok(ToolOutput::new(json!("written")))
/// });
/// let plan = Plan::from_value(json!({"steps": [
///     {"id": "save", "tool": "vault::write", "args": {"path": "a.md"}}
/// ]}))?;
/// let mut run = Executor::builder(registry).build()?.start(tool, &plan, Turn::new("s", "u"))?;
/// let mut events = run.events().unwrap();
/// let controls = run.controls();
/// let driver = async {
///     while let Some(event) = events.next().await {
///         match event.kind.as_ref() {
///             // The run writes: it asks first.
///             "run.confirmationRequested" => controls.confirm("approval-1"),
///             // The call is on its way: the user changes their mind.
///             "step.started" => controls.cancel(),
///             _ => {}
///         }
///     }
/// };
/// let (result, ()) = futures_util::future::join(run.finish(), driver).await;
/// assert_eq!(result.status, TurnStatus::Cancelled);
/// assert_eq!(result.step("save").unwrap().status, StepStatus::Cancelled);
/// assert_eq!(result.confirmation_id.as_deref(), Some("approval-1"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug, Default)]
pub struct RunControls {
    shared: Arc<ControlShared>,
}

#[derive(Debug, Default)]
struct ControlShared {
    signals: Mutex<Signals>,
    waker: AtomicWaker,
}

impl RunControls {
    /// Stops scheduling, drops the running calls of cancellable steps (marked `cancelled`:
    /// their tools may have acted) and lets the others finish.
    pub fn cancel(&self) {
        self.signal(|s| s.cancel = true);
    }

    /// Confirms the run under the approval `confirmation_id`, which every call then carries.
    pub fn confirm(&self, confirmation_id: impl Into<String>) {
        let id = confirmation_id.into();
        self.signal(|s| s.confirmed = Some(id));
    }

    /// Refuses the run's request for confirmation: nothing is dispatched.
    pub fn refuse(&self) {
        self.signal(|s| s.refused = true);
    }

    /// `true` once [`cancel`](RunControls::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.signals().cancel
    }

    fn signal(&self, change: impl FnOnce(&mut Signals)) {
        change(
            &mut self
                .shared
                .signals
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.shared.waker.wake();
    }

    fn signals(&self) -> Signals {
        self.shared
            .signals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A call in flight: its future, named by its key.
struct InFlight<F> {
    key: CallKey,
    future: Pin<Box<F>>,
}

impl<F> Future for InFlight<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = (CallKey, Result<ToolOutput, ToolError>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.future.as_mut().poll(cx));
        Poll::Ready((self.key, outcome))
    }
}

/// The async shell around a run's [`RunState`]: it owns the service, the calls' futures and
/// the timers, feeds the state the controls' signals, the calls that ended and the clock, and
/// does what the state decided.
struct Shell<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    state: RunState,
    service: S,
    controls: RunControls,
    running: FuturesUnordered<InFlight<S::Future>>,
    retry_timer: Option<Pin<Box<Sleep>>>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Calls dispatched or ended in this poll.
    work: usize,
    /// What the state decided and the shell has not yet done, in order.
    actions: VecDeque<Action>,
    /// The write of `run.json` in flight: the actions after it wait for it.
    writing: Option<RecordWrite>,
}

impl<S> Run<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
    S::Future: Send + 'static,
{
    pub(crate) fn new(
        config: Arc<ExecutorConfig>,
        service: S,
        plan: CheckedPlan,
        turn: Turn,
        audit: Option<AuditLog>,
        jitter_seed: u64,
    ) -> Self {
        let run_id = turn
            .run_id
            .clone()
            .unwrap_or_else(|| ulid::Ulid::generate().to_string());
        let (mut emitter, events) = Emitter::new(run_id, config.event_capacity);
        emitter.audit = audit;
        let controls = RunControls::default();
        let state = RunState::new(config, plan, turn, emitter, jitter_seed);
        let shell = Shell {
            state,
            service,
            controls: controls.clone(),
            running: FuturesUnordered::new(),
            retry_timer: None,
            deadline: None,
            work: 0,
            actions: VecDeque::new(),
            writing: None,
        };
        Run {
            shell,
            events: Some(events),
            controls,
        }
    }

    /// The run's id.
    pub fn id(&self) -> &str {
        self.shell.state.emitter.run_id()
    }

    /// The run's events; `None` after the first call. Events are only sent to a stream
    /// that is held.
    pub fn events(&mut self) -> Option<EventStream> {
        self.events.take()
    }

    /// The seed of the jitter of the run's retry pauses, as `run.json` records it.
    pub fn jitter_seed(&self) -> u64 {
        self.shell.state.jitter_seed
    }

    /// The run's controls.
    pub fn controls(&self) -> RunControls {
        self.controls.clone()
    }

    /// Runs the plan to its end: every step finished, skipped, cancelled, or stopped by the
    /// turn's deadline.
    pub async fn finish(self) -> TurnResult {
        self.finish_kept().await.0
    }

    /// Keeps every event and dispatched call, for a replay to compare.
    pub(crate) fn keep_record(&mut self) {
        self.shell.state.emitter.kept = Some(Vec::new());
        self.shell.state.dispatched = Some(Vec::new());
    }

    pub(crate) async fn finish_kept(self) -> (TurnResult, Vec<ExecutionEvent>, Vec<ToolCall>) {
        let Run {
            mut shell, events, ..
        } = self;
        // Nobody holds the stream: no event is built for it.
        drop(events);
        poll_fn(|cx| shell.poll_run(cx)).await;
        shell.state.into_result()
    }
}

impl<S> Shell<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
    S::Future: Send + 'static,
{
    /// Drives the run: nothing is decided while a record is being written, and the stream
    /// ends once everything decided is done.
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        ready!(self.perform(cx));
        let poll = self.schedule(cx);
        self.actions.extend(self.state.out.take());
        ready!(self.perform(cx));
        if self.state.phase == Phase::Done {
            self.state.emitter.close();
        }
        poll
    }

    /// Takes the signals, the timers and the calls that ended to the state, and makes the
    /// calls it decides.
    fn schedule(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // Calls dispatched or ended in one poll before the run lets the other tasks of its
        // thread (the event stream's reader, say) have a turn.
        const BUDGET: usize = 32;
        self.work = 0;
        loop {
            if self.work >= BUDGET {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // The clock is read once a pass, and the state is told it.
            let now = Instant::now();
            match self.state.phase {
                Phase::Done => return Poll::Ready(()),
                Phase::Start => {
                    self.state.begin(now);
                    if let Some(at) = self.state.deadline {
                        self.deadline = Some(Box::pin(sleep_until(at)));
                    }
                    continue;
                }
                Phase::AwaitConfirmation | Phase::Running => {}
            }
            self.controls.shared.waker.register(cx.waker());
            let signals = self.controls.signals();
            if let Some(fates) = self.state.on_signals(signals, now) {
                self.interrupt(fates);
                continue;
            }
            if let Some(deadline) = &mut self.deadline {
                if deadline.as_mut().poll(cx).is_ready() {
                    self.deadline = None;
                    let fates = self.state.on_deadline(now);
                    self.interrupt(fates);
                    continue;
                }
            }
            if self.state.phase == Phase::AwaitConfirmation {
                return Poll::Pending;
            }
            let mut progressed = false;
            while self.work < BUDGET {
                let Poll::Ready(Some((key, outcome))) = Pin::new(&mut self.running).poll_next(cx)
                else {
                    break;
                };
                self.work += 1;
                self.state.on_finished(key, outcome, now);
                progressed = true;
            }
            progressed |= self.due_retries(cx, now);
            progressed |= self.state.start_ready();
            progressed |= self.dispatch(cx, BUDGET, now);
            if self.state.end_if_settled() {
                continue;
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }

    /// Moves the retries that are due to their steps; arms the timer for the next.
    fn due_retries(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if self.state.next_retry().is_none() {
            self.retry_timer = None;
            return false;
        }
        let mut progressed = self.state.retries_due(now);
        if let Some(next) = self.state.next_retry() {
            let mut timer = Box::pin(sleep_until(next));
            if timer.as_mut().poll(cx).is_ready() {
                progressed = true;
            } else {
                self.retry_timer = Some(timer);
            }
        } else {
            self.retry_timer = None;
        }
        progressed
    }

    /// Makes the calls the state decides while the limits and the service allow.
    fn dispatch(&mut self, cx: &mut Context<'_>, budget: usize, now: Instant) -> bool {
        let mut progressed = false;
        while self.work < budget {
            let Some(next) = self.state.next_attempt() else {
                break;
            };
            let Poll::Ready(ready) = self.service.poll_ready(cx) else {
                break;
            };
            progressed = true;
            if let Some(Dispatch { key, call }) = self.state.start(next, ready, now) {
                self.work += 1;
                let future = Box::pin(self.service.call(call));
                self.running.push(InFlight { key, future });
            }
        }
        progressed
    }

    /// Does what the state decided for the calls in flight, in its order: keeps them, drops
    /// them, or leaves them to finish in the background.
    fn interrupt(&mut self, fates: Vec<(CallKey, Fate)>) {
        if self.state.next_retry().is_none() {
            self.retry_timer = None;
        }
        if fates.is_empty() {
            return;
        }
        let mut running: HashMap<CallKey, InFlight<S::Future>> = std::mem::take(&mut self.running)
            .into_iter()
            .map(|f| (f.key, f))
            .collect();
        let left = FuturesUnordered::new();
        for (key, fate) in fates {
            let Some(in_flight) = running.remove(&key) else {
                continue;
            };
            match fate {
                Fate::Keep => self.running.push(in_flight),
                Fate::Drop => drop(in_flight),
                Fate::Detach => left.push(in_flight),
            }
        }
        self.running.extend(running.into_values());
        if !left.is_empty() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let mut left = left;
                    poll_fn(|cx| loop {
                        match Pin::new(&mut left).poll_next(cx) {
                            Poll::Ready(Some(_)) => continue,
                            Poll::Ready(None) => return Poll::Ready(()),
                            Poll::Pending => return Poll::Pending,
                        }
                    })
                    .await;
                });
            }
        }
    }

    /// Does what the scheduling decided, in order: the events, the audit's lines and
    /// `run.json`. The actions after a record being written wait for its write, which is
    /// done off the run's thread; a write that fails is reported, never dropped.
    fn perform(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(write) = &mut self.writing {
                let outcome = ready!(Pin::new(write).poll(cx));
                self.writing = None;
                if let Err(error) = outcome {
                    self.report_unwritten(&error);
                }
            }
            let Some(action) = self.actions.pop_front() else {
                return Poll::Ready(());
            };
            match action {
                Action::Emit(event) => self.state.emitter.emit(move |_| *event),
                Action::RecordCall(call) => {
                    if let Some(audit) = &self.state.emitter.audit {
                        audit.record_call(&call);
                    }
                }
                Action::RecordResult(result) => {
                    if let Some(audit) = &self.state.emitter.audit {
                        audit.record_result(*result);
                    }
                }
                Action::WriteRecord(record) => self.writing = Some(RecordWrite::start(*record)),
            }
        }
    }

    /// Reports that `run.json` could not be written as a `run.auditFailed` event, so that
    /// the run's record is never silently incomplete.
    fn report_unwritten(&mut self, error: &str) {
        let message = format!("run.json could not be written: {error}");
        let error = error.to_owned();
        self.state.emitter.emit(|run| {
            ExecutionEvent::of_run(EventKind::RunAuditFailed, run, message)
                .level(EventLevel::Error)
                .payload(json!({"file": "run.json", "error": error}))
        });
    }
}

/// The write of a run's record in flight, on a thread that may block: its end, or why it
/// failed.
struct RecordWrite {
    done: oneshot::Receiver<Result<(), String>>,
}

impl RecordWrite {
    /// Starts writing `record` on the runtime's blocking threads, or on a thread of its own
    /// outside a runtime.
    fn start(record: RunRecord) -> Self {
        let (sender, done) = oneshot::channel();
        let write = move || {
            let text =
                serde_json::to_vec_pretty(&record.contents).expect("a run record serializes");
            let outcome = std::fs::write(&record.path, text).map_err(|e| e.to_string());
            // The run may be gone: then nobody waits for the outcome.
            let _ = sender.send(outcome);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(write)),
            // A thread that cannot start drops the sender: the write reports its writer
            // stopped.
            Err(_) => drop(
                std::thread::Builder::new()
                    .name("toolcall-run-record".into())
                    .spawn(write),
            ),
        }
        RecordWrite { done }
    }
}

impl Future for RecordWrite {
    type Output = Result<(), String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(Pin::new(&mut self.done).poll(cx));
        // A writer that ended without an answer (its runtime shut down) wrote nothing known.
        Poll::Ready(outcome.unwrap_or_else(|_| Err("its writer stopped".to_owned())))
    }
}
