//! The run's audit when its writer is behind: the run waits for it, and no line is lost.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use super::{Executor, Plan, Turn, TurnStatus};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};

/// The JSON lines of `file` in the run's directory.
fn lines(dir: &Path, file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{file} cannot be read: {e}"));
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{file}: {e}: {line}")))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_audit_writer_that_is_behind_loses_no_line() {
    const ITEMS: usize = 500;
    let root = std::env::temp_dir().join(format!(
        "toolcall-executor-audit-behind-{}-{}",
        std::process::id(),
        ulid::Ulid::generate()
    ));
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new("web", "fetch", RiskLevel::ReadOnly))
        .tool(ToolDescriptor::new("web", "flaky", RiskLevel::ReadOnly))
        .build()
        .unwrap();
    let mut builder = Executor::builder(registry)
        .max_concurrency(64)
        .audit_dir(&root)
        .jitter_seed(7);
    // One line of room: the writer is behind almost every time the run records.
    builder.audit_queue_capacity = 1;
    let executor = builder.build().unwrap();
    let flaky_calls = Arc::new(AtomicUsize::new(0));
    let tools = {
        let flaky_calls = flaky_calls.clone();
        tool_fn(move |call: ToolCall| {
            let failed_before =
                call.tool_name() == "flaky" && flaky_calls.fetch_add(1, Ordering::SeqCst) < 2;
            async move {
                if failed_before {
                    Err(ToolError::from_http_status(503, "busy, try later"))
                } else {
                    Ok(ToolOutput::new(json!({"args": call.params().as_value()})))
                }
            }
        })
    };
    let items: Vec<usize> = (0..ITEMS).collect();
    let plan = Plan::from_value(json!({"steps": [
        {"id": "pages", "tool": "web::fetch", "args": {"page": "{item}"}, "foreach": {"items": items}},
        {"id": "flaky", "tool": "web::flaky", "args": {}, "retry": {"maxAttempts": 3, "backoffMs": 10}}
    ]}))
    .unwrap();
    let mut run = executor
        .start(
            tools,
            &plan,
            Turn::new("sess-1", "user-1").with_run_id("run-behind"),
        )
        .unwrap();
    run.keep_record();
    let (result, events, calls) = run.finish_kept().await;
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 3);
    assert_eq!(calls.len(), ITEMS + 3);

    let dir = root.join("run-behind");
    // Every call, in the order it was dispatched.
    let recorded_calls: Vec<String> = lines(&dir, "calls.jsonl")
        .into_iter()
        .map(|line| {
            let call = ToolCall::from_value(line["call"].clone()).unwrap();
            call.run_link().unwrap().call_id.clone()
        })
        .collect();
    let dispatched: Vec<String> = calls
        .iter()
        .map(|c| c.run_link().unwrap().call_id.clone())
        .collect();
    assert_eq!(recorded_calls.len(), ITEMS + 3);
    assert_eq!(recorded_calls, dispatched);
    // A result for each call, none twice.
    let results = lines(&dir, "results.jsonl");
    assert_eq!(results.len(), ITEMS + 3);
    let answered: HashSet<&str> = results
        .iter()
        .map(|line| line["result"]["requestId"].as_str().unwrap())
        .collect();
    let requested: HashSet<&str> = calls.iter().map(ToolCall::request_id).collect();
    assert_eq!(answered, requested);
    // Every event, in the order it was emitted: two per call at least, and the run's own.
    let recorded_events: Vec<(String, Option<String>)> = lines(&dir, "events.jsonl")
        .into_iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["callId"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let emitted: Vec<(String, Option<String>)> = events
        .iter()
        .map(|e| (e.kind.to_string(), e.call_id.clone()))
        .collect();
    assert!(emitted.len() >= 2 * (ITEMS + 3) + 2, "{}", emitted.len());
    assert_eq!(recorded_events.len(), emitted.len());
    assert_eq!(recorded_events, emitted);
    assert_eq!(recorded_events.last().unwrap().0, "run.finished");
    std::fs::remove_dir_all(&root).unwrap();
}
