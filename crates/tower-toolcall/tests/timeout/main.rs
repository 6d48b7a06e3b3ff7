//! TimeoutLayer: which timeout an attempt gets, and what a timed-out attempt returns.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use support::{call_of, call_once, registry_of, ScriptedTool, Step};
use tokio::time::Instant;
use tower::Layer;
use tower_toolcall::registry::{
    LayerSetting, RiskLevel, TimeoutSettings, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{ErrorCode, ResultStatus, TimeoutLayer, ToolCall, ToolResult};

const WEB: &str = "agents.tools.web";

fn slow(secs: u64) -> ScriptedTool {
    ScriptedTool::always(Step::After(Duration::from_secs(secs), Box::new(Step::Ok)))
}

fn hinted(timeout: Duration) -> ToolCall {
    ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .timeout(timeout)
        .build()
        .unwrap()
}

/// How long a call of `call` through `layer` over a tool that answers after `secs` seconds
/// takes, and whether it timed out.
async fn run(layer: &TimeoutLayer, secs: u64, call: ToolCall) -> (Duration, bool) {
    let tool = slow(secs);
    let mut svc = layer.layer(tool.service());
    let start = Instant::now();
    let outcome = call_once(&mut svc, call).await;
    let timed_out = match outcome {
        Ok(_) => false,
        Err(err) => {
            assert_eq!(err.code(), ErrorCode::Timeout);
            true
        }
    };
    assert_eq!(tool.calls(), 1);
    (start.elapsed(), timed_out)
}

#[tokio::test(start_paused = true)]
async fn the_descriptor_timeout_bounds_an_attempt() {
    let registry = registry_of([ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
        .with_attempt_timeout(Duration::from_secs(2))]);
    let layer = TimeoutLayer::new(registry);
    assert_eq!(
        layer.attempt_timeout(WEB, "search"),
        Some(Duration::from_secs(2))
    );

    assert_eq!(
        run(&layer, 5, call_of(WEB, "search")).await,
        (Duration::from_secs(2), true)
    );
    assert_eq!(
        run(&layer, 1, call_of(WEB, "search")).await,
        (Duration::from_secs(1), false)
    );
}

#[tokio::test(start_paused = true)]
async fn the_call_hint_narrows_but_never_lengthens_it() {
    let registry = registry_of([ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
        .with_attempt_timeout(Duration::from_secs(2))]);
    let layer = TimeoutLayer::new(registry);

    let narrowed = run(&layer, 5, hinted(Duration::from_millis(500))).await;
    assert_eq!(narrowed, (Duration::from_millis(500), true));
    let not_lengthened = run(&layer, 5, hinted(Duration::from_secs(10))).await;
    assert_eq!(not_lengthened, (Duration::from_secs(2), true));
}

#[tokio::test(start_paused = true)]
async fn tools_without_a_timeout_get_the_layer_default() {
    let registry = registry_of([ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)]);
    let layer = TimeoutLayer::new(registry.clone());
    assert_eq!(
        run(&layer, 100, call_of(WEB, "search")).await,
        (Duration::from_secs(30), true)
    );

    let layer = TimeoutLayer::builder(registry.clone())
        .settings(TimeoutSettings::default().with_attempt_timeout_ms(3_000))
        .build()
        .unwrap();
    assert_eq!(
        run(&layer, 100, call_of(WEB, "search")).await,
        (Duration::from_secs(3), true)
    );

    let layer = TimeoutLayer::builder(registry)
        .no_default_timeout()
        .build()
        .unwrap();
    assert_eq!(layer.attempt_timeout(WEB, "search"), None);
    assert_eq!(
        run(&layer, 100, call_of(WEB, "search")).await,
        (Duration::from_secs(100), false)
    );
    let hinted_only = run(&layer, 100, hinted(Duration::from_secs(4))).await;
    assert_eq!(hinted_only, (Duration::from_secs(4), true));
}

#[tokio::test(start_paused = true)]
async fn a_tool_with_the_timeout_off_is_not_bounded_even_by_a_hint() {
    let off = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_timeout(LayerSetting::Off));
    let layer = TimeoutLayer::new(registry_of([off]));
    assert_eq!(
        run(&layer, 100, hinted(Duration::from_secs(1))).await,
        (Duration::from_secs(100), false)
    );
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_a_retriable_timeout() {
    let registry = registry_of([ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
        .with_policy(
            ToolPolicy::default()
                .with_timeout(TimeoutSettings::default().with_attempt_timeout_ms(750)),
        )]);
    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = TimeoutLayer::new(registry).layer(tool.service());
    let call = call_of(WEB, "search");

    let err = call_once(&mut svc, call.clone()).await.unwrap_err();

    assert_eq!(err.code(), ErrorCode::Timeout);
    assert!(err.is_retriable());
    assert!(!err.is_not_processed(), "the tool may have acted");
    assert!(err.message().contains("750 ms"), "{}", err.message());
    let result = ToolResult::from_outcome(&call, Err(err));
    assert_eq!(result.status, ResultStatus::Timeout);
    assert!(result.error.unwrap().retriable);
}

#[test]
fn a_zero_default_timeout_is_refused() {
    let err = TimeoutLayer::builder(ToolRegistry::open())
        .settings(TimeoutSettings::default().with_attempt_timeout_ms(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "timeout.attempt_timeout_ms");
}
