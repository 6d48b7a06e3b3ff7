//! The executor of an agent turn: plans, references, scheduling, the turn's deadline,
//! cascading failures, alternatives, confirmation, cancellation, events, audit and replay.

mod audit;
mod jitter;
mod limits;
mod properties;
mod tools;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::time::Instant;
use tools::{breaker_open, ok, ok_with, permanent, registry, transient, Answer, Toolbox};
use tower_toolcall::trace::ExecutionEvent;
use tower_toolcall_executor::{
    ConfirmationPolicy, Executor, OnDeadline, Plan, Recovery, StepStatus, Turn, TurnResult,
    TurnStatus,
};

fn executor() -> Executor {
    Executor::builder(registry()).build().unwrap()
}

fn plan(value: Value) -> Plan {
    Plan::from_value(value).unwrap()
}

fn turn() -> Turn {
    Turn::new("sess-1", "user-1").with_run_id("run-1")
}

fn status(result: &TurnResult, id: &str) -> StepStatus {
    result
        .step(id)
        .unwrap_or_else(|| panic!("no step {id}"))
        .status
}

/// Runs `plan` over `tools` and collects every event, in order.
async fn run_collecting(
    executor: &Executor,
    tools: &Toolbox,
    plan: &Plan,
) -> (TurnResult, Vec<ExecutionEvent>) {
    let mut run = executor.start(tools.service(), plan, turn()).unwrap();
    let events = run.events().unwrap();
    let collect = events.collect::<Vec<_>>();
    let (result, events) = futures::join!(run.finish(), collect);
    (result, events)
}

#[tokio::test(start_paused = true)]
async fn an_invalid_plan_lists_every_problem_and_dispatches_nothing() {
    let tools = Toolbox::new().script("travel::flights", vec![ok(1)]);
    let bad = plan(json!({"steps": [
        {"id": "a", "tool": "travel::nope", "args": {}},
        {"id": "b", "tool": "travel::flights", "args": {"to": 42}},
        {"id": "c", "tool": "travel::hotels", "args": {"near": "$steps.zzz.x", "n": "$vars.none"}},
        {"id": "d", "tool": "travel::hotels", "args": {"x": "$steps.e.x"}},
        {"id": "e", "tool": "travel::hotels", "args": {"x": "$steps.d.x"}},
        {"id": "f", "tool": "travel::hotels", "args": {}, "foreach": {"items": {"not": "an array"}}},
        {"id": "g", "tool": "travel::hotels", "args": {"q": "{item.name}"}},
        {"id": "a", "tool": "travel::hotels", "args": {}}
    ]}));
    let err = executor().start(tools.service(), &bad, turn()).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "steps[7].id",
            "steps[0].tool",
            "steps[1].args",
            "steps[2].args.n",
            "steps[2].args.near",
            "steps[5].foreach.items",
            "steps[6].args.q",
            "steps[3].dependsOn",
        ],
        "{err}"
    );
    let text = err.to_string();
    assert!(text.starts_with("invalid plan (8 problems): "), "{text}");
    assert!(
        text.contains("`travel::nope` is not a registered tool"),
        "{text}"
    );
    assert!(text.contains("dependency cycle d -> e -> d"), "{text}");
    assert!(text.contains("nothing was run"), "{text}");
    assert_eq!(tools.total(), 0);

    let unknown_member =
        Plan::from_value(json!({"steps": [{"id": "a", "tool": "t::x", "argz": {}}]})).unwrap_err();
    assert_eq!(unknown_member.problems()[0].field, "steps[0].argz");
    assert!(
        unknown_member.to_string().contains("argz"),
        "{unknown_member}"
    );
}

#[tokio::test(start_paused = true)]
async fn independent_steps_run_side_by_side_and_dependents_after() {
    let tools = Toolbox::new()
        .script(
            "travel::flights",
            vec![ok_with(100, json!({"arrival": "LYS"}))],
        )
        .script("travel::weather", vec![ok(100)])
        .script("travel::hotels", vec![ok(100)]);
    let p = plan(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}},
        {"id": "weather", "tool": "travel::weather", "args": {"city": "Lyon"}},
        {"id": "hotels", "tool": "travel::hotels", "args": {"near": "$steps.flights.arrival", "q": "near {$steps.flights.arrival}"}}
    ]}));
    let start = Instant::now();
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(tools.times("travel::weather")[0] - start, Duration::ZERO);
    assert_eq!(
        tools.times("travel::hotels")[0] - start,
        Duration::from_millis(100)
    );
    assert_eq!(
        result.output("hotels").unwrap()["args"],
        json!({"near": "LYS", "q": "near LYS"})
    );
    let hotels = tools
        .calls()
        .into_iter()
        .find(|c| c.tool_name() == "hotels")
        .unwrap();
    let link = hotels.run_link().unwrap();
    assert_eq!(
        (
            link.run_id.as_str(),
            link.step_id.as_str(),
            link.call_id.as_str(),
            link.attempt
        ),
        ("run-1", "hotels", "hotels#1", 1)
    );
    assert_eq!(hotels.session_key(), "sess-1");
}

#[tokio::test(start_paused = true)]
async fn run_wide_and_per_tool_limits_hold() {
    let tools = Toolbox::new()
        .script("travel::search", vec![ok(100)])
        .script("travel::fetch", vec![ok(100)]);
    let mut steps: Vec<Value> = (0..6)
        .map(|i| json!({"id": format!("s{i}"), "tool": "travel::search", "args": {"i": i}}))
        .collect();
    steps.extend(
        (0..6).map(|i| json!({"id": format!("f{i}"), "tool": "travel::fetch", "args": {"i": i}})),
    );
    let executor = Executor::builder(registry())
        .max_concurrency(4)
        .tool_concurrency("travel::search", 1)
        .build()
        .unwrap();
    let start = Instant::now();
    let result = executor
        .start(tools.service(), &plan(json!({ "steps": steps })), turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(tools.max_in_flight(), 4);
    assert_eq!(tools.max_in_flight_of("travel::search"), 1);
    assert_eq!(tools.total(), 12);
    // search runs one at a time: six rounds of 100 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(600));
}

#[tokio::test(start_paused = true)]
async fn foreach_expands_lazily_with_item_and_index_bound() {
    let tools = Toolbox::new()
        .script("travel::search", vec![ok_with(10, json!({"hits": (0..50).map(|i| json!({"name": format!("h{i}")})).collect::<Vec<_>>()}))])
        .script("travel::fetch", vec![ok(10)]);
    let p = plan(json!({"steps": [
        {"id": "search", "tool": "travel::search", "args": {}},
        {"id": "fetch", "tool": "travel::fetch",
         "args": {"name": "{item.name}", "at": "{index}", "label": "#{index}: {item.name}"},
         "foreach": {"items": "$steps.search.hits", "maxConcurrency": 3}}
    ]}));
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(tools.count("travel::fetch"), 50);
    assert_eq!(tools.max_in_flight_of("travel::fetch"), 3);
    let outputs = result.output("fetch").unwrap().as_array().unwrap();
    assert_eq!(outputs.len(), 50);
    assert_eq!(
        outputs[7]["args"],
        json!({"name": "h7", "at": 7, "label": "#7: h7"})
    );
    let call = &tools.calls()[8];
    let link = call.run_link().unwrap();
    assert_eq!(link.call_id, "fetch[7]#1");
    assert_eq!(link.loop_id.as_deref(), Some("run-1/fetch"));
    let iteration = link.iteration.as_ref().unwrap();
    assert_eq!((iteration.index, iteration.item_name.as_str()), (7, "item"));
    assert_eq!(iteration.item_value, json!({"name": "h7"}));
}

#[tokio::test(start_paused = true)]
async fn foreach_over_a_step_output_that_is_no_array_fails_the_step_without_calls() {
    let tools = Toolbox::new()
        .script("travel::search", vec![ok_with(1, json!({"hits": "none"}))])
        .script("travel::fetch", vec![ok(1)]);
    let p = plan(json!({"steps": [
        {"id": "search", "tool": "travel::search", "args": {}},
        {"id": "fetch", "tool": "travel::fetch", "args": {}, "foreach": {"items": "$steps.search.hits"}, "optional": true}
    ]}));
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(status(&result, "fetch"), StepStatus::Failed);
    assert_eq!(tools.count("travel::fetch"), 0);
    assert!(result
        .step("fetch")
        .unwrap()
        .error
        .as_ref()
        .unwrap()
        .message
        .contains("must be an array, got a string"));
    assert_eq!(
        result.status,
        TurnStatus::Completed,
        "an optional step does not fail the turn"
    );
}

#[tokio::test(start_paused = true)]
async fn the_turn_deadline_keeps_completed_results_and_skips_the_rest() {
    let tools = Toolbox::new()
        .script("travel::flights", vec![ok(1_000)])
        .script("travel::weather", vec![ok(60_000)])
        .script("travel::hotels", vec![ok(1_000)]);
    let p = plan(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}},
        {"id": "weather", "tool": "travel::weather", "args": {}},
        {"id": "hotels", "tool": "travel::hotels", "args": {"w": "$steps.weather"}}
    ]}));
    let executor = Executor::builder(registry())
        .turn_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let start = Instant::now();
    let (result, events) = run_collecting(&executor, &tools, &p).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "the running weather call is not awaited"
    );
    assert_eq!(result.status, TurnStatus::Partial);
    assert_eq!(status(&result, "flights"), StepStatus::Succeeded);
    assert!(result.output("flights").is_some());
    assert_eq!(status(&result, "weather"), StepStatus::TimedOut);
    assert_eq!(status(&result, "hotels"), StepStatus::Skipped);
    assert_eq!(tools.count("travel::hotels"), 0);
    assert_eq!(
        result.message,
        "The turn ran out of time. completed: flights; did not finish before the turn's deadline: weather, hotels."
    );
    // The timeout is in the turn trace (the events): the weather call ended with TIMEOUT.
    let weather_end = events
        .iter()
        .find(|e| e.kind == "step.failed" && e.call_id.as_deref() == Some("weather#1"))
        .expect("the timed-out call has its end event");
    assert_eq!(
        weather_end.payload.as_ref().unwrap()["errorCode"],
        "TIMEOUT"
    );
    assert_eq!(weather_end.elapsed_ms, Some(5_000));
}

#[tokio::test(start_paused = true)]
async fn at_the_deadline_calls_are_left_running_or_cancelled_as_configured() {
    for (on_deadline, left_running) in [(OnDeadline::LeaveRunning, 1), (OnDeadline::Cancel, 0)] {
        let tools = Toolbox::new().script("travel::weather", vec![ok(10_000)]);
        let p = plan(json!({"steps": [{"id": "weather", "tool": "travel::weather", "args": {}}]}));
        let executor = Executor::builder(registry())
            .turn_timeout(Duration::from_secs(1))
            .on_deadline(on_deadline)
            .build()
            .unwrap();
        let start = Instant::now();
        let result = executor
            .start(tools.service(), &p, turn())
            .unwrap()
            .finish()
            .await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{on_deadline:?}");
        assert_eq!(result.status, TurnStatus::Partial);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(tools.in_flight(), left_running, "{on_deadline:?}");
        // A call left running ends on its own time, unawaited.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(tools.in_flight(), 0, "{on_deadline:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_cascades_while_independent_steps_finish() {
    let tools = Toolbox::new()
        .script("travel::flights", vec![permanent(10)])
        .script("travel::hotels", vec![ok(10)])
        .script("travel::cars", vec![ok(10)])
        .script("travel::weather", vec![ok(50)]);
    let p = plan(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}, "optional": true},
        {"id": "hotels", "tool": "travel::hotels", "args": {"near": "$steps.flights.arrival"}, "optional": true},
        {"id": "cars", "tool": "travel::cars", "args": {}, "dependsOn": ["hotels"], "default": {"cars": []}},
        {"id": "summary", "tool": "travel::hotels", "args": {"cars": "$steps.cars.cars"}},
        {"id": "required", "tool": "travel::hotels", "args": {"h": "$steps.hotels"}},
        {"id": "weather", "tool": "travel::weather", "args": {}}
    ]}));
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(
        tools.count("travel::flights"),
        1,
        "a permanent failure is not retried"
    );
    assert_eq!(status(&result, "flights"), StepStatus::Failed);
    assert_eq!(
        status(&result, "hotels"),
        StepStatus::Skipped,
        "optional dependent skipped"
    );
    assert_eq!(
        status(&result, "cars"),
        StepStatus::Defaulted,
        "default used"
    );
    assert_eq!(result.output("cars"), Some(&json!({"cars": []})));
    assert_eq!(
        status(&result, "summary"),
        StepStatus::Succeeded,
        "runs on the default"
    );
    assert_eq!(status(&result, "required"), StepStatus::Skipped);
    assert_eq!(
        status(&result, "weather"),
        StepStatus::Succeeded,
        "independent step finishes"
    );
    assert_eq!(
        result.status,
        TurnStatus::Failed,
        "a required step without result escalates"
    );
    assert_eq!(tools.count("travel::cars"), 0);
    assert_eq!(tools.count("travel::hotels"), 1, "only summary ran");
    let decisions: Vec<(&str, Recovery, &str)> = result
        .trace
        .iter()
        .map(|d| (d.step_id.as_str(), d.decision, d.classification.as_str()))
        .collect();
    assert_eq!(
        decisions,
        vec![
            ("flights", Recovery::Skip, "permanent"),
            ("hotels", Recovery::Skip, "dependency"),
            ("cars", Recovery::Default, "dependency"),
            ("required", Recovery::Escalate, "dependency"),
        ]
    );
    assert_eq!(
        result.trace[0].error_code,
        Some(tower_toolcall::ErrorCode::NotFound)
    );
}

#[tokio::test(start_paused = true)]
async fn a_required_step_that_fails_permanently_escalates() {
    let tools = Toolbox::new()
        .script("travel::flights", vec![permanent(1)])
        .script("travel::weather", vec![ok(5)]);
    let p = plan(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "XYZ"}},
        {"id": "weather", "tool": "travel::weather", "args": {}}
    ]}));
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Failed);
    assert_eq!(status(&result, "weather"), StepStatus::Succeeded);
    assert_eq!(result.trace.len(), 1);
    assert_eq!(result.trace[0].decision, Recovery::Escalate);
    assert_eq!(
        result.step("flights").unwrap().error.as_ref().unwrap().code,
        tower_toolcall::ErrorCode::NotFound
    );
}

#[tokio::test(start_paused = true)]
async fn alternatives_answer_when_the_primary_fails_or_its_breaker_is_open() {
    for primary in [permanent(5), breaker_open()] {
        let tools = Toolbox::new()
            .script("travel::cars", vec![primary.clone()])
            .script(
                "travel::cars_backup",
                vec![ok_with(5, json!({"car": "Clio"}))],
            );
        let p = plan(json!({"steps": [
            {"id": "car", "tool": "travel::cars", "args": {"city": "Lyon"}, "alternatives": ["travel::cars_backup"]}
        ]}));
        let result = executor()
            .start(tools.service(), &p, turn())
            .unwrap()
            .finish()
            .await;
        assert_eq!(result.status, TurnStatus::Completed, "{primary:?}");
        assert_eq!(result.output("car"), Some(&json!({"car": "Clio"})));
        let step = result.step("car").unwrap();
        assert_eq!(
            (step.calls, step.answered_by.as_deref()),
            (2, Some("travel::cars_backup"))
        );
        assert_eq!(result.trace.len(), 1);
        assert_eq!(result.trace[0].decision, Recovery::Alternative);
        assert_eq!(result.trace[0].tool, "travel::cars");
        assert_eq!(result.trace[0].call_id.as_deref(), Some("car#1"));
        let backup = tools.calls().pop().unwrap();
        assert_eq!(backup.params().as_value(), &json!({"city": "Lyon"}));
        assert_eq!(backup.run_link().unwrap().call_id, "car#2");
    }
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_within_the_step_retry_and_traced() {
    let tools = Toolbox::new().script("travel::weather", vec![transient(1), transient(1), ok(1)]);
    let p = plan(json!({"steps": [
        {"id": "weather", "tool": "travel::weather", "args": {}, "retry": {"maxAttempts": 3, "backoffMs": 100, "jitterPercent": 0}}
    ]}));
    let start = Instant::now();
    let (result, events) = run_collecting(&executor(), &tools, &p).await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(tools.count("travel::weather"), 3);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(1 + 100 + 1 + 100 + 1)
    );
    let trace: Vec<(u32, Recovery, &str)> = result
        .trace
        .iter()
        .map(|d| (d.retry_count, d.decision, d.classification.as_str()))
        .collect();
    assert_eq!(
        trace,
        vec![
            (1, Recovery::Retry, "transient"),
            (2, Recovery::Retry, "transient")
        ]
    );
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind == "step.failed")
        .map(|e| e.payload.as_ref().unwrap())
        .collect();
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0]["decision"], "retry");
    assert_eq!(failed[0]["classification"], "transient");
    assert_eq!(failed[1]["retryCount"], 2);
    assert_eq!(failed[0]["errorCode"], "UPSTREAM_UNAVAILABLE");

    // Exhausted retries escalate a required step.
    let tools = Toolbox::new().script("travel::weather", vec![transient(1)]);
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(tools.count("travel::weather"), 3);
    assert_eq!(result.status, TurnStatus::Failed);
    assert_eq!(result.trace.last().unwrap().decision, Recovery::Escalate);
}

#[tokio::test(start_paused = true)]
async fn a_mutating_run_asks_for_confirmation_and_carries_its_id() {
    let tools = Toolbox::new().script("vault::write", vec![ok(1)]);
    let p = plan(json!({"steps": [
        {"id": "save", "tool": "vault::write", "args": {"path": "a.md"}, "preview": "Write a.md"}
    ]}));
    let mut run = executor().start(tools.service(), &p, turn()).unwrap();
    let mut events = run.events().unwrap();
    let controls = run.controls();
    let handle = tokio::spawn(run.finish());
    assert_eq!(events.next().await.unwrap().kind, "run.started");
    let asked = events.next().await.unwrap();
    assert_eq!(asked.kind, "run.confirmationRequested");
    assert_eq!(asked.payload.unwrap()["steps"][0]["preview"], "Write a.md");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(tools.total(), 0, "nothing runs before the confirmation");
    controls.confirm("confirm-7");
    let result = handle.await.unwrap();
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(result.confirmation_id.as_deref(), Some("confirm-7"));
    assert_eq!(
        tools.calls()[0].control().confirmation_id.as_deref(),
        Some("confirm-7")
    );
    assert_eq!(events.next().await.unwrap().kind, "run.confirmed");

    // Refused: by the controls, or by the executor's policy.
    let run = executor().start(tools.service(), &p, turn()).unwrap();
    run.controls().refuse();
    let result = run.finish().await;
    assert_eq!(result.status, TurnStatus::Refused);
    let strict = Executor::builder(registry())
        .confirmation(ConfirmationPolicy::Refuse)
        .build()
        .unwrap();
    let result = strict
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Refused);
    assert_eq!(status(&result, "save"), StepStatus::Skipped);
    assert_eq!(tools.total(), 1, "refused runs dispatch nothing");

    // A confirmation given with the turn needs no question.
    let result = executor()
        .start(tools.service(), &p, turn().with_confirmation_id("given"))
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(
        tools.calls()[1].control().confirmation_id.as_deref(),
        Some("given")
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_drops_cancellable_calls_and_lets_the_others_finish() {
    let tools = Toolbox::new()
        .script("travel::weather", vec![Answer::Hang])
        .script("travel::flights", vec![ok(1_000)])
        .script("travel::hotels", vec![ok(1)]);
    let p = plan(json!({"steps": [
        {"id": "weather", "tool": "travel::weather", "args": {}},
        {"id": "flights", "tool": "travel::flights", "args": {"to": "Lyon"}, "cancellable": false},
        {"id": "hotels", "tool": "travel::hotels", "args": {"f": "$steps.flights"}}
    ]}));
    let mut run = executor().start(tools.service(), &p, turn()).unwrap();
    let events = run.events().unwrap();
    let controls = run.controls();
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        controls.cancel();
    };
    let start = Instant::now();
    let (result, (), events) = futures::join!(run.finish(), canceller, events.collect::<Vec<_>>());
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(1_000),
        "the non-cancellable call ends"
    );
    assert_eq!(result.status, TurnStatus::Cancelled);
    assert_eq!(status(&result, "weather"), StepStatus::Cancelled);
    assert_eq!(status(&result, "flights"), StepStatus::Succeeded);
    assert_eq!(status(&result, "hotels"), StepStatus::Cancelled);
    assert_eq!(tools.count("travel::hotels"), 0);
    assert_eq!(tools.max_in_flight(), 2);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_ref()).collect();
    assert!(kinds.contains(&"run.cancelled"), "{kinds:?}");
    let weather_end = events
        .iter()
        .find(|e| e.kind == "step.failed" && e.call_id.as_deref() == Some("weather#1"))
        .unwrap();
    assert_eq!(
        weather_end.payload.as_ref().unwrap()["outcomeUnknown"],
        true
    );
}

#[tokio::test(start_paused = true)]
async fn every_call_has_started_before_its_end_and_the_stream_is_ordered() {
    let tools = Toolbox::new()
        .script("travel::search", vec![transient(5), ok(5)])
        .script("travel::fetch", vec![ok(3)]);
    let p = plan(json!({"steps": [
        {"id": "search", "tool": "travel::search", "args": {}, "retry": {"maxAttempts": 2}},
        {"id": "fetch", "tool": "travel::fetch", "args": {"i": "{index}"}, "foreach": {"items": [1, 2, 3]}}
    ]}));
    let (result, events) = run_collecting(&executor(), &tools, &p).await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(events.first().unwrap().kind, "run.started");
    assert_eq!(events.last().unwrap().kind, "run.finished");
    let calls: Vec<String> = tools
        .calls()
        .iter()
        .map(|c| c.run_link().unwrap().call_id.clone())
        .collect();
    // fetch does not depend on search: its items go out while search waits for its retry.
    assert_eq!(
        calls,
        [
            "search#1",
            "fetch[0]#1",
            "fetch[1]#1",
            "fetch[2]#1",
            "search#2"
        ]
    );
    for call in &calls {
        let at = |kind: &str| {
            events
                .iter()
                .position(|e| e.kind == kind && e.call_id.as_deref() == Some(call))
        };
        let started = at("step.started").unwrap_or_else(|| panic!("{call} has no step.started"));
        let ended = at("step.finished")
            .or(at("step.failed"))
            .unwrap_or_else(|| panic!("{call} has no end"));
        assert!(started < ended, "{call}");
        assert!(events.iter().all(|e| e.run_id == "run-1"));
    }
    assert_eq!(
        events.iter().filter(|e| e.kind == "step.progress").count(),
        3
    );
    assert_eq!(
        events.iter().filter(|e| e.kind == "step.scheduled").count(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_loses_counted_events_and_never_slows_the_tools() {
    let tools = Toolbox::new().script("travel::fetch", vec![ok(10)]);
    let p = plan(json!({"steps": [
        {"id": "fetch", "tool": "travel::fetch", "args": {}, "foreach": {"items": (0..100).collect::<Vec<_>>()}}
    ]}));
    let executor = Executor::builder(registry())
        .max_concurrency(10)
        .event_capacity(4)
        .build()
        .unwrap();
    let mut run = executor.start(tools.service(), &p, turn()).unwrap();
    let events = run.events().unwrap();
    let start = Instant::now();
    let result = run.finish().await;
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "ten rounds of ten calls"
    );
    assert_eq!(result.status, TurnStatus::Completed);
    // run.started, 1 scheduled, 100 × (started, finished, progress), step end, run.finished.
    let emitted = 1 + 1 + 300 + 1 + 1;
    assert_eq!(events.dropped(), emitted - 4);
    assert_eq!(result.events_dropped, emitted - 4);
    let kept: Vec<ExecutionEvent> = events.collect().await;
    assert_eq!(kept.len(), 4);
    assert_eq!(kept[0].kind, "run.started");
}

#[tokio::test(start_paused = true)]
async fn captured_variables_feed_later_steps() {
    let tools = Toolbox::new()
        .script("travel::flights", vec![ok_with(1, json!({"city": "Lyon"}))])
        .script("travel::hotels", vec![ok(1)]);
    let p = plan(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"to": "$vars.to"}, "captureAs": "trip"},
        {"id": "hotels", "tool": "travel::hotels", "args": {"city": "$vars.trip.city"}}
    ], "vars": {"to": "LYS"}}));
    let result = executor()
        .start(tools.service(), &p, turn())
        .unwrap()
        .finish()
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(tools.calls()[0].params().as_value(), &json!({"to": "LYS"}));
    assert_eq!(
        tools.calls()[1].params().as_value(),
        &json!({"city": "Lyon"})
    );
}
