//! TraceLayer: the span and events of every call, redacted, and the audit log behind it.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use support::capture::capture;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::trace::{AuditLog, TraceLayer};
use tower_toolcall::{
    tool_fn, CircuitBreakerLayer, EnvelopeValidateLayer, ErrorCode, HookLayer, IdempotencyLayer,
    RetryLayer, ToolCall, ToolError, ToolOutput,
};

async fn run<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready().await?.call(call).await
}

fn search(params: Value) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .tool_call_id("call_1")
        .correlation_id("corr-9")
        .params(params)
        .build()
        .unwrap()
}

fn event<'a>(
    events: &'a [support::capture::CapturedEvent],
    name: &str,
) -> &'a BTreeMap<String, String> {
    &events
        .iter()
        .find(|e| e.fields.get("event").map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no {name} event in {events:?}"))
        .fields
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_opens_a_gen_ai_span_and_logs_its_start_and_end() {
    let (capture, _guard) = capture();
    let mut svc = TraceLayer::new().layer(tool_fn(|_call: ToolCall| async {
        Ok(ToolOutput::new(json!({"hits": 1})))
    }));
    let call = search(json!({"query": "tower"}));
    run(&mut svc, call.clone()).await.unwrap();

    let spans = capture.spans();
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(span.name, "execute_tool");
    for (field, value) in [
        ("otel.name", "execute_tool search"),
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "search"),
        ("gen_ai.tool.call.id", "call_1"),
        ("requestId", call.request_id()),
        ("sessionKey", "sess-42"),
        ("correlationId", "corr-9"),
    ] {
        assert_eq!(
            span.fields.get(field).map(String::as_str),
            Some(value),
            "{field}"
        );
    }
    assert!(!span.fields.contains_key("error.type"));

    let events = capture.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let start = event(&events, "tool_call_start");
    assert_eq!(start["requestId"], call.request_id());
    assert_eq!(start["toolName"], "search");
    assert_eq!(events[0].level, tracing::Level::DEBUG);
    let end = event(&events, "tool_call_end");
    assert_eq!(end["state"], "success");
    assert_eq!(end["attempt"], "1");
    assert_eq!(end["fromCache"], "false");
    assert_eq!(end["correlationId"], "corr-9");
    assert!(end.contains_key("elapsedMs"));
    assert_eq!(events[1].level, tracing::Level::INFO);
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_call_is_blocked_and_marks_the_span_with_its_error_type() {
    let (capture, _guard) = capture();
    let closed = ToolRegistry::builder().build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(EnvelopeValidateLayer::new(closed))
        .service(tool_fn(move |_call: ToolCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok(ToolOutput::new(json!(null))) }
        }));
    let err = run(&mut svc, search(json!({}))).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let events = capture.events();
    let blocked = event(&events, "tool_call_blocked");
    assert_eq!(blocked["errorCode"], "NOT_FOUND");
    assert_eq!(blocked["attempt"], "0");
    assert_eq!(blocked["retriable"], "false");
    assert_eq!(blocked["state"], "error");
    assert_eq!(blocked["path"], "validation_rejected");
    assert!(events
        .iter()
        .all(|e| e.fields.get("event").map(String::as_str) != Some("tool_call_end")));
    assert_eq!(capture.spans()[0].fields["error.type"], "NOT_FOUND");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_that_refuses_a_retry_blocks_the_call_on_its_path() {
    let (capture, _guard) = capture();
    let registry = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "web", "name": "search", "risk": "read-only",
                       "policy": {"breaker": {"consecutive_failures": 1}}}]}"#,
    )
    .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(
            RetryLayer::builder(registry.clone())
                .seed(1)
                .build()
                .unwrap(),
        )
        .layer(CircuitBreakerLayer::new(registry))
        .service(tool_fn(|_call: ToolCall| async {
            Err::<ToolOutput, _>(ToolError::from_http_status(503, "down"))
        }));
    let call = ToolCall::builder("web", "search")
        .session("s")
        .actor("u")
        .build()
        .unwrap();
    let err = run(&mut svc, call).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);

    // The breaker logs its own refusal; the layer's event carries the contract's fields.
    let events: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.fields.contains_key("toolName"))
        .collect();
    let blocked = event(&events, "tool_call_blocked");
    assert_eq!(blocked["path"], "breaker_open");
    assert_eq!(blocked["attempt"], "1");
    assert_eq!(blocked["errorCode"], "CIRCUIT_OPEN");
    assert!(events
        .iter()
        .all(|e| e.fields.get("event").map(String::as_str) != Some("tool_call_end")));
}

#[tokio::test(flavor = "current_thread")]
async fn a_replayed_answer_ends_the_call_and_names_its_path() {
    let (capture, _guard) = capture();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(IdempotencyLayer::in_memory(ToolRegistry::open()))
        .service(tool_fn(|_call: ToolCall| async {
            Ok(ToolOutput::new(json!({"hits": 1})))
        }));
    let call = || {
        ToolCall::builder("web", "search")
            .session("s")
            .actor("u")
            .idempotency_key("k-1")
            .build()
            .unwrap()
    };
    run(&mut svc, call()).await.unwrap();
    run(&mut svc, call()).await.unwrap();

    let ends: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.fields.get("event").map(String::as_str) == Some("tool_call_end"))
        .map(|e| e.fields)
        .collect();
    assert_eq!(ends.len(), 2);
    assert!(!ends[0].contains_key("path"));
    assert_eq!(ends[1]["path"], "cache_hit");
    assert_eq!(ends[1]["fromCache"], "true");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_exhausted_retry_ends_with_its_state_and_attempts() {
    let (capture, _guard) = capture();
    let registry = ToolRegistry::open();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(RetryLayer::builder(registry).seed(1).build().unwrap())
        .service(tool_fn(|_call: ToolCall| async {
            Err::<ToolOutput, _>(ToolError::from_http_status(503, "down"))
        }));
    let call = ToolCall::builder("agents.tools.web", "search")
        .session("s")
        .actor("u")
        .params(json!({"q": 1}))
        .build()
        .unwrap();
    let err = run(&mut svc, call).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    let events = capture.events();
    let end = event(&events, "tool_call_end");
    assert_eq!(end["state"], "retry_exhausted");
    assert_eq!(end["attempt"], "4");
    assert_eq!(end["errorCode"], "RETRY_EXHAUSTED");
    assert_eq!(capture.spans()[0].fields["error.type"], "RETRY_EXHAUSTED");
}

#[tokio::test(flavor = "current_thread")]
async fn secrets_and_raw_keys_never_reach_the_logs() {
    let (capture, _guard) = capture();
    let secret = "sk-live-0123456789abcdefghij";
    let mut svc = TraceLayer::new().layer(tool_fn(move |_call: ToolCall| async move {
        Err::<ToolOutput, _>(ToolError::from_http_status(
            401,
            format!("upstream refused the key {secret}"),
        ))
    }));
    let call = ToolCall::builder("agents.tools.web", "search")
        .session("s")
        .actor("u")
        .idempotency_key("order-4711-raw-key")
        .params(json!({"api_key": secret}))
        .build()
        .unwrap();
    run(&mut svc, call).await.unwrap_err();
    let events = capture.events();
    let end = event(&events, "tool_call_end");
    assert_eq!(end["error"], "upstream refused the key [REDACTED]");
    assert_eq!(end["idempotencyKeyHash"].len(), 16);
    for value in capture.all_values() {
        assert!(!value.contains(secret), "secret in {value}");
        assert!(!value.contains("order-4711"), "raw key in {value}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_audited_run_of_a_thousand_calls_is_reconstructable() {
    let dir =
        std::env::temp_dir().join(format!("tower-toolcall-trace-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let audit = AuditLog::builder(&dir)
        .queue_capacity(100_000)
        .build()
        .unwrap();
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new(
            "agents.tools.web",
            "search",
            RiskLevel::ReadOnly,
        ))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    // Every third run fails once with 503, so some calls take two attempts.
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new().audit(audit.clone()))
        .layer(RetryLayer::builder(registry).seed(3).build().unwrap())
        .layer(HookLayer::new(audit.attempt_hooks()))
        .service(tool_fn(move |call: ToolCall| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if run.is_multiple_of(3) {
                    Err(ToolError::from_http_status(503, "busy"))
                } else {
                    Ok(ToolOutput::new(json!({"n": call.params().as_map()["n"]})))
                }
            }
        }));
    for n in 0..1000 {
        let call = ToolCall::builder("agents.tools.web", "search")
            .session("s")
            .actor("u")
            .request_id(format!("req-{n}"))
            .params(json!({"n": n, "token": "t0p-secret"}))
            .build()
            .unwrap();
        run(&mut svc, call).await.unwrap();
    }
    let stats = audit.shutdown();
    assert_eq!(stats.dropped, 0);

    let read = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(dir.join(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let calls = read("calls.jsonl");
    let results = read("results.jsonl");
    let events = read("events.jsonl");
    assert_eq!(calls.len(), 1000);
    assert_eq!(results.len(), 1000);
    let mut attempts_by_request = BTreeMap::new();
    for result in &results {
        let result = &result["result"];
        assert_eq!(result["status"], "success");
        attempts_by_request.insert(
            result["requestId"].as_str().unwrap().to_owned(),
            result["attempts"].as_u64().unwrap(),
        );
    }
    for call in &calls {
        let id = call["call"]["requestId"].as_str().unwrap();
        assert!(attempts_by_request.contains_key(id), "{id} has no result");
        assert_eq!(call["call"]["payload"]["params"]["token"], "[REDACTED]");
    }
    // Each attempt of each call has one step.started, then one step.finished or step.failed.
    let mut steps = BTreeMap::<String, u64>::new();
    let mut started = BTreeMap::<String, u64>::new();
    for e in &events {
        let run = e["runId"].as_str().unwrap().to_owned();
        match e["type"].as_str().unwrap() {
            "step.finished" | "step.failed" => {
                let ended = steps.entry(run.clone()).or_default();
                *ended += 1;
                assert_eq!(e["attempt"], *ended, "{run} ends attempts in order");
                assert_eq!(started.get(&run), Some(&*ended), "{run} ends what started");
            }
            "step.started" => {
                let begun = started.entry(run.clone()).or_default();
                *begun += 1;
                assert_eq!(e["attempt"], *begun, "{run} starts attempts in order");
            }
            _ => {}
        }
    }
    assert_eq!(steps, attempts_by_request);
    assert_eq!(started, attempts_by_request);
    let total: u64 = attempts_by_request.values().sum();
    assert_eq!(total, runs.load(Ordering::SeqCst) as u64);
    assert!(total > 1000, "some calls were retried");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_is_logged_with_the_contract_field_names() {
    let (capture, _guard) = capture();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(
            RetryLayer::builder(ToolRegistry::open())
                .seed(1)
                .build()
                .unwrap(),
        )
        .service(tool_fn(move |_call: ToolCall| {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    Err(ToolError::from_http_status(503, "busy"))
                } else {
                    Ok(ToolOutput::new(json!({"hits": 1})))
                }
            }
        }));
    let call = search(json!({"q": 1}));
    run(&mut svc, call.clone()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let events = capture.events();
    let retry = event(&events, "tool_call_retry");
    assert_eq!(retry["requestId"], call.request_id());
    assert_eq!(retry["toolName"], "search");
    assert_eq!(retry["sessionKey"], "sess-42");
    assert_eq!(retry["attempt"], "1");
    assert_eq!(retry["errorCode"], "UPSTREAM_UNAVAILABLE");
    for legacy in ["request_id", "tool", "error_code", "delay_ms"] {
        assert!(!retry.contains_key(legacy), "{legacy} in {retry:?}");
    }
    assert!(retry.contains_key("delayMs"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn credential_shaped_identifiers_are_redacted_in_logs_as_in_the_audit_log() {
    let (capture, _guard) = capture();
    let dir = std::env::temp_dir().join(format!("tower-toolcall-trace-ids-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let audit = AuditLog::builder(&dir).build().unwrap();
    let session = "ghp_S3ss10nKeyLooksLikeAT0kenAbcdef12";
    let correlation = "xoxb-123456789012-C0rrelat10nT0kenValue";
    let request = "AKIAIOSFODNN7EXAMPLE";
    let tool_call = "sk-proj-T00lCallIdLooksLikeAKey0123";
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new().audit(audit.clone()))
        .layer(
            RetryLayer::builder(ToolRegistry::open())
                .seed(1)
                .build()
                .unwrap(),
        )
        .service(tool_fn(|call: ToolCall| async move {
            match call.attempt() {
                1 => Err(ToolError::from_http_status(503, "busy")),
                _ => Ok(ToolOutput::new(json!({"hits": 1}))),
            }
        }));
    let call = ToolCall::builder("agents.tools.web", "search")
        .session(session)
        .actor("user-7")
        .request_id(request)
        .tool_call_id(tool_call)
        .correlation_id(correlation)
        .params(json!({"q": 1}))
        .build()
        .unwrap();
    run(&mut svc, call).await.unwrap();
    audit.shutdown();

    let secrets = [session, correlation, request, tool_call];
    for value in capture.all_values() {
        for secret in secrets {
            assert!(!value.contains(secret), "{secret} in {value}");
        }
    }
    let span = &capture.spans()[0];
    for field in [
        "requestId",
        "sessionKey",
        "correlationId",
        "gen_ai.tool.call.id",
    ] {
        assert_eq!(span.fields[field], "[REDACTED]", "{field}");
    }
    let events = capture.events();
    for name in ["tool_call_start", "tool_call_retry", "tool_call_end"] {
        let fields = event(&events, name);
        assert_eq!(fields["requestId"], "[REDACTED]", "{name}");
        assert_eq!(fields["sessionKey"], "[REDACTED]", "{name}");
    }

    // The audit log names the call the same way.
    let calls = std::fs::read_to_string(dir.join("calls.jsonl")).unwrap();
    let line: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(line["call"]["requestId"], span.fields["requestId"]);
    assert_eq!(
        line["call"]["toolCallId"],
        span.fields["gen_ai.tool.call.id"]
    );
    assert_eq!(
        line["call"]["target"]["sessionKey"],
        span.fields["sessionKey"]
    );
    assert_eq!(
        line["call"]["target"]["correlationId"],
        span.fields["correlationId"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
