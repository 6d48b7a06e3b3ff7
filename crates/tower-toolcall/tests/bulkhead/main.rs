//! BulkheadLayer: places per tool, a bounded queue by priority then arrival, refusals that
//! no other layer counts, deadlines honoured in the queue, and the `priority` call hint.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use futures::future::join_all;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready, task};
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::envelope::Priority;
use tower_toolcall::registry::{
    BreakerSettings, BulkheadSettings, RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy,
    ToolRegistry,
};
use tower_toolcall::{BreakerState, BulkheadLayer, ErrorCode, ShortCircuit, ToolCall, ToolStack};

use support::{call_once, registry_of, stacked, ScriptedTool, Step};

const NS: &str = "agents.tools.web";
const NAME: &str = "fetch";

/// `agents.tools.web::fetch`, `max_concurrent` calls at once and `max_queued` waiting.
fn limited(max_concurrent: u32, max_queued: u32) -> ToolDescriptor {
    ToolDescriptor::new(NS, NAME, RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_bulkhead(
            BulkheadSettings::default()
                .with_max_concurrent(max_concurrent)
                .with_max_queued(max_queued),
        ),
    )
}

/// A call of the tool with request id `id` and `priority`.
fn call(id: &str, priority: Priority) -> ToolCall {
    ToolCall::builder(NS, NAME)
        .request_id(id)
        .session("sess-42")
        .actor("user-7")
        .params(json!({"url": id}))
        .priority(priority)
        .build()
        .unwrap()
}

fn ids(tool: &ScriptedTool) -> Vec<String> {
    tool.received()
        .iter()
        .map(|call| call.request_id().to_owned())
        .collect()
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_the_tool_does_not_run() {
    let tool = ScriptedTool::always(Step::Hang);
    let layer = BulkheadLayer::new(registry_of([limited(2, 1)]));
    let mut svc = layer.layer(tool.service());
    let mut held = Vec::new();
    for n in 0..3 {
        let future = svc
            .ready()
            .await
            .unwrap()
            .call(call(&format!("c{n}"), Priority::Normal));
        let mut future = task::spawn(future);
        assert_pending!(future.poll());
        held.push(future);
    }
    assert_eq!(tool.calls(), 2, "two run, one waits");
    assert_eq!((layer.in_use(NS, NAME), layer.queued(NS, NAME)), (2, 1));

    let started = Instant::now();
    let err = call_once(&mut svc, call("c3", Priority::High))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert!(err.is_retriable() && err.is_not_processed() && err.is_rejected());
    assert_eq!(err.record().short_circuit, Some(ShortCircuit::BulkheadFull));
    assert_eq!(err.details().unwrap()["retryAfterMs"], 1_000);
    assert_eq!(err.details().unwrap()["maxConcurrent"], 2);
    assert_eq!(tool.calls(), 2, "the refused call never reached the tool");
    assert_eq!(layer.refused(NS, NAME), 1);
    drop(held);
    assert_eq!(
        (layer.in_use(NS, NAME), layer.queued(NS, NAME)),
        (0, 0),
        "dropped calls give back their places"
    );
}

#[tokio::test(start_paused = true)]
async fn waiting_calls_start_by_priority_then_arrival() {
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(1), Box::new(Step::Ok)));
    let layer = BulkheadLayer::new(registry_of([limited(1, 10)]));
    let mut svc = layer.layer(tool.service());
    let order = [
        ("first", Priority::Normal),
        ("low-1", Priority::Low),
        ("normal-1", Priority::Normal),
        ("high-1", Priority::High),
        ("low-2", Priority::Low),
        ("normal-2", Priority::Normal),
        ("high-2", Priority::High),
    ];
    let mut futures = Vec::new();
    for (id, priority) in order {
        futures.push(svc.ready().await.unwrap().call(call(id, priority)));
    }
    // `join_all` polls them first in this order: the order they begin to wait.
    for outcome in join_all(futures).await {
        outcome.unwrap();
    }
    assert_eq!(
        ids(&tool),
        ["first", "high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"]
    );
    assert_eq!((layer.in_use(NS, NAME), layer.queued(NS, NAME)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passes_in_the_queue_leaves_with_timeout() {
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(10), Box::new(Step::Ok)));
    let layer = BulkheadLayer::new(registry_of([limited(1, 2)]));
    let mut svc = layer.layer(tool.service());
    let running = svc
        .ready()
        .await
        .unwrap()
        .call(call("running", Priority::Normal));
    let mut running = task::spawn(running);
    assert_pending!(running.poll());

    // By `control.deadlineAtMs`.
    let late = ToolCall::builder(NS, NAME)
        .request_id("late")
        .session("sess-42")
        .actor("user-7")
        .deadline_at_ms(unix_now_ms() + 2_000)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = call_once(&mut svc, late).await.unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(1_900) && waited <= Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert!(err.is_not_processed());
    assert_eq!(err.record().short_circuit, Some(ShortCircuit::BulkheadFull));
    assert!(
        err.message().contains("waited for a place"),
        "{}",
        err.message()
    );

    // By the retry budget's time, counted from the call's arrival.
    let budgeted = ToolCall::builder(NS, NAME)
        .request_id("budgeted")
        .session("sess-42")
        .actor("user-7")
        .retry_budget(3, Duration::from_secs(3))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = call_once(&mut svc, budgeted).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert_eq!(layer.queued(NS, NAME), 0, "both left the queue");

    tokio::time::advance(Duration::from_secs(10)).await;
    assert_ready!(running.poll()).unwrap();
    assert_eq!(ids(&tool), ["running"], "the tool never ran the late calls");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiting_call_frees_its_place() {
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(1), Box::new(Step::Ok)));
    let layer = BulkheadLayer::new(registry_of([limited(1, 1)]));
    let mut svc = layer.layer(tool.service());
    let mut running = task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(call("running", Priority::Normal)),
    );
    assert_pending!(running.poll());

    let mut cancelled = task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(call("cancelled", Priority::High)),
    );
    assert_pending!(cancelled.poll());
    assert_eq!(layer.queued(NS, NAME), 1);
    drop(cancelled);
    assert_eq!(layer.queued(NS, NAME), 0, "its place in the queue is free");

    // The queue has room again: the next call waits instead of being refused.
    let mut next = task::spawn(svc.ready().await.unwrap().call(call("next", Priority::Low)));
    assert_pending!(next.poll());
    assert_eq!(layer.refused(NS, NAME), 0);

    // A waiting call given a place and dropped before it used it gives the place back.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready!(running.poll()).unwrap();
    assert!(next.is_woken(), "the freed place went to the waiting call");
    drop(next);
    assert_eq!(
        (layer.in_use(NS, NAME), layer.queued(NS, NAME)),
        (0, 0),
        "no place leaked"
    );
    call_once(&mut svc, call("after", Priority::Normal))
        .await
        .unwrap();
    assert_eq!(ids(&tool), ["running", "after"]);
}

#[tokio::test(start_paused = true)]
async fn a_tool_without_settings_is_not_limited() {
    let tool = ScriptedTool::always(Step::Hang);
    let plain = ToolDescriptor::new(NS, NAME, RiskLevel::ReadOnly);
    let layer = BulkheadLayer::new(registry_of([plain]));
    assert_eq!(layer.limits(NS, NAME), None);
    let mut svc = layer.layer(tool.service());
    let mut held = Vec::new();
    for n in 0..50 {
        let mut future = task::spawn(
            svc.ready()
                .await
                .unwrap()
                .call(call(&format!("c{n}"), Priority::Low)),
        );
        assert_pending!(future.poll());
        held.push(future);
    }
    assert_eq!(tool.calls(), 50);
    assert_eq!(layer.refused(NS, NAME), 0);
}

#[tokio::test(start_paused = true)]
async fn a_tool_policy_switches_the_layer_off() {
    let registry = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "agents.tools.web"
        name = "fetch"
        risk = "read-only"
        policy.bulkhead = "off"

        [[tools]]
        namespace = "agents.tools.web"
        name = "search"
        risk = "read-only"
        "#,
    )
    .unwrap();
    let layer = BulkheadLayer::builder(registry)
        .settings(
            BulkheadSettings::default()
                .with_max_concurrent(1)
                .with_max_queued(0),
        )
        .build()
        .unwrap();
    assert_eq!(layer.limits(NS, NAME), None);
    assert_eq!(
        layer.limits(NS, "search"),
        Some((1, 0)),
        "the layer's default"
    );

    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = layer.layer(tool.service());
    let mut a = task::spawn(svc.ready().await.unwrap().call(call("a", Priority::Normal)));
    let mut b = task::spawn(svc.ready().await.unwrap().call(call("b", Priority::Normal)));
    assert_pending!(a.poll());
    assert_pending!(b.poll());
    assert_eq!(tool.calls(), 2, "an `off` tool is not limited");
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let err = BulkheadLayer::builder(ToolRegistry::open())
        .settings(BulkheadSettings::default().with_max_concurrent(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "bulkhead.max_concurrent");

    let err = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "agents.tools.web"
        name = "fetch"
        risk = "read-only"
        policy.bulkhead = { max_concurrent = 0 }
        "#,
    )
    .unwrap_err();
    assert!(
        err.field().ends_with("policy.bulkhead.max_concurrent"),
        "{}",
        err.field()
    );
    assert!(err.to_string().contains("at least 1"), "{err}");

    let err = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "agents.tools.web"
        name = "fetch"
        risk = "read-only"
        policy.bulkhead = { max_concurrent = 2, max_waiting = 3 }
        "#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("max_waiting"), "{err}");

    // A tool that tunes its queue but sets no limit, over a layer that sets none either.
    let registry = registry_of([
        ToolDescriptor::new(NS, NAME, RiskLevel::ReadOnly).with_policy(
            ToolPolicy::default().with_bulkhead(BulkheadSettings::default().with_max_queued(3)),
        ),
    ]);
    let err = BulkheadLayer::builder(registry.clone())
        .build()
        .unwrap_err();
    assert_eq!(
        err.field(),
        "tools[agents.tools.web::fetch].policy.bulkhead.max_concurrent"
    );
    let layer = BulkheadLayer::builder(registry)
        .settings(BulkheadSettings::default().with_max_concurrent(2))
        .build()
        .unwrap();
    assert_eq!(
        layer.limits(NS, NAME),
        Some((2, 3)),
        "the layer's limit, the tool's queue"
    );
}

/// A stack over `registry` whose retries wait no longer than a millisecond.
fn stack_of(registry: ToolRegistry) -> ToolStack {
    ToolStack::builder(registry)
        .retry(|retry| {
            retry.settings(
                RetrySettings::default()
                    .with_max_attempts(3)
                    .with_base_delay_ms(1),
            )
        })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn in_the_stack_refusals_neither_open_the_breaker_nor_retry() {
    let descriptor = limited(1, 0).with_policy(
        ToolPolicy::default()
            .with_bulkhead(
                BulkheadSettings::default()
                    .with_max_concurrent(1)
                    .with_max_queued(0),
            )
            .with_breaker(BreakerSettings::default().with_consecutive_failures(1)),
    );
    let stack = stack_of(registry_of([descriptor]));
    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = stacked(&stack, tool.service());
    let mut running = task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(call("running", Priority::Normal)),
    );
    assert_pending!(running.poll());

    for n in 0..5 {
        let started = Instant::now();
        let err = call_once(&mut svc, call(&format!("refused-{n}"), Priority::High))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited);
        assert_eq!(started.elapsed(), Duration::ZERO, "no retry, no backoff");
        assert!(
            err.record().attempts.unwrap_or(0) == 0,
            "no attempt: {:?}",
            err.record().attempts
        );
    }
    assert_eq!(tool.calls(), 1);
    let breakers = stack.breakers().unwrap();
    assert_eq!(breakers.state(NS, NAME), BreakerState::Closed);
    let bulkhead = stack.bulkheads().unwrap();
    assert_eq!(bulkhead.refused(NS, NAME), 5);
}

#[tokio::test(start_paused = true)]
async fn in_the_stack_a_duplicate_of_a_running_call_takes_no_place() {
    let stack = stack_of(registry_of([limited(1, 0)]));
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(1), Box::new(Step::Ok)));
    let mut svc = stacked(&stack, tool.service());
    let keyed = |id: &str| {
        ToolCall::builder(NS, NAME)
            .request_id(id)
            .session("sess-42")
            .actor("user-7")
            .idempotency_key("fetch-1")
            .build()
            .unwrap()
    };
    let mut first = task::spawn(svc.ready().await.unwrap().call(keyed("first")));
    assert_pending!(first.poll());
    let mut duplicate = task::spawn(svc.ready().await.unwrap().call(keyed("again")));
    assert_pending!(duplicate.poll(), "it joins the running call");
    let bulkhead = stack.bulkheads().unwrap();
    assert_eq!(
        (
            bulkhead.in_use(NS, NAME),
            bulkhead.queued(NS, NAME),
            bulkhead.refused(NS, NAME)
        ),
        (1, 0, 0)
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let first = assert_ready!(first.poll()).unwrap();
    tokio::task::yield_now().await;
    let again = duplicate.await.unwrap();
    assert_eq!(first.content, again.content);
    assert_eq!(tool.calls(), 1);
}

/// A call of `namespace::name` with request id `id`.
fn call_of(namespace: &str, name: &str, id: &str) -> ToolCall {
    ToolCall::builder(namespace, name)
        .request_id(id)
        .session("sess-42")
        .actor("user-7")
        .params(json!({"id": id}))
        .build()
        .unwrap()
}

/// `max_concurrent` calls of the namespace's tools at once, `max_queued` waiting.
fn namespace_limit(max_concurrent: u32, max_queued: u32) -> BulkheadSettings {
    BulkheadSettings::default()
        .with_max_concurrent(max_concurrent)
        .with_max_queued(max_queued)
}

/// `fetch` limited to `max_concurrent` calls and `max_queued` waiting, beside an unlimited
/// `search`, both of the namespace `NS`.
fn fetch_and_search(max_concurrent: u32, max_queued: u32) -> ToolRegistry {
    registry_of([
        limited(max_concurrent, max_queued),
        ToolDescriptor::new(NS, "search", RiskLevel::ReadOnly),
    ])
}

/// A bulkhead over `registry` whose namespace `NS` has `max_concurrent` places and
/// `max_queued` waiting.
fn namespaced(registry: ToolRegistry, max_concurrent: u32, max_queued: u32) -> BulkheadLayer {
    BulkheadLayer::builder(registry)
        .namespace(NS, namespace_limit(max_concurrent, max_queued))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_namespace_limit_holds_its_tools_together_and_leaves_the_others_alone() {
    let tool = ScriptedTool::always(Step::Hang);
    let registry = registry_of([
        ToolDescriptor::new(NS, "fetch", RiskLevel::ReadOnly),
        ToolDescriptor::new(NS, "search", RiskLevel::ReadOnly),
        ToolDescriptor::new("vault", "read", RiskLevel::ReadOnly),
    ]);
    let layer = namespaced(registry, 1, 0);
    let mut svc = layer.layer(tool.service());
    let mut running = task::spawn(svc.ready().await.unwrap().call(call_of(NS, "fetch", "f")));
    assert_pending!(running.poll());

    let started = Instant::now();
    let err = call_once(&mut svc, call_of(NS, "search", "s"))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(err.record().short_circuit, Some(ShortCircuit::BulkheadFull));
    let details = err.details().unwrap();
    assert_eq!(
        (
            &details["limit"],
            &details["maxConcurrent"],
            &details["retryAfterMs"]
        ),
        (&json!("namespace"), &json!(1), &json!(1_000))
    );
    assert!(err.message().contains(NS), "{}", err.message());

    // Another namespace's tool has nothing to wait for.
    let mut other = task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(call_of("vault", "read", "v")),
    );
    assert_pending!(other.poll());
    assert_eq!(ids(&tool), ["f", "v"]);
    assert_eq!(
        (
            layer.namespace_in_use(NS),
            layer.namespace_queued(NS),
            layer.namespace_refused(NS)
        ),
        (1, 0, 1)
    );
    assert_eq!(
        layer.refused(NS, "search"),
        0,
        "its own limit refused nothing"
    );
    assert_eq!(layer.namespace_in_use("vault"), 0);
    drop(running);
    assert_eq!(
        layer.namespace_in_use(NS),
        0,
        "a dropped call gives its place back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_its_tool_holds_no_place_of_its_namespace() {
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(1), Box::new(Step::Ok)));
    let registry = fetch_and_search(1, 5);
    let layer = namespaced(registry, 2, 0);
    let mut svc = layer.layer(tool.service());
    let mut futures = Vec::new();
    for (name, id) in [(NAME, "fetch-0"), (NAME, "fetch-1"), ("search", "search-0")] {
        let mut future = task::spawn(svc.ready().await.unwrap().call(call_of(NS, name, id)));
        assert_pending!(future.poll());
        futures.push(future);
    }
    assert_eq!(
        ids(&tool),
        ["fetch-0", "search-0"],
        "the waiting fetch took no place"
    );
    assert_eq!((layer.in_use(NS, NAME), layer.queued(NS, NAME)), (1, 1));
    assert_eq!(
        (layer.namespace_in_use(NS), layer.namespace_queued(NS)),
        (2, 0)
    );

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready!(futures[0].poll()).unwrap();
    assert_ready!(futures[2].poll()).unwrap();
    assert_pending!(futures[1].poll());
    assert_eq!(ids(&tool), ["fetch-0", "search-0", "fetch-1"]);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready!(futures[1].poll()).unwrap();
    assert_eq!((layer.in_use(NS, NAME), layer.namespace_in_use(NS)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_the_time_waited_for_the_tool_and_then_the_namespace() {
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(10), Box::new(Step::Ok)));
    let registry = fetch_and_search(1, 1);
    let layer = namespaced(registry, 1, 1);
    let mut svc = layer.layer(tool.service());
    // A fetch holds the tool's place and the namespace's, until 10 s.
    let mut fetch = task::spawn(svc.ready().await.unwrap().call(call_of(NS, NAME, "fetch")));
    assert_pending!(fetch.poll());
    // The late fetch waits for the tool's place; the search at 5 s, for the namespace's.
    let late = ToolCall::builder(NS, NAME)
        .request_id("late")
        .session("sess-42")
        .actor("user-7")
        .deadline_at_ms(unix_now_ms() + 12_000)
        .build()
        .unwrap();
    let started = Instant::now();
    let mut late = task::spawn(svc.ready().await.unwrap().call(late));
    assert_pending!(late.poll());
    tokio::time::advance(Duration::from_secs(5)).await;
    let mut search = task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(call_of(NS, "search", "search")),
    );
    assert_pending!(search.poll());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_ready!(fetch.poll()).unwrap();
    // At 10 s the late fetch has its tool's place and waits behind the search for the
    // namespace's, which is free at 20 s: its deadline at 12 s passes first.
    let _ = search.poll();
    assert_pending!(late.poll());
    assert_eq!(
        layer.in_use(NS, NAME),
        1,
        "it holds its tool's place while it waits"
    );
    let err = late.await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(12));
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert!(
        err.message().contains("the tools of the namespace"),
        "{}",
        err.message()
    );
    assert_eq!((layer.in_use(NS, NAME), layer.namespace_queued(NS)), (0, 0));
    assert_eq!(
        ids(&tool),
        ["fetch", "search"],
        "the tool never ran the late call"
    );
}

#[tokio::test(start_paused = true)]
async fn a_layer_that_replaces_another_keeps_the_places_whose_limits_are_the_same() {
    let tool = ScriptedTool::always(Step::Hang);
    let registry = || fetch_and_search(1, 0);
    let before = namespaced(registry(), 2, 0);
    let mut old = before.layer(tool.service());
    let mut running = task::spawn(old.ready().await.unwrap().call(call_of(NS, NAME, "old")));
    assert_pending!(running.poll());

    // The same limits: the call still running on the old layer holds its places in the new.
    let after = BulkheadLayer::builder(registry())
        .namespace(NS, namespace_limit(2, 0))
        .carry(&before)
        .build()
        .unwrap();
    assert_eq!((after.in_use(NS, NAME), after.namespace_in_use(NS)), (1, 1));
    let mut new = after.layer(tool.service());
    let err = call_once(&mut new, call_of(NS, NAME, "new"))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::RateLimited,
        "the limit holds across the change"
    );

    // Other limits: free places.
    let changed = BulkheadLayer::builder(registry())
        .namespace(NS, namespace_limit(3, 0))
        .carry(&before)
        .build()
        .unwrap();
    assert_eq!(
        (changed.in_use(NS, NAME), changed.namespace_in_use(NS)),
        (1, 0)
    );
    drop(running);
    assert_eq!((after.in_use(NS, NAME), after.namespace_in_use(NS)), (0, 0));
}

#[test]
fn a_namespace_limit_without_places_is_refused_naming_the_field() {
    for settings in [
        namespace_limit(0, 1),
        BulkheadSettings::default().with_max_queued(4),
    ] {
        let err = BulkheadLayer::builder(ToolRegistry::open())
            .namespace("github", settings)
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "bulkhead.namespaces[github].max_concurrent");
    }
}

#[test]
fn priority_round_trips_and_a_bad_value_is_refused() {
    for (priority, name) in [
        (Priority::Low, "low"),
        (Priority::Normal, "normal"),
        (Priority::High, "high"),
    ] {
        let built = call("p", priority);
        let text = built.to_json();
        assert!(text.contains(&format!(r#""priority":"{name}""#)), "{text}");
        let parsed = ToolCall::from_json(text.as_bytes()).unwrap();
        assert_eq!(parsed, built);
        assert_eq!(parsed.priority(), priority);
        assert_eq!(parsed.to_json(), text, "byte for byte");
    }
    let absent = ToolCall::builder(NS, NAME)
        .session("s")
        .actor("u")
        .build()
        .unwrap();
    assert_eq!(absent.priority(), Priority::Normal);
    assert!(!absent.to_json().contains("priority"));

    let mut value: Value = serde_json::from_str(&call("p", Priority::High).to_json()).unwrap();
    value["payload"]["callHints"]["priority"] = json!("urgent");
    let err = ToolCall::from_json(value.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert_eq!(
        err.details().unwrap()["field"],
        "payload.callHints.priority"
    );
    let message = err.message();
    assert!(
        message.contains("`payload.callHints.priority`"),
        "{message}"
    );
    for accepted in ["low", "normal", "high"] {
        assert!(message.contains(accepted), "{message}");
    }
    value["payload"]["callHints"]["priority"] = json!({"high": null});
    let err = ToolCall::from_json(value.to_string().as_bytes()).unwrap_err();
    assert_eq!(
        err.details().unwrap()["field"],
        "payload.callHints.priority"
    );
}
