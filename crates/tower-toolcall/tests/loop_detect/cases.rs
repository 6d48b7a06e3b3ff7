// The loop-detection cases every store runs: included by `main.rs` here (in the process, with
// and without `InMemoryLoopStore`) and by the tests of `tower-toolcall-redis` (on Redis), each
// beside its own `Store` and `store_suite!`.

use std::collections::BTreeMap;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::time::Duration;

use serde_json::{json, Value};
use support::capture::{capture, CapturedEvent};
use support::Counter;

use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::loop_detect::{
    CommandErrorKind, LoopCommand, LoopDetectLayer, LoopDetectSettings, LoopSettingKey,
};

use tower_toolcall::registry::{
    LayerSetting, LoopMode, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};

use tower_toolcall::{
    tool_fn, ErrorClass, ErrorCode, ResultStatus, ToolCall, ToolError, ToolOutput, ToolResult,
};

const NS: &str = "agents.tools.web";

const BREAK_MESSAGE: &str = "Tool call loop detected: 'search' invoked with identical params 4 \
     times within 120s. This call was not executed, and neither is any repeat of it within \
     120s; other calls still run. Hint: change the inputs or the strategy instead of repeating \
     the same call, or ask the user.";

fn call_in(session: &str, tool: &str, params: Value) -> ToolCall {
    ToolCall::builder(NS, tool)
        .session(session)
        .actor("user-7")
        .params(params)
        .build()
        .expect("a valid call")
}

fn search(session: &str, params: Value) -> ToolCall {
    call_in(session, "search", params)
}

/// A call issued by `model` of `backend`, as the trace baggage says.
fn from_model(session: &str, params: Value, backend: &str, model: &str) -> ToolCall {
    ToolCall::builder(NS, "search")
        .session(session)
        .actor("user-7")
        .params(params)
        .baggage("gen_ai.system", backend)
        .baggage("gen_ai.request.model", model)
        .build()
        .expect("a valid call")
}

async fn send<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready().await?.call(call).await
}

/// Sends `call` until the layer refuses it; returns how many calls reached the tool before
/// (whether it succeeded or failed), and the refusal.
async fn runs_before_refusal<S>(svc: &mut S, call: &ToolCall) -> (usize, ToolError)
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    for ran in 0..100 {
        match send(svc, call.clone()).await {
            Err(error) if error.code() == ErrorCode::LoopDetected => return (ran, error),
            Ok(_) | Err(_) => {}
        }
    }
    panic!("100 identical calls ran and none was refused");
}

store_suite!(
    #[tokio::test]
    breaks_at_max_repeats_without_calling_the_tool,
    chance_then_break_lets_a_different_call_run,
    chance_then_break_breaks_when_the_call_repeats,
    session_beats_model_beats_server_and_unset_falls_back,
    a_model_can_switch_detection_off_and_a_session_back_on,
    sessions_never_affect_each_other,
    canonically_equal_params_are_identical_and_a_change_is_not,
    the_same_params_for_another_tool_are_another_call,
    cycles_of_two_and_three_calls_are_loops,
    a_a_b_twice_is_not_taken_for_a_loop_before_its_threshold,
    cycles_can_be_switched_off,
    repeated_identical_failures_break_below_max_repeats,
    a_tool_s_max_failures_stops_before_the_repeat_rule,
    a_session_s_max_failures_holds_for_it_alone_and_unset_falls_back,
    failures_with_changing_codes_count_as_plain_repeats,
    a_poller_whose_result_changes_is_never_blocked,
    a_poller_whose_result_stays_the_same_is_a_loop,
    result_aware_polling_can_be_switched_off,
    a_tool_can_switch_detection_off_or_set_its_own_limits,
    snowflake_ids_beyond_two_to_the_53_are_different_calls,
    a_read_whose_answer_changes_is_progress_without_marking,
    a_write_is_judged_on_its_arguments_whatever_its_answers,
    noise_members_do_not_make_calls_different_and_keys_keep_them,
    a_tool_s_own_noise_list_replaces_the_layer_s,
    cycles_of_four_and_five_calls_are_loops,
);

fn stack(
    layer: LoopDetectLayer,
    counter: &Counter,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> {
    ServiceBuilder::new().layer(layer).service(counter.tool())
}

async fn breaks_at_max_repeats_without_calling_the_tool(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let call = search("sess-1", json!({"query": "rust tower retry"}));

    for expected in 1..=3 {
        send(&mut svc, call.clone())
            .await
            .expect("below the threshold");
        assert_eq!(counter.get(), expected);
    }
    let err = send(&mut svc, call.clone()).await.unwrap_err();
    assert_eq!(
        counter.get(),
        3,
        "the 4th identical call never reaches the tool"
    );
    assert_eq!(err.code(), ErrorCode::LoopDetected);
    assert_eq!(err.class(), ErrorClass::Terminal);
    assert!(err.is_not_processed());
    assert!(err.is_rejected());
    assert_eq!(err.message(), BREAK_MESSAGE);
    assert_eq!(
        err.details(),
        Some(&json!({
            "action": "break",
            "rule": "repeat",
            "repeats": 4,
            "maxRepeats": 4,
            "windowSecs": 120
        }))
    );

    // A model that goes on repeating stays refused.
    let again = send(&mut svc, call.clone()).await.unwrap_err();
    assert_eq!(again.code(), ErrorCode::LoopDetected);
    assert_eq!(counter.get(), 3);

    let result = ToolResult::from_outcome(&call, Err(err));
    assert_eq!(result.status, ResultStatus::Error);
    assert_eq!(result.attempts, 0);
    assert!(result.error.unwrap().terminal);
}

async fn chance_then_break_lets_a_different_call_run(store: Store) {
    let counter = Counter::default();
    let layer = store.layer_with(loops(|s| s.mode = Some(LoopMode::ChanceThenBreak)));
    let mut svc = stack(layer, &counter);
    let looping = search("sess-1", json!({"query": "a"}));

    let (ran, chance) = runs_before_refusal(&mut svc, &looping).await;
    assert_eq!(ran, 3);
    assert_eq!(chance.details().unwrap()["action"], "chance");
    assert_eq!(chance.class(), ErrorClass::Terminal);
    assert!(chance.is_not_processed());
    assert_eq!(
        chance.message(),
        "Tool call loop detected: 'search' invoked with identical params 4 times within 120s. \
         This call was not executed. Stop and reflect on why the repeated calls did not bring \
         you closer to the goal, then change your approach: other inputs, another tool, or ask \
         the user. Repeating this exact call stops the session."
    );
    assert_eq!(counter.get(), 3, "the chance does not run the tool");

    let different = search("sess-1", json!({"query": "b"}));
    send(&mut svc, different)
        .await
        .expect("a changed call runs");
    assert_eq!(counter.get(), 4);
}

async fn chance_then_break_breaks_when_the_call_repeats(store: Store) {
    let counter = Counter::default();
    let layer = store.layer_with(loops(|s| s.mode = Some(LoopMode::ChanceThenBreak)));
    let mut svc = stack(layer, &counter);
    let looping = search("sess-1", json!({"query": "a"}));

    let (_, chance) = runs_before_refusal(&mut svc, &looping).await;
    assert_eq!(chance.details().unwrap()["action"], "chance");
    let broken = send(&mut svc, looping).await.unwrap_err();
    assert_eq!(
        broken.details(),
        Some(&json!({
            "action": "break",
            "rule": "repeat",
            "repeats": 5,
            "maxRepeats": 4,
            "windowSecs": 120
        }))
    );
    assert!(broken
        .message()
        .contains("neither is any repeat of it within 120s"));
    assert_eq!(counter.get(), 3);
}

async fn session_beats_model_beats_server_and_unset_falls_back(store: Store) {
    let counter = Counter::default();
    let layer = store
        .builder(ToolRegistry::open())
        .settings(loops(|s| s.max_repeats = Some(6)))
        .model("openai", "gpt-4o", loops(|s| s.max_repeats = Some(5)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    let mut phase = 0;
    let mut runs = |model: Option<(&'static str, &'static str)>| {
        phase += 1;
        let params = json!({"phase": phase});
        match model {
            Some((backend, model)) => from_model("sess-1", params, backend, model),
            None => search("sess-1", params),
        }
    };

    let gpt4o = Some(("openai", "gpt-4o"));
    assert_eq!(
        runs_before_refusal(&mut svc, &runs(gpt4o)).await.0,
        4,
        "model: 5"
    );
    assert_eq!(
        runs_before_refusal(&mut svc, &runs(None)).await.0,
        5,
        "server: 6"
    );
    let other_model = Some(("openai", "gpt-4o-mini"));
    assert_eq!(runs_before_refusal(&mut svc, &runs(other_model)).await.0, 5);

    // Awaited: written to the shared store, if there is one, before the next call.
    handle
        .apply(
            "sess-1",
            &LoopCommand::parse("!/set(tool-loop-max-repeats=3)").unwrap(),
        )
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        runs_before_refusal(&mut svc, &runs(gpt4o)).await.0,
        2,
        "session: 3"
    );
    assert_eq!(runs_before_refusal(&mut svc, &runs(None)).await.0, 2);

    // Awaited: written to the shared store, if there is one, before the next call.
    handle
        .apply(
            "sess-1",
            &LoopCommand::parse("!/unset(tool-loop-max-repeats)").unwrap(),
        )
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        runs_before_refusal(&mut svc, &runs(gpt4o)).await.0,
        4,
        "model again"
    );
    assert_eq!(
        runs_before_refusal(&mut svc, &runs(None)).await.0,
        5,
        "server again"
    );
}

async fn a_model_can_switch_detection_off_and_a_session_back_on(store: Store) {
    let counter = Counter::default();
    let layer = store
        .builder(ToolRegistry::open())
        .model("anthropic", "claude-x", loops(|s| s.enabled = Some(false)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    let call = from_model("sess-1", json!({"q": 1}), "anthropic", "claude-x");
    for _ in 0..8 {
        send(&mut svc, call.clone()).await.unwrap();
    }
    assert_eq!(handle.tracked_sessions(), 0);
    handle
        .set("sess-1", loops(|s| s.enabled = Some(true)))
        .unwrap()
        .await
        .unwrap();
    assert_eq!(runs_before_refusal(&mut svc, &call).await.0, 3);
}

async fn sessions_never_affect_each_other(store: Store) {
    let counter = Counter::default();
    let layer = store.layer(ToolRegistry::open());
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    let params = json!({"query": "same"});
    handle
        .apply(
            "strict",
            &LoopCommand::parse("!/set(tool-loop-max-repeats=2)").unwrap(),
        )
        .unwrap()
        .await
        .unwrap();

    for _ in 0..3 {
        send(&mut svc, search("a", params.clone())).await.unwrap();
    }
    for _ in 0..2 {
        send(&mut svc, search("b", params.clone())).await.unwrap();
    }
    send(&mut svc, search("strict", params.clone()))
        .await
        .unwrap();
    send(&mut svc, search("a", params.clone()))
        .await
        .expect_err("a's 4th");
    send(&mut svc, search("strict", params.clone()))
        .await
        .expect_err("strict's 2nd");
    send(&mut svc, search("b", params.clone()))
        .await
        .expect("b's 3rd runs whatever a and strict did");
    assert_eq!(counter.get(), 3 + 3 + 1);
    assert_eq!(handle.session_settings("b"), LoopDetectSettings::default());
}

async fn canonically_equal_params_are_identical_and_a_change_is_not(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let spellings = [
        r#"{"query": "rust", "limit": 10, "filters": {"lang": "en", "site": "docs.rs"}}"#,
        r#"{"limit":10.0,"filters":{"site":"docs.rs","lang":"en"},"query":"  rust "}"#,
        "{\n  \"filters\" : { \"lang\" : \"en\" , \"site\" : \"docs.rs\" },\n  \"query\" : \"rust\",\n  \"limit\" : 1e1,\n  \"clientTs\": 1734372720000, \"cursor\": null\n}",
    ];
    let parse = |params: &str| {
        let text = format!(
            r#"{{"contractVersion":"1.1","requestId":"01J9Z8Q4V6K3T2M1N0P9R8S7T7","toolName":"search",
               "toolNamespace":"{NS}","target":{{"sessionKey":"sess-1","actorId":"user-7"}},
               "payload":{{"version":"1.0","params":{params}}}}}"#
        );
        ToolCall::from_json(text.as_bytes()).unwrap()
    };
    for spelling in spellings {
        send(&mut svc, parse(spelling)).await.unwrap();
    }
    let changed = r#"{"query": "rust", "limit": 11, "filters": {"lang": "en", "site": "docs.rs"}}"#;
    send(&mut svc, parse(changed))
        .await
        .expect("a changed param is another call");
    for spelling in spellings {
        send(&mut svc, parse(spelling)).await.unwrap();
    }
    let err = send(&mut svc, parse(spellings[1])).await.unwrap_err();
    assert_eq!(err.details().unwrap()["repeats"], 4);
    assert_eq!(counter.get(), 7);
}

async fn the_same_params_for_another_tool_are_another_call(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    for i in 0..8 {
        let tool = if i < 4 { "search" } else { "fetch" };
        send(&mut svc, call_in("sess-1", tool, json!({"q": 1})))
            .await
            .expect_err_if(i == 3 || i == 7);
    }
    assert_eq!(counter.get(), 6);
}

/// `expect_err_if(c)`: an error when `c`, a success otherwise.
trait ExpectErrIf {
    fn expect_err_if(self, err: bool);
}

impl ExpectErrIf for Result<ToolOutput, ToolError> {
    fn expect_err_if(self, err: bool) {
        match (self, err) {
            (Ok(_), false) => {}
            (Err(e), true) => assert_eq!(e.code(), ErrorCode::LoopDetected),
            (Ok(_), true) => panic!("expected LOOP_DETECTED, the call ran"),
            (Err(e), false) => panic!("expected the call to run, got {e}"),
        }
    }
}

/// Sends calls of `pattern` (one signature per letter) and returns what happened to each:
/// `.` ran, `x` refused.
async fn pattern<S>(svc: &mut S, session: &str, pattern: &str) -> (String, Vec<ToolError>)
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let mut marks = String::new();
    let mut errors = Vec::new();
    for letter in pattern.chars() {
        match send(svc, search(session, json!({"step": letter.to_string()}))).await {
            Ok(_) => marks.push('.'),
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::LoopDetected);
                marks.push('x');
                errors.push(e);
            }
        }
    }
    (marks, errors)
}

async fn cycles_of_two_and_three_calls_are_loops(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);

    let (marks, errors) = pattern(&mut svc, "ab", "ABABABAB").await;
    assert_eq!(marks, ".....xxx");
    assert_eq!(
        errors[0].details(),
        Some(&json!({
            "action": "break",
            "rule": "cycle",
            "cycleLength": 2,
            "repeats": 3,
            "maxRepeats": 3,
            "windowSecs": 120
        }))
    );
    assert_eq!(
        errors[0].message(),
        "Tool call loop detected: 'search' invoked with identical params 3 times within 120s. \
         This call was not executed, and neither is any repeat of it within 120s; other calls \
         still run. The last 6 calls repeat a cycle of 2 calls 3 times. Hint: change the \
         inputs or the strategy instead of repeating the same call, or ask the user."
    );

    let (marks, errors) = pattern(&mut svc, "abc", "ABCABCABC").await;
    assert_eq!(marks, "........x");
    assert_eq!(errors[0].details().unwrap()["cycleLength"], 3);
}

async fn a_a_b_twice_is_not_taken_for_a_loop_before_its_threshold(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let (marks, _) = pattern(&mut svc, "aab", "AABAAB").await;
    assert_eq!(
        marks, "......",
        "two repetitions of A,A,B and at most 2 identical in a row"
    );
    let (marks, errors) = pattern(&mut svc, "aab", "AAB").await;
    assert_eq!(marks, "..x", "the third repetition completes a cycle of 3");
    assert_eq!(errors[0].details().unwrap()["cycleLength"], 3);
    assert_eq!(counter.get(), 8);
}

async fn cycles_can_be_switched_off(store: Store) {
    let counter = Counter::default();
    let layer = store
        .builder(ToolRegistry::open())
        .settings(loops(|s| s.cycles = Some(false)))
        .build()
        .unwrap();
    let mut svc = stack(layer, &counter);
    let (marks, _) = pattern(&mut svc, "ab", "ABABABABAB").await;
    assert_eq!(marks, "..........");
}

/// A tool that fails with the codes it is given, in turn, and counts its calls.
fn failing(
    codes: Vec<ErrorCode>,
    calls: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone {
    tool_fn(move |_call: ToolCall| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let code = codes[n % codes.len()];
        async move { Err(ToolError::new(code, "the upstream failed")) }
    })
}

async fn repeated_identical_failures_break_below_max_repeats(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = store.layer_with(loops(|s| s.max_repeats = Some(10)));
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(failing(vec![ErrorCode::UpstreamError], calls.clone()));
    let call = search("sess-1", json!({"query": "a"}));
    for _ in 0..3 {
        let err = send(&mut svc, call.clone()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::UpstreamError);
    }
    let err = send(&mut svc, call).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoopDetected);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        err.details(),
        Some(&json!({
            "action": "break",
            "rule": "failures",
            "errorCode": "UPSTREAM_ERROR",
            "repeats": 4,
            "maxRepeats": 4,
            "windowSecs": 120
        }))
    );
    assert!(err.message().contains(
        "Each of the last 3 identical calls failed with UPSTREAM_ERROR. Read the error and \
         change the call, or wait longer before each retry."
    ));
}

/// A tool that must not be retried blindly stops at its own `max_failures`, before the
/// repeat rule.
async fn a_tool_s_max_failures_stops_before_the_repeat_rule(store: Store) {
    let strict = ToolPolicy::default().with_loop_detect(loops(|s| s.max_failures = Some(2)));
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, "search", RiskLevel::Writes).with_policy(strict))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(registry))
        .service(failing(vec![ErrorCode::UpstreamUnavailable], calls.clone()));
    let (ran, err) = runs_before_refusal(&mut svc, &search("sess-1", json!({"q": 1}))).await;
    assert_eq!((ran, calls.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(err.details().unwrap()["rule"], "failures");
}

/// `!/set(tool-loop-max-failures=…)` changes the failure rule of its session only; through
/// a shared store, the other replicas read it too.
async fn a_session_s_max_failures_holds_for_it_alone_and_unset_falls_back(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = store.layer(ToolRegistry::open());
    let handle = layer.handle();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(failing(vec![ErrorCode::UpstreamUnavailable], calls.clone()));
    let set = |session: &'static str, command: &str| {
        handle
            .apply(session, &LoopCommand::parse(command).unwrap())
            .unwrap()
    };
    set("strict", "!/set(tool-loop-max-failures=2)")
        .await
        .unwrap();
    set("three", "!/set(tool-loop-max-failures=3)")
        .await
        .unwrap();
    set(
        "patient",
        "!/set(tool-loop-max-repeats=12, tool-loop-max-failures=8)",
    )
    .await
    .unwrap();
    let cases = [
        ("strict", 1, "the 2nd try after one failure"),
        ("three", 2, "the 3rd try after two failures"),
        (
            "default",
            3,
            "the 4th try after three failures: the layer's default",
        ),
        ("patient", 7, "the 8th try, past the repeat rule's default"),
    ];
    for (session, expected, what) in cases {
        let before = calls.load(Ordering::SeqCst);
        let (ran, err) = runs_before_refusal(&mut svc, &search(session, json!({"q": 1}))).await;
        assert_eq!(ran, expected, "{session}: {what}");
        assert_eq!(calls.load(Ordering::SeqCst) - before, expected, "{session}");
        assert_eq!(err.details().unwrap()["rule"], "failures", "{session}");
        assert_eq!(
            err.details().unwrap()["maxRepeats"],
            expected + 1,
            "{session}"
        );
    }

    // Unset, the session falls back to the layer's default.
    set("strict", "!/unset(tool-loop-max-failures)")
        .await
        .unwrap();
    let (ran, _) = runs_before_refusal(&mut svc, &search("strict", json!({"q": "again"}))).await;
    assert_eq!(ran, 3);
}

async fn failures_with_changing_codes_count_as_plain_repeats(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = store.layer_with(loops(|s| s.max_repeats = Some(6)));
    let codes = vec![ErrorCode::UpstreamError, ErrorCode::Timeout];
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(failing(codes, calls.clone()));
    let (ran, err) = runs_before_refusal(&mut svc, &search("sess-1", json!({"q": 1}))).await;
    assert_eq!(ran, 5, "max_repeats (6) decides");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(err.details().unwrap()["rule"], "repeat");
}

fn poller_registry() -> ToolRegistry {
    let poller = ToolPolicy::default().with_loop_detect(loops(|s| s.poller = Some(true)));
    ToolRegistry::builder()
        .tool(ToolDescriptor::new("jobs", "status", RiskLevel::ReadOnly).with_policy(poller))
        .build()
        .unwrap()
}

/// A job status tool whose answers are `states`, in turn.
fn job_status(
    states: Vec<Value>,
    calls: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone {
    tool_fn(move |_call: ToolCall| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let state = states[n.min(states.len() - 1)].clone();
        async move { Ok(ToolOutput::new(state)) }
    })
}

fn poll(session: &str) -> ToolCall {
    ToolCall::builder("jobs", "status")
        .session(session)
        .actor("user-7")
        .params(json!({"jobId": "job-1"}))
        .build()
        .unwrap()
}

async fn a_poller_whose_result_changes_is_never_blocked(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let progress: Vec<Value> = (0..=20)
        .map(|p| json!({"state": "running", "progress": p * 5}))
        .collect();
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(poller_registry()))
        .service(job_status(progress, calls.clone()));
    for _ in 0..20 {
        send(&mut svc, poll("sess-1"))
            .await
            .expect("progress changes");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);
}

async fn a_poller_whose_result_stays_the_same_is_a_loop(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let states = vec![
        json!({"state": "queued"}),
        json!({"state": "running", "progress": 10}),
        json!({"state": "running", "progress": 10}),
    ];
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(poller_registry()))
        .service(job_status(states, calls.clone()));
    let (ran, err) = runs_before_refusal(&mut svc, &poll("sess-1")).await;
    assert_eq!(ran, 4, "queued, then the same running result three times");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(err.details().unwrap()["rule"], "unchanged_poll");
    assert!(err
        .message()
        .contains("Its result did not change between these calls."));
}

async fn result_aware_polling_can_be_switched_off(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let progress: Vec<Value> = (0..10).map(|p| json!({"progress": p})).collect();
    let layer = store
        .builder(poller_registry())
        .settings(loops(|s| s.result_aware_polling = Some(false)))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(job_status(progress, calls.clone()));
    let (ran, err) = runs_before_refusal(&mut svc, &poll("sess-1")).await;
    assert_eq!(ran, 3);
    assert_eq!(err.details().unwrap()["rule"], "repeat");
}

async fn a_tool_can_switch_detection_off_or_set_its_own_limits(store: Store) {
    let off = ToolPolicy::default().with_loop_detect(LayerSetting::Off);
    let own = ToolPolicy::default().with_loop_detect(loops(|s| {
        s.max_repeats = Some(2);
        s.mode = Some(LoopMode::ChanceThenBreak);
    }));
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, "heartbeat", RiskLevel::ReadOnly).with_policy(off))
        .tool(ToolDescriptor::new(NS, "deploy", RiskLevel::Commands).with_policy(own))
        .tool(ToolDescriptor::new(NS, "search", RiskLevel::ReadOnly))
        .build()
        .unwrap();
    let counter = Counter::default();
    let layer = store
        .builder(registry)
        .model("openai", "gpt-4o", loops(|s| s.max_repeats = Some(8)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);

    for _ in 0..20 {
        send(&mut svc, call_in("sess-1", "heartbeat", json!({})))
            .await
            .expect("detection is off for this tool");
    }
    assert_eq!(handle.tracked_sessions(), 0, "an off tool is not tracked");

    let deploy = ToolCall::builder(NS, "deploy")
        .session("sess-1")
        .actor("user-7")
        .params(json!({"env": "prod"}))
        .baggage("gen_ai.system", "openai")
        .baggage("gen_ai.request.model", "gpt-4o")
        .build()
        .unwrap();
    let (ran, err) = runs_before_refusal(&mut svc, &deploy).await;
    assert_eq!(ran, 1, "the tool's max_repeats (2) beats the model's (8)");
    assert_eq!(err.details().unwrap()["action"], "chance");

    let command = LoopCommand::parse("!/set(tool-loop-max-repeats=3, tool-loop-mode=break)");
    handle
        .apply("sess-1", &command.unwrap())
        .unwrap()
        .await
        .unwrap();
    send(&mut svc, search("sess-1", json!({}))).await.unwrap();
    let deploy2 = ToolCall::builder(NS, "deploy")
        .session("sess-1")
        .actor("user-7")
        .params(json!({"env": "staging"}))
        .build()
        .unwrap();
    let (ran, err) = runs_before_refusal(&mut svc, &deploy2).await;
    assert_eq!(ran, 2, "the session's settings beat the tool's");
    assert_eq!(err.details().unwrap()["action"], "break");
}

/// A tool that asks for the canonical params twice with the default options, as the
/// idempotency layer does, and counts the calls in which both answers were the one cached
/// form.
fn canonical_sharing_tool(
    shared: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone {
    use tower_toolcall::canonical::CanonicalOptions;
    tool_fn(move |call: ToolCall| {
        let first = call
            .params()
            .canonical(&CanonicalOptions::default())
            .unwrap();
        let again = call
            .params()
            .canonical(&CanonicalOptions::default())
            .unwrap();
        if std::ptr::eq(first.as_ptr(), again.as_ptr()) {
            shared.fetch_add(1, Ordering::SeqCst);
        }
        async { Ok(ToolOutput::new(json!(null))) }
    })
}

// ---------------------------------------------------------------------------------------------
// Integers beyond 2^53 keep their digits

async fn snowflake_ids_beyond_two_to_the_53_are_different_calls(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let parse = |id: &str| {
        let text = format!(
            r#"{{"contractVersion":"1.1","requestId":"01J9Z8Q4V6K3T2M1N0P9R8S7T7","toolName":"search",
               "toolNamespace":"{NS}","target":{{"sessionKey":"sess-1","actorId":"user-7"}},
               "payload":{{"version":"1.0","params":{{"message_id":{id}}}}}}}"#
        );
        ToolCall::from_json(text.as_bytes()).unwrap()
    };
    // Three of one id and a fourth of the next: no loop. A double holds neither exactly and
    // rounds both to 1234567890123456768.
    for id in ["1234567890123456789"; 3] {
        send(&mut svc, parse(id)).await.unwrap();
    }
    send(&mut svc, parse("1234567890123456788"))
        .await
        .expect("another message id is another call");
    assert_eq!(counter.get(), 4);
    // The fourth of the same id is a loop.
    send(&mut svc, parse("1234567890123456788")).await.unwrap();
    send(&mut svc, parse("1234567890123456788")).await.unwrap();
    let err = send(&mut svc, parse("1234567890123456788"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoopDetected);
    assert_eq!(counter.get(), 6);
}

// ---------------------------------------------------------------------------------------------
// Answers, noise, longer cycles, failures with back-off, patient polls and re-sends

fn registered(namespace: &str, name: &str, risk: RiskLevel, policy: ToolPolicy) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(namespace, name, risk).with_policy(policy))
        .build()
        .unwrap()
}

fn read_only_status() -> ToolRegistry {
    registered("jobs", "status", RiskLevel::ReadOnly, ToolPolicy::default())
}

async fn a_read_whose_answer_changes_is_progress_without_marking(store: Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let progress: Vec<Value> = (0..=20).map(|p| json!({"lines": p})).collect();
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(read_only_status()))
        .service(job_status(progress, calls.clone()));
    for _ in 0..20 {
        send(&mut svc, poll("sess-1"))
            .await
            .expect("its answer changes");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);

    // The same answer three times, in quick succession: the 4th call is a loop.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(read_only_status()))
        .service(job_status(vec![json!({"state": "done"})], calls.clone()));
    let (ran, err) = runs_before_refusal(&mut svc, &poll("sess-2")).await;
    assert_eq!((ran, calls.load(Ordering::SeqCst)), (3, 3));
    assert_eq!(err.details().unwrap()["rule"], "unchanged_poll");
    assert!(err
        .message()
        .contains("If you are waiting for it to change, wait longer between calls."));
}

fn send_mail(session: &str, params: Value) -> ToolCall {
    ToolCall::builder("mail", "send")
        .session(session)
        .actor("user-7")
        .params(params)
        .build()
        .unwrap()
}

async fn a_write_is_judged_on_its_arguments_whatever_its_answers(store: Store) {
    // Each answer carries a fresh message id: the same mail sent again is still a repeat.
    let fresh_ids: Vec<Value> = (0..10)
        .map(|n| json!({"messageId": format!("m-{n}")}))
        .collect();
    let calls = Arc::new(AtomicUsize::new(0));
    let registry = registered("mail", "send", RiskLevel::Writes, ToolPolicy::default());
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(registry))
        .service(job_status(fresh_ids.clone(), calls.clone()));
    let mail = send_mail("sess-1", json!({"to": "cfo@acme.io", "body": "Q2"}));
    let (ran, err) = runs_before_refusal(&mut svc, &mail).await;
    assert_eq!(
        (ran, err.details().unwrap()["rule"].as_str()),
        (3, Some("repeat"))
    );

    // An operator lowers `max_repeats` for a write that must not repeat: the 2nd is refused.
    let once = ToolPolicy::default().with_loop_detect(loops(|s| s.max_repeats = Some(2)));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(registered("mail", "send", RiskLevel::Writes, once)))
        .service(job_status(fresh_ids, calls.clone()));
    let mail = send_mail("sess-2", json!({"to": "cfo@acme.io", "body": "Q2"}));
    let (ran, _) = runs_before_refusal(&mut svc, &mail).await;
    assert_eq!((ran, calls.load(Ordering::SeqCst)), (1, 1));
}

async fn noise_members_do_not_make_calls_different_and_keys_keep_them(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let noisy = |n: u32| {
        search(
            "sess-1",
            json!({"query": "rust", "requestId": format!("r-{n}"), "meta": {"nonce": n, "sentAt": n}}),
        )
    };
    for n in 0..3 {
        send(&mut svc, noisy(n)).await.unwrap();
    }
    let err = send(&mut svc, noisy(3)).await.unwrap_err();
    assert_eq!(err.details().unwrap()["repeats"], 4);
    assert_eq!(counter.get(), 3);
    // Idempotency keys keep every member: these are four different keys.
    let idempotency =
        tower_toolcall::idempotency::IdempotencyLayer::in_memory(ToolRegistry::open());
    let keys: std::collections::BTreeSet<_> = (0..4)
        .map(|n| idempotency.store_key(&noisy(n)).unwrap().unwrap())
        .collect();
    assert_eq!(keys.len(), 4);

    // A read whose answers differ only by noise answers the same.
    let calls = Arc::new(AtomicUsize::new(0));
    let answers: Vec<Value> = (0..10)
        .map(|n| json!({"state": "running", "requestId": format!("r-{n}"), "timestamp": n}))
        .collect();
    let mut svc = ServiceBuilder::new()
        .layer(store.layer(read_only_status()))
        .service(job_status(answers, calls.clone()));
    let (ran, _) = runs_before_refusal(&mut svc, &poll("sess-2")).await;
    assert_eq!(ran, 3);
}

async fn a_tool_s_own_noise_list_replaces_the_layer_s(store: Store) {
    // `timestamp` means something to this tool; `cursorToken` is its noise.
    let own = ToolPolicy::default().with_loop_detect(loops(|s| {
        s.ignore_members = Some(vec!["cursorToken".to_owned()]);
    }));
    let counter = Counter::default();
    let layer = store.layer(registered(NS, "search", RiskLevel::Writes, own));
    let mut svc = stack(layer, &counter);
    for n in 0..6 {
        send(
            &mut svc,
            search("sess-1", json!({"q": "logs", "timestamp": n})),
        )
        .await
        .expect("another timestamp is another call for this tool");
    }
    for n in 0..3 {
        send(
            &mut svc,
            search("sess-1", json!({"q": "logs", "cursorToken": n})),
        )
        .await
        .unwrap();
    }
    let err = send(
        &mut svc,
        search("sess-1", json!({"q": "logs", "cursorToken": 9})),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoopDetected);
    assert_eq!(counter.get(), 9);

    let err = LoopDetectLayer::builder(ToolRegistry::open())
        .settings(loops(|s| {
            s.ignore_members = Some(vec!["requestId".to_owned(), String::new()]);
        }))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "loop_detect.ignore_members[1]");
}

async fn cycles_of_four_and_five_calls_are_loops(store: Store) {
    let counter = Counter::default();
    let mut svc = stack(store.layer(ToolRegistry::open()), &counter);
    let (marks, errors) = pattern(&mut svc, "abcd", "ABCDABCDABCD").await;
    assert_eq!(marks, "...........x");
    assert_eq!(errors[0].details().unwrap()["cycleLength"], 4);
    let (marks, errors) = pattern(&mut svc, "abcde", "ABCDEABCDEABCDE").await;
    assert_eq!(marks, "..............x");
    assert_eq!(errors[0].details().unwrap()["cycleLength"], 5);
    // Configurable: cycles of up to 3 calls only.
    let layer = store
        .builder(ToolRegistry::open())
        .settings(loops(|s| s.max_cycle_length = Some(3)))
        .build()
        .unwrap();
    let mut svc = stack(layer, &counter);
    let (marks, _) = pattern(&mut svc, "short", "ABCDABCDABCDABCD").await;
    assert_eq!(marks, "................");
}

fn stack_without_idempotency(
    counter: &Counter,
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> {
    use tower::Layer;
    let registry = registered("mail", "send", RiskLevel::Writes, ToolPolicy::default());
    tower_toolcall::ToolStack::builder(registry)
        .without(tower_toolcall::StackLayer::Idempotency)
        .build()
        .unwrap()
        .layer(counter.tool())
}

/// The layers of every store, made by its `builder`.
impl Store {
    fn layer(&self, registry: ToolRegistry) -> LoopDetectLayer {
        self.builder(registry)
            .build()
            .expect("a valid configuration")
    }

    fn layer_with(&self, settings: LoopDetectSettings) -> LoopDetectLayer {
        self.builder(ToolRegistry::open())
            .settings(settings)
            .build()
            .expect("a valid configuration")
    }
}

/// Loop detection settings: the defaults, changed by `change`.
fn loops(change: impl FnOnce(&mut LoopDetectSettings)) -> LoopDetectSettings {
    let mut settings = LoopDetectSettings::default();
    change(&mut settings);
    settings
}
