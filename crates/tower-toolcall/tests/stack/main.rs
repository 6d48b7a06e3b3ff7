//! The whole stack, as `ToolStack` assembles it, over mock tools.

#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use tower::{Service, ServiceExt};
use tower_toolcall::breaker::BreakerKey;
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::hooks::ToolHooks;
use tower_toolcall::idempotency::{DedupeStore, InMemoryDedupeStore};
use tower_toolcall::registry::{
    IdempotencySettings, RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{
    tool_fn, ErrorCode, ResultStatus, ShortCircuit, StackLayer, ToolCall, ToolError, ToolOutput,
    ToolResult, ToolStack,
};

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(
            // Its answers may be a minute old: repeated searches are served from the record.
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_idempotent(true)
                .with_policy(ToolPolicy::default().with_idempotency(
                    IdempotencySettings::default().with_read_cache_ttl_ms(60_000),
                )),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes).with_input_schema(
                json!({
                    "type": "object",
                    "required": ["path"],
                    "properties": {"path": {"type": "string"}}
                }),
            ),
        )
        .build()
        .unwrap()
}

/// A tool whose first `failures` calls answer 503; counts its runs.
fn flaky_tool(
    failures: usize,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send,
> + Clone
       + Send
       + 'static {
    tool_fn(move |call: ToolCall| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if run < failures {
                Err(ToolError::from_http_status(503, "upstream overloaded"))
            } else {
                Ok(ToolOutput::new(
                    json!({"ran": run, "params": call.params().as_value()}),
                ))
            }
        }
    })
}

/// The stack over a tool whose first `failures` calls answer 503; counts the tool's runs.
fn stack(
    store: InMemoryDedupeStore,
    failures: usize,
    runs: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible> {
    let stack = ToolStack::builder(registry())
        .store(Arc::new(store))
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap();
    support::enveloped(&stack, flaky_tool(failures, runs))
}

async fn run<S>(svc: &mut S, call: ToolCall) -> ToolResult
where
    S: Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible>,
{
    svc.ready().await.unwrap().call(call).await.unwrap()
}

fn write(path: serde_json::Value, key: &str) -> ToolCall {
    ToolCall::builder("vault", "createFile")
        .session("sess-42")
        .actor("user-7")
        .idempotency_key(key)
        .params(json!({ "path": path }))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_leaves_no_record_and_never_reaches_the_tool() {
    let store = InMemoryDedupeStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = stack(store.clone(), 0, runs.clone());

    let result = run(&mut svc, write(json!(42), "k-1")).await;
    assert_eq!(result.error.unwrap().code, "VALIDATION_ERROR");
    assert_eq!(result.attempts, 0);
    let mut broken = write(json!("a.md"), "k-2");
    broken.envelope_mut().contract_version = "1.0".into();
    assert_eq!(
        run(&mut svc, broken).await.error.unwrap().code,
        "VALIDATION_ERROR"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        store.size().await.unwrap(),
        0,
        "no dedupe record was created"
    );

    // A valid call still runs, and leaves its record.
    let result = run(&mut svc, write(json!("a.md"), "k-3")).await;
    assert_eq!(result.status, ResultStatus::Success);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.size().await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_retry_of_a_write_runs_the_tool_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = stack(InMemoryDedupeStore::new(), 0, runs.clone());
    let first = run(&mut svc, write(json!("a.md"), "create-a")).await;
    let again = run(&mut svc, write(json!("a.md"), "create-a")).await;
    assert!(!first.from_cache && again.from_cache);
    assert_eq!(first.output, again.output);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let reused = run(&mut svc, write(json!("b.md"), "create-a")).await;
    assert_eq!(
        reused.error.unwrap().code,
        ErrorCode::IdempotencyKeyReused.as_str()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_flaky_upstream_is_retried_inside_one_idempotent_execution() {
    let store = InMemoryDedupeStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = stack(store.clone(), 2, runs.clone());
    let search = ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(json!({"query": "tower"}))
        .build()
        .unwrap();
    let result = run(&mut svc, search.clone()).await;
    assert_eq!(result.status, ResultStatus::Success);
    assert_eq!(result.attempts, 3);
    let retried = result.retried_by.unwrap();
    assert_eq!(retried.len(), 2);
    assert!(retried
        .iter()
        .all(|r| r.reason_code == "UPSTREAM_UNAVAILABLE"));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(
        store.size().await.unwrap(),
        1,
        "one record for the whole retried execution"
    );

    // The same search again: from the cache, the retries not repeated.
    let again = run(&mut svc, search).await;
    assert!(again.from_cache);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_looping_model_is_stopped_even_when_the_cache_answers() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = stack(InMemoryDedupeStore::new(), 0, runs.clone());
    let search = || {
        ToolCall::builder("agents.tools.web", "search")
            .session("sess-loop")
            .actor("user-7")
            .params(json!({"query": "same"}))
            .build()
            .unwrap()
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let result = run(&mut svc, search()).await;
        statuses.push((
            result.from_cache,
            result.error.map(|e| e.code.as_str().to_owned()),
        ));
    }
    assert_eq!(
        statuses,
        [
            (false, None),
            (true, None),
            (true, None),
            (false, Some("LOOP_DETECTED".to_owned())),
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// The builder: one registry, control, store and hooks object for every layer.

fn search(session: &str, query: &str) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session(session)
        .actor("user-7")
        .params(json!({ "query": query }))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_control_switches_every_layer_of_the_built_stack() {
    let control = ReliabilityControl::new();
    let stack = ToolStack::builder(registry().with_control(control.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = support::enveloped(&stack, flaky_tool(0, runs.clone()));
    stack
        .breakers()
        .unwrap()
        .force_open(&BreakerKey::tool("agents.tools.web", "search"));
    let refused = run(&mut svc, search("s", "a")).await;
    assert_eq!(refused.error.unwrap().code, "CIRCUIT_OPEN");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The kill switch, flipped through the stack's handle, reaches the breaker, the loop
    // detector and the idempotency layer alike: the same call runs every time.
    stack.control().set_enabled(false);
    for _ in 0..5 {
        let result = run(&mut svc, write(json!("a.md"), "same-key")).await;
        assert_eq!(result.status, ResultStatus::Success);
        assert!(!result.from_cache);
    }
    assert_eq!(
        run(&mut svc, search("s", "a")).await.status,
        ResultStatus::Success
    );
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert!(
        !control.is_enabled(),
        "the stack's control is the registry's"
    );
}

#[tokio::test(start_paused = true)]
async fn the_built_stack_gives_its_hooks_to_the_tool_and_to_every_short_circuit() {
    #[derive(Debug, Default)]
    struct Count {
        attempts: AtomicUsize,
        short_circuits: std::sync::Mutex<Vec<ShortCircuit>>,
    }
    impl ToolHooks for Count {
        fn before_attempt(&self, _call: &mut ToolCall) -> Result<(), ToolError> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn on_short_circuit(
            &self,
            _call: &ToolCall,
            path: ShortCircuit,
            _outcome: &Result<ToolOutput, ToolError>,
        ) {
            self.short_circuits.lock().unwrap().push(path);
        }
    }
    let hooks = Arc::new(Count::default());
    let stack = ToolStack::builder(registry())
        .hooks(hooks.clone())
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = support::enveloped(&stack, flaky_tool(2, runs.clone()));

    let first = run(&mut svc, search("s", "tower")).await;
    assert_eq!(first.attempts, 3);
    assert_eq!(hooks.attempts.load(Ordering::SeqCst), 3, "once per attempt");
    let again = run(&mut svc, search("s", "tower")).await;
    assert!(again.from_cache);
    assert_eq!(hooks.attempts.load(Ordering::SeqCst), 3);
    assert_eq!(
        *hooks.short_circuits.lock().unwrap(),
        [ShortCircuit::CacheHit]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_layer_left_out_of_the_stack_is_not_there() {
    let stack = ToolStack::builder(registry())
        .without(StackLayer::Idempotency)
        .without(StackLayer::Retry)
        .build()
        .unwrap();
    assert!(stack.dedupe_store().is_none() && stack.idempotency().is_none());
    assert!(stack.breakers().is_some() && stack.loop_sessions().is_some());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = support::enveloped(&stack, flaky_tool(1, runs.clone()));

    let first = run(&mut svc, write(json!("a.md"), "k")).await;
    assert_eq!(first.status, ResultStatus::RetriableError, "no retry layer");
    assert_eq!(first.attempts, 1);
    let second = run(&mut svc, write(json!("a.md"), "k")).await;
    assert_eq!(second.status, ResultStatus::Success);
    assert!(!second.from_cache, "no idempotency layer");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn the_handles_of_the_built_stack_act_on_its_layers() {
    let store = InMemoryDedupeStore::new();
    let stack = ToolStack::builder(registry())
        .store(Arc::new(store.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = support::enveloped(&stack, flaky_tool(0, runs.clone()));

    // The store given to the builder is the one the stack writes.
    run(&mut svc, write(json!("a.md"), "k-1")).await;
    assert_eq!(store.size().await.unwrap(), 1);
    assert_eq!(stack.dedupe_store().unwrap().size().await.unwrap(), 1);

    // Three repeats in a session, a reset through the handle, and the count starts again.
    for _ in 0..3 {
        run(&mut svc, search("sess-r", "same")).await;
    }
    stack.loop_sessions().unwrap().reset_session("sess-r");
    for _ in 0..3 {
        let result = run(&mut svc, search("sess-r", "same")).await;
        assert_eq!(result.error, None);
    }
    let fourth = run(&mut svc, search("sess-r", "same")).await;
    assert_eq!(fourth.error.unwrap().code, "LOOP_DETECTED");

    // A breaker forced open through the handle, then reset.
    let admin = stack.breakers().unwrap();
    let key = BreakerKey::tool("vault", "createFile");
    admin.force_open(&key);
    let refused = run(&mut svc, write(json!("b.md"), "k-2")).await;
    assert_eq!(refused.error.unwrap().code, ErrorCode::CircuitOpen.as_str());
    assert!(admin.reset(&key));
    let ran = run(&mut svc, write(json!("b.md"), "k-2")).await;
    assert_eq!(ran.status, ResultStatus::Success);
}

#[test]
fn a_bad_setting_of_any_layer_fails_the_build_naming_the_field() {
    let error = ToolStack::builder(registry())
        .idempotency(|idempotency| {
            idempotency.settings(IdempotencySettings::default().with_done_ttl_ms(0))
        })
        .build()
        .unwrap_err();
    assert!(
        error.to_string().contains("idempotency.done_ttl_ms"),
        "{error}"
    );
    let error = ToolStack::builder(registry())
        .retry(|retry| retry.settings(RetrySettings::default().with_max_attempts(0)))
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("max_attempts"), "{error}");
}

/// Tools whose policies change how their errors are classified.
const CLASSIFIED_TOOLS: &str = r#"
    [[tools]]
    namespace = "billing"
    name = "invoiceStatus"
    risk = "read-only"

    [tools.policy]
    classify = { terminal_http_statuses = [503] }

    [[tools]]
    namespace = "docs"
    name = "lookup"
    risk = "read-only"

    [tools.policy]
    retry = "off"
"#;

/// The stack with [`CLASSIFIED_TOOLS`] over a tool that always fails with `error`; counts
/// the tool's runs.
fn failing_stack(
    error: fn() -> ToolError,
    runs: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible> {
    let registry = ToolRegistry::from_toml_str(CLASSIFIED_TOOLS).unwrap();
    let tool = tool_fn(move |_call: ToolCall| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move { Err::<ToolOutput, _>(error()) }
    });
    let stack = ToolStack::builder(registry)
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap();
    support::enveloped(&stack, tool)
}

fn call_of(namespace: &str, name: &str) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-42")
        .actor("user-7")
        .request_id("req-1")
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_status_the_tool_classifies_terminal_is_reported_terminal() {
    let runs = Arc::new(AtomicUsize::new(0));
    let unavailable = || ToolError::from_http_status(503, "billing is in maintenance");
    let mut svc = failing_stack(unavailable, runs.clone());
    let result = run(&mut svc, call_of("billing", "invoiceStatus")).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a terminal failure is not retried"
    );
    assert_eq!(
        serde_json::to_value(&result).unwrap(),
        json!({
            "requestId": "req-1",
            "status": "error",
            "fromCache": false,
            "toolName": "invoiceStatus",
            "durationMs": 0,
            "attempts": 1,
            "error": {
                "code": "UPSTREAM_UNAVAILABLE",
                "message": "billing is in maintenance",
                "retriable": false,
                "terminal": true,
                "breakerState": "closed"
            }
        })
    );
}

#[tokio::test(start_paused = true)]
async fn an_unclassified_error_of_a_read_only_tool_is_reported_retriable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let unknown = || ToolError::new(ErrorCode::InternalError, "index is being rebuilt");
    let mut svc = failing_stack(unknown, runs.clone());
    let result = run(&mut svc, call_of("docs", "lookup")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "retry is off for this tool");
    assert_eq!(
        serde_json::to_value(&result).unwrap(),
        json!({
            "requestId": "req-1",
            "status": "retriable_error",
            "fromCache": false,
            "toolName": "lookup",
            "durationMs": 0,
            "attempts": 1,
            "error": {
                "code": "INTERNAL_ERROR",
                "message": "index is being rebuilt",
                "retriable": true,
                "terminal": false,
                "breakerState": "closed"
            }
        })
    );
}
