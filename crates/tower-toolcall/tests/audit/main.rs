//! The audit log: three JSONL streams, redacted, rotated, and never in the way of a call,
//! whether written to directly or through the TraceLayer.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::trace::{
    AuditLog, AuditSink, AuditStream, EventKind, EventLevel, ExecutionEvent, Redactor, TraceLayer,
};
use tower_toolcall::{tool_fn, HookLayer, ToolCall, ToolOutput, ToolResult};

#[path = "../support/mod.rs"]
mod support;

use support::{deep_value, on_a_large_stack};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-toolcall-audit-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn call(n: usize) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .request_id(format!("req-{n}"))
        .params(json!({"query": format!("q{n}"), "api_key": "abc123", "auth": "Bearer xyz.abc"}))
        .build()
        .unwrap()
}

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn calls_results_and_events_go_to_their_files_redacted() {
    let dir = temp_dir("streams");
    let audit = AuditLog::builder(&dir).build().unwrap();
    let call = call(1);
    audit.record_call(&call);
    audit.record_event(ExecutionEvent::new(
        EventKind::RunStarted,
        &call,
        "call received",
    ));
    audit.record_event(
        ExecutionEvent::new(
            EventKind::StepFailed,
            &call,
            "token sk-proj-0123456789abcdefghij refused",
        )
        .attempt(1)
        .level(EventLevel::Warn)
        .payload(json!({"errorCode": "UPSTREAM_UNAVAILABLE"})),
    );
    audit.record_result(ToolResult::from_outcome(
        &call,
        Ok(ToolOutput::new(json!({"hits": 1, "session_token": "t-1"}))),
    ));
    let stats = audit.shutdown();
    assert_eq!((stats.written, stats.dropped, stats.failed), (4, 0, 0));

    let calls = lines(&dir.join("calls.jsonl"));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["call"]["requestId"], "req-1");
    assert_eq!(
        calls[0]["call"]["payload"]["params"]["api_key"],
        "[REDACTED]"
    );
    assert_eq!(calls[0]["call"]["payload"]["params"]["auth"], "[REDACTED]");
    assert_eq!(calls[0]["call"]["payload"]["params"]["query"], "q1");
    assert!(calls[0]["ts"].as_str().unwrap().ends_with('Z'));

    let events = lines(&dir.join("events.jsonl"));
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["type"], "run.started");
    assert_eq!(events[0]["runId"], "req-1");
    assert_eq!(events[1]["attempt"], 1);
    assert_eq!(events[1]["level"], "warn");
    assert_eq!(events[1]["message"], "token [REDACTED] refused");
    assert_eq!(events[1]["tool"], "agents.tools.web::search");

    let results = lines(&dir.join("results.jsonl"));
    assert_eq!(results[0]["result"]["requestId"], "req-1");
    assert_eq!(
        results[0]["result"]["output"]["content"]["session_token"],
        "[REDACTED]"
    );

    let raw = std::fs::read_to_string(dir.join("calls.jsonl")).unwrap()
        + &std::fs::read_to_string(dir.join("events.jsonl")).unwrap()
        + &std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    for secret in ["abc123", "xyz.abc", "sk-proj", "t-1"] {
        assert!(!raw.contains(secret), "{secret} leaked");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_rotate_by_size_and_keep_as_many_as_configured() {
    let dir = temp_dir("rotate");
    let audit = AuditLog::builder(&dir)
        .max_file_bytes(2048)
        .keep_files(2)
        .build()
        .unwrap();
    for n in 0..200 {
        audit.record_call(&call(n));
    }
    let stats = audit.shutdown();
    assert_eq!(stats.written, 200);
    let current = std::fs::metadata(dir.join("calls.jsonl")).unwrap().len();
    let first = std::fs::metadata(dir.join("calls.jsonl.1")).unwrap().len();
    assert!(current <= 2048 && first <= 2048, "{current} {first}");
    assert!(dir.join("calls.jsonl.2").exists());
    assert!(
        !dir.join("calls.jsonl.3").exists(),
        "only two rotated files are kept"
    );
    // The newest lines are in the current file, in order.
    let newest = lines(&dir.join("calls.jsonl"));
    assert_eq!(newest.last().unwrap()["call"]["requestId"], "req-199");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sink whose first write blocks until the test lets it go.
struct StalledSink {
    started: mpsc::Sender<()>,
    release: Arc<Mutex<mpsc::Receiver<()>>>,
    lines: Arc<Mutex<Vec<(AuditStream, String)>>>,
}

impl AuditSink for StalledSink {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> io::Result<()> {
        let _ = self.started.send(());
        let _ = self.release.lock().unwrap().recv();
        self.lines
            .lock()
            .unwrap()
            .push((stream, String::from_utf8(line.to_vec()).unwrap()));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_stalled_writer_drops_and_counts_and_never_blocks_the_caller() {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let written = Arc::new(Mutex::new(Vec::new()));
    let sink = StalledSink {
        started: started_tx,
        release: Arc::new(Mutex::new(release_rx)),
        lines: written.clone(),
    };
    let audit = AuditLog::with_sink(sink, 4, Redactor::default());
    audit.record_call(&call(0));
    // The writer holds the first line and is stuck in the sink.
    started_rx.recv().unwrap();
    for n in 1..=1000 {
        audit.record_call(&call(n));
    }
    let stats = audit.stats();
    assert_eq!(
        stats.dropped, 996,
        "four lines fit in the queue, the rest are dropped"
    );
    for _ in 0..5 {
        release_tx.send(()).unwrap();
    }
    let stats = audit.shutdown();
    assert_eq!((stats.written, stats.dropped), (5, 996));
    let ids: Vec<String> = written
        .lock()
        .unwrap()
        .iter()
        .map(|(_, line)| {
            let value: Value = serde_json::from_str(line).unwrap();
            value["call"]["requestId"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids, ["req-0", "req-1", "req-2", "req-3", "req-4"]);

    audit.record_call(&call(2000));
    assert_eq!(
        audit.stats().dropped,
        997,
        "after shutdown, lines are dropped and counted"
    );
}

#[test]
fn bad_configuration_names_the_field() {
    let err = AuditLog::builder(temp_dir("small"))
        .max_file_bytes(10)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "audit.max_file_bytes");
    let err = AuditLog::builder(temp_dir("queue"))
        .queue_capacity(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "audit.queue_capacity");

    let file = temp_dir("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = AuditLog::builder(file.join("audit")).build().unwrap_err();
    assert_eq!(err.field(), "audit.dir");
    std::fs::remove_file(&file).unwrap();
}

/// A sink whose writes wait until its gate opens, and that counts what it wrote.
#[derive(Clone, Default)]
struct GatedSink {
    gate: Arc<(Mutex<bool>, Condvar)>,
    written: Arc<AtomicU64>,
}

impl GatedSink {
    fn open(&self) {
        let (open, opened) = &*self.gate;
        *open.lock().unwrap() = true;
        opened.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.gate.0.lock().unwrap()
    }
}

impl AuditSink for GatedSink {
    fn write_line(&mut self, _stream: AuditStream, _line: &[u8]) -> io::Result<()> {
        let (open, opened) = &*self.gate;
        let _open = opened
            .wait_while(open.lock().unwrap(), |open| !*open)
            .unwrap();
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_writer_never_slows_a_call_through_the_trace_layer() {
    const CALLS: usize = 200;
    // Each successful call: calls.jsonl, run.started, step.started, step.finished,
    // run.finished and results.jsonl.
    const LINES_PER_CALL: u64 = 6;
    const QUEUE: usize = 4;
    let tool_time = Duration::from_millis(250);

    let sink = GatedSink::default();
    // Should the call path ever wait for the writer, this opens the gate after a while of
    // real time, and the check below that the gate was still shut fails instead of hanging.
    let watchdog = {
        let sink = sink.clone();
        let (stop, stopped) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if stopped.recv_timeout(Duration::from_secs(30)).is_err() {
                sink.open();
            }
        });
        stop
    };
    let audit = AuditLog::with_sink(sink.clone(), QUEUE, Redactor::default());
    let svc =
        TraceLayer::new()
            .audit(audit.clone())
            .layer(HookLayer::new(audit.attempt_hooks()).layer(tool_fn(
                move |_call: ToolCall| async move {
                    tokio::time::sleep(tool_time).await;
                    Ok(ToolOutput::new(json!({"done": true})))
                },
            )));

    let start = Instant::now();
    let elapsed = futures::future::join_all((0..CALLS).map(|n| {
        let mut svc = svc.clone();
        async move {
            let called = Instant::now();
            svc.ready().await.unwrap().call(call(n)).await.unwrap();
            called.elapsed()
        }
    }))
    .await;
    assert!(
        !sink.is_open(),
        "every call ended while the writer was still stalled"
    );
    assert!(elapsed.iter().all(|e| *e == tool_time), "{elapsed:?}");
    assert_eq!(start.elapsed(), tool_time);

    let produced = CALLS as u64 * LINES_PER_CALL;
    let stalled = audit.stats();
    // At most a full queue and the line held by the writer got through.
    assert!(
        stalled.dropped >= produced - QUEUE as u64 - 1,
        "{stalled:?}"
    );
    assert_eq!(stalled.written, 0);

    sink.open();
    let stats = audit.shutdown();
    watchdog.send(()).unwrap();
    assert_eq!(stats.written + stats.dropped, produced, "{stats:?}");
    assert_eq!(
        stats.dropped, stalled.dropped,
        "nothing was dropped after the release"
    );
    assert_eq!(stats.failed, 0);
    assert_eq!(sink.written.load(Ordering::SeqCst), stats.written);
}

/// One line of a stream.
type Line = (AuditStream, Vec<u8>);

/// Lines kept in memory, by stream.
#[derive(Clone, Default)]
pub(crate) struct MemorySink(Arc<Mutex<Vec<Line>>>);

impl MemorySink {
    pub(crate) fn lines(&self, stream: AuditStream) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, line)| serde_json::from_slice(line).unwrap())
            .collect()
    }
}

impl AuditSink for MemorySink {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> io::Result<()> {
        self.0.lock().unwrap().push((stream, line.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How many arrays and objects are nested from the top of `value` down its first members.
fn nesting(value: &Value) -> usize {
    let mut depth = 0;
    let mut at = value;
    loop {
        at = match at {
            Value::Array(items) if !items.is_empty() => &items[0],
            Value::Object(map) if !map.is_empty() => map.values().next().unwrap(),
            _ => return depth,
        };
        depth += 1;
    }
}

#[test]
fn params_eight_thousand_levels_deep_are_audited_cut_short_without_a_crash() {
    on_a_large_stack(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(audit_a_deep_call());
    });
}

async fn audit_a_deep_call() {
    let sink = MemorySink::default();
    let audit = AuditLog::with_sink(sink.clone(), 64, Redactor::default());
    let mut svc =
        TraceLayer::new()
            .audit(audit.clone())
            .layer(HookLayer::new(audit.attempt_hooks()).layer(tool_fn(
                |_call: ToolCall| async move { Ok(ToolOutput::new(deep_value(8_000))) },
            )));
    let call = ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(Value::Object(
            [("deep".to_owned(), deep_value(8_000))]
                .into_iter()
                .collect(),
        ))
        .build()
        .unwrap();
    svc.ready().await.unwrap().call(call).await.unwrap();
    drop(svc);

    let stats = audit.shutdown();
    // The call, run.started, step.started, step.finished, run.finished and the result.
    assert_eq!((stats.written, stats.dropped, stats.failed), (6, 0, 0));
    let calls = sink.lines(AuditStream::Calls);
    let params = &calls[0]["call"]["payload"]["params"];
    let kept = nesting(&params["deep"]);
    assert!((60..=130).contains(&kept), "{kept} levels kept");
    assert!(params.to_string().contains("[TRUNCATED]"));
    let results = sink.lines(AuditStream::Results);
    let output = &results[0]["result"]["output"];
    assert!(output.to_string().contains("[TRUNCATED]"), "{output}");
}

mod attempts;
