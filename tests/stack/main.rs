//! The whole stack, in the recommended order, over mock tools.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::idempotency::{DedupeStore, InMemoryDedupeStore};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{
    tool_fn, CircuitBreakerLayer, EnvelopeValidateLayer, ErrorCode, IdempotencyLayer,
    LoopDetectLayer, RateLimitLayer, ResultEnvelopeLayer, ResultStatus, RetryLayer, TimeoutLayer,
    ToolCall, ToolError, ToolOutput, ToolResult,
};

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly).idempotent(true),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes).input_schema(json!({
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string"}}
            })),
        )
        .build()
        .unwrap()
}

/// The stack over a tool whose first `failures` calls answer 503; counts the tool's runs.
fn stack(
    store: InMemoryDedupeStore,
    failures: usize,
    runs: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible> {
    let registry = registry();
    let tool = tool_fn(move |call: ToolCall| {
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
    });
    stack_over(registry, store, tool)
}

/// The stack in the recommended order, with `registry`, over `tool`.
fn stack_over<T>(
    registry: ToolRegistry,
    store: InMemoryDedupeStore,
    tool: T,
) -> impl Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible>
where
    T: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone + Send + 'static,
    T::Future: Send + 'static,
{
    ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(EnvelopeValidateLayer::new(registry.clone()))
        .layer(LoopDetectLayer::new(registry.clone()))
        .layer(RateLimitLayer::new(registry.clone()))
        .layer(IdempotencyLayer::new(registry.clone(), store))
        .layer(
            RetryLayer::builder(registry.clone())
                .seed(7)
                .build()
                .unwrap(),
        )
        .layer(CircuitBreakerLayer::new(registry.clone()))
        .layer(TimeoutLayer::new(registry))
        .service(tool)
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
        statuses.push((result.from_cache, result.error.map(|e| e.code)));
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
    stack_over(registry, InMemoryDedupeStore::new(), tool)
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
