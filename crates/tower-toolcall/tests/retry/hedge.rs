//! Hedging: a second attempt beside a slow one, only where a repeat is safe.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder};
use tower_toolcall::breaker::CircuitBreakerLayer;
use tower_toolcall::registry::{
    BreakerSettings, RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::retry::GlobalRetryBudget;
use tower_toolcall::{
    tool_fn, BreakerState, ErrorCode, HedgeRecord, RetryLayer, StackLayer, ToolCall, ToolError,
    ToolOutput, ToolResult, ToolStack,
};

use super::support::{call_of, call_once, registry_of, ScriptedTool, Step};
use super::{create_file, search, unavailable, VAULT, WEB};

const SLOW: Duration = Duration::from_millis(1_000);
const FAST: Duration = Duration::from_millis(20);
const DELAY: u64 = 100;

fn hedged(settings: RetrySettings) -> ToolPolicy {
    ToolPolicy::default().with_retry(settings)
}

fn hedge_after(ms: u64) -> RetrySettings {
    RetrySettings::default().with_hedge_delay_ms(ms)
}

/// Answers after `SLOW` the first time, after `FAST` every other time.
fn slow_then_fast() -> ScriptedTool {
    ScriptedTool::new([
        Step::After(SLOW, Box::new(Step::Ok)),
        Step::After(FAST, Box::new(Step::Ok)),
    ])
}

/// `search`, a read hedged after `DELAY`.
fn hedged_search() -> ToolRegistry {
    registry_of([search().with_policy(hedged(hedge_after(DELAY)))])
}

fn layer(registry: ToolRegistry) -> RetryLayer {
    RetryLayer::builder(registry).seed(1).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_is_hedged_and_answers_at_the_fast_attempts_latency() {
    let registry = hedged_search();
    let retry = layer(registry);
    let tool = slow_then_fast();
    let mut svc = retry.layer(tool.service());
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(start.elapsed(), Duration::from_millis(DELAY) + FAST);
    assert_eq!(tool.calls(), 2);
    assert_eq!(
        tool.call_times()[1] - tool.call_times()[0],
        Duration::from_millis(DELAY)
    );
    assert_eq!(tool.received()[1].attempt(), 2, "the hedge is attempt 2");
    let record = out.record();
    assert_eq!(record.hedge, Some(HedgeRecord::new(1, DELAY, Some(2))));
    assert!(record.hedge.unwrap().hedge_won());
    assert_eq!(record.attempts, Some(2), "both attempts ran the tool");
    assert!(record.retried_by.is_empty(), "a hedge is not a retry");
    assert_eq!(retry.hedges(WEB, "search"), 1);

    let result = ToolResult::from_outcome(&call_of(WEB, "search"), Ok(out));
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(
        json["hedge"],
        json!({"attempt": 1, "delayMs": DELAY, "winner": 2})
    );
    assert_eq!(json["attempts"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_read_that_answers_before_the_delay_is_not_hedged() {
    let registry = hedged_search();
    let retry = layer(registry);
    let tool = ScriptedTool::always(Step::After(FAST, Box::new(Step::Ok)));
    let mut svc = retry.layer(tool.service());

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(tool.calls(), 1);
    assert_eq!(out.record().hedge, None);
    assert_eq!(out.record().attempts, None);
    let result = ToolResult::from_outcome(&call_of(WEB, "search"), Ok(out));
    assert!(serde_json::to_value(&result)
        .unwrap()
        .get("hedge")
        .is_none());
    assert_eq!(retry.hedges(WEB, "search"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_slow_write_without_a_key_is_never_hedged() {
    let policy = hedged(hedge_after(DELAY).with_forwards_idempotency_key(true));
    let registry = registry_of([create_file().with_policy(policy)]);
    let retry = layer(registry);
    let tool = slow_then_fast();
    let mut svc = retry.layer(tool.service());
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();

    assert_eq!(start.elapsed(), SLOW);
    assert_eq!(tool.calls(), 1);
    assert_eq!(out.record().hedge, None);
    assert_eq!(retry.hedges(VAULT, "createFile"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_write_with_a_key_is_hedged_only_by_a_tool_that_forwards_keys() {
    let with_key = || {
        ToolCall::builder(VAULT, "createFile")
            .session("s")
            .actor("u")
            .idempotency_key("create-1")
            .build()
            .unwrap()
    };
    for (forwards, calls) in [(true, 2), (false, 1)] {
        let policy = hedged(hedge_after(DELAY).with_forwards_idempotency_key(forwards));
        let retry = layer(registry_of([create_file().with_policy(policy)]));
        let tool = slow_then_fast();
        let mut svc = retry.layer(tool.service());

        let out = call_once(&mut svc, with_key()).await.unwrap();

        assert_eq!(tool.calls(), calls, "forwards keys: {forwards}");
        assert_eq!(out.record().hedge.is_some(), forwards);
        let keys: Vec<_> = tool
            .received()
            .iter()
            .map(|c| c.idempotency_key().map(str::to_owned))
            .collect();
        assert!(keys.iter().all(|k| k.as_deref() == Some("create-1")));
    }
}

#[tokio::test(start_paused = true)]
async fn a_safety_critical_call_is_never_hedged() {
    let registry = hedged_search();
    let retry = layer(registry);
    let tool = slow_then_fast();
    let mut svc = retry.layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .safety_critical(true)
        .build()
        .unwrap();
    let start = Instant::now();

    let out = call_once(&mut svc, call).await.unwrap();

    assert_eq!(start.elapsed(), SLOW);
    assert_eq!(tool.calls(), 1);
    assert_eq!(out.record().hedge, None);
}

#[tokio::test(start_paused = true)]
async fn a_spent_retry_budget_sends_no_hedge() {
    // One token, and calls earn none: the first slow call spends it on its hedge.
    let budget = GlobalRetryBudget::builder()
        .capacity(1.0)
        .retry_ratio(0.0)
        .min_per_second(0.0)
        .build()
        .unwrap();
    let registry = hedged_search();
    let retry = RetryLayer::builder(registry)
        .budget(budget.clone())
        .build()
        .unwrap();
    let tool = ScriptedTool::new([
        Step::After(SLOW, Box::new(Step::Ok)),
        Step::After(FAST, Box::new(Step::Ok)),
        Step::After(SLOW, Box::new(Step::Ok)),
        Step::After(FAST, Box::new(Step::Ok)),
    ]);
    let mut svc = retry.layer(tool.service());

    let first = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    assert!(first.record().hedge.is_some());
    assert_eq!(tool.calls(), 2);

    let start = Instant::now();
    let second = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(start.elapsed(), SLOW, "no hedge: the slow attempt answered");
    assert_eq!(tool.calls(), 3);
    assert_eq!(second.record().hedge, None);
    assert_eq!(budget.stats().granted, 1);
    assert_eq!(budget.stats().refused, 1);
    assert_eq!(retry.hedges(WEB, "search"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_allowed_one_attempt_is_not_hedged() {
    let registry = hedged_search();
    let retry = layer(registry);
    let tool = slow_then_fast();
    let mut svc = retry.layer(tool.service());
    let call = ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .retry_budget(1, Duration::from_secs(10))
        .build()
        .unwrap();

    call_once(&mut svc, call).await.unwrap();

    assert_eq!(tool.calls(), 1);
}

/// A registry whose `search` opens its breaker at the first failure, cools down for a
/// second and admits two probes at once when half-open: a hedge would be let through as
/// the second probe.
fn fragile_search() -> ToolRegistry {
    let policy = hedged(hedge_after(DELAY)).with_breaker(
        BreakerSettings::default()
            .with_consecutive_failures(1)
            .with_cooldown_ms(1_000)
            .with_half_open_probes(2),
    );
    registry_of([search().with_policy(policy)])
}

/// Opens the breaker of `search` with one failure, then lets its cooldown pass.
async fn open_then_cool_down<S>(svc: &mut S)
where
    S: tower::Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let err = call_once(svc, call_of(WEB, "search")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen, "{err}");
    tokio::time::advance(Duration::from_millis(1_000)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hedge_is_never_a_second_probe_of_a_half_open_breaker() {
    let probe = || {
        ScriptedTool::new([
            unavailable(),
            Step::After(SLOW, Box::new(Step::Ok)),
            Step::After(FAST, Box::new(Step::Ok)),
        ])
    };

    // The stack hands the retry layer its breakers: the probe runs alone.
    let tool = probe();
    let stack = ToolStack::builder(fragile_search())
        .without(StackLayer::LoopDetect)
        .build()
        .unwrap();
    let breakers = stack.breakers().unwrap().clone();
    let mut svc = stack.layer(tool.service());
    open_then_cool_down(&mut svc).await;
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(start.elapsed(), SLOW);
    assert_eq!(tool.calls(), 2, "the failure, then the probe alone");
    assert_eq!(out.record().hedge, None);
    assert_eq!(out.record().breaker_state, Some(BreakerState::HalfOpen));
    assert_eq!(breakers.state(WEB, "search"), BreakerState::HalfOpen);

    // Without them the hedge is admitted as a second probe.
    let tool = probe();
    let registry = fragile_search();
    let mut svc = ServiceBuilder::new()
        .layer(layer(registry.clone()))
        .layer(CircuitBreakerLayer::new(registry))
        .service(tool.service());
    open_then_cool_down(&mut svc).await;
    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    assert_eq!(tool.calls(), 3, "the failure, the probe and its hedge");
}

#[tokio::test(start_paused = true)]
async fn a_closed_breaker_lets_the_hedge_go() {
    let tool = slow_then_fast();
    let registry = fragile_search();
    let breaker = CircuitBreakerLayer::new(registry.clone());
    let retry = RetryLayer::builder(registry)
        .breakers(breaker.admin())
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(retry)
        .layer(breaker)
        .service(tool.service());

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(tool.calls(), 2);
    assert!(out.record().hedge.unwrap().hedge_won());
}

/// Counts the futures of a tool that were dropped, and those that finished.
#[derive(Clone, Default)]
struct Drops {
    dropped: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

struct Guard(Drops);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drops {
    /// A tool whose first call takes `SLOW` and the others `FAST`.
    fn tool(
        &self,
    ) -> impl tower::Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl Future<Output = Result<ToolOutput, ToolError>>,
    > + Clone {
        let drops = self.clone();
        let calls = Arc::new(AtomicUsize::new(0));
        tool_fn(move |_call: ToolCall| {
            let guard = Guard(drops.clone());
            let took = if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                SLOW
            } else {
                FAST
            };
            async move {
                tokio::time::sleep(took).await;
                guard.0.finished.fetch_add(1, Ordering::SeqCst);
                drop(guard);
                Ok(ToolOutput::new(json!({"took": took.as_millis() as u64})))
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn the_losing_attempt_is_cancelled() {
    let drops = Drops::default();
    let registry = hedged_search();
    let mut svc = layer(registry).layer(drops.tool());

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(out.content["took"], 20, "the hedge answered");
    assert_eq!(drops.finished.load(Ordering::SeqCst), 1);
    assert_eq!(
        drops.dropped.load(Ordering::SeqCst),
        2,
        "the slow attempt's future was dropped when the hedge answered"
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_attempt_and_its_hedge() {
    let policy = hedged(hedge_after(DELAY).with_deadline_ms(500));
    let retry = layer(registry_of([search().with_policy(policy)]));
    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = retry.layer(tool.service());
    let start = Instant::now();

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(tool.calls(), 2);
    assert_eq!(err.record().attempts, Some(2));
    assert_eq!(err.record().hedge, Some(HedgeRecord::new(1, DELAY, None)));
}

#[tokio::test(start_paused = true)]
async fn when_one_attempt_fails_the_other_may_still_answer() {
    let retry = layer(registry_of([
        search().with_policy(hedged(hedge_after(DELAY)))
    ]));
    let tool = ScriptedTool::new([
        Step::After(Duration::from_millis(300), Box::new(unavailable())),
        Step::After(Duration::from_millis(400), Box::new(Step::Ok)),
    ]);
    let mut svc = retry.layer(tool.service());
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(start.elapsed(), Duration::from_millis(DELAY + 400));
    assert_eq!(tool.calls(), 2);
    assert_eq!(out.record().attempts, Some(2));
    assert_eq!(
        out.record().hedge,
        Some(HedgeRecord::new(1, DELAY, Some(2)))
    );
}

#[tokio::test(start_paused = true)]
async fn the_percentile_of_recent_latencies_sets_the_delay() {
    let policy = hedged(RetrySettings::default().with_hedge_percentile(90));
    let retry = layer(registry_of([search().with_policy(policy)]));
    // 16 calls of 30 to 45 ms: the 90th percentile is 44 ms. Until they are known, no
    // delay is set and nothing is hedged.
    let mut steps: Vec<Step> = (30..46)
        .map(|ms| Step::After(Duration::from_millis(ms), Box::new(Step::Ok)))
        .collect();
    steps.push(Step::After(SLOW, Box::new(Step::Ok)));
    steps.push(Step::After(FAST, Box::new(Step::Ok)));
    let tool = ScriptedTool::new(steps);
    let mut svc = retry.layer(tool.service());
    for _ in 0..16 {
        let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
        assert_eq!(out.record().hedge, None);
    }
    assert_eq!(retry.hedges(WEB, "search"), 0);
    let start = Instant::now();

    let out = call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(out.record().hedge, Some(HedgeRecord::new(1, 44, Some(2))));
    assert_eq!(start.elapsed(), Duration::from_millis(44) + FAST);
    assert_eq!(tool.calls(), 18);
}

#[test]
fn bad_hedge_settings_are_refused_naming_the_field() {
    let err = RetryLayer::builder(ToolRegistry::open())
        .settings(RetrySettings::default().with_hedge_delay_ms(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "retry.hedge_delay_ms");
    for bad in [0, 100] {
        let err = RetryLayer::builder(ToolRegistry::open())
            .settings(RetrySettings::default().with_hedge_percentile(bad))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "retry.hedge_percentile", "{bad}");
    }
    let tool = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
        .with_policy(hedged(RetrySettings::default().with_hedge_percentile(100)));
    let err = ToolRegistry::builder().tool(tool).build().unwrap_err();
    assert!(
        err.field().ends_with("retry.hedge_percentile"),
        "{}",
        err.field()
    );

    let parsed: ToolPolicy =
        serde_json::from_str(r#"{"retry": {"hedge_delay_ms": 50, "hedge_percentile": 95}}"#)
            .unwrap();
    assert_eq!(
        parsed,
        hedged(
            RetrySettings::default()
                .with_hedge_delay_ms(50)
                .with_hedge_percentile(95)
        )
    );
}
