// The idempotency cases every store runs: included by `main.rs` here (in memory) and by the
// tests of `tower-toolcall-redis` (on Redis), each beside its own `Backend`.


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
    IdempotencySettings, KeyScope, LayerSetting, OnStoreError, ParamsMismatch, RiskLevel,
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
    type Store: DedupeStore + Clone;

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
fn over(idem: &IdempotencyLayer, tool: &MockTool) -> impl ToolStack {
    idem.layer(tool.service())
}

fn registry(policy: ToolPolicy) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, TOOL, RiskLevel::Writes).with_policy(policy))
        .build()
        .unwrap()
}

fn policy(overrides: IdempotencySettings) -> ToolPolicy {
    ToolPolicy::default().with_idempotency(overrides)
}

fn layer(store: impl DedupeStore, policy: ToolPolicy) -> IdempotencyLayer {
    IdempotencyLayer::new(registry(policy), Arc::new(store))
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
    let loosen = IdempotencySettings::default().with_callers_may_loosen(true);
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
            policy(IdempotencySettings::default().with_dedupe_mode(DedupeMode::BestEffort)),
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
        policy(IdempotencySettings::default().with_done_ttl_ms(ttl.as_millis() as u64)),
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
    let loosen = IdempotencySettings::default().with_callers_may_loosen(true);
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
                IdempotencySettings::default()
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
            policy(IdempotencySettings::default().with_scope(KeyScope::Global)),
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
        policy(IdempotencySettings::default().with_inflight_lease_ms(lease.as_millis() as u64)),
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
                IdempotencySettings::default().with_inflight_lease_ms(lease.as_millis() as u64),
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
        .layer(IdempotencyLayer::new(registry, Arc::new(store.clone())))
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
            policy(IdempotencySettings::default().with_callers_may_loosen(true)),
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
                IdempotencySettings::default()
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

