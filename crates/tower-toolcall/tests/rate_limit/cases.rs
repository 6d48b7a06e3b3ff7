// The rate-limit cases every store runs: included by `main.rs` here (in memory) and by the
// tests of `tower-toolcall-redis` (on Redis), each beside its own `Store`.

use std::time::Duration;

use support::{call_of, call_once, registry_of, ScriptedTool, Step};
use tokio::time::Instant;
use tower::Layer;
use tower_toolcall::registry::{
    LayerSetting, OnLimit, RateLimitKey, RateLimitSettings, RiskLevel, ToolDescriptor, ToolPolicy,
    ToolRegistry,
};
use tower_toolcall::{ErrorCode, RateLimitLayer, ResultStatus, ToolCall, ToolResult};

const WEB: &str = "agents.tools.web";

fn limited(per_second: u32, key: RateLimitKey, on_limit: OnLimit) -> ToolDescriptor {
    ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_rate_limit(
            RateLimitSettings::default()
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

support::store_suite!(
    #[tokio::test(start_paused = true)]
    the_eleventh_call_in_a_second_is_rate_limited,
    sessions_and_tenants_get_quotas_of_their_own,
    a_waiting_policy_delays_the_call_until_the_quota_allows_it,
    a_wait_longer_than_allowed_is_rejected,
    the_layer_default_limits_every_tool_but_those_switched_off,
);

async fn the_eleventh_call_in_a_second_is_rate_limited(store: Store) {
    let tool = ScriptedTool::always(Step::Ok);
    let layer = store.layer(registry_of([limited(
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
    let retry_after = err.retry_after().expect("a retry-after");
    store.assert_about(retry_after, Duration::from_millis(100), "retry after");
    let retry_after_ms = err.details().unwrap()["retryAfterMs"].as_u64().unwrap();
    store.assert_about(
        Duration::from_millis(retry_after_ms),
        retry_after,
        "retryAfterMs",
    );
    assert_eq!(err.details().unwrap()["perSecond"], 10);
    assert_eq!(
        ToolResult::from_outcome(&call, Err(err)).status,
        ResultStatus::RetriableError
    );

    store.advance(retry_after).await;
    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    assert!(call_once(&mut svc, call_of(WEB, "search")).await.is_err());
    assert_eq!(tool.calls(), 11);
}

async fn sessions_and_tenants_get_quotas_of_their_own(store: Store) {
    let tool = ScriptedTool::always(Step::Ok);
    let by_session = store.layer(registry_of([limited(
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
    store.assert_tracked_keys(&by_session, (WEB, "search"), 2);

    let tool = ScriptedTool::always(Step::Ok);
    let by_tenant = store.layer(registry_of([limited(
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

async fn a_waiting_policy_delays_the_call_until_the_quota_allows_it(store: Store) {
    let tool = ScriptedTool::always(Step::Ok);
    let layer = store.layer(registry_of([limited(
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

    let waited = start.elapsed();
    store.assert_about(waited, Duration::from_millis(100), "the wait");
    assert_eq!(tool.calls(), 11);
    assert!(tool.call_times()[10] - start >= waited.saturating_sub(Duration::from_millis(1)));
}

async fn a_wait_longer_than_allowed_is_rejected(store: Store) {
    let slow_quota = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default().with_rate_limit(
            RateLimitSettings::default()
                .with_per_second(1)
                .with_on_limit(OnLimit::Wait)
                .with_max_wait_ms(500),
        ),
    );
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = store.layer(registry_of([slow_quota])).layer(tool.service());
    call_once(&mut svc, call_of(WEB, "search")).await.unwrap();
    let start = Instant::now();

    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();

    store.assert_about(Duration::ZERO, start.elapsed(), "no wait");
    assert_eq!(err.code(), ErrorCode::RateLimited);
    let retry_after = err.retry_after().expect("a retry-after");
    store.assert_about(retry_after, Duration::from_secs(1), "retry after");
    assert_eq!(tool.calls(), 1);
}

async fn the_layer_default_limits_every_tool_but_those_switched_off(store: Store) {
    let off = ToolDescriptor::new(WEB, "fetch", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_rate_limit(LayerSetting::Off));
    let registry = ToolRegistry::builder()
        .open(true)
        .tool(off)
        .build()
        .unwrap();
    let layer = store
        .builder(registry)
        .settings(RateLimitSettings::default().with_per_second(1))
        .build().unwrap();
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
    store.assert_tracked_keys(&layer, ("plugins", "a"), 2);
    assert_eq!(layer.tracked_keys(WEB, "fetch"), 0);
}

/// The layer of every store, made by its `builder`.
impl Store {
    fn layer(&self, registry: ToolRegistry) -> RateLimitLayer {
        self.builder(registry)
            .build()
            .expect("a valid configuration")
    }
}
