//! RateLimitLayer: quotas per tool, tenant or session, rejection or wait, and idle keys.

#[path = "../support/mod.rs"]
mod support;

/// Where the quotas are kept: the cases of `cases.rs` run against every store (the crate
/// `tower-toolcall-redis` runs them on Redis).
enum Store {
    /// The governor limiter, on paused tokio time.
    Memory,
}

impl Store {
    fn builder(&self, registry: ToolRegistry) -> tower_toolcall::rate_limit::RateLimitLayerBuilder {
        let builder = RateLimitLayer::builder(registry)
            .on_store_failure(tower_toolcall::shared_store::FailurePolicy::Closed);
        match self {
            Store::Memory => builder,
        }
    }

    /// Lets `duration` pass on the store's clock.
    async fn advance(&self, duration: Duration) {
        match self {
            Store::Memory => tokio::time::advance(duration).await,
        }
    }

    /// Asserts that `actual` is `expected`: exactly on paused time, and within 50 ms on the
    /// server's clock, where the calls themselves take time.
    fn assert_about(&self, actual: Duration, expected: Duration, what: &str) {
        match self {
            Store::Memory => assert_eq!(actual, expected, "{what}"),
        }
    }

    /// Asserts how many keys the in-memory limiter holds; Redis keys expire by themselves.
    fn assert_tracked_keys(&self, layer: &RateLimitLayer, tool: (&str, &str), expected: usize) {
        let tracked = layer.tracked_keys(tool.0, tool.1);
        match self {
            Store::Memory => assert_eq!(tracked, expected, "keys of {tool:?}"),
        }
    }
}

include!("cases.rs");

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
    .settings(RateLimitSettings::default().with_sweep_interval_ms(1_000))
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
    .settings(
        RateLimitSettings::default()
            .with_max_keys(100)
            .with_sweep_interval_ms(3_600_000),
    )
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
    .settings(
        RateLimitSettings::default()
            .with_max_keys(MAX_KEYS)
            .with_sweep_interval_ms(3_600_000),
    )
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

#[test]
fn invalid_configuration_names_the_field() {
    let err = RateLimitLayer::builder(ToolRegistry::open())
        .settings(RateLimitSettings::default().with_per_second(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "rate_limit.per_second");
    let err = RateLimitLayer::builder(ToolRegistry::open())
        .settings(RateLimitSettings::default().with_max_wait_ms(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "rate_limit.max_wait_ms");
    let keyed_only = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly).with_policy(
        ToolPolicy::default()
            .with_rate_limit(RateLimitSettings::default().with_key(RateLimitKey::ToolSession)),
    );
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
