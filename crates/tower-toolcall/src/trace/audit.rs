//! The audit log: `calls.jsonl`, `results.jsonl` and `events.jsonl`, written off the call path.
//!
//! Recording a line puts it on a bounded queue and returns at once; a dedicated thread
//! redacts, serializes and writes. When the writer falls behind and the queue is full, the
//! line is dropped and counted, so a slow disk never slows a call. Files rotate when they
//! pass a size (`calls.jsonl` → `calls.jsonl.1` → …), and [`AuditLog::shutdown`] flushes
//! everything still queued.
//!
//! ```no_run
//! use tower_toolcall::trace::AuditLog;
//!
//! let audit = AuditLog::builder("/var/log/agent-gateway")
//!     .max_file_bytes(64 << 20)
//!     .keep_files(4)
//!     .build()?;
//! // … hand `audit.clone()` to the TraceLayer …
//! let stats = audit.shutdown();
//! println!("{} lines written, {} dropped", stats.written, stats.dropped);
//! # Ok::<(), tower_toolcall::ConfigError>(())
//! ```

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::event_kind::{EventKind, EventLevel};
use crate::envelope::{Params, ToolCall, ToolResult};
use crate::error::ConfigError;
use crate::redact::{cut_too_deep, Redactor};
use crate::time::unix_now_ms;

/// The stack of the writer thread: 64 MiB of address space, of which only the pages used are
/// ever committed. The writer may hold the last reference to a call's params, or own a tool's
/// output, and dropping a `serde_json::Value` recurses once per level of nesting: a value that
/// the thread which built it could drop, the writer can drop too, even when that thread had a
/// larger stack than the 2 MiB a thread gets by default.
const WRITER_STACK_BYTES: usize = 64 << 20;

/// The three streams of the audit log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditStream {
    /// `calls.jsonl`: every call envelope as it arrived.
    Calls,
    /// `results.jsonl`: every result envelope.
    Results,
    /// `events.jsonl`: run and step events.
    Events,
}

impl AuditStream {
    /// The file name of the stream.
    pub const fn file_name(self) -> &'static str {
        match self {
            AuditStream::Calls => "calls.jsonl",
            AuditStream::Results => "results.jsonl",
            AuditStream::Events => "events.jsonl",
        }
    }

    const ALL: [AuditStream; 3] = [
        AuditStream::Calls,
        AuditStream::Results,
        AuditStream::Events,
    ];
}

/// Where the writer thread puts lines: files by default, anything else in tests or for
/// other back ends.
pub trait AuditSink: Send + 'static {
    /// Writes one line (without its newline) to `stream`.
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> io::Result<()>;
    /// Flushes what was written.
    fn flush(&mut self) -> io::Result<()>;
}

/// An event of a run, as an executor of plans (`tower-toolcall-executor`'s) streams it and
/// `events.jsonl` records it.
///
/// The trace layer writes the events of each call too. A call an executor issued carries a
/// [`RunLink`](crate::envelope::RunLink), and its events take the run's `runId`, `stepId`
/// and `callId` from it, so that they agree with the executor's. For any other call, the
/// call is a *run* of its own (its `runId` is the call's `requestId`, its `callId` the
/// `toolCallId`) and each try of it an `attempt`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ExecutionEvent {
    /// `run.started`, `run.confirmationRequested`, `run.confirmed`, `run.cancelled`,
    /// `run.finished`, `step.scheduled`, `step.started`, `step.progress`, `step.finished`,
    /// `step.failed`; from the trace layer also `step.shadow` (a decision a layer in shadow
    /// mode did not enforce), `step.refused` (a layer refused the call), `step.cached` (an
    /// idempotency record answered it), `run.failed`, `run.blocked`, and `admin.change` (an
    /// operator's change, see [`ExecutionEvent::admin`]).
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The run: the executor's run id, else the call's `requestId`.
    pub run_id: String,
    /// The plan step, for events of a step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// The call: the executor's call id, else the call's `toolCallId`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The attempt, 1-based, for events of one try of a call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// `namespace::name`; empty for an event of the whole run.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool: String,
    /// `info`, `warn` or `error`.
    pub level: EventLevel,
    /// What happened.
    pub message: String,
    /// When it happened (RFC 3339, UTC); the audit log stamps each line it writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// Milliseconds since the run started, on the runtime's clock (so that paused time in
    /// tests and replays governs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
    /// Structured details (an error code, a delay, a breaker state, a decision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

impl ExecutionEvent {
    /// An event of `call`.
    ///
    /// ```
    /// use tower_toolcall::envelope::RunLink;
    /// use tower_toolcall::trace::{EventKind, ExecutionEvent};
    /// use tower_toolcall::ToolCall;
    ///
    /// let call = ToolCall::builder("travel", "flights")
    ///     .session("s")
    ///     .actor("u")
    ///     .run_link(RunLink::new("run-1", "flights", "flights:1"))
    ///     .build()?;
    /// let event = ExecutionEvent::new(EventKind::StepStarted, &call, "dispatching");
    /// assert_eq!(event.run_id, "run-1");
    /// assert_eq!(event.step_id.as_deref(), Some("flights"));
    /// assert_eq!(event.tool, "travel::flights");
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn new(kind: EventKind, call: &ToolCall, message: impl Into<String>) -> Self {
        let (run_id, step_id, call_id, attempt) = match call.run_link() {
            Some(link) => (
                link.run_id.clone(),
                Some(link.step_id.clone()),
                Some(link.call_id.clone()),
                Some(link.attempt),
            ),
            None => (
                call.request_id().to_owned(),
                None,
                call.envelope().tool_call_id.clone(),
                None,
            ),
        };
        ExecutionEvent {
            kind,
            run_id,
            step_id,
            call_id,
            attempt,
            tool: format!("{}::{}", call.tool_namespace(), call.tool_name()),
            level: EventLevel::Info,
            message: message.into(),
            timestamp: None,
            elapsed_ms: None,
            payload: None,
        }
    }

    /// An event of the run `run_id` as a whole.
    ///
    /// ```
    /// use tower_toolcall::trace::{EventKind, EventLevel, ExecutionEvent};
    ///
    /// let event = ExecutionEvent::of_run(EventKind::RunStarted, "run-1", "3 steps").level(EventLevel::Info);
    /// assert_eq!(event.kind, "run.started");
    /// assert!(event.step_id.is_none());
    /// ```
    pub fn of_run(kind: EventKind, run_id: impl Into<String>, message: impl Into<String>) -> Self {
        ExecutionEvent {
            kind,
            run_id: run_id.into(),
            step_id: None,
            call_id: None,
            attempt: None,
            tool: String::new(),
            level: EventLevel::Info,
            message: message.into(),
            timestamp: None,
            elapsed_ms: None,
            payload: None,
        }
    }

    /// An operator's change (a breaker forced open or reset, a switch flipped), of kind
    /// `admin.change`: `target` names what changed (`tool:web::search`, `switches`) in the
    /// `tool` member, and the event gets a run id of its own.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall::trace::ExecutionEvent;
    ///
    /// let event = ExecutionEvent::admin("tool:web::search", "breaker forced open")
    ///     .payload(json!({"action": "force_open"}));
    /// assert_eq!(event.kind, "admin.change");
    /// assert_eq!(event.tool, "tool:web::search");
    /// ```
    pub fn admin(target: impl Into<String>, message: impl Into<String>) -> Self {
        let mut event = ExecutionEvent::of_run(
            EventKind::AdminChange,
            ulid::Ulid::generate().to_string(),
            message,
        );
        event.tool = target.into();
        event
    }

    /// Sets the attempt.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// Sets the plan step.
    pub fn step(mut self, step_id: impl Into<String>) -> Self {
        self.step_id = Some(step_id.into());
        self
    }

    /// Sets the tool, `namespace::name`.
    pub fn tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = tool.into();
        self
    }

    /// Sets the level: `info`, `warn` or `error`.
    pub fn level(mut self, level: EventLevel) -> Self {
        self.level = level;
        self
    }

    /// Sets the details.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }
}

/// What the audit log has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditStats {
    /// Lines written.
    pub written: u64,
    /// Lines dropped because the writer was behind.
    pub dropped: u64,
    /// Lines lost to write errors.
    pub failed: u64,
}

enum Entry {
    Call(ToolCall, u64),
    Result(Box<ToolResult>, u64),
    Event(Box<ExecutionEvent>, u64),
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// The audit log's handle. Cheap to clone; every clone feeds the same writer thread.
///
/// Its `record_*` methods are how anything outside the trace layer (an executor of plans,
/// say) writes call envelopes, result envelopes and [`ExecutionEvent`]s into the same three
/// streams. By default a record never waits: when the writer is behind, it is dropped and
/// counted. A [`lossless`](AuditLog::lossless) handle waits for room instead.
#[derive(Clone)]
pub struct AuditLog {
    shared: Arc<Shared>,
    /// The records of this handle wait for room instead of being dropped.
    lossless: bool,
}

struct Shared {
    /// The only sender of the queue: once it is gone, the writer drains the queue, flushes
    /// and ends.
    queue: RwLock<Option<SyncSender<Entry>>>,
    counters: Arc<Counters>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditLog")
            .field("stats", &self.stats())
            .field("lossless", &self.lossless)
            .finish_non_exhaustive()
    }
}

impl AuditLog {
    /// A builder for an audit log writing files into `dir`.
    pub fn builder(dir: impl Into<PathBuf>) -> AuditLogBuilder {
        AuditLogBuilder {
            dir: dir.into(),
            max_file_bytes: 100 << 20,
            keep_files: 5,
            queue_capacity: 8192,
            redactor: Redactor::default(),
        }
    }

    /// An audit log writing to `sink`, with a queue of `queue_capacity` lines.
    pub fn with_sink(sink: impl AuditSink, queue_capacity: usize, redactor: Redactor) -> Self {
        let (sender, receiver) = mpsc::sync_channel(queue_capacity.max(1));
        let counters = Arc::new(Counters::default());
        let worker = {
            let counters = counters.clone();
            std::thread::Builder::new()
                .name("toolcall-audit".into())
                .stack_size(WRITER_STACK_BYTES)
                .spawn(move || write_loop(receiver, sink, redactor, &counters))
                .expect("the audit writer thread starts")
        };
        AuditLog {
            shared: Arc::new(Shared {
                queue: RwLock::new(Some(sender)),
                counters,
                worker: Mutex::new(Some(worker)),
            }),
            lossless: false,
        }
    }

    /// A handle to the same log whose records wait for room when the writer is behind,
    /// instead of being dropped: for records that must not be lost, such as a run's audit
    /// that a replay reads back. The writer is a thread of its own, so the wait is for the
    /// disk, never for the caller's thread; it blocks the caller, so keep it off paths that
    /// must not wait.
    ///
    /// ```
    /// use tower_toolcall::trace::{AuditLog, EventKind, ExecutionEvent};
    ///
    /// let dir = std::env::temp_dir().join(format!("audit-lossless-{}", std::process::id()));
    /// let audit = AuditLog::builder(&dir).queue_capacity(1).build()?.lossless();
    /// for n in 0..100 {
    ///     audit.record_event(ExecutionEvent::of_run(EventKind::StepProgress, "run-1", format!("{n}")));
    /// }
    /// let stats = audit.shutdown();
    /// assert_eq!((stats.written, stats.dropped), (100, 0));
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    #[must_use]
    pub fn lossless(&self) -> AuditLog {
        AuditLog {
            shared: self.shared.clone(),
            lossless: true,
        }
    }

    /// Queues the call envelope for `calls.jsonl`; never waits, unless the handle is
    /// [`lossless`](AuditLog::lossless).
    pub fn record_call(&self, call: &ToolCall) {
        self.send(Entry::Call(call.clone(), unix_now_ms()));
    }

    /// Queues the result envelope for `results.jsonl`; never waits, unless the handle is
    /// [`lossless`](AuditLog::lossless).
    pub fn record_result(&self, result: ToolResult) {
        self.send(Entry::Result(Box::new(result), unix_now_ms()));
    }

    /// Hooks that write `step.started` before each attempt reaches the tool and
    /// `step.finished` or `step.failed` after it, to put around the tool (see
    /// [`AuditAttempts`](super::AuditAttempts)).
    pub fn attempt_hooks(&self) -> super::AuditAttempts {
        super::AuditAttempts::new(self.clone())
    }

    /// Queues an event for `events.jsonl`; never waits, unless the handle is
    /// [`lossless`](AuditLog::lossless). The log stamps the event's `timestamp` with the
    /// time it was queued.
    pub fn record_event(&self, event: ExecutionEvent) {
        self.send(Entry::Event(Box::new(event), unix_now_ms()));
    }

    /// What has been written and dropped so far.
    pub fn stats(&self) -> AuditStats {
        let c = &self.shared.counters;
        AuditStats {
            written: c.written.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting lines, writes and flushes everything queued, and waits for the
    /// writer. Lines recorded afterwards are dropped and counted.
    pub fn shutdown(&self) -> AuditStats {
        self.shared
            .queue
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let worker = self
            .shared
            .worker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
        self.stats()
    }

    fn send(&self, entry: Entry) {
        if self.lossless {
            self.send_waiting(entry);
            return;
        }
        let accepted = {
            let queue = self.shared.queue.read().unwrap_or_else(|p| p.into_inner());
            queue
                .as_ref()
                .is_some_and(|sender| match sender.try_send(entry) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
                })
        };
        if !accepted {
            self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AuditLog {
    fn send_waiting(&self, entry: Entry) {
        let queue = self.shared.queue.read().unwrap_or_else(|p| p.into_inner());
        // The writer is a thread of its own: waiting for room never waits on this one.
        let sent = queue
            .as_ref()
            .is_some_and(|sender| sender.send(entry).is_ok());
        if !sent {
            self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn write_loop(
    receiver: Receiver<Entry>,
    mut sink: impl AuditSink,
    redactor: Redactor,
    counters: &Counters,
) {
    let mut line = Vec::with_capacity(1024);
    // `recv` fails once the queue is empty and its sender is gone.
    while let Ok(first) = receiver.recv() {
        let mut next = Some(first);
        while let Some(entry) = next {
            let (stream, value) = render(entry, &redactor);
            line.clear();
            serde_json::to_writer(&mut line, &value).expect("JSON values always serialize");
            let counter = match sink.write_line(stream, &line) {
                Ok(()) => &counters.written,
                Err(_) => &counters.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            next = receiver.try_recv().ok();
        }
        // The queue is empty: a good moment to flush.
        let _ = sink.flush();
    }
    let _ = sink.flush();
}

/// The line of `entry`, redacted.
///
/// The values callers and tools fill in (params, output, error details) may have been built in
/// code deeper than any parser allows, and serializing one whole recurses once per level: they
/// are cut at the redactor's depth (`[TRUNCATED]` below it) before the rest is serialized, so
/// that every line is read back by a parser limited to 128 levels.
fn render(entry: Entry, redactor: &Redactor) -> (AuditStream, Value) {
    match entry {
        Entry::Call(call, at) => {
            let mut envelope = call.envelope().clone();
            envelope.payload.params = Params::empty();
            let mut line = json!({ "ts": rfc3339(at) });
            line["call"] = serde_json::to_value(&envelope).expect("a call serializes");
            let mut line = redactor.redact_value(&line);
            // `line.call.payload.params`: three levels down.
            line["call"]["payload"]["params"] =
                redactor.redact_value_within(call.params().as_value(), 3);
            (AuditStream::Calls, line)
        }
        Entry::Result(mut result, at) => {
            if let Some(output) = &mut result.output {
                cut_too_deep(&mut output.content);
                output
                    .metadata
                    .iter_mut()
                    .flatten()
                    .for_each(|(_, v)| cut_too_deep(v));
            }
            if let Some(details) = result.error.as_mut().and_then(|e| e.details.as_mut()) {
                cut_too_deep(details);
            }
            let mut line = json!({ "ts": rfc3339(at) });
            line["result"] = serde_json::to_value(&*result).expect("a result serializes");
            (AuditStream::Results, redactor.redact_value(&line))
        }
        Entry::Event(event, at) => {
            let mut value = serde_json::to_value(&*event).expect("an event serializes");
            value["timestamp"] = Value::String(rfc3339(at));
            (AuditStream::Events, redactor.redact_value(&value))
        }
    }
}

/// Unix milliseconds as RFC 3339 in UTC, e.g. `2025-12-16T18:12:00.000Z`.
fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Builds an [`AuditLog`] that writes JSONL files.
#[derive(Debug)]
#[must_use]
pub struct AuditLogBuilder {
    dir: PathBuf,
    max_file_bytes: u64,
    keep_files: usize,
    queue_capacity: usize,
    redactor: Redactor,
}

impl AuditLogBuilder {
    /// Rotate a file when it passes this size (default 100 MiB).
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Rotated files kept per stream (default 5).
    pub fn keep_files(mut self, files: usize) -> Self {
        self.keep_files = files;
        self
    }

    /// Lines that may wait for the writer before new ones are dropped (default 8192).
    pub fn queue_capacity(mut self, lines: usize) -> Self {
        self.queue_capacity = lines;
        self
    }

    /// The redactor applied to every line.
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Creates the folder, opens the files and starts the writer.
    pub fn build(self) -> Result<AuditLog, ConfigError> {
        if self.max_file_bytes < 1024 {
            return Err(ConfigError::new(
                "audit.max_file_bytes",
                format!("must be at least 1024, got {}", self.max_file_bytes),
            ));
        }
        if self.queue_capacity == 0 {
            return Err(ConfigError::new(
                "audit.queue_capacity",
                "must be at least 1, got 0",
            ));
        }
        let sink =
            FileSink::open(&self.dir, self.max_file_bytes, self.keep_files).map_err(|e| {
                ConfigError::new(
                    "audit.dir",
                    format!("cannot be written ({}): {e}", self.dir.display()),
                )
            })?;
        Ok(AuditLog::with_sink(
            sink,
            self.queue_capacity,
            self.redactor,
        ))
    }
}

/// Writes each stream to its file in a folder, rotating by size.
struct FileSink {
    dir: PathBuf,
    max_bytes: u64,
    keep: usize,
    files: Vec<(AuditStream, BufWriter<File>, u64)>,
}

impl FileSink {
    fn open(dir: &Path, max_bytes: u64, keep: usize) -> io::Result<FileSink> {
        fs::create_dir_all(dir)?;
        let mut files = Vec::with_capacity(3);
        for stream in AuditStream::ALL {
            let path = dir.join(stream.file_name());
            let file = OpenOptions::new().create(true).append(true).open(&path)?;
            let len = file.metadata()?.len();
            files.push((stream, BufWriter::new(file), len));
        }
        Ok(FileSink {
            dir: dir.to_owned(),
            max_bytes,
            keep,
            files,
        })
    }

    fn rotate(&mut self, index: usize) -> io::Result<()> {
        let stream = self.files[index].0;
        self.files[index].1.flush()?;
        let base = self.dir.join(stream.file_name());
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", base.display()));
        if self.keep == 0 {
            fs::remove_file(&base)?;
        } else {
            let _ = fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                if numbered(n).exists() {
                    fs::rename(numbered(n), numbered(n + 1))?;
                }
            }
            fs::rename(&base, numbered(1))?;
        }
        let file = OpenOptions::new().create(true).append(true).open(&base)?;
        self.files[index].1 = BufWriter::new(file);
        self.files[index].2 = 0;
        Ok(())
    }
}

impl AuditSink for FileSink {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> io::Result<()> {
        let index = self
            .files
            .iter()
            .position(|(s, _, _)| *s == stream)
            .expect("every stream has a file");
        let size = line.len() as u64 + 1;
        if self.files[index].2 > 0 && self.files[index].2 + size > self.max_bytes {
            self.rotate(index)?;
        }
        let (_, writer, len) = &mut self.files[index];
        writer.write_all(line)?;
        writer.write_all(b"\n")?;
        *len += size;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        for (_, writer, _) in &mut self.files {
            writer.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_734_372_720_000), "2024-12-16T18:12:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
