//! A caller's `transport.retryPolicy`: it narrows the tool's policy, never widens it; a wider
//! field is clamped and listed in the result's `retryPolicyClamped`; a value out of range is
//! refused naming the field.

use proptest::prelude::*;
use tower_toolcall::envelope::CallRetryPolicy;
use tower_toolcall::RetryClamp;

use super::*;

fn caller(change: impl FnOnce(&mut CallRetryPolicy)) -> CallRetryPolicy {
    let mut policy = CallRetryPolicy::default();
    change(&mut policy);
    policy
}

fn call_with(policy: CallRetryPolicy) -> ToolCall {
    ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .retry_policy(policy)
        .build()
        .unwrap()
}

/// A search tool of 4 attempts, a fixed delay of 100 ms (no jitter spread) capped at 1 s.
fn layer() -> RetryLayer {
    let settings = RetrySettings::default()
        .with_max_attempts(4)
        .with_base_delay_ms(100)
        .with_max_delay_ms(1_000)
        .with_jitter(JitterKind::Percent)
        .with_jitter_percent(0);
    RetryLayer::builder(registry_of([search()]))
        .settings(settings)
        .no_budget()
        .seed(1)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn fewer_attempts_and_slower_backoff_are_followed() {
    let tool = ScriptedTool::always(unavailable());
    let mut svc = layer().layer(tool.service());
    let policy = caller(|p| {
        p.max_attempts = Some(3);
        p.initial_delay_ms = Some(200);
        p.backoff_multiplier = Some(3.0);
    });
    let err = call_once(&mut svc, call_with(policy)).await.unwrap_err();
    assert_eq!(tool.calls(), 3, "the caller's 3 attempts, not the tool's 4");
    let delays: Vec<u64> = err.record().retried_by.iter().map(|r| r.delay_ms).collect();
    assert_eq!(delays, [200, 600], "200 ms growing ×3");
    assert!(
        err.record().retry_clamped.is_empty(),
        "nothing asked for more"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wider_request_is_clamped_and_listed_never_refused() {
    let tool = ScriptedTool::always(unavailable());
    let mut svc = layer().layer(tool.service());
    let policy = caller(|p| {
        p.max_attempts = Some(10);
        p.initial_delay_ms = Some(10);
        p.max_delay_ms = Some(60_000);
        p.backoff_multiplier = Some(1.0);
        p.jitter_percent = Some(50);
    });
    let call = call_with(policy);
    let err = call_once(&mut svc, call.clone()).await.unwrap_err();
    assert_eq!(tool.calls(), 4, "the tool's 4 attempts");
    let delays: Vec<u64> = err.record().retried_by.iter().map(|r| r.delay_ms).collect();
    assert_eq!(delays, [100, 200, 400], "the tool's base and doubling");
    let clamped = &err.record().retry_clamped;
    assert_eq!(
        clamped,
        &vec![
            RetryClamp::new("maxAttempts", 10, 4),
            RetryClamp::new("initialDelayMs", 10, 100),
            RetryClamp::new("maxDelayMs", 60_000, 1_000),
            RetryClamp::new("backoffMultiplier", 1.0, 2.0),
            RetryClamp::new("jitterPercent", 50, 0),
        ]
    );
    let result = ToolResult::from_outcome(&call, Err(err));
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(
        json["retryPolicyClamped"][0],
        json!({"field": "maxAttempts", "requested": 10, "applied": 4})
    );
    assert_eq!(result.status, ResultStatus::RetryExhausted);
}

#[tokio::test(start_paused = true)]
async fn only_listed_errors_are_retried() {
    let tool = ScriptedTool::new([unavailable(), Step::Ok]);
    let mut svc = layer().layer(tool.service());
    let policy = caller(|p| p.retryable_errors = Some(vec!["TIMEOUT".into()]));
    let err = call_once(&mut svc, call_with(policy)).await.unwrap_err();
    assert_eq!(
        tool.calls(),
        1,
        "UPSTREAM_UNAVAILABLE is not in the caller's list"
    );
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);

    let tool = ScriptedTool::new([unavailable(), Step::Ok]);
    let mut svc = layer().layer(tool.service());
    let policy = caller(|p| p.retryable_errors = Some(vec!["UPSTREAM_UNAVAILABLE".into()]));
    call_once(&mut svc, call_with(policy)).await.unwrap();
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_listed_error_the_tool_would_not_retry_is_not_retried() {
    let tool = ScriptedTool::always(Step::Fail(ToolError::from_http_status(404, "gone")));
    let mut svc = layer().layer(tool.service());
    let policy = caller(|p| p.retryable_errors = Some(vec!["NOT_FOUND".into()]));
    call_once(&mut svc, call_with(policy)).await.unwrap_err();
    assert_eq!(tool.calls(), 1);
}

#[test]
fn values_out_of_range_are_refused_naming_the_field() {
    let refused = |policy: serde_json::Value| {
        let err = ToolCall::from_value(json!({
            "contractVersion": "1.1", "requestId": "r", "toolName": "search",
            "toolNamespace": WEB, "target": {"sessionKey": "s", "actorId": "u"},
            "payload": {"version": "1.0", "params": {}},
            "transport": {"retryPolicy": policy},
        }))
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValidationError);
        err.message().to_owned()
    };
    for (policy, field) in [
        (
            json!({"maxAttempts": 0}),
            "`transport.retryPolicy.maxAttempts`",
        ),
        (
            json!({"backoffMultiplier": 0.5}),
            "`transport.retryPolicy.backoffMultiplier`",
        ),
        (
            json!({"jitterPercent": 101}),
            "`transport.retryPolicy.jitterPercent`",
        ),
        (
            json!({"initialDelayMs": 500, "maxDelayMs": 100}),
            "`transport.retryPolicy.maxDelayMs`",
        ),
        (
            json!({"retryableErrors": ["TIMEOUT", "SLOW"]}),
            "`transport.retryPolicy.retryableErrors[1]`",
        ),
        (json!({"initialDelayMs": -1}), "initialDelayMs"),
    ] {
        let message = refused(policy.clone());
        assert!(message.contains(field), "{policy}: {message}");
    }
}

#[test]
fn the_policy_round_trips_in_the_envelope() {
    let policy = caller(|p| {
        p.max_attempts = Some(2);
        p.initial_delay_ms = Some(150);
        p.max_delay_ms = Some(900);
        p.backoff_multiplier = Some(2.5);
        p.jitter_percent = Some(10);
        p.retryable_errors = Some(vec!["TIMEOUT".into()]);
    });
    let call = call_with(policy.clone());
    let json = serde_json::to_value(call.envelope()).unwrap();
    assert_eq!(
        json["transport"]["retryPolicy"],
        json!({"maxAttempts": 2, "initialDelayMs": 150, "maxDelayMs": 900,
               "backoffMultiplier": 2.5, "jitterPercent": 10, "retryableErrors": ["TIMEOUT"]})
    );
    let back = ToolCall::from_value(json).unwrap();
    assert_eq!(back.transport().retry_policy.as_ref(), Some(&policy));
}

proptest! {
    /// Whatever the caller asks, its call gets no more attempts than the tool's (nor than
    /// the caller's), and every delay within the tool's bounds: its base delay to its cap.
    #[test]
    fn the_effective_policy_is_never_wider_than_the_tools(
        max_attempts in proptest::option::of(1u32..20),
        initial in proptest::option::of(0u64..5_000),
        max in proptest::option::of(0u64..10_000),
        multiplier in proptest::option::of(1.0f64..10.0),
        percent in proptest::option::of(0u32..=100),
        failures in 1usize..8,
    ) {
        prop_assume!(match (initial, max) { (Some(i), Some(m)) => m >= i, _ => true });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut steps: Vec<Step> = (0..failures).map(|_| unavailable()).collect();
            steps.push(Step::Ok);
            let tool = ScriptedTool::new(steps);
            let mut svc = layer().layer(tool.service());
            let policy = caller(|p| {
                p.max_attempts = max_attempts;
                p.initial_delay_ms = initial;
                p.max_delay_ms = max;
                p.backoff_multiplier = multiplier;
                p.jitter_percent = percent;
            });
            let outcome = call_once(&mut svc, call_with(policy)).await;
            let record = match &outcome {
                Ok(output) => output.record().clone(),
                Err(error) => error.record().clone(),
            };
            prop_assert!(tool.calls() <= 4, "{} attempts", tool.calls());
            if let Some(asked) = max_attempts {
                prop_assert!(tool.calls() as u32 <= asked.max(1));
            }
            for (k, retry) in record.retried_by.iter().enumerate() {
                prop_assert!(
                    (100..=1_000).contains(&retry.delay_ms),
                    "retry {}: {} ms is outside the tool's 100..=1000",
                    k + 1,
                    retry.delay_ms
                );
            }
            Ok(())
        })?;
    }
}
