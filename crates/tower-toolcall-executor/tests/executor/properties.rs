//! Properties: reference resolution, and runs of random plans with random failures.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tower_toolcall::trace::ExecutionEvent;
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolError, ToolOutput};
use tower_toolcall_executor::{
    reconstruct, replay, resolve, Executor, Plan, Scope, Step, StepRetry, StepStatus, Turn,
    TurnResult,
};

use crate::audit::temp_dir;
use crate::tools::registry;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        "[a-z {}.$]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Strings that hold no reference: no `$steps.`, `$vars.`, and no braces.
fn plain_value() -> impl Strategy<Value = Value> {
    json_value().prop_map(|v| strip(&v))
}

fn strip(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(['{', '}', '$'], "_")),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), strip(v))).collect()),
        other => other.clone(),
    }
}

proptest! {
    #[test]
    fn args_without_references_resolve_to_themselves(args in plain_value()) {
        let (steps, vars) = (HashMap::new(), Map::new());
        prop_assert_eq!(resolve(&args, &Scope::new(&steps, &vars)).unwrap(), args);
    }

    #[test]
    fn a_whole_reference_becomes_the_value_it_points_at(
        output in json_value(),
        key in "[a-z]{1,6}",
        index in 0u64..1000,
    ) {
        let mut steps = HashMap::new();
        steps.insert("s".to_owned(), json!({ key.clone(): [output.clone()] }));
        let mut vars = Map::new();
        vars.insert("v".to_owned(), output.clone());
        let item = json!({"x": output.clone()});
        let scope = Scope::new(&steps, &vars).with_item("item", &item).with_index("index", index);
        let args = json!({
            "a": format!("$steps.s.{key}.0"),
            "b": format!("$steps.s.{key}[0]"),
            "c": "$vars.v",
            "d": "{item.x}",
            "e": "{index}",
            "f": ["n{index}"],
        });
        let resolved = resolve(&args, &scope).unwrap();
        prop_assert_eq!(&resolved["a"], &output);
        prop_assert_eq!(&resolved["b"], &output);
        prop_assert_eq!(&resolved["c"], &output);
        prop_assert_eq!(&resolved["d"], &output);
        prop_assert_eq!(&resolved["e"], &json!(index));
        prop_assert_eq!(&resolved["f"][0], &json!(format!("n{index}")));
        // Resolution is pure: the same scope gives the same args.
        prop_assert_eq!(resolve(&args, &scope).unwrap(), resolved);
    }

    #[test]
    fn a_path_that_is_not_there_is_an_error_naming_the_member(key in "[a-z]{1,6}") {
        let mut steps = HashMap::new();
        steps.insert("s".to_owned(), json!({"other": 1}));
        let vars = Map::new();
        let args = json!({"deep": {"x": format!("$steps.s.{key}q")}});
        let err = resolve(&args, &Scope::new(&steps, &vars)).unwrap_err();
        prop_assert_eq!(err.field(), "args.deep.x");
        prop_assert!(err.to_string().contains("has no value at"), "{}", err);
    }
}

/// How a step's tool behaves in a random plan.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Ok,
    TransientOnce,
    Permanent,
    Hang,
}

#[derive(Clone, Debug)]
struct RandomStep {
    deps: Vec<usize>,
    fate: Fate,
    millis: u64,
    optional: bool,
    default: bool,
    retry: bool,
}

fn random_plan() -> impl Strategy<Value = Vec<RandomStep>> {
    prop::collection::vec(
        (
            prop::collection::vec(any::<prop::sample::Index>(), 0..3),
            prop_oneof![
                4 => Just(Fate::Ok),
                2 => Just(Fate::TransientOnce),
                1 => Just(Fate::Permanent),
                1 => Just(Fate::Hang),
            ],
            1u64..400,
            any::<bool>(),
            prop::bool::weighted(0.2),
            any::<bool>(),
        ),
        1..9,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (deps, fate, millis, optional, default, retry))| {
                let mut deps: Vec<usize> = if i == 0 {
                    vec![]
                } else {
                    deps.iter().map(|d| d.index(i)).collect()
                };
                deps.sort_unstable();
                deps.dedup();
                RandomStep {
                    deps,
                    fate,
                    millis,
                    optional,
                    default,
                    retry,
                }
            })
            .collect()
    })
}

fn to_plan(steps: &[RandomStep]) -> Plan {
    let mut plan = Plan::new();
    for (i, s) in steps.iter().enumerate() {
        let mut args = Map::new();
        for d in &s.deps {
            args.insert(format!("from{d}"), json!(format!("$steps.s{d}.step")));
        }
        let mut step = Step::new(format!("s{i}"), "travel::search", Value::Object(args))
            .with_optional(s.optional);
        if s.default {
            step = step.with_default(json!({"step": "default"}));
        }
        if s.retry {
            step = step.with_retry(StepRetry::new(2, Duration::from_millis(25)));
        }
        plan = plan.with_step(step);
    }
    plan
}

/// The tool of a random plan: each step's fate, after its time (`scale` stretches it).
fn tool(
    steps: &[RandomStep],
    scale: impl Fn(usize, u64) -> u64 + Send + Sync + 'static,
) -> impl tower::Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
> + Clone {
    let steps = Arc::new(steps.to_vec());
    let scale = Arc::new(scale);
    tool_fn(move |call: ToolCall| {
        let link = call
            .run_link()
            .expect("the executor links its calls")
            .clone();
        let i: usize = link.step_id[1..].parse().unwrap();
        let step = steps[i].clone();
        let millis = scale(i, step.millis);
        async move {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            match step.fate {
                Fate::Ok => {}
                Fate::TransientOnce if link.attempt > 1 => {}
                Fate::TransientOnce => return Err(ToolError::from_http_status(503, "busy")),
                Fate::Permanent => return Err(ToolError::new(ErrorCode::NotFound, "gone")),
                Fate::Hang => std::future::pending::<()>().await,
            }
            Ok(ToolOutput::new(
                json!({"step": link.step_id, "args": call.params().as_value()}),
            ))
        }
    })
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn statuses(result: &TurnResult) -> Vec<(StepStatus, Option<Value>)> {
    result
        .steps
        .iter()
        .map(|s| (s.status, s.output.clone()))
        .collect()
}

fn check_events(events: &[ExecutionEvent], calls: usize) -> Result<(), TestCaseError> {
    let mut started = 0;
    for (k, e) in events.iter().enumerate() {
        if e.kind != "step.started" {
            continue;
        }
        started += 1;
        let id = e.call_id.as_deref().unwrap();
        let end = events[k + 1..].iter().any(|later| {
            (later.kind == "step.finished" || later.kind == "step.failed")
                && later.call_id.as_deref() == Some(id)
        });
        prop_assert!(end, "call {} has no end event", id);
    }
    prop_assert_eq!(started, calls, "one step.started per dispatched call");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_keep_the_executor_invariants(steps in random_plan(), seed in any::<u64>()) {
        let plan = to_plan(&steps);
        let rt = paused_runtime();
        let root = temp_dir("prop");
        let executor = Executor::builder(registry())
            .turn_timeout(Duration::from_millis(1_500))
            .max_concurrency(3)
            .audit_dir(&root)
            .build()
            .unwrap();
        let (result, events, calls) = rt.block_on(async {
            let service = tool(&steps, |_, ms| ms);
            let mut run = executor.start(service, &plan, Turn::new("s", "u").with_run_id("run")).unwrap();
            let events = run.events().unwrap();
            let (result, events) = futures::join!(run.finish(), futures::StreamExt::collect::<Vec<_>>(events));
            let calls: u32 = result.steps.iter().map(|s| s.calls).sum();
            (result, events, calls as usize)
        });
        prop_assert_eq!(result.events_dropped, 0);
        // A step never runs after a dependency ended without output.
        for (i, s) in steps.iter().enumerate() {
            if result.steps[i].calls > 0 {
                for &d in &s.deps {
                    prop_assert!(result.steps[d].status.has_output(),
                        "s{} ran though s{} ended {:?}", i, d, result.steps[d].status);
                }
            }
        }
        check_events(&events, calls)?;

        // Replay reproduces the same calls and events.
        let recorded = reconstruct(root.join("run")).unwrap();
        prop_assert_eq!(recorded.calls.len(), calls);
        let report = rt.block_on(replay(&recorded, &recorded.executor(registry()).unwrap())).unwrap();
        prop_assert_eq!(report.divergence, None);
        prop_assert_eq!(statuses(&report.result), statuses(&result));
        std::fs::remove_dir_all(&root).unwrap();

        // Without a deadline or hangs, the result does not depend on the completion order.
        let no_hang: Vec<RandomStep> = steps
            .iter()
            .cloned()
            .map(|mut s| { if matches!(s.fate, Fate::Hang) { s.fate = Fate::Ok; } s })
            .collect();
        let plan = to_plan(&no_hang);
        let executor = Executor::builder(registry()).max_concurrency(3).build().unwrap();
        let run_with = |scale: fn(u64, usize, u64) -> u64| {
            let service = tool(&no_hang, move |i, ms| scale(seed, i, ms));
            rt.block_on(executor.start(service, &plan, Turn::new("s", "u").with_run_id("run")).unwrap().finish())
        };
        let forward = run_with(|_, _, ms| ms);
        let shuffled = run_with(|seed, i, ms| (ms * 7 + (seed >> (i % 60)) % 397) % 400 + 1);
        prop_assert_eq!(statuses(&forward), statuses(&shuffled));
        prop_assert_eq!(forward.status, shuffled.status);
    }
}
