//! The audit directory of a run, its reconstruction, and deterministic replay; the trace
//! layer's events of calls the executor issued.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::envelope::RunLink;
use tower_toolcall::trace::{AuditLog, Redactor, TraceLayer};
use tower_toolcall::{tool_fn, HookLayer, ToolCall, ToolOutput};
use tower_toolcall_executor::{reconstruct, replay, Executor, Plan, StepStatus, Turn, TurnStatus};

use crate::tools::{ok, ok_with, permanent, registry, transient, Answer, Toolbox};

pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "toolcall-executor-{name}-{}-{}",
        std::process::id(),
        ulid::Ulid::generate()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn travel_plan() -> Plan {
    Plan::from_value(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}},
        {"id": "hotels", "tool": "travel::hotels", "args": {"near": "$steps.flights.arrival", "n": "{index}"},
         "foreach": {"items": [1, 2, 3]}},
        {"id": "weather", "tool": "travel::weather", "args": {}, "optional": true},
        {"id": "car", "tool": "travel::cars", "args": {"city": "Lyon"}, "alternatives": ["travel::cars_backup"],
         "retry": {"maxAttempts": 2, "backoffMs": 50}}
    ]}))
    .unwrap()
}

fn travel_tools() -> Toolbox {
    Toolbox::new()
        .script(
            "travel::flights",
            vec![ok_with(120, json!({"arrival": "LYS"}))],
        )
        .script("travel::hotels", vec![ok(40), permanent(10), ok(30)])
        .script("travel::weather", vec![Answer::Hang])
        .script("travel::cars", vec![transient(20), permanent(20)])
        .script("travel::cars_backup", vec![ok(15)])
}

#[tokio::test(start_paused = true)]
async fn a_run_leaves_an_audit_directory_that_reconstructs_and_replays_without_divergence() {
    let root = temp_dir("replay");
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .turn_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let tools = travel_tools();
    let mut run = executor
        .start(
            tools.service(),
            &travel_plan(),
            Turn::new("sess-1", "user-1").with_run_id("run-42"),
        )
        .unwrap();
    let events = run.events().unwrap();
    let (result, events) =
        futures::join!(run.finish(), futures::StreamExt::collect::<Vec<_>>(events));
    assert_eq!(result.status, TurnStatus::Partial, "{}", result.message);
    assert_eq!(result.step("weather").unwrap().status, StepStatus::TimedOut);
    assert_eq!(
        result.step("car").unwrap().answered_by.as_deref(),
        Some("travel::cars_backup")
    );
    assert_eq!(result.step("hotels").unwrap().status, StepStatus::Failed);

    let dir = root.join("run-42");
    let recorded = reconstruct(&dir).unwrap();
    assert_eq!(recorded.run_id, "run-42");
    assert_eq!(recorded.plan, travel_plan());
    assert_eq!(recorded.status, Some(TurnStatus::Partial));
    assert_eq!(recorded.policy.turn_timeout_ms, Some(2_000));
    assert_eq!(recorded.calls.len(), tools.total());
    assert_eq!(recorded.calls.len(), 1 + 3 + 1 + 3);
    // Every call has a result line: the weather call's says its outcome is unknown.
    assert_eq!(recorded.results.len(), recorded.calls.len());
    let weather = recorded
        .results
        .iter()
        .find(|r| r.tool_name == "weather")
        .unwrap();
    assert_eq!(
        weather.error.as_ref().unwrap().details.as_ref().unwrap()["outcomeUnknown"],
        true
    );
    // events.jsonl holds exactly the events the stream gave.
    let kinds = |events: &[tower_toolcall::trace::ExecutionEvent]| {
        events
            .iter()
            .map(|e| (e.kind.to_string(), e.call_id.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&recorded.events), kinds(&events));
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["policy"]["maxConcurrency"], 8);
    assert_eq!(run_json["confirmationId"], Value::Null);

    let before = tools.total();
    let report = replay(&recorded, &recorded.executor(registry()).unwrap())
        .await
        .unwrap();
    assert_eq!(tools.total(), before, "a replay calls no tool");
    assert_eq!(report.divergence, None);
    assert_eq!(report.result.steps, result.steps);
    assert_eq!(report.result.trace, result.trace);
    assert_eq!(kinds(&report.events), kinds(&events));

    // Another policy, checked against the recording: one call at a time changes the order.
    let serial = Executor::builder(registry())
        .policy(recorded.policy.clone())
        .max_concurrency(1)
        .build()
        .unwrap();
    let report = replay(&recorded, &serial).await.unwrap();
    let divergence = report
        .divergence
        .expect("a serial run dispatches in another order");
    assert_eq!(divergence.stream, "calls");
    assert_eq!(divergence.index, 1);
    assert!(divergence
        .recorded
        .unwrap()
        .starts_with("weather weather#1 travel::weather"));
    assert!(divergence
        .replayed
        .unwrap()
        .starts_with("hotels hotels[0]#1"));

    // A changed plan diverges at its first changed call.
    let mut changed = recorded.clone();
    changed.plan.steps[0].args = json!({"to": "Paris"});
    let report = replay(&changed, &recorded.executor(registry()).unwrap())
        .await
        .unwrap();
    let divergence = report.divergence.unwrap();
    assert_eq!((divergence.stream, divergence.index), ("calls", 0));
    assert!(divergence.replayed.unwrap().ends_with(r#"{"to":"Paris"}"#));
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_confirmation_reaches_run_json_and_every_call() {
    let root = temp_dir("confirm");
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = Toolbox::new().script("vault::write", vec![ok(1)]);
    let plan = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "vault::write", "args": {"p": 1, "api_key": "sk-proj-0123456789abcdefghij"}},
        {"id": "b", "tool": "vault::write", "args": {"p": 2}}
    ]}))
    .unwrap();
    let run = executor
        .start(
            tools.service(),
            &plan,
            Turn::new("s", "u").with_run_id("run-c"),
        )
        .unwrap();
    run.controls().confirm("approval-9");
    assert_eq!(run.finish().await.status, TurnStatus::Completed);
    let recorded = reconstruct(root.join("run-c")).unwrap();
    assert_eq!(recorded.confirmation_id.as_deref(), Some("approval-9"));
    assert!(recorded
        .calls
        .iter()
        .all(|c| c.control().confirmation_id.as_deref() == Some("approval-9")));
    let kinds: Vec<&str> = recorded.events.iter().map(|e| e.kind.as_ref()).collect();
    assert_eq!(
        &kinds[..3],
        ["run.started", "run.confirmationRequested", "run.confirmed"]
    );
    assert_eq!(recorded.calls[0].params().as_map()["api_key"], "[REDACTED]");
    let run_json = std::fs::read_to_string(root.join("run-c/run.json")).unwrap();
    assert!(!run_json.contains("sk-proj"), "run.json is redacted too");
    // The replay compares params redacted as the audit wrote them.
    let report = replay(&recorded, &recorded.executor(registry()).unwrap())
        .await
        .unwrap();
    assert_eq!(report.divergence, None);
    assert_eq!(report.calls[0].params().as_map()["api_key"], "[REDACTED]");
    // A registry without the recorded tool refuses the replay with the plan's problem.
    let other = tower_toolcall::registry::ToolRegistry::builder()
        .build()
        .unwrap();
    let err = replay(&recorded, &recorded.executor(other).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.problems()[0].field, "steps[0].tool");
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_executors_redactor_reaches_run_json_and_the_audit_lines() {
    let root = temp_dir("redactor");
    // A secret name and a credential shape the built-in rules do not know.
    let redactor = Redactor::builder()
        .secret_name("card_pin")
        .credential_pattern("acme_[0-9a-f]{32}")
        .build()
        .unwrap();
    assert!(!Redactor::default().is_secret_name("card_pin"));
    let token = "acme_0123456789abcdef0123456789abcdef";
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .redactor(redactor.clone())
        .build()
        .unwrap();
    let tools = Toolbox::new().script("travel::search", vec![ok(1)]);
    let plan = Plan::from_value(json!({
        "vars": {"token": token},
        "steps": [{"id": "a", "tool": "travel::search", "args": {"card_pin": "4321", "q": "$vars.token"}}]
    }))
    .unwrap();
    let run = executor
        .start(
            tools.service(),
            &plan,
            Turn::new("s", "u").with_run_id("run-r"),
        )
        .unwrap();
    assert_eq!(run.finish().await.status, TurnStatus::Completed);

    let dir = root.join("run-r");
    let text = std::fs::read_to_string(dir.join("run.json")).unwrap();
    assert!(!text.contains("4321"), "{text}");
    assert!(!text.contains(token), "{text}");
    let run_json: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        run_json["plan"]["steps"][0]["args"]["card_pin"],
        "[REDACTED]"
    );
    assert_eq!(run_json["status"], "completed");
    // The audit's lines are redacted by the same redactor.
    let calls = std::fs::read_to_string(dir.join("calls.jsonl")).unwrap();
    assert!(!calls.contains("4321") && !calls.contains(token), "{calls}");
    let recorded = reconstruct(&dir).unwrap();
    assert_eq!(
        recorded.calls[0].params().as_map()["card_pin"],
        "[REDACTED]"
    );
    // A replay whose executor has the run's redactor compares params as the audit wrote them.
    let same = Executor::builder(registry())
        .policy(recorded.policy.clone())
        .redactor(redactor)
        .build()
        .unwrap();
    assert_eq!(replay(&recorded, &same).await.unwrap().divergence, None);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_broken_audit_directory_is_an_error_naming_the_file_and_line() {
    let dir = temp_dir("broken");
    let err = reconstruct(&dir).unwrap_err();
    assert_eq!(err.field(), "run.json");
    let plan = json!({"steps": [{"id": "a", "tool": "travel::search", "args": {}}]});
    std::fs::write(
        dir.join("run.json"),
        json!({"runId": "r", "plan": plan, "turn": {"sessionKey": "s", "actorId": "u"},
               "policy": {"maxConcurrency": 1, "onDeadline": "leaveRunning", "confirmation": "ask", "maxStepAttempts": 1}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("calls.jsonl"), "").unwrap();
    std::fs::write(dir.join("results.jsonl"), "").unwrap();
    std::fs::write(
        dir.join("events.jsonl"),
        "{\"type\": \"run.started\"}\nnot json\n",
    )
    .unwrap();
    let err = reconstruct(&dir).unwrap_err();
    assert_eq!(err.field(), "events.jsonl:1");
    assert!(err.problem().contains("runId"), "{err}");

    // A seed that is not a decimal string is refused, naming it.
    let mut run = json!({"runId": "r", "plan": plan, "turn": {"sessionKey": "s", "actorId": "u"},
               "policy": {"maxConcurrency": 1, "onDeadline": "leaveRunning", "confirmation": "ask", "maxStepAttempts": 1}});
    for bad in [json!("12x"), json!(-1), json!("18446744073709551616")] {
        run["jitterSeed"] = bad.clone();
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
        let err = reconstruct(&dir).unwrap_err();
        assert_eq!(err.field(), "run.json", "{bad}");
        assert!(err.problem().contains("jitterSeed"), "{bad}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_trace_layer_writes_step_started_uses_the_run_ids_and_records_a_dropped_call() {
    let dir = temp_dir("trace");
    let audit = AuditLog::builder(&dir).build().unwrap();
    let mut svc =
        TraceLayer::new()
            .audit(audit.clone())
            .layer(HookLayer::new(audit.attempt_hooks()).layer(tool_fn(
                |call: ToolCall| async move {
                    if call.params().as_map().contains_key("slow") {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                    }
                    Ok(ToolOutput::new(json!("done")))
                },
            )));
    let call = |params: Value| {
        ToolCall::builder("travel", "flights")
            .session("s")
            .actor("u")
            .params(params)
            .run_link(RunLink::new("run-7", "flights", "flights#1"))
            .build()
            .unwrap()
    };
    svc.ready()
        .await
        .unwrap()
        .call(call(json!({})))
        .await
        .unwrap();
    let slow = svc.ready().await.unwrap().call(call(json!({"slow": true})));
    let _ = tokio::time::timeout(Duration::from_secs(1), slow).await;
    audit.shutdown();
    let events: Vec<Value> = std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "run.started",
            "step.started",
            "step.finished",
            "run.finished",
            "run.started",
            "step.started",
            "step.failed",
            "run.cancelled"
        ]
    );
    for e in &events {
        assert_eq!(
            (
                e["runId"].as_str(),
                e["stepId"].as_str(),
                e["callId"].as_str()
            ),
            (Some("run-7"), Some("flights"), Some("flights#1"))
        );
    }
    assert_eq!(events[1]["attempt"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_run_json_that_cannot_be_written_is_an_event_of_the_run() {
    use futures::StreamExt;
    let root = temp_dir("unwritable");
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = Toolbox::new().script("travel::flights", vec![ok(10)]);
    let plan = Plan::from_value(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}}
    ]}))
    .unwrap();
    let mut run = executor
        .start(
            tools.service(),
            &plan,
            Turn::new("s", "u").with_run_id("gone"),
        )
        .unwrap();
    // The run's folder disappears before the run writes its record.
    std::fs::remove_dir_all(root.join("gone")).unwrap();
    let events = run.events().unwrap().collect::<Vec<_>>();
    let (result, events) = futures::join!(run.finish(), events);
    assert_eq!(result.status, TurnStatus::Completed);
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "run.auditFailed")
        .collect();
    // Once when the run starts, once when it ends; both before `run.finished`.
    assert_eq!(failed.len(), 2, "{events:?}");
    assert!(failed.iter().all(|e| e.level == "error"));
    assert_eq!(failed[0].payload.as_ref().unwrap()["file"], "run.json");
    assert_eq!(events.last().unwrap().kind, "run.finished");
    std::fs::remove_dir_all(&root).ok();
}
