//! The idempotency layer and its stores. Every case of the shared suite (`cases.rs`,
//! `derived.rs`) is written once and runs here for `InMemoryDedupeStore` (paused time), and
//! in the tests of `tower-toolcall-redis` for `RedisDedupeStore` on a real `redis-server`
//! that each test starts on a free loopback port (real time, short TTLs).

#[path = "../support/mod.rs"]
mod support;

struct Memory {
    store: InMemoryDedupeStore,
}

impl Memory {
    fn new() -> Memory {
        Memory {
            store: InMemoryDedupeStore::new(),
        }
    }
}

impl Backend for Memory {
    type Store = InMemoryDedupeStore;

    fn store(&self) -> InMemoryDedupeStore {
        self.store.clone()
    }

    fn elapse(&self, by: Duration) -> impl Future<Output = ()> + Send {
        // With paused time, sleeping moves the clock from timer to timer and lets every task
        // run in between, as if the time had passed.
        tokio::time::sleep(by)
    }

    fn time(&self, nominal: Duration) -> Duration {
        nominal
    }

    fn exact_time(&self) -> bool {
        true
    }
}

/// Runs each case on the memory store.
macro_rules! store_suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case(super::Memory::new()).await;
                }
            )*
        }
    };
}

include!("cases.rs");

// ---------------------------------------------------------------------------------------------
// The memory store only

#[tokio::test(start_paused = true)]
async fn memory_store_response_future_dropped_unpolled_frees_the_key() {
    // The memory store claims the key when the call is made; a response future dropped
    // before it is polled must not leave the key held until its lease ends.
    let store = InMemoryDedupeStore::new();
    let tool = MockTool::echo(Duration::ZERO);
    let idem = layer(store.clone(), ToolPolicy::default());
    let mut svc = over(&idem, &tool);
    let make = || call("sess-42", json!({"path": "a.md"})).build().unwrap();
    let key = idem.store_key(&make()).unwrap().unwrap();
    ServiceExt::ready(&mut svc).await.unwrap();
    drop(svc.call(make()));
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Cancelled);
    assert_eq!(tool.runs(), 0);
    let out = run(&svc, make()).await.unwrap();
    assert!(!out.record().from_cache);
    assert_eq!(
        tool.runs(),
        1,
        "the key was free: the next call runs the tool"
    );
}

#[tokio::test(start_paused = true)]
async fn memory_store_stays_at_capacity_under_200_000_keys_and_evicts_the_oldest() {
    let store = InMemoryDedupeStore::new();
    let cap = store.capacity();
    assert_eq!(cap, 25_000);
    let lease = Duration::from_secs(120);
    let key = |i: usize| format!("/vault::createFile/g/k{i}");
    for i in 0..200_000 {
        let ClaimOutcome::Claimed(claimed) = store
            .claim(&claim_request(&key(i), "d", lease))
            .await
            .unwrap()
        else {
            panic!("key {i} is fresh");
        };
        store
            .finalize(&claimed, done(json!(i), Duration::from_secs(3600)))
            .await
            .unwrap();
        if i == 10 {
            // A claim that finds key 0 makes it the most recently used.
            assert!(matches!(
                store
                    .claim(&claim_request(&key(0), "d", lease))
                    .await
                    .unwrap(),
                ClaimOutcome::Existing { .. }
            ));
        }
        if i == cap + 5 {
            // Six evictions so far: keys 1 to 6, not key 0.
            assert!(store.get(&key(0)).await.unwrap().is_some());
            assert!(store.get(&key(6)).await.unwrap().is_none());
            assert!(store.get(&key(7)).await.unwrap().is_some());
        }
        if i % 25_000 == 0 {
            assert!(store.stats().records <= cap);
        }
    }
    let stats = store.stats();
    assert_eq!(stats.records, cap, "the size stays at the cap");
    assert_eq!(stats.evicted, 200_000 - cap as u64);
    assert!(
        store.get(&key(1)).await.unwrap().is_none(),
        "the oldest completed record went first"
    );
    assert!(store.get(&key(199_999)).await.unwrap().is_some());
    assert!(store.get(&key(200_000 - cap)).await.unwrap().is_some());
    assert!(store.get(&key(200_000 - cap - 1)).await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn memory_store_full_of_in_flight_records_refuses_and_never_evicts_them() {
    let store = InMemoryDedupeStore::builder().capacity(2).build().unwrap();
    let tool = MockTool::echo(Duration::from_secs(10));
    let idem = layer(store.clone(), ToolPolicy::default());
    let svc = over(&idem, &tool);
    let running: Vec<_> = ["a.md", "b.md"]
        .into_iter()
        .map(|path| {
            tokio::spawn(run_owned(
                svc.clone(),
                call("s", json!({"path": path})).build().unwrap(),
            ))
        })
        .collect();
    tool.started.notified().await;
    tool.started.notified().await;
    assert_eq!(store.stats().inflight, 2);

    let err = run(&svc, call("s", json!({"path": "c.md"})).build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::StoreUnavailable);
    assert!(err.is_retriable() && err.is_not_processed());
    assert!(err.message().contains("capacity"), "{}", err.message());
    assert_eq!(tool.runs(), 2, "fail closed: the tool did not run");
    assert_eq!(store.stats().rejected_at_capacity, 1);
    assert_eq!(store.stats().inflight, 2, "no in-flight record was evicted");

    let open = over(
        &IdempotencyLayer::builder(registry(ToolPolicy::default()), Arc::new(store.clone()))
            .settings(IdempotencySettings::default().with_on_store_error(OnStoreError::FailOpen))
            .build()
            .unwrap(),
        &tool,
    );
    let out = run(&open, call("s", json!({"path": "d.md"})).build().unwrap())
        .await
        .unwrap();
    assert!(!out.record().from_cache);
    assert_eq!(
        tool.runs(),
        3,
        "fail open: the tool ran without deduplication"
    );

    for handle in running {
        handle.await.unwrap().unwrap();
    }
    // Settled now, they make room.
    run(&svc, call("s", json!({"path": "c.md"})).build().unwrap())
        .await
        .unwrap();
    assert_eq!(store.stats().evicted, 1);
    assert_eq!(idem.stats().store_errors, 1);
}

/// A flood of `FLOOD` keys from one client, at the default capacity, against a victim that
/// completed one call first: the flood evicts its own oldest records, the victim's record
/// stays, and its re-send is answered from it. The clients are tenants (`by_tenant`) or, for
/// calls without a tenant, sessions.
async fn flood_against_a_victim(by_tenant: bool) {
    const FLOOD: usize = 30_000;
    let store = InMemoryDedupeStore::new();
    let cap = store.capacity();
    let idem = layer(store.clone(), ToolPolicy::default());
    let (victim_tool, flood_tool) = (
        MockTool::echo(Duration::ZERO),
        MockTool::echo(Duration::ZERO),
    );
    let (victim, flood) = (over(&idem, &victim_tool), over(&idem, &flood_tool));
    let client = |session: &str, tenant: &str, path: String, key: String| {
        let builder = call(session, json!({ "path": path })).idempotency_key(key);
        let builder = if by_tenant {
            builder.tenant(tenant)
        } else {
            builder
        };
        builder.build().unwrap()
    };
    // With tenants, both clients use the same session name: only the tenant tells them apart.
    let victim_call = |n: usize| {
        let session = if by_tenant { "s" } else { "victim" };
        client(session, "victim", format!("v{n}.md"), format!("victim-{n}"))
    };
    let flood_call = |i: usize| {
        let session = if by_tenant { "s" } else { "flood" };
        client(session, "flood", format!("f{i}.md"), format!("flood-{i}"))
    };

    let first = run(&victim, victim_call(0)).await.unwrap();
    assert!(!first.record().from_cache);
    for i in 0..FLOOD {
        run(&flood, flood_call(i)).await.unwrap();
    }
    assert_eq!(flood_tool.runs(), FLOOD);
    let stats = store.stats();
    assert_eq!(stats.records, cap, "{stats:?}");
    assert_eq!(stats.partitions, 2, "{stats:?}");
    // The victim's record and the flood's newest: the flood's oldest made room.
    let evicted = FLOOD + 1 - cap;
    assert_eq!(stats.evicted, evicted as u64, "{stats:?}");
    assert_eq!(
        stats.evicted_live, evicted as u64,
        "every one before its TTL"
    );
    let held = |call: ToolCall| {
        let key = idem.store_key(&call).unwrap().unwrap();
        let store = store.clone();
        async move { store.get(&key).await.unwrap().is_some() }
    };
    assert!(held(victim_call(0)).await, "the victim's record survived");
    assert!(!held(flood_call(0)).await && !held(flood_call(evicted - 1)).await);
    assert!(held(flood_call(evicted)).await && held(flood_call(FLOOD - 1)).await);

    // A new call of the victim, within its share, makes room from the flood, not from the
    // victim's own older record.
    run(&victim, victim_call(1)).await.unwrap();
    assert!(!held(flood_call(evicted)).await, "the flood's oldest went");
    assert!(held(victim_call(0)).await);

    let retry = run(&victim, victim_call(0)).await.unwrap();
    assert!(
        retry.record().from_cache,
        "the re-send is answered from its record"
    );
    assert_eq!(retry.content, first.content);
    assert_eq!(
        victim_tool.runs(),
        2,
        "one run per victim key, none for the re-send"
    );
}

#[tokio::test(start_paused = true)]
async fn memory_store_flood_from_one_tenant_evicts_its_own_records_not_anothers() {
    flood_against_a_victim(true).await;
}

#[tokio::test(start_paused = true)]
async fn memory_store_flood_from_one_session_evicts_its_own_records_not_anothers() {
    flood_against_a_victim(false).await;
}

/// A claim, a result or a deletion whose future is dropped before it is polled changes
/// nothing: the key stays free, and its record as it was.
#[tokio::test(start_paused = true)]
async fn a_memory_store_operation_dropped_unpolled_changes_nothing() {
    let store = InMemoryDedupeStore::new();
    let key = "/vault::createFile/g/k";
    let request = ClaimRequest::new(
        key,
        "k",
        "d",
        call("s", json!({})).build().unwrap(),
        Duration::from_secs(120),
    );
    drop(store.claim(&request));
    assert_eq!(store.get(key).await.unwrap(), None);

    let ClaimOutcome::Claimed(claimed) = store.claim(&request).await.unwrap() else {
        panic!("the key is free");
    };
    drop(store.finalize(&claimed, done(json!("a"), Duration::from_secs(60))));
    drop(store.delete(key));
    let record = store.get(key).await.unwrap().expect("still claimed");
    assert_eq!(record.state, RecordState::Inflight);
}

#[tokio::test(start_paused = true)]
async fn memory_store_shares_are_off_with_a_floor_as_large_as_the_capacity() {
    // One least-recently-used list, as without shares: the oldest record goes, whoever
    // holds it, and it was still live.
    let store = InMemoryDedupeStore::builder()
        .capacity(3)
        .min_share(3)
        .build()
        .unwrap();
    let lease = Duration::from_secs(120);
    for (session, key) in [("a", "k0"), ("b", "k1"), ("b", "k2"), ("b", "k3")] {
        let request = ClaimRequest::new(
            format!("/vault::createFile/g/{key}"),
            key,
            "d",
            call(session, json!({})).build().unwrap(),
            lease,
        );
        let ClaimOutcome::Claimed(claimed) = store.claim(&request).await.unwrap() else {
            panic!("{key} is fresh");
        };
        store
            .finalize(&claimed, done(json!(key), Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    assert!(store
        .get("/vault::createFile/g/k0")
        .await
        .unwrap()
        .is_none());
    let stats = store.stats();
    assert_eq!(
        (stats.records, stats.evicted, stats.evicted_live),
        (3, 1, 1)
    );
    assert_eq!(stats.partitions, 1, "session a has no record left");
}

#[tokio::test(start_paused = true)]
async fn memory_store_sweeps_expired_records_and_its_sweeper_stops_when_dropped() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let store = InMemoryDedupeStore::builder()
        .sweep_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let tool = MockTool::echo(Duration::ZERO);
    let svc = over(
        &layer(
            store.clone(),
            policy(IdempotencySettings::default().with_done_ttl_ms(1_000)),
        ),
        &tool,
    );
    run(&svc, call("s", json!({"path": "a.md"})).build().unwrap())
        .await
        .unwrap();
    assert_eq!(store.stats().records, 1);
    assert_eq!(metrics.num_alive_tasks(), 1, "the sweeper runs");

    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(store.stats().records, 0, "swept without being read");
    assert_eq!(store.stats().expired, 1);

    drop(svc);
    drop(store);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        0,
        "the sweeper stopped with the store"
    );
}

#[test]
fn bad_configuration_is_refused_with_the_field_named() {
    let err = InMemoryDedupeStore::builder()
        .capacity(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "idempotency.store.capacity");
    let err = IdempotencyLayer::builder(ToolRegistry::open(), Arc::new(InMemoryDedupeStore::new()))
        .settings(IdempotencySettings::default().with_inflight_lease_ms(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "idempotency.inflight_lease_ms");
    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "vault", "name": "w", "risk": "writes",
            "policy": {"idempotency": {"on_store_error": "fail_sometimes"}}}]}"#,
    )
    .unwrap_err();
    assert!(
        err.field().starts_with("tools[0].policy.idempotency"),
        "{err}"
    );
    let policy: ToolPolicy = serde_json::from_value(
        json!({"idempotency": {"on_store_error": "fail_open", "scope": "global"}}),
    )
    .unwrap();
    let overrides = policy.idempotency.overrides().unwrap();
    assert_eq!(overrides.on_store_error, Some(OnStoreError::FailOpen));
    assert_eq!(overrides.scope, Some(KeyScope::Global));
}

// The memory store's bound in bytes.

#[tokio::test(start_paused = true)]
async fn memory_store_stays_under_its_bound_in_bytes_with_large_results() {
    const MAX_BYTES: usize = 1 << 20;
    let store = InMemoryDedupeStore::builder()
        .max_bytes(MAX_BYTES)
        .build()
        .unwrap();
    assert_eq!(store.max_bytes(), MAX_BYTES);
    let lease = Duration::from_secs(120);
    let key = |i: usize| format!("/vault::createFile/g/k{i}");
    // 500 results of 64 KiB each: 30 MiB in all, far more than the bound.
    for i in 0..500 {
        let ClaimOutcome::Claimed(claimed) = store
            .claim(&claim_request(&key(i), "d", lease))
            .await
            .unwrap()
        else {
            panic!("key {i} is fresh");
        };
        let large = json!({"n": i, "text": "x".repeat(64 << 10)});
        store
            .finalize(&claimed, done(large, Duration::from_secs(3600)))
            .await
            .unwrap();
        let stats = store.stats();
        assert!(stats.bytes <= MAX_BYTES, "{stats:?} after {i}");
    }
    let stats = store.stats();
    assert!((10..20).contains(&stats.records), "{stats:?}");
    assert_eq!(stats.evicted, 500 - stats.records as u64);
    // The newest result is kept and replayed; the oldest went first.
    let newest = store.get(&key(499)).await.unwrap().unwrap();
    assert_eq!(newest.payload.unwrap().content["n"], 499);
    assert!(store.get(&key(0)).await.unwrap().is_none());
    assert!(matches!(
        store
            .claim(&claim_request(&key(499), "d", lease))
            .await
            .unwrap(),
        ClaimOutcome::Existing { .. }
    ));

    let err = InMemoryDedupeStore::builder()
        .max_bytes(1024)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "idempotency.store.max_bytes");
}

// ---------------------------------------------------------------------------------------------
// Keys: parts that join alike never share a record; integers beyond 2^53 keep their digits

/// A layer on the memory store over a registry of `tools` (namespace, name), each with the
/// default policy.
fn layer_of_tools(tools: &[(&str, &str)]) -> IdempotencyLayer {
    let registry = tools
        .iter()
        .fold(ToolRegistry::builder(), |builder, (ns, name)| {
            builder.tool(ToolDescriptor::new(*ns, *name, RiskLevel::Writes))
        })
        .build()
        .unwrap();
    IdempotencyLayer::new(registry, Arc::new(InMemoryDedupeStore::new()))
}

/// Sends `calls` in turn through `idem` over one mock tool, and checks that every one ran the
/// tool and none was answered from another's record.
async fn each_call_runs_the_tool(idem: &IdempotencyLayer, calls: &[ToolCall]) {
    let tool = MockTool::echo(Duration::ZERO);
    let svc = over(idem, &tool);
    let mut keys = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let out = run(&svc, call.clone()).await.unwrap();
        assert_eq!(out.content["run"], i + 1, "call {i} ran the tool");
        assert!(
            !out.record().from_cache,
            "call {i} was not answered from cache"
        );
        keys.push(idem.store_key(call).unwrap().unwrap());
    }
    assert_eq!(tool.runs(), calls.len());
    for (i, key) in keys.iter().enumerate() {
        assert!(
            !keys[..i].contains(key),
            "store key {key} of call {i} is another's"
        );
    }
}

/// A call of `namespace::name` by `actor` in `session`, with `key` as its idempotency key
/// (`None`: a derived key).
fn call_of(namespace: &str, name: &str, session: &str, actor: &str, key: Option<&str>) -> ToolCall {
    let builder = ToolCall::builder(namespace, name)
        .session(session)
        .actor(actor)
        .params(json!({"path": "a.md"}));
    match key {
        Some(key) => builder.idempotency_key(key),
        None => builder,
    }
    .build()
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn tools_whose_names_join_alike_never_share_a_key() {
    // `x::y` + `z` and `x` + `y::z` both read `x::y::z`.
    let tools = [("x::y", "z"), ("x", "y::z"), ("x:", ":y::z")];
    for key in [Some("k-1"), None] {
        let calls: Vec<ToolCall> = tools
            .iter()
            .map(|(ns, name)| call_of(ns, name, "s", "u", key))
            .collect();
        each_call_runs_the_tool(&layer_of_tools(&tools), &calls).await;
    }
}

#[tokio::test(start_paused = true)]
async fn sessions_and_actors_holding_separators_never_share_a_key() {
    let targets = [
        ("a::b", "c"),
        ("a", "b::c"),
        ("a/b", "c"),
        ("a", "b/c"),
        ("a:", ":b"),
        ("a%2Fb", "c"),
    ];
    for key in [Some("k-1"), None] {
        let calls: Vec<ToolCall> = targets
            .iter()
            .map(|(session, actor)| call_of(NS, TOOL, session, actor, key))
            .collect();
        each_call_runs_the_tool(&layer_of_tools(&[(NS, TOOL)]), &calls).await;
    }
    // A session that holds the actor and the key after a separator is not that actor's.
    let calls = [
        call_of(NS, TOOL, "s/u", "k", Some("k")),
        call_of(NS, TOOL, "s", "u/k", Some("k")),
        call_of(NS, TOOL, "s", "u", Some("k/k")),
    ];
    each_call_runs_the_tool(&layer_of_tools(&[(NS, TOOL)]), &calls).await;
}

#[tokio::test(start_paused = true)]
async fn tenants_holding_separators_never_share_a_key() {
    // `t/x` + `vault` and `t` + `x/vault` both read `t/x/vault`; braces would change the
    // Redis Cluster hash tag.
    let tools = [(NS, TOOL), ("x/vault", TOOL), ("x", "vault::createFile")];
    let with_tenant = |tenant: &str, ns: &str, name: &str| {
        ToolCall::builder(ns, name)
            .session("s")
            .actor("u")
            .tenant(tenant)
            .params(json!({"path": "a.md"}))
            .idempotency_key("k-1")
            .build()
            .unwrap()
    };
    let calls = [
        with_tenant("t/x", NS, TOOL),
        with_tenant("t", "x/vault", TOOL),
        with_tenant("t::x", NS, TOOL),
        with_tenant("t", "x", "vault::createFile"),
        with_tenant("{t}", NS, TOOL),
        with_tenant("{t", NS, TOOL),
        with_tenant("%7Bt%7D", NS, TOOL),
    ];
    let idem = layer_of_tools(&tools);
    each_call_runs_the_tool(&idem, &calls).await;
    for call in &calls {
        let key = idem.store_key(call).unwrap().unwrap();
        assert!(!key.contains(['{', '}']), "{key} keeps no brace");
    }
}

/// A call parsed from JSON text whose params are `params` (JSON text), with `key`.
fn parsed_call(params: &str, key: Option<&str>) -> ToolCall {
    let key = key.map_or(String::new(), |k| format!(r#","idempotencyKey":"{k}""#));
    let text = format!(
        r#"{{"contractVersion":"1.1","requestId":"01J9Z8Q4V6K3T2M1N0P9R8S7T7","toolName":"{TOOL}",
           "toolNamespace":"{NS}","target":{{"sessionKey":"sess-42","actorId":"user-7"}},
           "payload":{{"version":"1.0","params":{params}{key}}}}}"#
    );
    ToolCall::from_json(text.as_bytes()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn snowflake_ids_beyond_two_to_the_53_are_neither_a_cache_hit_nor_a_conflict() {
    let first = r#"{"message_id":1234567890123456789}"#;
    let second = r#"{"message_id":1234567890123456788}"#;
    // Parsing keeps every digit.
    assert_eq!(
        parsed_call(first, None).params().as_value()["message_id"].as_u64(),
        Some(1234567890123456789)
    );

    // Derived keys: two keys, two runs.
    let calls = [parsed_call(first, None), parsed_call(second, None)];
    each_call_runs_the_tool(&layer_of_tools(&[(NS, TOOL)]), &calls).await;

    // One caller key for both: the second is a reused key, not the first one's result.
    let tool = MockTool::echo(Duration::ZERO);
    let svc = over(&layer_of_tools(&[(NS, TOOL)]), &tool);
    run(&svc, parsed_call(first, Some("send-1"))).await.unwrap();
    let err = run(&svc, parsed_call(second, Some("send-1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyReused);
    let again = run(&svc, parsed_call(first, Some("send-1"))).await.unwrap();
    assert!(again.record().from_cache);
    assert_eq!(tool.runs(), 1);
}

mod derived;

/// A memory store whose first `failures` writes of a result fail, as a store that cannot be
/// reached for a moment does.
#[derive(Clone, Debug)]
struct FailingFinalize {
    inner: InMemoryDedupeStore,
    failures: Arc<AtomicUsize>,
}

use tower_toolcall::idempotency::{DedupeRecord, StoreError};
use tower_toolcall::shared_store::StoreFuture;

/// Claims and results go through the store's futures: the store answers nothing at once.
impl DedupeStore for FailingFinalize {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        self.inner.claim(request)
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<DedupeRecord>> {
        self.inner.get(key)
    }

    fn finalize<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        completion: Completion,
    ) -> StoreFuture<'a, Finalized> {
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            let down = StoreError::Unavailable("the store is down for a moment".into());
            return Box::pin(std::future::ready(Err(down)));
        }
        self.inner.finalize(claimed, completion)
    }

    fn cancel<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        self.inner.cancel(claimed, keep_for)
    }

    fn renew<'a>(&'a self, claimed: &'a DedupeRecord, lease: Duration) -> StoreFuture<'a, bool> {
        self.inner.renew(claimed, lease)
    }

    fn wait<'a>(&'a self, seen: &'a DedupeRecord) -> StoreFuture<'a, Option<DedupeRecord>> {
        self.inner.wait(seen)
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        self.inner.delete(key)
    }

    fn flush_prefix<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, u64> {
        self.inner.flush_prefix(prefix)
    }

    fn sweep_expired(&self) -> StoreFuture<'_, u64> {
        self.inner.sweep_expired()
    }

    fn size(&self) -> StoreFuture<'_, u64> {
        self.inner.size()
    }

    fn find_by_fingerprint<'a>(
        &'a self,
        fingerprint: &'a str,
    ) -> StoreFuture<'a, Option<DedupeRecord>> {
        self.inner.find_by_fingerprint(fingerprint)
    }
}

/// A result the store could not take at first: for a write, the key stays held and the
/// result is written again, so that the duplicate waiting on the call gets it and the tool
/// runs once; for a read, the key is freed, and the duplicate runs the read again.
#[tokio::test(start_paused = true)]
async fn a_result_the_store_could_not_take_keeps_a_writes_key_and_frees_a_reads() {
    // The write's result fails twice: its first write and the first write again.
    for (risk, failures, runs) in [(RiskLevel::Writes, 2, 1), (RiskLevel::ReadOnly, 1, 2)] {
        let store = FailingFinalize {
            inner: InMemoryDedupeStore::new(),
            failures: Arc::new(AtomicUsize::new(failures)),
        };
        let registry = ToolRegistry::builder()
            .tool(ToolDescriptor::new(NS, TOOL, risk))
            .build()
            .unwrap();
        let idem = IdempotencyLayer::new(registry, Arc::new(store));
        let tool = MockTool::echo(Duration::from_millis(200));
        let svc = over(&idem, &tool);
        let keyed = || {
            call("s", json!({"path": "a.md"}))
                .idempotency_key("k-1")
                .build()
                .unwrap()
        };
        let first = tokio::spawn(run_owned(svc.clone(), keyed()));
        tool.started.notified().await;
        let duplicate = tokio::spawn(run_owned(svc.clone(), keyed()));
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.content["run"], 1, "{risk:?}");
        let duplicate = tokio::time::timeout(Duration::from_secs(10), duplicate)
            .await
            .expect("the duplicate is answered")
            .unwrap()
            .unwrap();
        assert_eq!(tool.runs(), runs, "{risk:?}: the tool's runs");
        if runs == 1 {
            assert!(
                duplicate.record().from_cache,
                "the stored result answers it"
            );
            assert_eq!(duplicate.content["run"], 1);
        }
        assert_eq!(idem.stats().store_errors, 1, "{risk:?}");
    }
}
