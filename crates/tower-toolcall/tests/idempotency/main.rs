//! The idempotency layer and its stores. Every case of the shared suite is written once and
//! runs for `InMemoryDedupeStore` (paused time) and for `RedisDedupeStore` on a real
//! `redis-server` that each test starts on a free loopback port (real time, short TTLs).

#[path = "../support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_toolcall::canonical::{canonical_json, derive_key, params_digest, CanonicalOptions};
use tower_toolcall::idempotency::{
    key_fingerprint, tenant_prefix, ClaimOutcome, ClaimRequest, Completion, DedupeStore, Execution,
    Finalized, IdempotencyLayer, InMemoryDedupeStore, RecordState,
};
use tower_toolcall::registry::{
    IdempotencyOverrides, KeyScope, LayerSetting, OnStoreError, ParamsMismatch, RiskLevel,
    ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{
    tool_fn, DedupeMode, EnvelopeValidateLayer, ErrorClass, ErrorCode, MatchedOn,
    ResultEnvelopeLayer, ToolCall, ToolError, ToolOutput,
};

// ---------------------------------------------------------------------------------------------
// Backends

/// A store to run the suite against, and how time passes for it.
trait Backend: Send + Sync + 'static {
    type Store: DedupeStore + std::fmt::Debug;

    /// A new handle to the backend's store: for Redis, another replica with its own
    /// connections.
    fn store(&self) -> Self::Store;

    /// Lets `by` pass: paused time for memory, real time for Redis.
    fn elapse(&self, by: Duration) -> impl Future<Output = ()> + Send;

    /// A duration the case names (`24 h`, `2 min`) as this backend can wait for it: the
    /// duration itself with paused time, a short real one for Redis.
    fn time(&self, nominal: Duration) -> Duration;

    /// Whether ages are exact (paused time).
    fn exact_time(&self) -> bool;
}

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

#[cfg(feature = "redis")]
mod redis_backend {
    use super::*;
    use support::redis_server::RedisServer;
    use tower_toolcall::idempotency::RedisDedupeStore;

    pub(crate) struct Redis {
        pub(crate) server: Mutex<RedisServer>,
        url: String,
    }

    impl Redis {
        pub(crate) fn start() -> Redis {
            let server = RedisServer::start();
            let url = server.url();
            Redis {
                server: Mutex::new(server),
                url,
            }
        }

        pub(crate) fn replica(&self, operation_timeout: Duration) -> RedisDedupeStore {
            RedisDedupeStore::builder(self.url.as_str())
                .operation_timeout(operation_timeout)
                .build()
                .expect("a valid store configuration")
        }
    }

    impl Backend for Redis {
        type Store = RedisDedupeStore;

        fn store(&self) -> RedisDedupeStore {
            self.replica(Duration::from_secs(2))
        }

        fn elapse(&self, by: Duration) -> impl Future<Output = ()> + Send {
            tokio::time::sleep(by)
        }

        fn time(&self, nominal: Duration) -> Duration {
            nominal.min(Duration::from_millis(400))
        }

        fn exact_time(&self) -> bool {
            false
        }
    }
}

/// Runs each case once per store.
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

        #[cfg(feature = "redis")]
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::redis_backend::Redis::start()).await;
                }
            )*
        }
    };
}

store_suite!(
    concurrent_identical_calls_run_the_tool_once,
    best_effort_duplicate_in_flight_fails_fast,
    duplicate_stops_waiting_at_the_call_deadline,
    done_is_answered_from_cache_until_its_ttl_ends,
    result_envelope_reports_the_cache_match,
    retriable_failure_runs_again_under_best_effort_only,
    terminal_failure_is_answered_from_cache,
    same_key_with_other_params_is_a_conflict_or_an_independent_key,
    scope_session_global_and_tenant_separate_keys,
    dropped_first_caller_cancels_and_frees_the_key,
    holder_that_stops_loses_its_key_and_its_late_result,
    lease_is_renewed_while_the_tool_runs,
    refused_calls_leave_no_record,
    error_that_was_not_processed_frees_the_key,
    calls_pass_through_when_deduplication_is_off,
    a_caller_may_not_loosen_the_tools_dedupe_mode_unless_its_policy_says_so,
    store_claims_finalizes_and_fences_by_version,
    store_deletes_and_flushes_by_tenant_prefix,
    store_finds_a_record_by_its_fingerprint,
);

// ---------------------------------------------------------------------------------------------
// Helpers

const NS: &str = "vault";
const TOOL: &str = "createFile";

/// A tool service, or a stack over one, that the tests can clone and spawn.
trait ToolStack:
    Service<ToolCall, Response = ToolOutput, Error = ToolError, Future: Send> + Clone + Send + 'static
{
}

impl<T> ToolStack for T where
    T: Service<ToolCall, Response = ToolOutput, Error = ToolError, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// What the mock tool answers on its `n`-th run (from 1).
type Respond = Arc<dyn Fn(&ToolCall, usize) -> Result<ToolOutput, ToolError> + Send + Sync>;

/// A mock tool: counts its runs, announces each start, takes `delay`, and answers.
#[derive(Clone)]
struct MockTool {
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    delay: Duration,
    respond: Respond,
}

impl MockTool {
    fn echo(delay: Duration) -> MockTool {
        MockTool::responding(delay, |call, n| {
            Ok(
                ToolOutput::new(json!({"run": n, "params": call.params().as_value()}))
                    .with_metadata("etag", json!(format!("e{n}"))),
            )
        })
    }

    fn responding(
        delay: Duration,
        respond: impl Fn(&ToolCall, usize) -> Result<ToolOutput, ToolError> + Send + Sync + 'static,
    ) -> MockTool {
        MockTool {
            runs: Arc::default(),
            started: Arc::default(),
            delay,
            respond: Arc::new(respond),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn service(&self) -> impl ToolStack {
        let tool = self.clone();
        tool_fn(move |call: ToolCall| {
            let tool = tool.clone();
            async move {
                let n = tool.runs.fetch_add(1, Ordering::SeqCst) + 1;
                tool.started.notify_one();
                tokio::time::sleep(tool.delay).await;
                (tool.respond)(&call, n)
            }
        })
    }
}

/// `idem` over the mock tool.
fn over<St: DedupeStore>(idem: &IdempotencyLayer<St>, tool: &MockTool) -> impl ToolStack {
    idem.layer(tool.service())
}

fn registry(policy: ToolPolicy) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, TOOL, RiskLevel::Writes).with_policy(policy))
        .build()
        .unwrap()
}

fn policy(overrides: IdempotencyOverrides) -> ToolPolicy {
    ToolPolicy::default().with_idempotency(overrides)
}

fn layer<St: DedupeStore>(store: St, policy: ToolPolicy) -> IdempotencyLayer<St> {
    IdempotencyLayer::new(registry(policy), store)
}

/// A call of the tool in `session` with `params`.
fn call(session: &str, params: Value) -> tower_toolcall::envelope::ToolCallBuilder {
    ToolCall::builder(NS, TOOL)
        .session(session)
        .actor("user-7")
        .params(params)
}

async fn run<Svc>(svc: &Svc, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    Svc: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone,
{
    svc.clone().oneshot(call).await
}

fn matched_on(output: &ToolOutput) -> Option<MatchedOn> {
    output.record().cache.as_ref().map(|c| c.matched_on)
}

/// Polls `check` until it holds, letting time pass (up to `limit` of it).
async fn eventually<B: Backend, F, Fut>(b: &B, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let step = Duration::from_millis(10);
    let mut waited = Duration::ZERO;
    while !check().await {
        assert!(
            waited < limit,
            "the condition did not hold within {limit:?}"
        );
        b.elapse(step).await;
        waited += step;
    }
}

/// A future that can be frozen: while frozen it is not polled at all, as if its process
/// had stopped.
struct Freezable<F> {
    inner: Pin<Box<F>>,
    control: Arc<Mutex<(bool, Option<Waker>)>>,
}

#[derive(Clone)]
struct Freezer(Arc<Mutex<(bool, Option<Waker>)>>);

impl Freezer {
    fn freeze(&self) {
        self.0.lock().unwrap().0 = true;
    }

    fn thaw(&self) {
        let waker = {
            let mut control = self.0.lock().unwrap();
            control.0 = false;
            control.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

fn freezable<F: Future>(inner: F) -> (Freezable<F>, Freezer) {
    let control = Arc::new(Mutex::new((false, None)));
    (
        Freezable {
            inner: Box::pin(inner),
            control: control.clone(),
        },
        Freezer(control),
    )
}

impl<F: Future> Future for Freezable<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut control = self.control.lock().unwrap();
            if control.0 {
                control.1 = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// The shared suite

async fn concurrent_identical_calls_run_the_tool_once<B: Backend>(b: B) {
    let tool = MockTool::echo(Duration::from_millis(300));
    let layer = layer(b.store(), ToolPolicy::default());
    let svc = over(&layer, &tool);
    let params = json!({"path": "XYZ/Foo.md", "content": "hello"});

    let started = tokio::time::Instant::now();
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let svc = svc.clone();
            let call = call("sess-42", params.clone()).build().unwrap();
            tokio::spawn(async move { svc.oneshot(call).await })
        })
        .collect();
    let mut outputs = Vec::new();
    for handle in calls {
        outputs.push(handle.await.unwrap().expect("every call succeeds"));
    }

    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "the waiters were woken by the result, not by a poll or the end of the lease"
    );
    assert_eq!(tool.runs(), 1, "the tool runs once for 100 identical calls");
    let first = &outputs[0].content;
    assert!(outputs.iter().all(|o| &o.content == first));
    assert!(outputs.iter().all(|o| o.metadata == outputs[0].metadata));
    let joined = outputs
        .iter()
        .filter(|o| o.record().from_cache && matched_on(o) == Some(MatchedOn::Inflight))
        .count();
    assert_eq!(joined, 99);
    assert_eq!(outputs.iter().filter(|o| !o.record().from_cache).count(), 1);
    let stats = layer.stats();
    assert_eq!((stats.executions, stats.inflight_joins), (1, 99));
}

async fn best_effort_duplicate_in_flight_fails_fast<B: Backend>(b: B) {
    let tool = MockTool::echo(Duration::from_millis(500));
    // The tool lets callers ask for best effort under its enforced mode.
    let loosen = IdempotencyOverrides::default().with_callers_may_loosen(true);
    let svc = over(&layer(b.store(), policy(loosen)), &tool);
    let make = || {
        call("sess-42", json!({"path": "a.md"}))
            .dedupe_mode(DedupeMode::BestEffort)
            .build()
            .unwrap()
    };
    let first = tokio::spawn(run_owned(svc.clone(), make()));
    tool.started.notified().await;

    let err = run(&svc, make()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyInFlight);
    assert!(err.is_retriable() && err.is_not_processed());
    assert!(err.details().unwrap()["keyFingerprint"].is_string());
    assert!(
        !first.is_finished(),
        "refused while the first call still runs"
    );
    assert_eq!(tool.runs(), 1);

    let out = first.await.unwrap().unwrap();
    assert!(!out.record().from_cache);
    assert_eq!(tool.runs(), 1);

    // The tool's policy gives the mode when the call does not say.
    let tool = MockTool::echo(Duration::from_millis(500));
    let svc = over(
        &layer(
            b.store(),
            policy(IdempotencyOverrides::default().with_dedupe_mode(DedupeMode::BestEffort)),
        ),
        &tool,
    );
    let make = || call("sess-43", json!({"path": "a.md"})).build().unwrap();
    let first = tokio::spawn(run_owned(svc.clone(), make()));
    tool.started.notified().await;
    let err = run(&svc, make()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyInFlight);
    first.await.unwrap().unwrap();
    assert_eq!(tool.runs(), 1);
}

async fn duplicate_stops_waiting_at_the_call_deadline<B: Backend>(b: B) {
    let tool = MockTool::echo(b.time(Duration::from_secs(10)));
    let svc = over(&layer(b.store(), ToolPolicy::default()), &tool);
    let make = || call("sess-42", json!({"path": "a.md"}));
    let first = tokio::spawn(run_owned(svc.clone(), make().build().unwrap()));
    tool.started.notified().await;

    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hurried = make().deadline_at_ms(now_ms + 100).build().unwrap();
    let err = run(&svc, hurried).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout);
    assert!(err.is_not_processed());
    assert!(err.message().contains("deadline"), "{}", err.message());
    assert!(!first.is_finished(), "the first call still runs");
    let out = first.await.unwrap().unwrap();
    assert!(!out.record().from_cache);
    assert_eq!(tool.runs(), 1);
}

async fn run_owned<Svc>(svc: Svc, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    Svc: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.oneshot(call).await
}

async fn done_is_answered_from_cache_until_its_ttl_ends<B: Backend>(b: B) {
    let ttl = b.time(Duration::from_secs(24 * 60 * 60));
    let tool = MockTool::echo(Duration::ZERO);
    let store = b.store();
    let layer = layer(
        store.clone(),
        policy(IdempotencyOverrides::default().with_done_ttl_ms(ttl.as_millis() as u64)),
    );
    let svc = over(&layer, &tool);
    let params = json!({"path": "XYZ/Foo.md", "content": "hello", "clientTs": 1});
    let first_call = call("sess-42", params).build().unwrap();
    let key = layer.store_key(&first_call).unwrap().unwrap();
    let canonical =
        canonical_json(first_call.params().as_value(), &CanonicalOptions::default()).unwrap();
    let digest = params_digest(&canonical);
    // The key is derived, a hash already: results name it by its first 16 hex digits.
    let derived = derive_key(
        first_call.tool_namespace(),
        first_call.tool_name(),
        &canonical,
        first_call.session_key(),
        first_call.actor_id(),
    );

    let first = run(&svc, first_call).await.unwrap();
    let stored = store.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.state, RecordState::Done);
    assert_eq!(*stored.request.params_digest, digest);

    // A volatile member does not change the key.
    let again_call = call(
        "sess-42",
        json!({"path": "XYZ/Foo.md", "content": " hello ", "clientTs": 2}),
    )
    .build()
    .unwrap();
    let again = run(&svc, again_call).await.unwrap();
    assert_eq!(tool.runs(), 1);
    assert_eq!(again.content, first.content);
    assert_eq!(again.metadata, first.metadata);
    assert!(again.record().from_cache);
    let cache = again.record().cache.clone().unwrap();
    assert_eq!(cache.matched_on, MatchedOn::Completed);
    assert_eq!(cache.key_fingerprint, derived[..16]);
    assert_eq!(again.record().attempts, Some(1));
    let unchanged = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        *unchanged.request.params_digest, digest,
        "the digest is unchanged"
    );
    assert_eq!(unchanged.version, stored.version);

    b.elapse(ttl + Duration::from_millis(50)).await;
    let later = run(
        &svc,
        call("sess-42", json!({"path": "XYZ/Foo.md", "content": "hello"}))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        tool.runs(),
        2,
        "past its TTL the record is gone and the tool runs again"
    );
    assert!(!later.record().from_cache);
    assert_eq!(later.content["run"], 2);
}

async fn result_envelope_reports_the_cache_match<B: Backend>(b: B) {
    let tool = MockTool::echo(Duration::ZERO);
    let idem = layer(b.store(), ToolPolicy::default());
    let svc = ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(idem.clone())
        .service(tool.service());
    let make = || {
        call("sess-42", json!({"path": "XYZ/Foo.md"}))
            .idempotency_key("create-foo-1")
            .build()
            .unwrap()
    };
    let key = idem.store_key(&make()).unwrap().unwrap();
    let first = svc.clone().oneshot(make()).await.unwrap();
    assert!(!first.from_cache && first.cache.is_none());

    b.elapse(Duration::from_millis(1520)).await;
    let cached = svc.clone().oneshot(make()).await.unwrap();
    let json = serde_json::to_value(&cached).unwrap();
    assert_eq!(json["fromCache"], true);
    assert_eq!(json["status"], "success");
    assert_eq!(json["cache"]["matchedOn"], "completed");
    let fingerprint = json["cache"]["keyFingerprint"].as_str().unwrap();
    assert_eq!(fingerprint, key_fingerprint(&key));
    assert_eq!(fingerprint.len(), 16);
    assert!(
        !json.to_string().contains("create-foo-1"),
        "the raw key never shows"
    );
    let age = json["cache"]["ageMs"].as_u64().unwrap();
    if b.exact_time() {
        assert_eq!(age, 1520);
    } else {
        assert!((1500..10_000).contains(&age), "ageMs {age}");
    }
    assert_eq!(json["output"], serde_json::to_value(&first.output).unwrap());
    assert_eq!(tool.runs(), 1);
}

async fn retriable_failure_runs_again_under_best_effort_only<B: Backend>(b: B) {
    let tool = MockTool::responding(Duration::ZERO, |_, n| match n {
        1 => Err(ToolError::from_http_status(502, "bad gateway").with_details(json!({"hop": 1}))),
        n => Ok(ToolOutput::new(json!({"run": n}))),
    });
    // The tool lets callers ask for best effort under its enforced mode.
    let loosen = IdempotencyOverrides::default().with_callers_may_loosen(true);
    let svc = over(&layer(b.store(), policy(loosen)), &tool);
    let make = |mode| {
        call("sess-42", json!({"path": "a.md"}))
            .idempotency_key("k-1")
            .dedupe_mode(mode)
            .build()
            .unwrap()
    };

    let failed = run(&svc, make(DedupeMode::Enforced)).await.unwrap_err();
    assert_eq!(failed.code(), ErrorCode::UpstreamUnavailable);
    assert!(!failed.record().from_cache);

    // Enforced: the failure is cached, retriable or not.
    let cached = run(&svc, make(DedupeMode::Enforced)).await.unwrap_err();
    assert_eq!(tool.runs(), 1);
    assert!(cached.record().from_cache);
    assert_eq!(cached.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(cached.class(), ErrorClass::Retriable);
    assert_eq!(cached.http_status(), Some(502));
    assert_eq!(cached.message(), "bad gateway");
    assert_eq!(cached.details(), Some(&json!({"hop": 1})));

    // Best effort: a retriable failure runs again.
    let rerun = run(&svc, make(DedupeMode::BestEffort)).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(!rerun.record().from_cache);
    assert_eq!(rerun.content["run"], 2);
    let now_cached = run(&svc, make(DedupeMode::BestEffort)).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert_eq!(now_cached.content["run"], 2);
}

async fn terminal_failure_is_answered_from_cache<B: Backend>(b: B) {
    let tool = MockTool::responding(Duration::ZERO, |_, _| {
        Err(ToolError::from_http_status(404, "no such folder")
            .with_retry_after(Duration::from_millis(1500))
            .with_details(json!({"path": "XYZ"})))
    });
    let svc = over(&layer(b.store(), ToolPolicy::default()), &tool);
    let make = || {
        call("sess-42", json!({"path": "XYZ/Foo.md"}))
            .dedupe_mode(DedupeMode::BestEffort)
            .build()
            .unwrap()
    };
    let original = run(&svc, make()).await.unwrap_err();
    let cached = run(&svc, make()).await.unwrap_err();
    assert_eq!(
        tool.runs(),
        1,
        "a terminal failure is not run again, even best effort"
    );
    assert!(cached.record().from_cache);
    assert_eq!(
        cached.record().cache.as_ref().unwrap().matched_on,
        MatchedOn::Completed
    );
    assert_eq!(cached.code(), ErrorCode::NotFound);
    assert_eq!(cached.class(), ErrorClass::Terminal);
    assert_eq!(cached.message(), original.message());
    assert_eq!(cached.http_status(), Some(404));
    assert_eq!(cached.retry_after(), Some(Duration::from_millis(1500)));
    assert_eq!(cached.details(), original.details());
    assert!(!cached.is_not_processed());
}

async fn same_key_with_other_params_is_a_conflict_or_an_independent_key<B: Backend>(b: B) {
    let store = b.store();
    let tool = MockTool::echo(Duration::ZERO);
    let conflict = layer(store.clone(), ToolPolicy::default());
    let svc = over(&conflict, &tool);
    let with = |path: &str| {
        call("sess-42", json!({"path": path}))
            .idempotency_key("create-1")
            .build()
            .unwrap()
    };
    run(&svc, with("a.md")).await.unwrap();
    let err = run(&svc, with("b.md")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyReused);
    assert!(err.is_not_processed() && !err.is_retriable());
    assert!(!err.message().contains("create-1"));
    assert_eq!(
        tool.runs(),
        1,
        "never a false cache hit, never a second run"
    );
    let key = conflict.store_key(&with("a.md")).unwrap().unwrap();
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.payload.unwrap().content["params"]["path"], "a.md");
    assert_eq!(conflict.stats().key_conflicts, 1);

    let independent_tool = MockTool::echo(Duration::ZERO);
    let independent = over(
        &layer(
            store.clone(),
            policy(
                IdempotencyOverrides::default()
                    .with_on_params_mismatch(ParamsMismatch::Independent),
            ),
        ),
        &independent_tool,
    );
    let a = run(&independent, with("a.md")).await.unwrap();
    let b_out = run(&independent, with("b.md")).await.unwrap();
    assert_eq!(
        independent_tool.runs(),
        2,
        "with the independent policy both run"
    );
    assert_eq!(a.content["params"]["path"], "a.md");
    assert_eq!(b_out.content["params"]["path"], "b.md");
    let a_again = run(&independent, with("a.md")).await.unwrap();
    assert!(a_again.record().from_cache);
    assert_eq!(a_again.content, a.content);
    assert_eq!(independent_tool.runs(), 2);

    // A caller's key that equals the key derived for other params is no false hit either:
    // the record it wrote is checked by its params digest.
    let derived_for = |path: &str| {
        let params = json!({"path": path});
        let canonical = canonical_json(&params, &CanonicalOptions::default()).unwrap();
        derive_key(NS, TOOL, &canonical, "sess-42", "user-7")
    };
    let posing = call("sess-42", json!({"path": "c.md"}))
        .idempotency_key(derived_for("d.md"))
        .build()
        .unwrap();
    run(&svc, posing).await.unwrap();
    assert_eq!(tool.runs(), 2);
    let honest = call("sess-42", json!({"path": "d.md"})).build().unwrap();
    let err = run(&svc, honest).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyReused);
    assert_eq!(
        tool.runs(),
        2,
        "the derived call gets no output of other params"
    );
}

async fn scope_session_global_and_tenant_separate_keys<B: Backend>(b: B) {
    let params = json!({"query": "tower retry"});
    let session_tool = MockTool::echo(Duration::ZERO);
    let session_scoped = over(&layer(b.store(), ToolPolicy::default()), &session_tool);
    for session in ["sess-1", "sess-2", "sess-1"] {
        run(
            &session_scoped,
            call(session, params.clone()).build().unwrap(),
        )
        .await
        .unwrap();
    }
    assert_eq!(session_tool.runs(), 2, "one run per session");

    let global_tool = MockTool::echo(Duration::ZERO);
    let global = over(
        &layer(
            b.store(),
            policy(IdempotencyOverrides::default().with_scope(KeyScope::Global)),
        ),
        &global_tool,
    );
    for session in ["sess-3", "sess-4"] {
        let out = run(&global, call(session, params.clone()).build().unwrap())
            .await
            .unwrap();
        assert_eq!(out.content["run"], 1);
    }
    assert_eq!(
        global_tool.runs(),
        1,
        "global scope: one run for every session"
    );
    for tenant in ["tenant-a", "tenant-b", "tenant-a"] {
        run(
            &global,
            call("sess-5", params.clone())
                .tenant(tenant)
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    }
    assert_eq!(global_tool.runs(), 3, "each tenant has keys of its own");
}

async fn dropped_first_caller_cancels_and_frees_the_key<B: Backend>(b: B) {
    let store = b.store();
    let tool = MockTool::echo(Duration::from_secs(60));
    let idem = layer(store.clone(), ToolPolicy::default());
    let svc = over(&idem, &tool);
    let make = || call("sess-42", json!({"path": "a.md"})).build().unwrap();
    let key = idem.store_key(&make()).unwrap().unwrap();

    let first = tokio::spawn(run_owned(svc.clone(), make()));
    tool.started.notified().await;
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().state,
        RecordState::Inflight
    );
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    eventually(&b, Duration::from_secs(2), || async {
        store.get(&key).await.unwrap().map(|r| r.state) == Some(RecordState::Cancelled)
    })
    .await;

    let quick = MockTool::echo(Duration::ZERO);
    let svc = over(&idem, &quick);
    let out = run(&svc, make()).await.unwrap();
    assert_eq!(quick.runs(), 1, "the key is free: the next call runs");
    assert!(!out.record().from_cache);
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().state,
        RecordState::Done
    );
}

async fn holder_that_stops_loses_its_key_and_its_late_result<B: Backend>(b: B) {
    let lease = b.time(Duration::from_secs(120));
    let store = b.store();
    let release_first = Arc::new(Notify::new());
    let gate = release_first.clone();
    let tool = MockTool::responding(Duration::ZERO, |_, n| {
        Ok(ToolOutput::new(json!({"run": n})))
    });
    let gated = {
        let inner = tool.clone();
        tool_fn(move |call: ToolCall| {
            let mut inner = inner.service();
            let gate = gate.clone();
            async move {
                let out = inner.call(call).await;
                if out.as_ref().map(|o| o.content["run"] == 1).unwrap_or(false) {
                    gate.notified().await;
                }
                out
            }
        })
    };
    let idem = layer(
        store.clone(),
        policy(IdempotencyOverrides::default().with_inflight_lease_ms(lease.as_millis() as u64)),
    );
    let svc = ServiceBuilder::new().layer(idem.clone()).service(gated);
    let make = || call("sess-42", json!({"path": "a.md"})).build().unwrap();
    let key = idem.store_key(&make()).unwrap().unwrap();

    let (holder, freezer) = freezable(run_owned(svc.clone(), make()));
    let holder = tokio::spawn(holder);
    tool.started.notified().await;
    freezer.freeze();
    let claimed_version = store.get(&key).await.unwrap().unwrap().version;

    // The holder makes no progress (it renews nothing); its lease ends.
    b.elapse(lease + Duration::from_millis(100)).await;
    let taken_over = run(&svc, make()).await.unwrap();
    assert_eq!(tool.runs(), 2, "the next caller takes the key over");
    assert_eq!(taken_over.content["run"], 2);
    let record = store.get(&key).await.unwrap().unwrap();
    assert!(
        record.version > claimed_version,
        "a takeover gets a larger version"
    );

    // The holder comes back and finishes: its result is refused by the version check.
    release_first.notify_one();
    freezer.thaw();
    let late = holder.await.unwrap().unwrap();
    assert_eq!(
        late.content["run"], 1,
        "the late caller still gets its own output"
    );
    assert!(!late.record().from_cache);
    assert_eq!(idem.stats().stale_results, 1);
    let kept = store.get(&key).await.unwrap().unwrap();
    assert_eq!(kept.state, RecordState::Done);
    assert_eq!(kept.payload.unwrap().content["run"], 2, "not overwritten");

    let cached = run(&svc, make()).await.unwrap();
    assert_eq!(cached.content["run"], 2);
    assert!(cached.record().from_cache);
    assert_eq!(tool.runs(), 2);
}

async fn lease_is_renewed_while_the_tool_runs<B: Backend>(b: B) {
    let lease = b.time(Duration::from_secs(120));
    let tool = MockTool::echo(lease * 5 / 2);
    let svc = over(
        &layer(
            b.store(),
            policy(
                IdempotencyOverrides::default().with_inflight_lease_ms(lease.as_millis() as u64),
            ),
        ),
        &tool,
    );
    let make = || call("sess-42", json!({"path": "a.md"})).build().unwrap();
    let first = tokio::spawn(run_owned(svc.clone(), make()));
    tool.started.notified().await;

    // Past the first lease, the holder is alive and has renewed: the duplicate joins.
    b.elapse(lease * 3 / 2).await;
    let joined = run(&svc, make()).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(tool.runs(), 1, "a renewed lease is not taken over");
    assert_eq!(joined.content, first.content);
    assert_eq!(matched_on(&joined), Some(MatchedOn::Inflight));
}

async fn refused_calls_leave_no_record<B: Backend>(b: B) {
    let store = b.store();
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new(NS, TOOL, RiskLevel::Writes).with_input_schema(json!({
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string"}}
            })),
        )
        .tool(
            ToolDescriptor::new(NS, "raw", RiskLevel::Writes)
                .with_policy(ToolPolicy::default().with_validate(LayerSetting::Off)),
        )
        .build()
        .unwrap();
    let tool = MockTool::echo(Duration::ZERO);
    let svc = ServiceBuilder::new()
        .layer(EnvelopeValidateLayer::new(registry.clone()))
        .layer(IdempotencyLayer::new(registry, store.clone()))
        .service(tool.service());

    let invalid = call("sess-42", json!({"content": "no path"}))
        .build()
        .unwrap();
    let err = run(&svc, invalid).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);

    // Params too deep for canonical JSON, on a tool whose validation is off: this layer
    // refuses the call itself.
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({ "n": deep });
    }
    let too_deep = ToolCall::builder(NS, "raw")
        .session("sess-42")
        .actor("user-7")
        .params(json!({ "d": deep }))
        .build()
        .unwrap();
    let err = run(&svc, too_deep).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);

    assert_eq!(tool.runs(), 0);
    assert_eq!(store.size().await.unwrap(), 0, "no record was created");
}

async fn error_that_was_not_processed_frees_the_key<B: Backend>(b: B) {
    let store = b.store();
    let tool = MockTool::responding(Duration::ZERO, |_, n| match n {
        1 => Err(ToolError::from_http_status(429, "slow down")),
        n => Ok(ToolOutput::new(json!({"run": n}))),
    });
    let idem = layer(store.clone(), ToolPolicy::default());
    let svc = over(&idem, &tool);
    let make = || call("sess-42", json!({"path": "a.md"})).build().unwrap();
    let key = idem.store_key(&make()).unwrap().unwrap();

    let err = run(&svc, make()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().state,
        RecordState::Cancelled,
        "a refusal before any effect does not hold the key"
    );
    let out = run(&svc, make()).await.unwrap();
    assert_eq!(out.content["run"], 2);
    assert_eq!(idem.stats().released_unprocessed, 1);
}

async fn a_caller_may_not_loosen_the_tools_dedupe_mode_unless_its_policy_says_so<B: Backend>(b: B) {
    let tool = MockTool::echo(Duration::ZERO);
    let disabled = |key: &str| {
        call("sess-loosen", json!({"path": "a.md"}))
            .idempotency_key(key)
            .dedupe_mode(DedupeMode::Disabled)
            .build()
            .unwrap()
    };
    // By default the call's `disabled` is ignored: the key still holds.
    let strict = over(&layer(b.store(), ToolPolicy::default()), &tool);
    run(&strict, disabled("k-strict")).await.unwrap();
    let again = run(&strict, disabled("k-strict")).await.unwrap();
    assert_eq!(
        tool.runs(),
        1,
        "the caller could not switch deduplication off"
    );
    assert!(again.record().from_cache);

    // A tool whose policy lets callers loosen its mode: `disabled` is followed.
    let loose = over(
        &layer(
            b.store(),
            policy(IdempotencyOverrides::default().with_callers_may_loosen(true)),
        ),
        &tool,
    );
    run(&loose, disabled("k-loose")).await.unwrap();
    let again = run(&loose, disabled("k-loose")).await.unwrap();
    assert_eq!(tool.runs(), 3);
    assert!(!again.record().from_cache);
}

async fn calls_pass_through_when_deduplication_is_off<B: Backend>(b: B) {
    let store = b.store();
    let tool = MockTool::echo(Duration::ZERO);
    let off = over(
        &layer(
            store.clone(),
            ToolPolicy::default().with_idempotency(LayerSetting::Off),
        ),
        &tool,
    );
    let make = || call("sess-42", json!({"path": "a.md"}));
    run(&off, make().build().unwrap()).await.unwrap();
    run(&off, make().build().unwrap()).await.unwrap();
    assert_eq!(tool.runs(), 2, "layer off for the tool");

    let on = over(
        &layer(
            store.clone(),
            policy(
                IdempotencyOverrides::default()
                    .with_derive_key(false)
                    .with_callers_may_loosen(true),
            ),
        ),
        &tool,
    );
    run(&on, make().build().unwrap()).await.unwrap();
    for _ in 0..2 {
        let disabled = make()
            .dedupe_mode(DedupeMode::Disabled)
            .idempotency_key("k");
        run(&on, disabled.build().unwrap()).await.unwrap();
    }
    assert_eq!(
        tool.runs(),
        5,
        "no key without derivation; dedupeMode disabled"
    );
    assert_eq!(store.size().await.unwrap(), 0);

    // A key a hook put on the call is used when derivation is off.
    let mut hooked = make().build().unwrap();
    hooked.set_hook_idempotency_key("from-hook");
    run(&on, hooked.clone()).await.unwrap();
    let cached = run(&on, hooked).await.unwrap();
    assert!(cached.record().from_cache);
    assert_eq!(tool.runs(), 6);
}

fn claim_request(key: &str, digest: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(
        key,
        "k",
        digest,
        call("sess-42", json!({"path": "a.md"}))
            .request_id("01J9Z8Q4V6K3T2M1N0P9R8S7T6")
            .tool_call_id("call_1")
            .build()
            .unwrap(),
        lease,
    )
}

fn done(content: Value, ttl: Duration) -> Completion {
    let output = ToolOutput::new(content);
    let execution = Execution::from_outcome(&Ok(output.clone()), 0, 5);
    Completion::new(Ok(output), execution, ttl)
}

async fn store_claims_finalizes_and_fences_by_version<B: Backend>(b: B) {
    let store = b.store();
    let lease = b.time(Duration::from_secs(120));
    let request = claim_request("t/vault::createFile/s/a/b/k", "d1", lease);
    let ClaimOutcome::Claimed(first) = store.claim(&request).await.unwrap() else {
        panic!("a free key is claimed");
    };
    assert_eq!(first.state, RecordState::Inflight);
    assert_eq!(
        first.lock_until_ms,
        Some(first.created_at_ms + lease.as_millis() as u64)
    );
    let ClaimOutcome::Existing { record, .. } = store.claim(&request).await.unwrap() else {
        panic!("a held key is not claimed twice");
    };
    assert_eq!(record.version, first.version);
    assert_eq!(record.request, first.request);
    assert!(store.renew(&first, lease).await.unwrap());

    // The lease ends: another claim takes over with a larger version; the first holder can
    // neither renew nor finalize nor cancel any more.
    b.elapse(lease + Duration::from_millis(100)).await;
    let ClaimOutcome::Claimed(second) = store.claim(&request).await.unwrap() else {
        panic!("a key whose lease ended is taken over");
    };
    assert!(second.version > first.version);
    assert!(!store.renew(&first, lease).await.unwrap());
    assert!(!store.cancel(&first, lease).await.unwrap());
    assert_eq!(
        store
            .finalize(&first, done(json!("late"), lease))
            .await
            .unwrap(),
        Finalized::Stale {
            current_version: Some(second.version)
        }
    );
    assert_eq!(
        store
            .finalize(&second, done(json!("fresh"), lease))
            .await
            .unwrap(),
        Finalized::Written
    );
    let stored = store.get(&request.key).await.unwrap().unwrap();
    assert_eq!(stored.state, RecordState::Done);
    assert_eq!(stored.payload.as_ref().unwrap().content, json!("fresh"));
    assert_eq!(stored.version, second.version);
    assert_eq!(stored.execution.as_ref().unwrap().attempt_count, 1);
    assert_eq!(stored.lock_until_ms, None);

    // The record's JSON has the documented shape.
    let json = serde_json::to_value(&stored).unwrap();
    for member in [
        "key",
        "tool",
        "idempotencyKey",
        "state",
        "createdAtMs",
        "updatedAtMs",
        "expiresAtMs",
        "ttlMs",
        "request",
        "execution",
        "payload",
        "version",
    ] {
        assert!(json.get(member).is_some(), "{member} in {json}");
    }
    assert_eq!(json["state"], "done");
    assert_eq!(json["request"]["paramsDigest"], "d1");
    assert_eq!(json["request"]["toolCallId"], "call_1");
    assert_eq!(json["execution"]["attempts"][0]["status"], "success");
}

async fn store_deletes_and_flushes_by_tenant_prefix<B: Backend>(b: B) {
    let store = b.store();
    let lease = b.time(Duration::from_secs(120));
    let keys = [
        format!("{}vault::createFile/s/a/b/k1", tenant_prefix(Some("acme"))),
        format!("{}vault::createFile/s/a/b/k2", tenant_prefix(Some("acme"))),
        format!("{}vault::createFile/s/a/b/k1", tenant_prefix(Some("other"))),
        format!("{}vault::createFile/s/a/b/k1", tenant_prefix(None)),
    ];
    for key in &keys {
        let ClaimOutcome::Claimed(claimed) =
            store.claim(&claim_request(key, "d", lease)).await.unwrap()
        else {
            panic!("fresh keys are claimed");
        };
        store
            .finalize(&claimed, done(json!(1), lease))
            .await
            .unwrap();
    }
    assert_eq!(store.size().await.unwrap(), 4);
    assert_eq!(
        store
            .flush_prefix(&tenant_prefix(Some("acme")))
            .await
            .unwrap(),
        2
    );
    assert_eq!(store.size().await.unwrap(), 2);
    assert!(store.get(&keys[0]).await.unwrap().is_none());
    assert!(store.get(&keys[2]).await.unwrap().is_some());
    assert!(store.delete(&keys[3]).await.unwrap());
    assert!(!store.delete(&keys[3]).await.unwrap());
    assert_eq!(store.size().await.unwrap(), 1);
}

async fn store_finds_a_record_by_its_fingerprint<B: Backend>(b: B) {
    let store = b.store();
    let lease = b.time(Duration::from_secs(120));
    let derived = "ab".repeat(32);
    let keys = [
        format!(
            "{}vault::createFile/s/a/b/report-1",
            tenant_prefix(Some("acme"))
        ),
        format!("{}vault::createFile/g/{derived}", tenant_prefix(None)),
    ];
    for key in &keys {
        let ClaimOutcome::Claimed(claimed) =
            store.claim(&claim_request(key, "d", lease)).await.unwrap()
        else {
            panic!("fresh keys are claimed");
        };
        store
            .finalize(&claimed, done(json!(key), lease))
            .await
            .unwrap();
    }
    let found = store
        .find_by_fingerprint(&key_fingerprint(&keys[0]))
        .await
        .unwrap()
        .expect("the record of the key's fingerprint");
    assert_eq!(&*found.key, keys[0]);
    let found = store
        .find_by_fingerprint(&derived[..16])
        .await
        .unwrap()
        .expect("a derived key is named by its first 16 hex digits");
    assert_eq!(&*found.key, keys[1]);
    assert!(store
        .find_by_fingerprint("0123456789abcdef")
        .await
        .unwrap()
        .is_none());
    assert!(store.find_by_fingerprint("short").await.unwrap().is_none());
}

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
        &IdempotencyLayer::builder(registry(ToolPolicy::default()), store.clone())
            .on_store_error(OnStoreError::FailOpen)
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
            policy(IdempotencyOverrides::default().with_done_ttl_ms(1_000)),
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
    let err = IdempotencyLayer::builder(ToolRegistry::open(), InMemoryDedupeStore::new())
        .inflight_lease(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "idempotency.inflight_lease");
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

// ---------------------------------------------------------------------------------------------
// The Redis store only

#[cfg(feature = "redis")]
mod redis_only {
    use super::redis_backend::Redis;
    use super::*;
    use tower_toolcall::idempotency::{RedisDedupeStore, StoreError};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_replicas_run_the_tool_once_and_wake_waiters_by_pubsub() {
        let redis = Redis::start();
        let tool = MockTool::echo(Duration::from_millis(400));
        let replicas = [redis.store(), redis.store()];
        let layers = replicas
            .clone()
            .map(|store| layer(store, ToolPolicy::default()));
        let services = layers.clone().map(|l| over(&l, &tool));
        let params = json!({"path": "XYZ/Foo.md"});
        let calls: Vec<_> = (0..50)
            .map(|i| {
                let svc = services[i % 2].clone();
                let call = call("sess-42", params.clone()).build().unwrap();
                tokio::spawn(async move { svc.oneshot(call).await })
            })
            .collect();
        let mut outputs = Vec::new();
        for handle in calls {
            outputs.push(handle.await.unwrap().unwrap());
        }
        assert_eq!(tool.runs(), 1, "one execution across both replicas");
        assert!(outputs.iter().all(|o| o.content == outputs[0].content));
        assert_eq!(outputs.iter().filter(|o| o.record().from_cache).count(), 49);

        let joins: u64 = layers.iter().map(|l| l.stats().inflight_joins).sum();
        let hits: u64 = layers.iter().map(|l| l.stats().completed_hits).sum();
        assert_eq!(joins + hits, 49);
        assert!(joins > 0);
        for (replica, layer) in replicas.iter().zip(&layers) {
            let stats = replica.stats();
            assert!(
                stats.fallback_polls <= layer.stats().inflight_joins,
                "at most one fallback poll per waiter: {stats:?}"
            );
        }
        let wakeups: u64 = replicas.iter().map(|r| r.stats().pubsub_wakeups).sum();
        assert!(wakeups >= 1, "waiters were woken by pub/sub");
        let polls: u64 = replicas.iter().map(|r| r.stats().fallback_polls).sum();
        assert_eq!(polls, 0, "nothing was lost, so nobody polled");

        // Every waiter unsubscribed again.
        let mut left = usize::MAX;
        for _ in 0..100 {
            left = replicas.iter().map(|r| r.stats().subscribed_channels).sum();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_server_fails_closed_or_open_and_recovers_after_restart() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::ZERO);
        let closed = over(&layer(store.clone(), ToolPolicy::default()), &tool);
        let open = over(
            &layer(
                store.clone(),
                policy(IdempotencyOverrides::default().with_on_store_error(OnStoreError::FailOpen)),
            ),
            &tool,
        );
        let deadline = Duration::from_secs(3);
        let make = |path: &str| call("sess-42", json!({"path": path})).build().unwrap();

        run(&closed, make("before.md")).await.unwrap();
        assert_eq!(tool.runs(), 1);

        redis.server.lock().unwrap().kill();
        let err = tokio::time::timeout(deadline, run(&closed, make("down.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);
        assert!(err.is_retriable() && err.is_not_processed());
        assert_eq!(tool.runs(), 1, "fail closed: the tool did not run");
        // A cached answer is not available either: no stale read, an honest refusal.
        let err = tokio::time::timeout(deadline, run(&closed, make("before.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);

        let out = tokio::time::timeout(deadline, run(&open, make("down.md")))
            .await
            .expect("no hang past the deadline")
            .unwrap();
        assert!(!out.record().from_cache);
        assert_eq!(tool.runs(), 2, "fail open: the tool ran");

        redis.server.lock().unwrap().restart();
        let mut recovered = None;
        for _ in 0..100 {
            match tokio::time::timeout(deadline, run(&closed, make("after.md")))
                .await
                .expect("no hang past the deadline")
            {
                Ok(out) => {
                    recovered = Some(out);
                    break;
                }
                Err(err) => {
                    assert_eq!(err.code(), ErrorCode::StoreUnavailable);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let recovered = recovered.expect("calls work again after the restart");
        assert!(!recovered.record().from_cache);
        let cached = run(&closed, make("after.md")).await.unwrap();
        assert!(cached.record().from_cache, "the store keeps results again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_killed_while_the_tool_runs_returns_its_result_without_a_hang() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::from_millis(300));
        let idem = layer(store, ToolPolicy::default());
        let svc = over(&idem, &tool);
        let running = tokio::spawn(run_owned(
            svc.clone(),
            call("sess-42", json!({"path": "a.md"})).build().unwrap(),
        ));
        tool.started.notified().await;
        redis.server.lock().unwrap().kill();
        let out = tokio::time::timeout(Duration::from_secs(3), running)
            .await
            .expect("no hang past the deadline")
            .unwrap()
            .unwrap();
        assert_eq!(
            out.content["run"], 1,
            "the tool's result reaches its caller"
        );
        assert_eq!(
            idem.stats().store_errors,
            1,
            "the result could not be stored"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_share_a_cluster_slot_with_their_channel() {
        let store = RedisDedupeStore::open("redis://127.0.0.1:1/").unwrap();
        let key = store.record_key("acme/vault::createFile/g/k%7B1%7D");
        assert_eq!(key, "toolcall:idem:{acme/vault::createFile/g/k%7B1%7D}");
        let err = RedisDedupeStore::builder("redis://127.0.0.1:1/")
            .key_prefix("bad{prefix")
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.key_prefix");
        let err = RedisDedupeStore::open("http://nope").unwrap_err();
        assert_eq!(err.field(), "idempotency.redis.url");
        // A server nobody listens on: an error within the timeout, never a hang.
        let store = RedisDedupeStore::builder("redis://127.0.0.1:1/")
            .operation_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(2), store.ping())
            .await
            .expect("bounded by the operation timeout")
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The Redis store: claims whose answer never came, and the commands a call costs

#[cfg(feature = "redis")]
mod redis_unanswered_claims_and_round_trips {
    use super::redis_backend::Redis;
    use super::*;
    use tower_toolcall::idempotency::{RedisDedupeStore, StoreError};

    /// How long a test lets a call run before it counts its claim as sent to a frozen server.
    const CLAIM_ON_ITS_WAY: Duration = Duration::from_millis(100);

    /// A call of the tool whose key is `name`'s own.
    fn make(name: &str) -> ToolCall {
        call("sess-42", json!({"path": name})).build().unwrap()
    }

    /// Connects the store and loads its scripts: a fresh key and a hit of another key.
    async fn warm_up(svc: &impl ToolStack) {
        for _ in 0..2 {
            run(svc, make("warm-up.md")).await.unwrap();
        }
    }

    /// Asserts that the record of `key` soon leaves the key free: gone, or cancelled; never
    /// in flight with nobody to hold it.
    async fn assert_key_freed(store: &impl DedupeStore, key: &str) {
        let mut record = None;
        for _ in 0..50 {
            record = store.get(key).await.unwrap();
            if record
                .as_ref()
                .is_none_or(|r| r.state == RecordState::Cancelled)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the key is still held by a claim nobody owns: {record:?}");
    }

    /// Waits (at most 3 s) until `store` answers again: after an operation timed out, the
    /// store skips its server until a probe finds it back.
    async fn until_answers(store: &RedisDedupeStore) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while store.ping().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the store did not come back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `call`'s result within half a second: a free key, not one that waits for a lease.
    async fn promptly(
        call: impl Future<Output = Result<ToolOutput, ToolError>>,
    ) -> Result<ToolOutput, ToolError> {
        tokio::time::timeout(Duration::from_millis(500), call)
            .await
            .expect("the duplicate was answered at once, not after the lease")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caller_dropped_while_its_claim_is_unanswered_frees_the_key() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_secs(1));
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(store.clone(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        let key = idem.store_key(&make("a.md")).unwrap().unwrap();
        warm_up(&svc).await;

        redis.server.lock().unwrap().freeze();
        let first = tokio::spawn(run_owned(svc.clone(), make("a.md")));
        tokio::time::sleep(CLAIM_ON_ITS_WAY).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        redis.server.lock().unwrap().resume();

        assert_key_freed(&store, &key).await;
        let out = promptly(run(&svc, make("a.md"))).await.unwrap();
        assert_eq!(tool.runs(), 2, "the duplicate ran the tool");
        assert!(!out.record().from_cache);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_that_timed_out_is_released_and_the_retry_runs_at_once() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(store.clone(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        let key = idem.store_key(&make("a.md")).unwrap().unwrap();
        warm_up(&svc).await;

        redis.server.lock().unwrap().freeze();
        let err = run(&svc, make("a.md")).await.unwrap_err();
        redis.server.lock().unwrap().resume();
        assert_eq!(err.code(), ErrorCode::StoreUnavailable);
        assert!(err.is_retriable() && err.is_not_processed());
        assert_eq!(tool.runs(), 1, "the tool did not run");

        until_answers(&store).await;
        assert_key_freed(&store, &key).await;
        let out = promptly(run(&svc, make("a.md"))).await.unwrap();
        assert_eq!(tool.runs(), 2, "the retry ran the tool");
        assert!(!out.record().from_cache);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_that_timed_out_against_a_held_key_leaves_its_holder_alone() {
        let redis = Redis::start();
        let store = redis.replica(Duration::from_millis(300));
        let request = claim_request("/vault::createFile/g/k", "d1", Duration::from_secs(120));
        let ClaimOutcome::Claimed(holder) = store.claim(&request).await.unwrap() else {
            panic!("a fresh key is claimed");
        };

        redis.server.lock().unwrap().freeze();
        let err = store.claim(&request).await.unwrap_err();
        redis.server.lock().unwrap().resume();
        assert!(
            matches!(err, StoreError::Timeout(_) | StoreError::Unavailable(_)),
            "{err}"
        );

        // The claim that timed out was never applied: its release leaves the holder's record.
        until_answers(&store).await;
        let record = store.get(&request.key).await.unwrap().unwrap();
        assert_eq!(
            (record.state, record.version),
            (RecordState::Inflight, holder.version)
        );
        let finalized = store
            .finalize(&holder, done(json!({"ok": true}), Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(
            finalized,
            Finalized::Written,
            "the holder still holds the key"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fresh_key_costs_two_commands_and_a_hit_one() {
        let redis = Redis::start();
        let mut monitor = redis.server.lock().unwrap().monitor();
        let tool = MockTool::echo(Duration::ZERO);
        let idem = layer(redis.store(), ToolPolicy::default());
        let svc = over(&idem, &tool);
        warm_up(&svc).await;
        monitor.take_commands();

        let names = ["a.md", "b.md", "c.md", "d.md", "e.md"];
        for name in names {
            assert!(!run(&svc, make(name)).await.unwrap().record().from_cache);
        }
        assert_eq!(
            monitor.take_commands(),
            ["SET", "EVALSHA"].repeat(names.len()),
            "a fresh key: the claim, then the finalize"
        );
        for name in names {
            assert!(run(&svc, make(name)).await.unwrap().record().from_cache);
        }
        assert_eq!(
            monitor.take_commands(),
            ["SET"].repeat(names.len()),
            "a hit: the claim alone"
        );
        assert_eq!(tool.runs(), 1 + names.len());
    }
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
fn layer_of_tools(tools: &[(&str, &str)]) -> IdempotencyLayer<InMemoryDedupeStore> {
    let registry = tools
        .iter()
        .fold(ToolRegistry::builder(), |builder, (ns, name)| {
            builder.tool(ToolDescriptor::new(*ns, *name, RiskLevel::Writes))
        })
        .build()
        .unwrap();
    IdempotencyLayer::new(registry, InMemoryDedupeStore::new())
}

/// Sends `calls` in turn through `idem` over one mock tool, and checks that every one ran the
/// tool and none was answered from another's record.
async fn each_call_runs_the_tool(idem: &IdempotencyLayer<InMemoryDedupeStore>, calls: &[ToolCall]) {
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
