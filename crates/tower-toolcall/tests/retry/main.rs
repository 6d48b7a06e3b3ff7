//! RetryLayer: what is retried, how long it waits, when it gives up, and what it records.

#[path = "../support/mod.rs"]
mod support;

mod caller_policy;
mod hedge;

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use support::{call_of, call_once, registry_of, ScriptedTool, Step};
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder};
use tower_toolcall::breaker::{BreakerKey, CircuitBreakerLayer};
use tower_toolcall::registry::{
    ClassifyOverrides, JitterKind, LayerSetting, OnLimit, RateLimitKey, RateLimitSettings,
    RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::retry::{Backoff, GlobalRetryBudget};
use tower_toolcall::{
    BreakerState, CallRecord, ErrorCode, HookLayer, RateLimitLayer, ResultStatus, RetryLayer,
    RetryRecord, TimeoutLayer, ToolCall, ToolError, ToolHooks, ToolResult,
};

const WEB: &str = "agents.tools.web";
const VAULT: &str = "vault";

fn search() -> ToolDescriptor {
    ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
}

fn create_file() -> ToolDescriptor {
    ToolDescriptor::new(VAULT, "createFile", RiskLevel::Writes)
}

fn unavailable() -> Step {
    Step::Fail(ToolError::from_http_status(503, "upstream returned 503"))
}

/// The delays of full jitter with `seed`, drawn as the docs say: before retry k,
/// `random(0, min(4000, 200 · 2^(k−1)))` milliseconds.
fn full_jitter(seed: u64, retries: u32) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (1..=retries)
        .map(|k| rng.random_range(0..=(200u64 << (k - 1)).min(4000)))
        .collect()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(start_paused = true)]
async fn tr5_a_timed_out_attempt_is_retried_after_the_seeded_delay() {
    let registry = registry_of([search().with_attempt_timeout(Duration::from_secs(1))]);
    let tool = ScriptedTool::new([
        Step::After(Duration::from_secs(5), Box::new(Step::Ok)),
        Step::Ok,
    ]);
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder(registry.clone())
                .seed(7)
                .build()
                .unwrap(),
        )
        .layer(TimeoutLayer::new(registry))
        .service(tool.service());

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    let [delay] = full_jitter(7, 1)[..] else {
        unreachable!()
    };
    assert_eq!(tool.calls(), 2);
    let times = tool.call_times();
    assert_eq!(
        times[1] - times[0],
        Duration::from_secs(1) + Duration::from_millis(delay),
        "the retry comes after the 1 s timeout and the jittered delay"
    );
    assert_eq!(out.record().attempts, Some(2));
    assert_eq!(
        out.record().retried_by,
        vec![RetryRecord::new(1, delay, "TIMEOUT", 1000)]
    );
}

#[tokio::test(start_paused = true)]
async fn successive_delays_are_successive_draws_of_the_seeded_generator() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::new([unavailable(), unavailable(), unavailable(), Step::Ok]);
    let mut svc = RetryLayer::builder(registry)
        .seed(99)
        .build()
        .unwrap()
        .layer(tool.service());
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    let delays = full_jitter(99, 3);
    let recorded: Vec<u64> = out.record().retried_by.iter().map(|r| r.delay_ms).collect();
    assert_eq!(recorded, delays);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(delays.iter().sum()),
        "the call took exactly the delays"
    );
    // The library's backoff agrees with the formula.
    let mut rng = SmallRng::seed_from_u64(99);
    let backoff = Backoff::new(
        Duration::from_millis(200),
        Duration::from_secs(4),
        JitterKind::Full,
        0,
    );
    let computed: Vec<u64> = (1..=3)
        .map(|k| backoff.delay(k, None, &mut rng).as_millis() as u64)
        .collect();
    assert_eq!(computed, delays);
}

#[tokio::test(start_paused = true)]
async fn tr6_a_400_is_answered_after_one_attempt_as_terminal() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::always(Step::Fail(ToolError::from_http_status(400, "bad query")));
    let mut svc = RetryLayer::new(registry).layer(tool.service());
    let call = call_of(WEB, "search");

    let err = call_once(&mut svc, call.clone()).await.unwrap_err();

    assert_eq!(tool.calls(), 1);
    assert_eq!(err.code(), ErrorCode::ValidationError);
    let result = ToolResult::from_outcome(&call, Err(err));
    assert_eq!(result.status, ResultStatus::Error);
    assert_eq!(result.attempts, 1);
    let error = result.error.unwrap();
    assert!(error.terminal && !error.retriable);
    assert_eq!(result.retried_by, None);
}

#[tokio::test(start_paused = true)]
async fn tr7_always_503_is_exhausted_after_four_attempts_within_the_deadline() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::always(unavailable());
    let breaker = CircuitBreakerLayer::new(registry.clone());
    let admin = breaker.admin();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::builder(registry).seed(3).build().unwrap())
        .layer(breaker)
        .service(tool.service());
    let call = call_of(WEB, "search");
    let start = Instant::now();

    let err = call_once(&mut svc, call.clone()).await.unwrap_err();

    let delays = full_jitter(3, 3);
    assert_eq!(tool.calls(), 4);
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(
        err.message(),
        "search failed 4 times: upstream returned 503"
    );
    assert_eq!(
        err.details().unwrap(),
        &json!({
            "reason": "max_attempts",
            "attempts": 4,
            "lastError": {
                "code": "UPSTREAM_UNAVAILABLE",
                "message": "upstream returned 503",
                "httpStatus": 503
            }
        })
    );
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<ToolError>())
        .expect("the last error is the source");
    assert_eq!(source.http_status(), Some(503));
    let total: u64 = delays.iter().sum();
    assert_eq!(start.elapsed(), Duration::from_millis(total));
    assert!(start.elapsed() < Duration::from_secs(30));

    let status = admin.status(&BreakerKey::tool(WEB, "search")).unwrap();
    assert_eq!(status.stats.failures, 4, "the breaker saw every attempt");
    assert_eq!(status.consecutive_failures, 4);

    let result = ToolResult::from_outcome(&call, Err(err));
    let json = serde_json::to_value(&result).unwrap();
    let retried: Vec<_> = delays
        .iter()
        .enumerate()
        .map(|(i, d)| {
            json!({"attempt": i + 1, "delayMs": d, "reasonCode": "UPSTREAM_UNAVAILABLE", "latencyMs": 0})
        })
        .collect();
    assert_eq!(
        json,
        json!({
            "requestId": call.request_id(),
            "status": "retry_exhausted",
            "fromCache": false,
            "toolName": "search",
            "durationMs": 0,
            "attempts": 4,
            "error": {
                "code": "RETRY_EXHAUSTED",
                "message": "search failed 4 times: upstream returned 503",
                "retriable": false,
                "terminal": true,
                "breakerState": "closed",
                "details": {
                    "reason": "max_attempts",
                    "attempts": 4,
                    "lastError": {
                        "code": "UPSTREAM_UNAVAILABLE",
                        "message": "upstream returned 503",
                        "httpStatus": 503
                    }
                }
            },
            "retriedBy": retried
        })
    );
}

#[tokio::test(start_paused = true)]
async fn tr11_nothing_is_retried_while_the_breaker_is_open() {
    let registry = registry_of([create_file().with_idempotent(true)]);
    let tool = ScriptedTool::always(unavailable());
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder(registry.clone())
                .seed(1)
                .build()
                .unwrap(),
        )
        .layer(CircuitBreakerLayer::new(registry))
        .service(tool.service());

    // Four attempts: four failures, the breaker (5 consecutive) stays closed.
    let first = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(first.code(), ErrorCode::RetryExhausted);
    assert_eq!(tool.calls(), 4);

    // The fifth failure opens it; the retry that follows is refused and not retried again.
    let call = call_of(VAULT, "createFile");
    let second = call_once(&mut svc, call.clone()).await.unwrap_err();
    assert_eq!(tool.calls(), 5);
    assert_eq!(second.code(), ErrorCode::CircuitOpen);
    assert_eq!(second.record().attempts, Some(1));
    assert_eq!(second.record().retried_by.len(), 1);
    assert_eq!(
        ToolResult::from_outcome(&call, Err(second)).status,
        ResultStatus::CircuitOpen
    );

    // While open: one refusal, no call, no retry.
    let third = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(third.code(), ErrorCode::CircuitOpen);
    assert!(third.is_rejected());
    assert!(third.record().retried_by.is_empty());
    assert_eq!(tool.calls(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_mutating_tool_is_not_retried_after_an_ambiguous_timeout() {
    let registry = registry_of([create_file().with_attempt_timeout(Duration::from_secs(1))]);
    let tool = ScriptedTool::new([Step::Hang, Step::Ok]);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(registry.clone()))
        .layer(TimeoutLayer::new(registry))
        .service(tool.service());

    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();

    assert_eq!(err.code(), ErrorCode::Timeout);
    assert_eq!(
        tool.calls(),
        1,
        "the write may have happened: no second one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mutating_tool_is_retried_after_connection_refused() {
    let registry = registry_of([create_file()]);
    let refused = ToolError::from_io_error(io::Error::from(io::ErrorKind::ConnectionRefused));
    let tool = ScriptedTool::new([Step::Fail(refused), Step::Ok]);
    let mut svc = RetryLayer::builder(registry)
        .seed(5)
        .build()
        .unwrap()
        .layer(tool.service());

    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();

    assert_eq!(tool.calls(), 2);
    assert_eq!(
        out.record().retried_by[0].reason_code,
        "UPSTREAM_UNAVAILABLE"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mutating_tool_is_retried_when_a_forwarded_key_or_the_caller_makes_it_safe() {
    let forwarding = create_file().with_policy(
        ToolPolicy::default()
            .with_retry(RetrySettings::default().with_forwards_idempotency_key(true)),
    );
    let reset = || ToolError::from_io_error(io::Error::from(io::ErrorKind::ConnectionReset));
    let cases: [(&str, ToolDescriptor, ToolCall, usize); 4] = [
        (
            "key forwarded by the tool",
            forwarding.clone(),
            ToolCall::builder(VAULT, "createFile")
                .session("s")
                .actor("u")
                .idempotency_key("create-1")
                .build()
                .unwrap(),
            2,
        ),
        (
            "key the tool does not forward",
            create_file(),
            ToolCall::builder(VAULT, "createFile")
                .session("s")
                .actor("u")
                .idempotency_key("create-1")
                .build()
                .unwrap(),
            1,
        ),
        (
            "caller vouches",
            create_file(),
            ToolCall::builder(VAULT, "createFile")
                .session("s")
                .actor("u")
                .expected_retry_safe(true)
                .build()
                .unwrap(),
            2,
        ),
        (
            "safety-critical call of a forwarding tool",
            forwarding,
            ToolCall::builder(VAULT, "createFile")
                .session("s")
                .actor("u")
                .idempotency_key("create-1")
                .safety_critical(true)
                .build()
                .unwrap(),
            1,
        ),
    ];
    for (name, descriptor, call, calls) in cases {
        let tool = ScriptedTool::new([Step::Fail(reset()), Step::Ok]);
        let mut svc = RetryLayer::new(registry_of([descriptor])).layer(tool.service());
        let outcome = call_once(&mut svc, call).await;
        assert_eq!(tool.calls(), calls, "{name}");
        assert_eq!(outcome.is_ok(), calls == 2, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_calls_against_a_dead_tool_stay_within_the_global_budget() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::always(unavailable());
    let layer = RetryLayer::builder(registry).seed(11).build().unwrap();
    let budget = layer.budget().unwrap().clone();
    let svc = layer.layer(tool.service());
    let start = Instant::now();

    let calls = (0..1000).map(|_| {
        let mut svc = svc.clone();
        async move { call_once(&mut svc, call_of(WEB, "search")).await }
    });
    let outcomes = futures::future::join_all(calls).await;

    let retries = tool.calls() - 1000;
    let seconds = start.elapsed().as_secs_f64();
    let allowed = GlobalRetryBudget::DEFAULT_CAPACITY
        + GlobalRetryBudget::DEFAULT_RETRY_RATIO * 1000.0
        + GlobalRetryBudget::DEFAULT_MIN_PER_SECOND * seconds;
    assert!(
        (retries as f64) <= allowed,
        "{retries} retries, the budget allows {allowed}"
    );
    assert!(
        retries >= 250,
        "the budget's share was used: {retries} retries"
    );
    assert_eq!(budget.stats().granted, retries as u64);
    let spent = outcomes
        .iter()
        .filter(|o| o.as_ref().unwrap_err().details().unwrap()["reason"] == "retry_budget")
        .count();
    assert!(
        spent > 500,
        "most calls were told the budget is spent: {spent}"
    );
    let spent_error = outcomes
        .iter()
        .find_map(|o| {
            o.as_ref()
                .err()
                .filter(|e| e.details().unwrap()["reason"] == "retry_budget")
        })
        .unwrap();
    assert_eq!(spent_error.code(), ErrorCode::RetryExhausted);
    assert!(spent_error.message().contains("retry budget"));
}

#[tokio::test(start_paused = true)]
async fn retry_after_sets_the_delay() {
    let registry = registry_of([search()]);
    let throttled =
        ToolError::from_http_status(429, "slow down").with_retry_after(Duration::from_secs(2));
    let tool = ScriptedTool::new([Step::Fail(throttled), Step::Ok]);
    let mut svc = RetryLayer::new(registry).layer(tool.service());

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    let times = tool.call_times();
    assert_eq!(times[1] - times[0], Duration::from_secs(2));
    assert_eq!(out.record().retried_by[0].delay_ms, 2000);
    assert_eq!(out.record().retried_by[0].reason_code, "RATE_LIMITED");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_deadline_is_not_waited_for() {
    let registry = registry_of([search()]);
    let throttled =
        ToolError::from_http_status(429, "slow down").with_retry_after(Duration::from_secs(60));
    let tool = ScriptedTool::new([Step::Fail(throttled), Step::Ok]);
    let mut svc = RetryLayer::new(registry).layer(tool.service());
    let start = Instant::now();

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(tool.calls(), 1);
    // Nothing ran: the throttle's own code, retriable, with its time to come back.
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert!(err.is_retriable() && err.is_not_processed());
    assert_eq!(err.details().unwrap()["reason"], "retry_deadline");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
}

#[tokio::test(start_paused = true)]
async fn a_dependency_restarting_through_every_attempt_is_unavailable_and_retriable() {
    let registry = registry_of([create_file()]);
    let restarting = ToolError::new(
        ErrorCode::UpstreamUnavailable,
        "the MCP server vault is restarting; the call did not run; call again in 100 ms",
    )
    .not_processed(true)
    .with_retry_after(Duration::from_millis(100));
    let tool = ScriptedTool::always(Step::Fail(restarting));
    let mut svc = RetryLayer::builder(registry)
        .seed(5)
        .build()
        .unwrap()
        .layer(tool.service());

    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();

    assert_eq!(tool.calls(), 4);
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
    assert!(err.is_retriable() && err.is_not_processed(), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_millis(100)));
    assert!(
        err.message().starts_with("createFile never ran: "),
        "{}",
        err.message()
    );
    assert_eq!(err.details().unwrap()["attempts"], 4);
    let result = ToolResult::from_outcome(&call_of(VAULT, "createFile"), Err(err));
    let error = result.error.unwrap();
    assert!(error.retriable && !error.terminal);
    assert_eq!(error.retry_after_ms, Some(100));
}

#[tokio::test(start_paused = true)]
async fn a_terminal_answer_never_carries_a_retry_hint() {
    // The tool ran (a 500 after it acted), then the dependency asked for time: exhausted,
    // terminal, and no hint beside it.
    let registry = registry_of([search()]);
    let throttled =
        ToolError::from_http_status(429, "slow down").with_retry_after(Duration::from_millis(10));
    let tool = ScriptedTool::new([
        Step::Fail(ToolError::from_http_status(500, "oops")),
        Step::Fail(throttled.clone()),
        Step::Fail(throttled.clone()),
        Step::Fail(throttled),
    ]);
    let mut svc = RetryLayer::builder(registry)
        .seed(5)
        .build()
        .unwrap()
        .layer(tool.service());

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(tool.calls(), 4);
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert!(!err.is_retriable());
    assert_eq!(err.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn a_call_deadline_shorter_than_the_backoff_stops_early_with_timeout() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::new([unavailable(), Step::Ok]);
    // Equal jitter over a 2 s base: the first delay is between 1 and 2 s.
    let mut svc = RetryLayer::builder(registry)
        .settings(
            RetrySettings::default()
                .with_base_delay_ms(2_000)
                .with_jitter(JitterKind::Equal),
        )
        .build()
        .unwrap()
        .layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .deadline_at_ms(unix_ms() + 1000)
        .build()
        .unwrap();
    let start = Instant::now();

    let err = call_once(&mut svc, call.clone()).await.unwrap_err();

    assert_eq!(start.elapsed(), Duration::ZERO, "it does not sleep in vain");
    assert_eq!(tool.calls(), 1);
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert_eq!(err.details().unwrap()["reason"], "call_deadline");
    assert_eq!(
        err.details().unwrap()["lastError"]["code"],
        "UPSTREAM_UNAVAILABLE"
    );
    assert_eq!(
        ToolResult::from_outcome(&call, Err(err)).status,
        ResultStatus::Timeout
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_budget_of_the_envelope_narrows_attempts_and_time() {
    let registry = registry_of([search()]);

    let tool = ScriptedTool::always(unavailable());
    let mut svc = RetryLayer::new(registry.clone()).layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .retry_budget(2, Duration::from_secs(30))
        .build()
        .unwrap();
    let err = call_once(&mut svc, call).await.unwrap_err();
    assert_eq!(tool.calls(), 2);
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(err.record().attempts, Some(2));

    let tool = ScriptedTool::always(unavailable());
    let mut svc = RetryLayer::builder(registry)
        .settings(
            RetrySettings::default()
                .with_base_delay_ms(2_000)
                .with_jitter(JitterKind::Equal),
        )
        .build()
        .unwrap()
        .layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .retry_budget(4, Duration::from_millis(900))
        .build()
        .unwrap();
    let err = call_once(&mut svc, call).await.unwrap_err();
    assert_eq!(tool.calls(), 1);
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(err.details().unwrap()["reason"], "retry_deadline");
    assert!(err.message().contains("900 ms"), "{}", err.message());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_the_attempt_in_flight() {
    let registry = registry_of([search()]);
    let tool = ScriptedTool::new([unavailable(), Step::Hang]);
    let mut svc = RetryLayer::builder(registry)
        .settings(RetrySettings::default().with_deadline_ms(3_000))
        .seed(2)
        .build()
        .unwrap()
        .layer(tool.service());
    let start = Instant::now();

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(tool.calls(), 2);
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(err.details().unwrap()["reason"], "retry_deadline");
    assert_eq!(err.details().unwrap()["lastError"]["code"], "TIMEOUT");
    assert_eq!(err.record().attempts, Some(2));
    assert!(err.message().contains("while an attempt was running"));

    // The call's own deadline ends it the same way, as a timeout.
    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = RetryLayer::new(registry_of([search()])).layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .deadline_at_ms(unix_ms() + 1500)
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call_once(&mut svc, call).await.unwrap_err();
    assert!(
        start.elapsed() > Duration::from_millis(1400)
            && start.elapsed() <= Duration::from_millis(1500)
    );
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert_eq!(err.details().unwrap()["reason"], "call_deadline");
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_is_not_attempted() {
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = RetryLayer::new(registry_of([search()])).layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .deadline_at_ms(unix_ms() - 1)
        .build()
        .unwrap();

    let err = call_once(&mut svc, call).await.unwrap_err();

    assert_eq!(tool.calls(), 0);
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert!(err.is_not_processed());
    assert!(err.is_rejected());
}

#[tokio::test(start_paused = true)]
async fn per_tool_policy_overrides_and_off() {
    let terminal_503 =
        search()
            .with_policy(ToolPolicy::default().with_classify(
                ClassifyOverrides::default().with_terminal_http_statuses(vec![503]),
            ));
    let two_attempts = ToolDescriptor::new(WEB, "fetch", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_retry(
            RetrySettings::default()
                .with_max_attempts(2)
                .with_jitter(JitterKind::Percent)
                .with_jitter_percent(10),
        ),
    );
    let off = ToolDescriptor::new(WEB, "crawl", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_retry(LayerSetting::Off));
    let registry = registry_of([terminal_503, two_attempts, off]);
    let layer = RetryLayer::builder(registry).seed(4).build().unwrap();
    assert_eq!(layer.policy(WEB, "fetch").unwrap().max_attempts(), 2);
    assert_eq!(layer.policy(WEB, "search").unwrap().max_attempts(), 4);
    assert!(layer.policy(WEB, "crawl").is_none());

    let tool = ScriptedTool::always(unavailable());
    let mut svc = layer.layer(tool.service());

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 1, "503 is terminal for search");
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);

    let err = call_once(&mut svc, call_of(WEB, "fetch"))
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 3, "fetch makes two attempts");
    let mut rng = SmallRng::seed_from_u64(4);
    let expected = rng.random_range(180..=220u64);
    assert_eq!(
        err.record().retried_by[0].delay_ms,
        expected,
        "±10 % of 200 ms"
    );

    let err = call_once(&mut svc, call_of(WEB, "crawl"))
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 4, "crawl is not retried");
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(err.record().attempts, None, "and its record is untouched");
}

#[tokio::test(start_paused = true)]
async fn a_success_on_the_first_attempt_leaves_the_record_alone() {
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = RetryLayer::new(registry_of([search()])).layer(tool.service());
    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    assert_eq!(out.record(), &CallRecord::EMPTY);
    assert_eq!(tool.calls(), 1);
}

#[test]
fn invalid_configuration_names_the_field() {
    let open = ToolRegistry::open;
    let field =
        |r: Result<RetryLayer, tower_toolcall::ConfigError>| r.unwrap_err().field().to_owned();
    let with = |settings: RetrySettings| RetryLayer::builder(open()).settings(settings).build();
    assert_eq!(
        field(with(RetrySettings::default().with_max_attempts(0))),
        "retry.max_attempts"
    );
    assert_eq!(
        field(with(
            RetrySettings::default()
                .with_base_delay_ms(2_000)
                .with_max_delay_ms(1_000)
        )),
        "retry.max_delay_ms"
    );
    assert_eq!(
        field(with(RetrySettings::default().with_jitter_percent(150))),
        "retry.jitter_percent"
    );
    assert_eq!(
        field(with(RetrySettings::default().with_deadline_ms(0))),
        "retry.deadline_ms"
    );
    // A tool's override that contradicts the layer's numbers.
    let low_cap = search().with_policy(
        ToolPolicy::default().with_retry(RetrySettings::default().with_max_delay_ms(100)),
    );
    let err = RetryLayer::builder(registry_of([low_cap]))
        .build()
        .unwrap_err();
    assert_eq!(
        err.field(),
        "tools[agents.tools.web::search].policy.retry.max_delay_ms"
    );
    assert!(err.to_string().contains("base delay (200 ms)"), "{err}");
    // The registry itself refuses a policy of 0 attempts.
    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "read-only",
            "policy": {"retry": {"max_attempts": 0}}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.retry.max_attempts");
    let err = GlobalRetryBudget::builder()
        .capacity(0.0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "retry.budget.capacity");
}

#[tokio::test(start_paused = true)]
async fn one_call_through_stacks_of_two_registries_gets_each_registrys_policy() {
    let attempts = |max_attempts| {
        search().with_policy(
            ToolPolicy::default()
                .with_retry(RetrySettings::default().with_max_attempts(max_attempts)),
        )
    };
    // In the second registry, another tool sorts before `search`: the tool's index differs.
    let crawl = ToolDescriptor::new(WEB, "crawl", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_retry(LayerSetting::Off));
    let (two, three) = (
        registry_of([attempts(2)]),
        registry_of([attempts(3), crawl]),
    );
    let tool = ScriptedTool::always(unavailable());
    let mut twice = RetryLayer::new(two).layer(tool.service());
    let mut thrice = RetryLayer::new(three).layer(tool.service());

    // The same call alternates between the stacks, each time as the tool received it from
    // the other: each stack looks the tool up in its own registry, whatever the other found.
    let mut call = call_of(WEB, "search");
    let mut expected = 0;
    for (in_three, runs) in [(false, 2), (true, 3), (false, 2)] {
        let err = if in_three {
            call_once(&mut thrice, call).await
        } else {
            call_once(&mut twice, call).await
        }
        .unwrap_err();
        call = tool.received().pop().expect("the tool received the call");
        expected += runs;
        assert_eq!(err.record().attempts, Some(runs));
        assert_eq!(tool.calls(), expected as usize);
    }
}

// ---------------------------------------------------------------------------------------------
// Policies: what the layer and a tool's overrides set, read back, with the bounds themselves
// allowed.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_policy_keeps_the_numbers_it_was_given_and_its_bounds_are_allowed() {
    let layer = RetryLayer::builder(ToolRegistry::open())
        .settings(
            RetrySettings::default()
                .with_max_attempts(3)
                .with_base_delay_ms(1_000)
                .with_max_delay_ms(1_000)
                .with_jitter(JitterKind::Percent)
                .with_jitter_percent(100)
                .with_deadline_ms(10_000)
                .with_forwards_idempotency_key(true),
        )
        .build()
        .unwrap();
    let policy = layer.policy("any", "tool").unwrap();
    assert_eq!(policy.max_attempts(), 3);
    assert_eq!(policy.deadline(), Duration::from_secs(10));
    assert!(policy.forwards_idempotency_key());
    assert_eq!(
        policy.backoff(),
        &Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
            JitterKind::Percent,
            100
        )
    );

    let overridden = search().with_policy(
        ToolPolicy::default().with_retry(
            RetrySettings::default()
                .with_max_attempts(1)
                .with_base_delay_ms(50)
                .with_max_delay_ms(50)
                .with_deadline_ms(700)
                .with_jitter(JitterKind::Percent)
                .with_jitter_percent(100)
                .with_forwards_idempotency_key(true),
        ),
    );
    let layer = RetryLayer::new(registry_of([overridden, create_file()]));
    let policy = layer.policy(WEB, "search").unwrap();
    assert_eq!(policy.max_attempts(), 1);
    assert_eq!(policy.deadline(), Duration::from_millis(700));
    assert!(policy.forwards_idempotency_key());
    assert_eq!(
        policy.backoff(),
        &Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(50),
            JitterKind::Percent,
            100
        )
    );
    let defaults = layer.policy(VAULT, "createFile").unwrap();
    assert_eq!(
        (
            defaults.max_attempts(),
            defaults.deadline(),
            defaults.forwards_idempotency_key()
        ),
        (4, Duration::from_secs(30), false)
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_given_up_after_running_the_tool_is_not_reported_as_unprocessed() {
    let tool = ScriptedTool::always(unavailable());
    let mut svc = RetryLayer::builder(registry_of([search()]))
        .seed(1)
        .build()
        .unwrap()
        .layer(tool.service());

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(tool.calls(), 4);
    assert!(!err.is_not_processed(), "the tool ran four times");
}

/// The stack of `tr11` over `inner`: retry outside, the breaker inside.
fn retry_over_breaker<S>(
    registry: ToolRegistry,
    inner: S,
) -> (
    impl tower::Service<ToolCall, Response = tower_toolcall::ToolOutput, Error = ToolError>,
    tower_toolcall::breaker::BreakerAdmin,
)
where
    S: tower::Service<ToolCall, Response = tower_toolcall::ToolOutput, Error = ToolError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let breaker = CircuitBreakerLayer::new(registry.clone());
    let admin = breaker.admin();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::builder(registry).seed(1).build().unwrap())
        .layer(breaker)
        .service(inner);
    (svc, admin)
}

#[tokio::test(start_paused = true)]
async fn a_tools_connection_refused_counts_as_an_attempt_and_opens_the_breaker() {
    let refused = ToolError::from_io_error(io::Error::from(io::ErrorKind::ConnectionRefused));
    assert!(refused.is_not_processed() && !refused.is_rejected());
    let tool = ScriptedTool::always(Step::Fail(refused));
    let (mut svc, admin) = retry_over_breaker(registry_of([create_file()]), tool.service());

    // Four attempts, each one counted by the retry layer and by the breaker.
    let first = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(first.code(), ErrorCode::RetryExhausted);
    assert_eq!(first.record().attempts, Some(4));
    assert!(!first.is_rejected());
    assert_eq!(tool.calls(), 4);
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!((status.stats.failures, status.stats.neutral), (4, 0));

    // The fifth refused connection opens the breaker, which rejects the retry after it.
    let second = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(tool.calls(), 5);
    assert_eq!(admin.state(VAULT, "createFile"), BreakerState::Open);
    assert_eq!(second.code(), ErrorCode::CircuitOpen);
    assert!(second.is_rejected());
    assert_eq!(second.record().attempts, Some(1));
}

/// Hooks that deny every attempt with an error that, from the tool, would count.
struct DenyAll;

impl ToolHooks for DenyAll {
    fn before_attempt(&self, _call: &mut ToolCall) -> Result<(), ToolError> {
        Err(ToolError::from_http_status(503, "paused by the operator"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_denial_is_no_attempt_and_never_opens_the_breaker() {
    let tool = ScriptedTool::always(Step::Ok);
    let denied = HookLayer::new(DenyAll).layer(tool.service());
    let (mut svc, admin) = retry_over_breaker(registry_of([create_file()]), denied);

    for _ in 0..10 {
        let call = call_of(VAULT, "createFile");
        let err = call_once(&mut svc, call.clone()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
        assert!(err.is_rejected() && err.is_not_processed());
        assert_eq!(err.record().attempts, None, "not retried");
        assert_eq!(ToolResult::from_outcome(&call, Err(err)).attempts, 0);
    }
    assert_eq!(tool.calls(), 0);
    assert_eq!(admin.state(VAULT, "createFile"), BreakerState::Closed);
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!((status.stats.failures, status.stats.neutral), (0, 10));
}

#[tokio::test(start_paused = true)]
async fn a_layer_refusal_is_no_attempt_and_never_opens_the_breaker() {
    let limited = create_file().with_policy(
        ToolPolicy::default().with_rate_limit(
            RateLimitSettings::default()
                .with_per_second(1)
                .with_key(RateLimitKey::Tool)
                .with_on_limit(OnLimit::Reject),
        ),
    );
    let registry = registry_of([limited.with_idempotent(true)]);
    let tool = ScriptedTool::always(Step::Ok);
    let throttled = RateLimitLayer::new(registry.clone()).layer(tool.service());
    let (mut svc, admin) = retry_over_breaker(registry, throttled);

    call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    for _ in 0..10 {
        let call = call_of(VAULT, "createFile");
        let err = call_once(&mut svc, call.clone()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited);
        assert!(err.is_rejected() && err.is_retriable());
        assert_eq!(err.record().attempts, None, "not retried");
        assert_eq!(ToolResult::from_outcome(&call, Err(err)).attempts, 0);
    }
    assert_eq!(tool.calls(), 1);
    assert_eq!(admin.state(VAULT, "createFile"), BreakerState::Closed);
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!(
        (
            status.stats.successes,
            status.stats.failures,
            status.stats.neutral
        ),
        (1, 0, 10)
    );
}
