//! Hostile plans and turns: long dependency chains, deep args, references that multiply an
//! output, run ids that would leave the audit directory, step ids no reference can name,
//! retry pauses of years, and thousands of steps under one tool's limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolOutput};
use tower_toolcall_executor::{
    reconstruct, replay, ConfirmationPolicy, Executor, Plan, Step, StepRetry, StepStatus, Turn,
    TurnStatus,
};

use crate::audit::temp_dir;
use crate::tools::{ok, registry, Answer, Toolbox};

/// A tool that answers every call with its params, counting the calls.
fn echo(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    ToolCall,
    Response = ToolOutput,
    Error = tower_toolcall::ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, tower_toolcall::ToolError>>
                 + Send
                 + 'static,
> {
    let calls = calls.clone();
    tool_fn(move |call: ToolCall| {
        calls.fetch_add(1, Ordering::SeqCst);
        let params = call.params().as_value().clone();
        async move { Ok(ToolOutput::new(params)) }
    })
}

/// An executor of any tool that runs without asking for a confirmation.
fn open_executor() -> Executor {
    Executor::builder(ToolRegistry::open())
        .confirmation(ConfirmationPolicy::NotRequired)
        .build()
        .unwrap()
}

/// `n` steps, each depending on the next (the last on the first when `cycle`).
fn chain(n: usize, cycle: bool) -> Plan {
    (0..n).fold(Plan::new(), |plan, i| {
        let next = if i + 1 < n {
            Some(i + 1)
        } else {
            cycle.then_some(0)
        };
        let step = Step::new(format!("s{i}"), "travel::hotels", json!({}));
        plan.with_step(match next {
            Some(next) => step.with_depends_on(format!("s{next}")),
            None => step,
        })
    })
}

#[test]
fn chains_and_cycles_of_100_000_steps_are_checked_on_a_runtime_worker() {
    const STEPS: usize = 100_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let (chain_result, cycle_error) = runtime.block_on(async {
        tokio::spawn(async {
            let executor = Executor::builder(registry()).build().unwrap();
            let forward = executor.check(&chain(STEPS, false));
            let cycle = executor.check(&chain(STEPS, true)).unwrap_err();
            (forward, cycle)
        })
        .await
        .unwrap()
    });
    assert_eq!(chain_result, Ok(()));
    assert_eq!(cycle_error.problems().len(), 1, "{cycle_error}");
    let problem = &cycle_error.problems()[0];
    assert_eq!(problem.field, "steps[0].dependsOn");
    assert!(
        problem
            .problem
            .starts_with("closes a dependency cycle s0 -> s99999 -> s99998 -> "),
        "{}",
        problem.problem
    );
    assert!(
        problem.problem.ends_with(" -> s2 -> s1 -> s0"),
        "{}",
        problem.problem
    );
    assert!(
        problem.problem.contains("(99985 more steps)"),
        "{}",
        problem.problem
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_chain_of_20_000_steps_runs_last_step_first_on_a_runtime_worker() {
    const STEPS: usize = 20_000;
    let calls = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tool = {
        let (calls, order) = (calls.clone(), order.clone());
        tool_fn(move |call: ToolCall| {
            calls.fetch_add(1, Ordering::SeqCst);
            let step = call.run_link().unwrap().step_id.clone();
            order.lock().unwrap().push(step);
            async { Ok(ToolOutput::new(json!(1))) }
        })
    };
    let result = tokio::spawn(async move {
        let executor = Executor::builder(registry()).build().unwrap();
        executor
            .start(tool, &chain(STEPS, false), Turn::new("s", "u"))
            .unwrap()
            .finish()
            .await
    })
    .await
    .unwrap();
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(calls.load(Ordering::SeqCst), STEPS);
    let order = order.lock().unwrap();
    assert_eq!(order.first().map(String::as_str), Some("s19999"));
    assert_eq!(order.last().map(String::as_str), Some("s0"));
}

/// `1` wrapped in `depth` arrays, built in code (no parser's limit applies).
fn nested(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = Value::Array(vec![value]);
    }
    value
}

/// The object `{"q": value}`, built without serializing `value` (as `json!` would).
fn q(value: Value) -> Value {
    Value::Object([("q".to_owned(), value)].into_iter().collect())
}

/// Takes a deep value apart one level at a time, so that the test does not rely on how
/// deep a recursive drop may go.
fn dismantle(mut value: Value) {
    loop {
        value = match value {
            Value::Array(mut items) => match items.pop() {
                Some(inner) => inner,
                None => return,
            },
            Value::Object(members) => match members.into_iter().next() {
                Some((_, inner)) => inner,
                None => return,
            },
            _ => return,
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn args_nested_5000_deep_are_refused_with_the_depth_error() {
    const DEPTH: usize = 5_000;
    let (fields, problem, mut plan) = tokio::spawn(async {
        let plan = Plan::new()
            .with_var("deep", nested(DEPTH))
            .with_step(Step::new("a", "travel::hotels", q(nested(DEPTH))))
            .with_step(Step::new("b", "travel::hotels", json!({})).with_default(nested(DEPTH)));
        let calls = Arc::new(AtomicUsize::new(0));
        let executor = Executor::builder(registry()).build().unwrap();
        let err = executor
            .start(echo(&calls), &plan, Turn::new("s", "u"))
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let fields: Vec<String> = err.problems().iter().map(|p| p.field.clone()).collect();
        (fields, err.problems()[1].problem.clone(), plan)
    })
    .await
    .unwrap();
    assert_eq!(fields, ["vars.deep", "steps[0].args", "steps[1].default"]);
    assert_eq!(problem, "nests deeper than 64 levels; flatten it");
    dismantle(plan.vars.remove("deep").unwrap());
    dismantle(std::mem::take(&mut plan.steps[0].args));
    dismantle(plan.steps[1].default.take().unwrap());

    // At the limit (the args object and 63 arrays), the same args are accepted; one level
    // more is refused.
    let executor = Executor::builder(registry()).build().unwrap();
    let at_limit = |depth: usize| {
        Plan::new().with_step(Step::new("a", "travel::hotels", q(nested(depth - 1))))
    };
    assert_eq!(executor.check(&at_limit(64)), Ok(()));
    assert!(executor.check(&at_limit(65)).is_err());
}

#[tokio::test(start_paused = true)]
async fn references_that_nest_an_output_too_deep_fail_the_call_not_the_process() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = {
        let calls = calls.clone();
        tool_fn(move |call: ToolCall| {
            calls.fetch_add(1, Ordering::SeqCst);
            let deep = call.tool_name() == "deep";
            async move {
                // An output nested 60 deep: fine alone, too deep under 10 more levels.
                Ok(ToolOutput::new(if deep { nested(60) } else { json!(1) }))
            }
        })
    };
    let plan = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "t::deep"},
        {"id": "b", "tool": "t::use", "args": {"x": [[[[[[[[[["$steps.a"]]]]]]]]]]}, "optional": true},
        {"id": "c", "tool": "t::use", "args": {"x": "$steps.a"}}
    ]}))
    .unwrap();
    let result = open_executor()
        .start(tool, &plan, Turn::new("s", "u"))
        .unwrap()
        .finish()
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "b is never sent");
    let b = result.step("b").unwrap();
    assert_eq!(b.status, StepStatus::Failed);
    let error = b.error.as_ref().unwrap();
    assert_eq!(error.code, ErrorCode::ValidationError);
    assert!(
        error.message.contains("deeper than 64 levels"),
        "{}",
        error.message
    );
    assert_eq!(result.step("c").unwrap().status, StepStatus::Succeeded);
}

/// The name of a test of this binary, as `--exact` wants it.
fn test_name(function: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    format!("{module}::{function}")
}

/// `VmRSS` or `VmHWM` of this process, in bytes.
#[cfg(target_os = "linux")]
fn memory(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kb: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

/// Runs `function` (a test of this binary) alone in a child process, so that its peak
/// memory is its own and not that of the tests beside it.
#[cfg(target_os = "linux")]
fn in_own_process(function: &str, env: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test_name(function).as_str(), "--exact", "--test-threads=1"])
        .env(env, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

const MEMORY_CHILD: &str = "TOOLCALL_EXECUTOR_MEMORY_CHILD";

#[cfg(target_os = "linux")]
#[test]
fn references_that_multiply_an_output_are_refused_at_the_params_limit() {
    if std::env::var_os(MEMORY_CHILD).is_none() {
        return in_own_process(
            "references_that_multiply_an_output_are_refused_at_the_params_limit",
            MEMORY_CHILD,
        );
    }
    const LIMIT: usize = 1 << 20;
    let before = memory("VmRSS");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();

    // Each step echoes the previous output twice: 60 doublings of 1 KB, far more than any
    // memory if they were built.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut plan =
        Plan::new().with_step(Step::new("s0", "t::echo", json!({"v": "x".repeat(1000)})));
    for k in 1..=60 {
        let prev = format!("$steps.s{}", k - 1);
        plan = plan.with_step(Step::new(
            format!("s{k}"),
            "t::echo",
            json!({"l": prev, "r": prev}),
        ));
    }
    let result = runtime.block_on(
        open_executor()
            .start(echo(&calls), &plan, Turn::new("s", "u"))
            .unwrap()
            .finish(),
    );
    assert_eq!(result.status, TurnStatus::Failed, "{}", result.message);
    // s0's args are 1,008 bytes, s_k's 11 + 2 · s_(k-1): s10's 1,043,445 bytes fit,
    // s11's do not.
    assert_eq!(calls.load(Ordering::SeqCst), 11);
    let refused = result.step("s11").unwrap();
    assert_eq!(refused.status, StepStatus::Failed);
    let error = refused.error.as_ref().unwrap();
    assert_eq!(error.code, ErrorCode::PayloadTooLarge);
    assert!(
        error.message.contains("`args.r`: reference `$steps.s10`")
            && error.message.contains(&format!("limit of {LIMIT} bytes")),
        "{}",
        error.message
    );
    assert_eq!(result.step("s12").unwrap().status, StepStatus::Skipped);
    assert_eq!(result.step("s60").unwrap().status, StepStatus::Skipped);

    // One step whose template copies a 600 KB output 10,000 times (6 GB if built), and
    // one that writes it twice into a string.
    let calls = Arc::new(AtomicUsize::new(0));
    let copies: Vec<&str> = vec!["$steps.page"; 10_000];
    let plan = Plan::from_value(json!({"steps": [
        {"id": "page", "tool": "t::echo", "args": {"v": "x".repeat(600_000)}},
        {"id": "fan", "tool": "t::echo", "args": {"copies": copies}, "optional": true},
        {"id": "text", "tool": "t::echo", "args": {"t": "{$steps.page.v} and {$steps.page.v}"},
         "optional": true}
    ]}))
    .unwrap();
    let result = runtime.block_on(
        open_executor()
            .start(echo(&calls), &plan, Turn::new("s", "u"))
            .unwrap()
            .finish(),
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the page is fetched");
    for (id, field) in [("fan", "`args.copies[1]`"), ("text", "`args.t`")] {
        let step = result.step(id).unwrap();
        assert_eq!(step.status, StepStatus::Failed);
        let error = step.error.as_ref().unwrap();
        assert_eq!(error.code, ErrorCode::PayloadTooLarge, "{id}");
        assert!(error.message.contains(field), "{id}: {}", error.message);
    }

    let growth = memory("VmHWM").saturating_sub(before);
    assert!(
        growth < 64 << 20,
        "peak memory grew by {growth} bytes while resolving"
    );
}

#[tokio::test(start_paused = true)]
async fn the_params_limit_can_be_set_per_executor() {
    let calls = Arc::new(AtomicUsize::new(0));
    let plan = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "t::echo", "args": {"v": "x".repeat(3_000)}},
        {"id": "b", "tool": "t::echo", "args": {"v": "$steps.a.v"}}
    ]}))
    .unwrap();
    let executor = Executor::builder(ToolRegistry::open())
        .confirmation(ConfirmationPolicy::NotRequired)
        .max_params_bytes(2_000)
        .build()
        .unwrap();
    let result = executor
        .start(echo(&calls), &plan, Turn::new("s", "u"))
        .unwrap()
        .finish()
        .await;
    // The static args of `a` are over the limit too: nothing is sent.
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let error = result.step("a").unwrap().error.clone().unwrap();
    assert_eq!(error.code, ErrorCode::PayloadTooLarge);
    assert!(
        error.message.contains("limit of 2000 bytes"),
        "{}",
        error.message
    );
    assert!(Executor::builder(ToolRegistry::open())
        .max_params_bytes(1)
        .build()
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn run_ids_that_would_leave_the_audit_directory_are_refused() {
    let root = temp_dir("run-ids");
    let outside = root.with_file_name(format!(
        "{}-outside",
        root.file_name().unwrap().to_string_lossy()
    ));
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = Toolbox::new().script("travel::hotels", vec![ok(1)]);
    let plan = Plan::from_value(json!({"steps": [{"id": "a", "tool": "travel::hotels"}]})).unwrap();
    let outside_name = outside.file_name().unwrap().to_string_lossy().into_owned();
    let bad = [
        format!("../{outside_name}"),
        format!("../../{outside_name}"),
        outside.display().to_string(),
        String::new(),
        ".".to_owned(),
        "..".to_owned(),
        "a/b".to_owned(),
        "a\\b".to_owned(),
        "a\0b".to_owned(),
        "run 1".to_owned(),
        "x".repeat(129),
    ];
    for id in &bad {
        let err = executor
            .start(
                tools.service(),
                &plan,
                Turn::new("s", "u").with_run_id(id.clone()),
            )
            .unwrap_err();
        assert_eq!(err.problems().len(), 1, "{id:?}: {err}");
        assert_eq!(err.problems()[0].field, "runId", "{id:?}");

        let read = serde_json::from_value::<Turn>(json!({
            "sessionKey": "s", "actorId": "u", "runId": id
        }))
        .unwrap_err();
        assert!(read.to_string().starts_with("runId "), "{id:?}: {read}");
    }
    assert!(
        !outside.exists(),
        "nothing is written outside the audit directory"
    );
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "nor at its root"
    );
    assert_eq!(tools.total(), 0);

    for id in [
        "run-1",
        "01J9ZQ5Y3V7C8X2M4N6P8R0T2W",
        "a.b_c-d",
        &"x".repeat(128),
    ] {
        let turn: Turn = serde_json::from_value(json!({
            "sessionKey": "s", "actorId": "u", "runId": id
        }))
        .unwrap();
        let result = executor
            .start(tools.service(), &plan, turn)
            .unwrap()
            .finish()
            .await;
        assert_eq!(result.status, TurnStatus::Completed);
        assert!(root.join(id).join("run.json").is_file(), "{id}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// The lines of `file` in `dir`.
fn line_count(dir: &std::path::Path, file: &str) -> usize {
    std::fs::read_to_string(dir.join(file))
        .unwrap()
        .lines()
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_run_id_with_a_record_is_not_reused_and_a_replay_does_not_append_to_it() {
    let root = temp_dir("reuse");
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = Toolbox::new().script("travel::hotels", vec![ok(5)]);
    let plan = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "travel::hotels"},
        {"id": "b", "tool": "travel::hotels", "args": {"after": "$steps.a.tool"}}
    ]}))
    .unwrap();
    let turn = || Turn::new("s", "u").with_run_id("run-7");
    executor
        .start(tools.service(), &plan, turn())
        .unwrap()
        .finish()
        .await;
    let dir = root.join("run-7");
    let counts = |dir: &std::path::Path| {
        ["calls.jsonl", "results.jsonl", "events.jsonl"].map(|f| line_count(dir, f))
    };
    let recorded_counts = counts(&dir);
    let run_json = std::fs::read_to_string(dir.join("run.json")).unwrap();

    let again = executor.start(tools.service(), &plan, turn()).unwrap_err();
    assert_eq!(again.problems()[0].field, "runId");
    assert!(
        again.to_string().contains("already has a record"),
        "{again}"
    );

    let recorded = reconstruct(&dir).unwrap();
    let refused = replay(&recorded, &executor).await.unwrap_err();
    assert_eq!(refused.problems()[0].field, "runId");
    assert_eq!(counts(&dir), recorded_counts, "the record is unchanged");
    assert_eq!(
        std::fs::read_to_string(dir.join("run.json")).unwrap(),
        run_json
    );
    assert_eq!(tools.total(), 2);

    // An executor without the audit directory replays it.
    let report = replay(&recorded, &recorded.executor(registry()).unwrap())
        .await
        .unwrap();
    assert_eq!(report.divergence, None);
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_replay_of_a_run_that_stopped_with_calls_in_flight_ends_with_a_divergence() {
    let root = temp_dir("crashed");
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = Toolbox::new().script("travel::hotels", vec![ok(5)]);
    let plan = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "travel::hotels"},
        {"id": "b", "tool": "travel::hotels", "args": {"after": "$steps.a.tool"}},
        {"id": "c", "tool": "travel::hotels", "args": {"after": "$steps.b.tool"}, "optional": true}
    ]}))
    .unwrap();
    executor
        .start(
            tools.service(),
            &plan,
            Turn::new("s", "u").with_run_id("run-c"),
        )
        .unwrap()
        .finish()
        .await;
    // The process died while `b` ran: its call is recorded, its result is not.
    let dir = root.join("run-c");
    let mut recorded = reconstruct(&dir).unwrap();
    assert_eq!(recorded.calls.len(), 3);
    recorded.results.truncate(1);
    recorded.calls.truncate(2);

    let report = tokio::time::timeout(
        Duration::from_secs(60),
        replay(&recorded, &recorded.executor(registry()).unwrap()),
    )
    .await
    .expect("the replay ends")
    .unwrap();
    let divergence = report.divergence.expect("a divergence");
    assert_eq!(divergence.stream, "results");
    assert_eq!(divergence.index, 1);
    assert_eq!(divergence.recorded, None);
    assert!(
        divergence
            .replayed
            .as_deref()
            .unwrap()
            .starts_with("b b#1 travel::hotels"),
        "{divergence:?}"
    );
    let b = report.result.step("b").unwrap();
    assert_eq!(b.status, StepStatus::Failed);
    assert_eq!(b.error.as_ref().unwrap().code, ErrorCode::NotFound);
    assert!(
        b.error
            .as_ref()
            .unwrap()
            .message
            .contains("no result in the recording"),
        "{:?}",
        b.error
    );
    assert_eq!(tools.total(), 3, "a replay calls no tool");
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_retry_pause_over_the_cap_is_refused() {
    let executor = Executor::builder(registry()).build().unwrap();
    assert_eq!(executor.policy().max_backoff_ms, 60_000);
    let years = Plan::from_value(json!({"steps": [
        {"id": "a", "tool": "travel::hotels",
         "retry": {"maxAttempts": 3, "backoffMs": 100_000_000_000_u64}}
    ]}))
    .unwrap();
    let err = executor.check(&years).unwrap_err();
    assert_eq!(err.problems().len(), 1);
    assert_eq!(err.problems()[0].field, "steps[0].retry.backoffMs");
    assert_eq!(
        err.problems()[0].problem,
        "must be at most 60000, got 100000000000; ask for a shorter pause"
    );
    let minute = Plan::new().with_step(
        Step::new("a", "travel::hotels", json!({}))
            .with_retry(StepRetry::new(3, Duration::from_secs(60))),
    );
    assert_eq!(executor.check(&minute), Ok(()));
    let hour = Plan::new().with_step(
        Step::new("a", "travel::hotels", json!({}))
            .with_retry(StepRetry::new(3, Duration::from_secs(3_600))),
    );
    assert!(executor.check(&hour).is_err());
    let patient = Executor::builder(registry())
        .max_backoff(Duration::from_secs(3_600))
        .build()
        .unwrap();
    assert_eq!(patient.check(&hour), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_run_has_a_turn_deadline_by_default() {
    let executor = Executor::builder(registry()).build().unwrap();
    assert_eq!(executor.policy().turn_timeout_ms, Some(300_000));
    let tools = Toolbox::new()
        .script("travel::hotels", vec![Answer::Hang])
        .script("travel::weather", vec![ok(10)]);
    let plan = Plan::from_value(json!({"steps": [
        {"id": "hotels", "tool": "travel::hotels"},
        {"id": "weather", "tool": "travel::weather"}
    ]}))
    .unwrap();
    let started = tokio::time::Instant::now();
    let run = executor
        .start(tools.service(), &plan, Turn::new("s", "u"))
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(3_600), run.finish())
        .await
        .expect("the run ends by its default deadline");
    assert_eq!(started.elapsed(), Duration::from_secs(300));
    assert_eq!(result.status, TurnStatus::Partial);
    assert_eq!(result.step("hotels").unwrap().status, StepStatus::TimedOut);
    assert_eq!(
        result.step("weather").unwrap().status,
        StepStatus::Succeeded
    );

    // A deadline too far to tell is no crash: the run starts and waits.
    let far = Executor::builder(registry())
        .turn_timeout(Duration::MAX)
        .build()
        .unwrap();
    let run = far
        .start(tools.service(), &plan, Turn::new("s", "u"))
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(3_600), run.finish()).await;
    assert!(waited.is_err(), "the run waits for its hanging call");
    assert_eq!(tools.count("travel::weather"), 2);
}

#[test]
fn step_ids_and_captures_that_no_reference_can_name_are_refused() {
    let executor = Executor::builder(registry()).build().unwrap();
    let bad = ["x/y", "a.b", "../../x", "a\0b", "x y", "a[0]", "$x"];
    let mut plan = Plan::new();
    for id in bad {
        plan = plan.with_step(Step::new(id, "travel::hotels", json!({})));
    }
    plan = plan.with_step(Step::new("good", "travel::hotels", json!({})).with_capture_as("a.b"));
    let err = executor.check(&plan).unwrap_err();
    let fields: Vec<&str> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "steps[0].id",
            "steps[1].id",
            "steps[2].id",
            "steps[3].id",
            "steps[4].id",
            "steps[5].id",
            "steps[6].id",
            "steps[7].captureAs"
        ]
    );
    assert_eq!(
        err.problems()[3].problem,
        "`a\\0b` cannot be named by a `$steps.` reference; use only letters, digits, `_` and `-`"
    );
    // A reference to such a step is one problem, not a literal string sent to a tool.
    let referencing = Plan::from_value(json!({"steps": [
        {"id": "x/y", "tool": "travel::hotels"},
        {"id": "b", "tool": "travel::hotels", "args": {"q": "$steps.x/y"}, "dependsOn": ["x/y"]}
    ]}))
    .unwrap();
    let err = executor.check(&referencing).unwrap_err();
    assert_eq!(err.problems()[0].field, "steps[0].id", "{err}");
    assert_eq!(err.problems().len(), 1, "{err}");

    let fine = Plan::new()
        .with_step(Step::new("a-b_1", "travel::hotels", json!({})).with_capture_as("the_x"))
        .with_step(Step::new(
            "étape",
            "travel::hotels",
            json!({"q": "$steps.a-b_1"}),
        ));
    assert_eq!(executor.check(&fine), Ok(()));
}

/// Runs `STEPS` independent steps, one in a hundred on another tool, and gives the wall
/// time it took.
async fn independent_steps(executor: &Executor) -> Duration {
    const STEPS: usize = 40_000;
    let calls = Arc::new(AtomicUsize::new(0));
    let mut plan = Plan::new();
    for i in 0..STEPS {
        let tool = if i % 100 == 0 {
            "travel::weather"
        } else {
            "travel::hotels"
        };
        plan = plan.with_step(Step::new(format!("s{i}"), tool, json!({})));
    }
    let started = std::time::Instant::now();
    let result = executor
        .start(echo(&calls), &plan, Turn::new("s", "u"))
        .unwrap()
        .finish()
        .await;
    let took = started.elapsed();
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    assert_eq!(calls.load(Ordering::SeqCst), STEPS);
    assert!(
        result
            .steps
            .iter()
            .all(|s| s.status == StepStatus::Succeeded && s.calls == 1),
        "every step ran once"
    );
    took
}

#[tokio::test(start_paused = true)]
async fn forty_thousand_steps_under_one_tools_limit_schedule_in_linear_time() {
    let free = Executor::builder(registry())
        .max_concurrency(16)
        .build()
        .unwrap();
    let capped = Executor::builder(registry())
        .max_concurrency(16)
        .tool_concurrency("travel::hotels", 4)
        .build()
        .unwrap();
    let without_cap = independent_steps(&free).await;
    let with_cap = independent_steps(&capped).await;
    // A scan of every waiting step per call would take minutes; the cap may cost a little
    // per call, not per waiting step.
    assert!(
        with_cap < without_cap * 2 + Duration::from_secs(1),
        "with the cap {with_cap:?}, without {without_cap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shared_plan_is_not_copied_by_its_run() {
    let items: Vec<u32> = (0..1_000).collect();
    let plan = Arc::new(
        Plan::from_value(json!({"steps": [
            {"id": "each", "tool": "travel::hotels", "args": {"n": "{item}"},
             "foreach": {"items": items}}
        ]}))
        .unwrap(),
    );
    let tools = Toolbox::new().script("travel::hotels", vec![ok(1)]);
    let run = Executor::builder(registry())
        .build()
        .unwrap()
        .start_shared(tools.service(), plan.clone(), Turn::new("s", "u"))
        .unwrap();
    assert_eq!(
        Arc::strong_count(&plan),
        2,
        "the run holds the caller's plan"
    );
    let result = run.finish().await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(tools.count("travel::hotels"), 1_000);
    assert_eq!(Arc::strong_count(&plan), 1);
}
