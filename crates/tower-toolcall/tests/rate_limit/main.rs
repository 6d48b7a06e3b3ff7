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

/// Where the quotas are kept: the cases of the table run against both.
enum Store {
    /// The governor limiter, on paused tokio time.
    Memory,
    /// A `redis-server` of the case's own, on the server's clock: time passes for real.
    #[cfg(feature = "redis")]
    Redis(support::redis_server::RedisServer),
}

impl Store {
    fn layer(&self, registry: ToolRegistry) -> RateLimitLayer {
        self.builder(registry)
            .build()
            .expect("a valid configuration")
    }

    fn builder(&self, registry: ToolRegistry) -> tower_toolcall::rate_limit::RateLimitLayerBuilder {
        let builder = RateLimitLayer::builder(registry)
            .on_store_failure(tower_toolcall::shared_store::FailurePolicy::Closed);
        match self {
            Store::Memory => builder,
            #[cfg(feature = "redis")]
            Store::Redis(server) => builder.store(
                tower_toolcall::rate_limit::RedisRateLimitStore::open(&server.url())
                    .expect("a valid store configuration"),
            ),
        }
    }

    /// Lets `duration` pass on the store's clock.
    async fn advance(&self, duration: Duration) {
        match self {
            Store::Memory => tokio::time::advance(duration).await,
            #[cfg(feature = "redis")]
            Store::Redis(_) => tokio::time::sleep(duration).await,
        }
    }

    /// Asserts that `actual` is `expected`: exactly on paused time, and within 50 ms on the
    /// server's clock, where the calls themselves take time.
    fn assert_about(&self, actual: Duration, expected: Duration, what: &str) {
        match self {
            Store::Memory => assert_eq!(actual, expected, "{what}"),
            #[cfg(feature = "redis")]
            Store::Redis(_) => assert!(
                actual.abs_diff(expected) <= Duration::from_millis(50),
                "{what}: {actual:?}, expected about {expected:?}"
            ),
        }
    }

    /// Asserts how many keys the in-memory limiter holds; Redis keys expire by themselves.
    fn assert_tracked_keys(&self, layer: &RateLimitLayer, tool: (&str, &str), expected: usize) {
        let tracked = layer.tracked_keys(tool.0, tool.1);
        match self {
            Store::Memory => assert_eq!(tracked, expected, "keys of {tool:?}"),
            #[cfg(feature = "redis")]
            Store::Redis(_) => assert_eq!(tracked, 0, "no in-memory keys beside the store"),
        }
    }
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
            RateLimitOverrides::default()
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

async fn the_layer_default_limits_every_tool_but_those_switched_off(store: Store) {
    let off = ToolDescriptor::new(WEB, "fetch", RiskLevel::ReadOnly)
        .with_policy(ToolPolicy::default().with_rate_limit(LayerSetting::Off));
    let registry = ToolRegistry::builder()
        .open(true)
        .tool(off)
        .build()
        .unwrap();
    let layer = store.builder(registry).per_second(1).build().unwrap();
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
