//! RateLimitLayer: quotas per tool, tenant or session, rejection or wait, and idle keys.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use support::{call_of, call_once, registry_of, ScriptedTool, Step};
use tokio::time::Instant;
use tower::Layer;
use tower_toolcall::registry::{
    LayerSetting, OnLimit, RateLimitKey, RateLimitOverrides, RiskLevel, ToolDescriptor, ToolPolicy,
    ToolRegistry,
};
use tower_toolcall::{ErrorCode, RateLimitLayer, ResultStatus, ToolCall, ToolResult};

const WEB: &str = "agents.tools.web";

fn limited(per_second: u32, key: RateLimitKey, on_limit: OnLimit) -> ToolDescriptor {
    ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_rate_limit(
            RateLimitOverrides::default()
                .with_per_second(per_second)
                .with_key(key)
                .with_on_limit(on_limit),
        ),
    )
}

fn in_session(session: &str) -> ToolCall {
    ToolCall::builder(WEB, "search")
        .session(session)
        .actor("u")
        .build()
        .unwrap()
}

fn of_tenant(tenant: &str) -> ToolCall {
    ToolCall::builder(WEB, "search")
        .session("s")
        .actor("u")
        .tenant(tenant)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_eleventh_call_in_a_second_is_rate_limited() {
    let tool = ScriptedTool::always(Step::Ok);
    let layer = RateLimitLayer::new(registry_of([limited(
        10,
        RateLimitKey::Tool,
        OnLimit::Reject,
    )]));
    let mut svc = layer.layer(tool.service());

    for _ in 0..10 {
        call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    }
    let call = call_of(WEB, "search");
    let err = call_once(&mut svc, call.clone()).await.unwrap_err();

    assert_eq!(tool.calls(), 10, "the eleventh never reached the tool");
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert!(err.is_retriable() && err.is_not_processed());
    assert_eq!(err.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(err.details().unwrap()["retryAfterMs"], 100);
    assert_eq!(err.details().unwrap()["perSecond"], 10);
    assert_eq!(
        ToolResult::from_outcome(&call, Err(err)).status,
        ResultStatus::RetriableError
    );

    tokio::time::advance(Duration::from_millis(100)).await;
    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    assert!(call_once(&mut svc, call_of(WEB, "search")).await.is_err());
    assert_eq!(tool.calls(), 11);
}

#[tokio::test(start_paused = true)]
async fn sessions_and_tenants_get_quotas_of_their_own() {
    let tool = ScriptedTool::always(Step::Ok);
    let by_session = RateLimitLayer::new(registry_of([limited(
        2,
        RateLimitKey::ToolSession,
        OnLimit::Reject,
    )]));
    let mut svc = by_session.layer(tool.service());
    for session in ["a", "b"] {
        for _ in 0..2 {
            call_once(&mut svc, in_session(session)).await.unwrap();
        }
        let err = call_once(&mut svc, in_session(session)).await.unwrap_err();
        assert!(
            err.message().contains("for this session"),
            "{}",
            err.message()
        );
    }
    assert_eq!(tool.calls(), 4);
    assert_eq!(by_session.tracked_keys(WEB, "search"), 2);

    let tool = ScriptedTool::always(Step::Ok);
    let by_tenant = RateLimitLayer::new(registry_of([limited(
        1,
        RateLimitKey::ToolTenant,
        OnLimit::Reject,
    )]));
    let mut svc = by_tenant.layer(tool.service());
    call_once(&mut svc, of_tenant("acme")).await.unwrap();
    call_once(&mut svc, of_tenant("globex")).await.unwrap();
    assert!(call_once(&mut svc, of_tenant("acme")).await.is_err());
    // Other sessions of a tenant share its quota.
    assert!(call_once(&mut svc, of_tenant("globex")).await.is_err());
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_policy_delays_the_call_until_the_quota_allows_it() {
    let tool = ScriptedTool::always(Step::Ok);
    let layer = RateLimitLayer::new(registry_of([limited(
        10,
        RateLimitKey::Tool,
        OnLimit::Wait,
    )]));
    let mut svc = layer.layer(tool.service());
    for _ in 0..10 {
        call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    }
    let start = Instant::now();

    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();

    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(tool.calls(), 11);
    assert_eq!(tool.call_times()[10] - start, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_allowed_is_rejected() {
    let slow_quota = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_rate_limit(
            RateLimitOverrides::default()
                .with_per_second(1)
                .with_on_limit(OnLimit::Wait)
                .with_max_wait_ms(500),
        ),
    );
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = RateLimitLayer::new(registry_of([slow_quota])).layer(tool.service());
    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    let start = Instant::now();

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_evicted() {
    // By hand.
    let tool = ScriptedTool::always(Step::Ok);
    let layer = RateLimitLayer::new(registry_of([limited(
        10,
        RateLimitKey::ToolSession,
        OnLimit::Reject,
    )]));
    let mut svc = layer.layer(tool.service());
    for i in 0..300 {
        call_once(&mut svc, in_session(&format!("s{i}")))
            .await
            .unwrap();
    }
    assert_eq!(layer.tracked_keys(WEB, "search"), 300);
    layer.sweep();
    assert_eq!(
        layer.tracked_keys(WEB, "search"),
        300,
        "their quotas are not full yet"
    );
    // governor drops a key once its quota has been full for one emission interval (100 ms).
    tokio::time::advance(Duration::from_millis(200)).await;
    layer.sweep();
    assert_eq!(layer.tracked_keys(WEB, "search"), 0);

    // On the schedule.
    let layer = RateLimitLayer::builder(registry_of([limited(
        10,
        RateLimitKey::ToolSession,
        OnLimit::Reject,
    )]))
    .sweep_interval(Duration::from_secs(1))
    .build()
    .unwrap();
    let mut svc = layer.layer(tool.service());
    for i in 0..50 {
        call_once(&mut svc, in_session(&format!("s{i}")))
            .await
            .unwrap();
    }
    assert_eq!(layer.tracked_keys(WEB, "search"), 50);
    tokio::time::advance(Duration::from_secs(1)).await;
    call_once(&mut svc, in_session("late")).await.unwrap();
    assert_eq!(
        layer.tracked_keys(WEB, "search"),
        1,
        "only the fresh key is left"
    );

    // When a limiter holds too many keys.
    let layer = RateLimitLayer::builder(registry_of([limited(
        10,
        RateLimitKey::ToolSession,
        OnLimit::Reject,
    )]))
    .max_keys(100)
    .sweep_interval(Duration::from_secs(3600))
    .build()
    .unwrap();
    let mut svc = layer.layer(tool.service());
    for i in 0..255 {
        call_once(&mut svc, in_session(&format!("s{i}")))
            .await
            .unwrap();
    }
    assert_eq!(layer.tracked_keys(WEB, "search"), 100);
    tokio::time::advance(Duration::from_secs(1)).await;
    call_once(&mut svc, in_session("s255")).await.unwrap();
    assert_eq!(layer.tracked_keys(WEB, "search"), 100);
    layer.sweep();
    assert_eq!(layer.tracked_keys(WEB, "search"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_number_of_keys_never_exceeds_max_keys() {
    const MAX_KEYS: usize = 100;
    let tool = ScriptedTool::always(Step::Ok);
    let layer = RateLimitLayer::builder(registry_of([limited(
        2,
        RateLimitKey::ToolSession,
        OnLimit::Reject,
    )]))
    .max_keys(MAX_KEYS)
    .sweep_interval(Duration::from_secs(3600))
    .build()
    .unwrap();
    let mut svc = layer.layer(tool.service());
    for i in 0..MAX_KEYS * 50 {
        call_once(&mut svc, in_session(&format!("s{i}")))
            .await
            .unwrap();
        assert!(layer.tracked_keys(WEB, "search") <= MAX_KEYS, "after {i}");
    }
    assert_eq!(layer.tracked_keys(WEB, "search"), MAX_KEYS);
    assert_eq!(tool.calls(), MAX_KEYS * 50);

    // The newest key keeps its own quota: its burst of 2, then a refusal.
    let newest = format!("s{}", MAX_KEYS * 50 - 1);
    call_once(&mut svc, in_session(&newest)).await.unwrap();
    let refused = call_once(&mut svc, in_session(&newest)).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::RateLimited);
    // A recently used key too; the least recently used made room and starts over.
    let recent = format!("s{}", MAX_KEYS * 50 - 2);
    call_once(&mut svc, in_session(&recent)).await.unwrap();
    assert!(call_once(&mut svc, in_session(&recent)).await.is_err());
    assert_eq!(layer.tracked_keys(WEB, "search"), MAX_KEYS);
}

#[tokio::test(start_paused = true)]
async fn the_layer_default_limits_every_tool_but_those_switched_off() {
    let off = ToolDescriptor::new(WEB, "fetch", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_rate_limit(LayerSetting::Off));
    let registry = ToolRegistry::builder()
        .open(true)
        .tool(off)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(registry)
        .per_second(1)
        .build()
        .unwrap();
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = layer.layer(tool.service());

    for _ in 0..5 {
        call_once(&mut svc, call_of(WEB, "fetch")).await.unwrap();
    }
    // Unregistered tools each get their own quota.
    call_once(&mut svc, call_of("plugins", "a")).await.unwrap();
    call_once(&mut svc, call_of("plugins", "b")).await.unwrap();
    assert!(call_once(&mut svc, call_of("plugins", "a")).await.is_err());
    assert_eq!(tool.calls(), 7);
    assert_eq!(layer.tracked_keys("plugins", "a"), 2);
    assert_eq!(layer.tracked_keys(WEB, "fetch"), 0);
}

#[test]
fn invalid_configuration_names_the_field() {
    let err = RateLimitLayer::builder(ToolRegistry::open())
        .per_second(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "rate_limit.per_second");
    let err = RateLimitLayer::builder(ToolRegistry::open())
        .max_wait(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "rate_limit.max_wait");
    let keyed_only =
        ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)
            .with_policy(ToolPolicy::default().with_rate_limit(
                RateLimitOverrides::default().with_key(RateLimitKey::ToolSession),
            ));
    let err = RateLimitLayer::builder(registry_of([keyed_only]))
        .build()
        .unwrap_err();
    assert_eq!(
        err.field(),
        "tools[agents.tools.web::search].policy.rate_limit.per_second"
    );
    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "read-only",
            "policy": {"rate_limit": {"per_second": 0}}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.rate_limit.per_second");
}
