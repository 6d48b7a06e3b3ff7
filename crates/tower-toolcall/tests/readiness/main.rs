//! Every layer, and the whole stack, around a tool whose readiness fails: the readiness error
//! comes out (as an error, or as an error envelope at the edge), the tool is never called
//! after it, and the next call polls readiness again.
//!
//! The tool is a `tower_test` mock: its `call` panics unless its `poll_ready` said ready, and
//! `Handle::send_error` makes its next `poll_ready` fail.

use std::task::Poll;

use serde_json::json;
use tower::util::MapErr;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock::{self, Handle, Spawn};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::trace::TraceLayer;
use tower_toolcall::{
    CircuitBreakerLayer, EnvelopeValidateLayer, ErrorCode, HookLayer, IdempotencyLayer,
    LoopDetectLayer, RateLimitLayer, ResultEnvelopeLayer, ResultStatus, RetryLayer, TimeoutLayer,
    ToolCall, ToolError, ToolHooks, ToolOutput, ToolResult,
};

/// The mock tool, its errors made `ToolError`s.
type MockTool = MapErr<mock::Mock<ToolCall, ToolOutput>, fn(BoxError) -> ToolError>;

type MockHandle = Handle<ToolCall, ToolOutput>;

fn mock_tool() -> (MockTool, MockHandle) {
    let (tool, handle) = mock::pair();
    (
        tool.map_err(unavailable as fn(BoxError) -> ToolError),
        handle,
    )
}

fn unavailable(error: BoxError) -> ToolError {
    ToolError::new(
        ErrorCode::UpstreamUnavailable,
        format!("the tool is unavailable: {error}"),
    )
}

/// The message of the readiness error the mock gives.
const NOT_READY: &str = "the tool is unavailable: worker died";

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new("docs", "lookup", RiskLevel::ReadOnly).with_idempotent(true))
        .build()
        .unwrap()
}

fn lookup() -> ToolCall {
    ToolCall::builder("docs", "lookup")
        .session("sess-1")
        .actor("user-1")
        .request_id("req-1")
        .params(json!({"q": "tower"}))
        .build()
        .unwrap()
}

struct NoHooks;

impl ToolHooks for NoHooks {}

/// Runs `call` on `svc` while the mock tool answers its one request with `answer`.
async fn answered<S, R>(
    svc: &mut Spawn<S>,
    handle: &mut MockHandle,
    answer: Result<ToolOutput, &'static str>,
) -> Result<R, S::Error>
where
    S: Service<ToolCall, Response = R>,
{
    let (outcome, ()) = tokio::join!(svc.call(lookup()), async {
        let (_request, send) = handle.next_request().await.expect("the tool is called");
        match answer {
            Ok(output) => send.send_response(output),
            Err(error) => send.send_error(error),
        }
    });
    outcome
}

fn assert_tool_not_called(handle: &mut MockHandle, layer: &str) {
    assert!(
        handle.poll_request().is_pending(),
        "{layer}: the tool was called after its readiness failed"
    );
}

/// `layer` around the mock: a failed readiness comes out as the error, and once the tool is
/// ready again a call goes through.
async fn check_layer<L>(name: &str, layer: L)
where
    L: Layer<MockTool>,
    L::Service: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let (tool, mut handle) = mock_tool();
    let mut svc = Spawn::new(layer.layer(tool));

    handle.send_error("worker died");
    match svc.poll_ready() {
        Poll::Ready(Err(error)) => {
            assert_eq!(error.code(), ErrorCode::UpstreamUnavailable, "{name}");
            assert_eq!(error.message(), NOT_READY, "{name}");
        }
        other => panic!("{name}: readiness gave {other:?}, not the tool's error"),
    }
    assert_tool_not_called(&mut handle, name);

    handle.allow(1);
    assert!(
        matches!(svc.poll_ready(), Poll::Ready(Ok(()))),
        "{name}: ready again"
    );
    let output = answered(&mut svc, &mut handle, Ok(ToolOutput::new(json!("found"))))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(output.content, json!("found"), "{name}");
}

#[tokio::test(start_paused = true)]
async fn every_layer_passes_a_failed_readiness_on_and_never_calls_the_tool() {
    check_layer("validate", EnvelopeValidateLayer::new(registry())).await;
    check_layer("loop_detect", LoopDetectLayer::new(registry())).await;
    check_layer("rate_limit", RateLimitLayer::new(registry())).await;
    check_layer("idempotency", IdempotencyLayer::in_memory(registry())).await;
    check_layer("retry", RetryLayer::new(registry())).await;
    check_layer("breaker", CircuitBreakerLayer::new(registry())).await;
    check_layer("timeout", TimeoutLayer::new(registry())).await;
    check_layer("trace", TraceLayer::new()).await;
    check_layer("hooks", HookLayer::new(NoHooks)).await;
}

#[tokio::test(start_paused = true)]
async fn retry_stops_when_readiness_fails_between_attempts() {
    let (tool, mut handle) = mock_tool();
    let mut svc = Spawn::new(RetryLayer::new(registry()).layer(tool));
    handle.allow(1);
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));

    // The first attempt fails retriably, then the tool's readiness fails before the second.
    let (outcome, ()) = tokio::join!(svc.call(lookup()), async {
        let (_request, send) = handle.next_request().await.unwrap();
        handle.send_error("worker died");
        send.send_error("overloaded");
    });
    let error = outcome.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(error.message(), NOT_READY);
    assert_eq!(error.record().attempts, Some(1));
    assert_eq!(error.record().retried_by.len(), 1);
    assert_tool_not_called(&mut handle, "retry");
}

/// The error envelope of a call whose stack was not ready.
fn not_ready_envelope() -> serde_json::Value {
    json!({
        "requestId": "req-1",
        "status": "retriable_error",
        "fromCache": false,
        "toolName": "lookup",
        "durationMs": 0,
        "attempts": 0,
        "error": {
            "code": "UPSTREAM_UNAVAILABLE",
            "message": NOT_READY,
            "retriable": true,
            "terminal": false
        }
    })
}

/// `svc` at the edge around the mock: a failed readiness answers the next call with an error
/// envelope without calling the tool, and the call after that runs the tool.
async fn check_edge<S>(mut svc: Spawn<S>, mut handle: MockHandle)
where
    S: Service<ToolCall, Response = ToolResult, Error = std::convert::Infallible>,
{
    handle.send_error("worker died");
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    let result = svc.call(lookup()).await.unwrap();
    assert_eq!(serde_json::to_value(&result).unwrap(), not_ready_envelope());
    assert_tool_not_called(&mut handle, "edge");

    handle.allow(1);
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    let result = answered(&mut svc, &mut handle, Ok(ToolOutput::new(json!("found"))))
        .await
        .unwrap();
    assert_eq!(result.status, ResultStatus::Success);
    assert_eq!(result.output.unwrap().content, json!("found"));
}

#[tokio::test(start_paused = true)]
async fn the_result_envelope_answers_a_failed_readiness_without_calling_the_tool() {
    let (tool, handle) = mock_tool();
    check_edge(Spawn::new(ResultEnvelopeLayer::new().layer(tool)), handle).await;
}

#[tokio::test(start_paused = true)]
async fn the_whole_stack_answers_a_failed_readiness_without_calling_the_tool() {
    let (tool, handle) = mock_tool();
    let registry = registry();
    let stack = ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(TraceLayer::new())
        .layer(EnvelopeValidateLayer::new(registry.clone()))
        .layer(LoopDetectLayer::new(registry.clone()))
        .layer(RateLimitLayer::new(registry.clone()))
        .layer(IdempotencyLayer::in_memory(registry.clone()))
        .layer(RetryLayer::new(registry.clone()))
        .layer(CircuitBreakerLayer::new(registry.clone()))
        .layer(TimeoutLayer::new(registry))
        .layer(HookLayer::new(NoHooks))
        .service(tool);
    check_edge(Spawn::new(stack), handle).await;
}
