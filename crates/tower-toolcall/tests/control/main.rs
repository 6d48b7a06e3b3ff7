//! The operator's switches over the whole stack: the kill switch (TR-14), breaker
//! enforcement, key derivation and shadow mode, with what each leaves in the records, the
//! logs, the audit log and the metrics.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{AuditLog, AuditSink, AuditStream, Redactor, TraceLayer};
use tower_toolcall::{
    tool_fn, BreakerState, CallEnvelope, CallRecord, CircuitBreakerLayer, ErrorCode,
    IdempotencyLayer, LoopDetectLayer, RateLimitLayer, ResultEnvelopeLayer, RetryLayer,
    ShadowDecision, ShadowVerdict, ToolCall, ToolError, ToolOutput, ToolResult, ToolStack,
};

use support::call_once;
use support::capture::capture;

const TOOLS: &str = r#"{"tools": [
    {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true,
     "input_schema": {"type": "object", "required": ["mode"]}},
    {"namespace": "web", "name": "fetch", "risk": "read-only", "idempotent": true,
     "policy": {"rate_limit": {"per_second": 2, "burst": 2}}},
    {"namespace": "web", "name": "fetch_patiently", "risk": "read-only", "idempotent": true,
     "policy": {"rate_limit": {"per_second": 2, "burst": 2, "on_limit": "wait"}}},
    {"namespace": "web", "name": "lookup", "risk": "read-only", "idempotent": true,
     "policy": {"retry": {"max_attempts": 3}, "breaker": {"consecutive_failures": 2}}},
    {"namespace": "vault", "name": "write", "risk": "writes",
     "policy": {"retry": "off", "breaker": {"consecutive_failures": 2}}}
]}"#;

/// The registry of [`TOOLS`] under `control`.
fn registry(control: &ReliabilityControl) -> ToolRegistry {
    ToolRegistry::from_json_str(TOOLS)
        .unwrap()
        .with_control(control.clone())
}

/// Switches as the environment variables `vars` set them.
fn switches(vars: &[(&'static str, &'static str)]) -> ReliabilityControl {
    let vars = vars.to_vec();
    ReliabilityControl::from_lookup(move |name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    })
    .unwrap()
}

/// A tool that answers by its `mode` param, counts its runs and keeps the envelopes it was
/// given. Modes: `ok` (answers `{"n": n}`), `flaky` (503 the first time for its `n`, then success), `bad` (400),
/// `down` (503), `slow` (success after 40 s, longer than the default attempt timeout).
#[derive(Clone, Default)]
struct ModeTool {
    runs: Arc<AtomicUsize>,
    failed_once: Arc<Mutex<HashSet<u64>>>,
    seen: Arc<Mutex<Vec<CallEnvelope>>>,
}

impl ModeTool {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn seen(&self) -> Vec<CallEnvelope> {
        self.seen.lock().unwrap().clone()
    }

    fn service(
        &self,
    ) -> impl Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send,
    > + Clone
           + Send
           + 'static {
        let tool = self.clone();
        tool_fn(move |call: ToolCall| {
            let run = tool.runs.fetch_add(1, Ordering::SeqCst) + 1;
            tool.seen.lock().unwrap().push(call.envelope().clone());
            let params = call.params().as_map();
            let mode = params
                .get("mode")
                .and_then(Value::as_str)
                .unwrap_or("ok")
                .to_owned();
            let n = params.get("n").and_then(Value::as_u64).unwrap_or(0);
            let first_flake = mode == "flaky" && tool.failed_once.lock().unwrap().insert(n);
            async move {
                match mode.as_str() {
                    "bad" => Err(ToolError::from_http_status(400, "bad input")),
                    "down" => Err(ToolError::from_http_status(503, "down")),
                    "flaky" if first_flake => Err(ToolError::from_http_status(503, "busy")),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(40)).await;
                        Ok(ToolOutput::new(json!({"run": run, "n": n, "slow": true})))
                    }
                    // The same answer for the same call, as a real read gives it: loop
                    // detection judges a read-only tool's repeats by its answers.
                    _ => Ok(ToolOutput::new(json!({"n": n}))),
                }
            }
        })
    }
}

/// Every layer, in the recommended order, as the crate's builder assembles it.
fn full_stack(registry: &ToolRegistry) -> ToolStack {
    ToolStack::builder(registry.clone())
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap()
}

fn call(namespace: &str, name: &str, params: Value) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-1")
        .actor("user-7")
        .params(params)
        .build()
        .unwrap()
}

fn search(mode: &str, n: u64) -> ToolCall {
    call("web", "search", json!({"mode": mode, "n": n}))
}

fn write(mode: &str, n: u64) -> ToolCall {
    call("vault", "write", json!({"mode": mode, "n": n}))
}

fn keyed(mut call: ToolCall, key: &str) -> ToolCall {
    call.envelope_mut().payload.idempotency_key = Some(key.to_owned());
    call
}

/// The record of an outcome, success or failure.
fn record(outcome: &Result<ToolOutput, ToolError>) -> &CallRecord {
    match outcome {
        Ok(output) => output.record(),
        Err(error) => error.record(),
    }
}

fn verdicts(outcome: &Result<ToolOutput, ToolError>) -> Vec<(ShadowLayer, ShadowVerdict)> {
    record(outcome)
        .shadow
        .iter()
        .map(|d| (d.layer, d.verdict))
        .collect()
}

fn code(outcome: &Result<ToolOutput, ToolError>) -> Option<ErrorCode> {
    outcome.as_ref().err().map(ToolError::code)
}

/// One call of each kind the layers act on, in one session:
/// success, retriable failure, terminal failure, failures that open a breaker and a call
/// after them, a call slower than its timeout, a loop, a duplicate idempotency key, a burst
/// over a rate limit, a malformed call, a call of an unknown tool, params against the schema.
fn script() -> Vec<(&'static str, ToolCall)> {
    let mut malformed = search("ok", 14);
    malformed.envelope_mut().contract_version = "1.0".into();
    let mut script = vec![
        ("success", search("ok", 1)),
        ("retriable failure, then success", search("flaky", 2)),
        ("terminal failure", search("bad", 3)),
        ("failure 1 of the breaker", write("down", 4)),
        ("failure 2 of the breaker", write("down", 5)),
        ("call after the breaker opened", write("down", 6)),
        ("slower than its timeout", search("slow", 7)),
    ];
    for _ in 0..5 {
        script.push(("loop of identical calls", search("ok", 8)));
    }
    script.push(("first of a key", keyed(search("ok", 9), "dup-1")));
    script.push(("duplicate of the key", keyed(search("ok", 9), "dup-1")));
    for n in 10..14 {
        script.push(("burst over 2/s", call("web", "fetch", json!({"n": n}))));
    }
    script.push(("malformed envelope", malformed));
    script.push(("unknown tool", call("nope", "tool", json!({"n": 15}))));
    script.push((
        "params against the schema",
        call("web", "search", json!({"n": 16})),
    ));
    script
}

/// The result envelope of every call of the script, as JSON.
async fn play<S>(svc: &mut S) -> Vec<Value>
where
    S: Service<ToolCall, Response = ToolResult, Error = Infallible>,
{
    let mut results = Vec::new();
    for (_, call) in script() {
        let result = svc.ready().await.unwrap().call(call).await.unwrap();
        results.push(serde_json::to_value(result).unwrap());
    }
    results
}

/// The script with request ids that stay the same from run to run.
fn with_fixed_ids<S>(svc: S) -> impl Service<ToolCall, Response = ToolResult, Error = Infallible>
where
    S: Service<ToolCall, Response = ToolResult, Error = Infallible>,
{
    let seq = Arc::new(AtomicUsize::new(0));
    tower::ServiceBuilder::new()
        .map_request(move |mut call: ToolCall| {
            let n = seq.fetch_add(1, Ordering::SeqCst);
            call.envelope_mut().request_id = format!("req-{n}");
            call
        })
        .service(svc)
}

#[tokio::test(start_paused = true)]
async fn with_the_kill_switch_off_the_stack_answers_as_the_bare_tool_does() {
    let bare_tool = ModeTool::default();
    let mut bare = with_fixed_ids(
        ServiceBuilder::new()
            .layer(ResultEnvelopeLayer::new())
            .service(bare_tool.service()),
    );
    let expected = play(&mut bare).await;

    let off = switches(&[("TOOL_RELIABILITY_ENABLED", "false")]);
    let stacked_tool = ModeTool::default();
    let mut stack = with_fixed_ids(support::enveloped(
        &full_stack(&registry(&off)),
        stacked_tool.service(),
    ));
    let got = play(&mut stack).await;

    let script = script();
    assert_eq!(
        bare_tool.runs(),
        script.len(),
        "the bare tool runs every call"
    );
    assert_eq!(stacked_tool.runs(), bare_tool.runs());
    assert!(
        stacked_tool.seen() == bare_tool.seen(),
        "the tool is given the same calls"
    );
    for ((what, _), (got, expected)) in script.iter().zip(got.iter().zip(&expected)) {
        assert_eq!(got, expected, "{what}");
    }

    // The same script through the enabled stack: every layer acts on its part.
    let enabled_tool = ModeTool::default();
    let mut enabled = with_fixed_ids(support::enveloped(
        &full_stack(&registry(&ReliabilityControl::new())),
        enabled_tool.service(),
    ));
    let enforced = play(&mut enabled).await;
    let differs: Vec<&str> = script
        .iter()
        .zip(enforced.iter().zip(&expected))
        .filter(|(_, (enforced, expected))| enforced != expected)
        .map(|((what, _), _)| *what)
        .collect();
    for what in [
        "retriable failure, then success",
        "call after the breaker opened",
        "slower than its timeout",
        "loop of identical calls",
        "duplicate of the key",
        "burst over 2/s",
        "malformed envelope",
        "unknown tool",
        "params against the schema",
    ] {
        assert!(differs.contains(&what), "the enabled stack acts on: {what}");
    }
    assert!(enabled_tool.runs() < bare_tool.runs());
}

#[tokio::test(start_paused = true)]
async fn the_kill_switch_flips_at_run_time() {
    let control = ReliabilityControl::new();
    let tool = ModeTool::default();
    let mut svc = support::stacked(&full_stack(&registry(&control)), tool.service());
    for n in 0..2 {
        let outcome = call_once(&mut svc, write("down", n)).await;
        assert_eq!(code(&outcome), Some(ErrorCode::UpstreamUnavailable));
    }
    let refused = call_once(&mut svc, write("down", 2)).await;
    assert_eq!(code(&refused), Some(ErrorCode::CircuitOpen));
    assert_eq!(tool.runs(), 2);

    control.set_enabled(false);
    let passed = call_once(&mut svc, write("down", 3)).await;
    assert_eq!(code(&passed), Some(ErrorCode::UpstreamUnavailable));
    assert_eq!(tool.runs(), 3, "the next call reaches the tool");
    assert_eq!(record(&passed), &CallRecord::EMPTY, "no layer touched it");

    control.set_enabled(true);
    let refused = call_once(&mut svc, write("down", 4)).await;
    assert_eq!(code(&refused), Some(ErrorCode::CircuitOpen));
    assert_eq!(tool.runs(), 3, "the breaker refuses again");
}

/// Breaker not enforced, by either switch: the state machine runs as when enforcing, every
/// call reaches the tool, and the records say what the breaker would have done.
async fn breaker_lets_every_call_through(control: ReliabilityControl) {
    let registry = registry(&control);
    let breaker = CircuitBreakerLayer::new(registry.clone());
    let admin = breaker.admin();
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(breaker)
        .service(tool.service());
    use ShadowLayer::Breaker;
    use ShadowVerdict::{WouldOpen, WouldReject};

    let first = call_once(&mut svc, write("down", 1)).await;
    assert_eq!(verdicts(&first), []);
    let second = call_once(&mut svc, write("down", 2)).await;
    assert_eq!(verdicts(&second), [(Breaker, WouldOpen)]);
    assert_eq!(admin.state("vault", "write"), BreakerState::Open);
    for n in 3..6 {
        let outcome = call_once(&mut svc, write("down", n)).await;
        assert_eq!(code(&outcome), Some(ErrorCode::UpstreamUnavailable));
        assert_eq!(verdicts(&outcome), [(Breaker, WouldReject)]);
    }
    assert_eq!(tool.runs(), 5, "every call ran");
    let stats = admin.status(&tower_toolcall::breaker::BreakerKey::tool("vault", "write"));
    let stats = stats.unwrap().stats;
    assert_eq!(
        (stats.failures, stats.rejected),
        (2, 3),
        "the calls it would have refused are not counted"
    );

    // After the cooldown, a failed probe reopens the breaker, and successful ones close it.
    tokio::time::advance(Duration::from_secs(30)).await;
    let probe = call_once(&mut svc, write("down", 6)).await;
    assert_eq!(verdicts(&probe), [(Breaker, WouldOpen)]);
    assert_eq!(admin.state("vault", "write"), BreakerState::Open);
    tokio::time::advance(Duration::from_secs(30)).await;
    let probe = call_once(&mut svc, write("ok", 7)).await;
    assert_eq!(verdicts(&probe), []);
    assert_eq!(admin.state("vault", "write"), BreakerState::HalfOpen);
    let probe = call_once(&mut svc, write("ok", 8)).await;
    assert_eq!(record(&probe).breaker_state, Some(BreakerState::Closed));
    assert_eq!(tool.runs(), 8);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_in_shadow_mode_never_fails_a_call() {
    breaker_lets_every_call_through(switches(&[("TOOL_RELIABILITY_SHADOW", "breaker")])).await;
}

#[tokio::test(start_paused = true)]
async fn with_open_mode_off_a_breaker_never_fails_a_call() {
    breaker_lets_every_call_through(switches(&[("TOOL_RELIABILITY_OPEN_MODE", "off")])).await;
}

#[tokio::test(start_paused = true)]
async fn a_retried_call_keeps_the_shadow_decisions_of_every_attempt() {
    let control = switches(&[("TOOL_RELIABILITY_SHADOW", "breaker")]);
    let registry = registry(&control);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder(registry.clone())
                .seed(3)
                .build()
                .unwrap(),
        )
        .layer(CircuitBreakerLayer::new(registry))
        .service(tool.service());
    // Attempt 1 fails, attempt 2 fails and would open the breaker, attempt 3 would be
    // refused: it runs and fails too.
    let outcome = call_once(&mut svc, call("web", "lookup", json!({"mode": "down"}))).await;
    assert_eq!(code(&outcome), Some(ErrorCode::RetryExhausted));
    assert_eq!(tool.runs(), 3);
    assert_eq!(record(&outcome).attempts, Some(3));
    assert_eq!(
        record(&outcome).shadow,
        [
            ShadowDecision::new(ShadowLayer::Breaker, ShadowVerdict::WouldOpen),
            ShadowDecision::new(ShadowLayer::Breaker, ShadowVerdict::WouldReject),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn loop_detection_in_shadow_mode_lets_the_loop_run_and_keeps_counting() {
    let control = switches(&[("TOOL_RELIABILITY_SHADOW", "loop_detect")]);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(registry(&control)))
        .service(tool.service());
    let mut seen = Vec::new();
    for _ in 0..5 {
        let outcome = call_once(&mut svc, search("ok", 1)).await;
        assert!(outcome.is_ok());
        seen.push(verdicts(&outcome));
    }
    let block = vec![(ShadowLayer::LoopDetect, ShadowVerdict::WouldBlock)];
    assert_eq!(seen, [vec![], vec![], vec![], block.clone(), block]);
    assert_eq!(tool.runs(), 5, "every repeat ran");

    // The history went on as when enforcing: enforced now, the next repeat is refused.
    control.set_shadow(ShadowLayer::LoopDetect, false);
    let refused = call_once(&mut svc, search("ok", 1)).await;
    assert_eq!(code(&refused), Some(ErrorCode::LoopDetected));
    assert_eq!(tool.runs(), 5);
}

/// The idempotency layer over a tool that answers `{"run": n}` after the call's
/// `sleep_ms`.
fn idempotent_stack(
    control: &ReliabilityControl,
) -> (
    impl Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    >,
    IdempotencyLayer,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let layer = IdempotencyLayer::in_memory(ToolRegistry::open().with_control(control.clone()));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(tool_fn(move |call: ToolCall| {
            let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let sleep = call.params().as_map().get("sleep_ms");
            let sleep = sleep.and_then(Value::as_u64).unwrap_or(0);
            async move {
                tokio::time::sleep(Duration::from_millis(sleep)).await;
                Ok(ToolOutput::new(json!({"run": run})))
            }
        }));
    (svc, layer, runs)
}

fn create(key: &str, path: &str, sleep_ms: u64) -> ToolCall {
    keyed(
        call(
            "vault",
            "create",
            json!({"path": path, "sleep_ms": sleep_ms}),
        ),
        key,
    )
}

#[tokio::test(start_paused = true)]
async fn idempotency_in_shadow_mode_runs_again_and_leaves_the_record_alone() {
    use ShadowLayer::Idempotency;
    let control = switches(&[("TOOL_RELIABILITY_SHADOW", "idempotency")]);
    let (mut svc, layer, runs) = idempotent_stack(&control);

    // A fresh key is claimed and stored as usual; a duplicate would be replayed.
    let first = call_once(&mut svc, create("k-1", "a.md", 0)).await.unwrap();
    assert_eq!(first.content, json!({"run": 1}));
    let again = call_once(&mut svc, create("k-1", "a.md", 0)).await;
    assert_eq!(
        verdicts(&again),
        [(Idempotency, ShadowVerdict::WouldReplay)]
    );
    let again = again.unwrap();
    assert_eq!(again.content, json!({"run": 2}));
    assert!(!again.record().from_cache);
    // The same key with other params would be refused.
    let other = call_once(&mut svc, create("k-1", "b.md", 0)).await;
    assert_eq!(
        verdicts(&other),
        [(Idempotency, ShadowVerdict::WouldConflict)]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3, "the tool ran every time");

    // A duplicate of a running call would join it.
    let slow = tokio::spawn(svc.ready().await.unwrap().call(create("k-2", "c.md", 1000)));
    tokio::task::yield_now().await;
    assert_eq!(runs.load(Ordering::SeqCst), 4, "the first call of k-2 runs");
    let joining = call_once(&mut svc, create("k-2", "c.md", 1000)).await;
    assert_eq!(
        verdicts(&joining),
        [(Idempotency, ShadowVerdict::WouldJoin)]
    );
    assert_eq!(joining.unwrap().content, json!({"run": 5}));
    assert_eq!(slow.await.unwrap().unwrap().content, json!({"run": 4}));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    assert_eq!(layer.stats().executions, 2, "two calls claimed their key");

    // Enforced again, the records answer: the first runs' results, not the shadowed ones.
    control.set_shadow(Idempotency, false);
    let replay = call_once(&mut svc, create("k-1", "a.md", 0)).await.unwrap();
    assert!(replay.record().from_cache);
    assert_eq!(replay.content, json!({"run": 1}));
    let replay = call_once(&mut svc, create("k-2", "c.md", 1000))
        .await
        .unwrap();
    assert_eq!(replay.content, json!({"run": 4}));
    let conflict = call_once(&mut svc, create("k-1", "b.md", 0)).await;
    assert_eq!(code(&conflict), Some(ErrorCode::IdempotencyKeyReused));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn with_derivation_off_only_given_keys_deduplicate() {
    let control = switches(&[("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY", "off")]);
    let (mut svc, _layer, runs) = idempotent_stack(&control);
    let keyless = || call("vault", "create", json!({"path": "a.md"}));
    let first = call_once(&mut svc, keyless()).await.unwrap();
    let second = call_once(&mut svc, keyless()).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "identical keyless calls both run"
    );
    assert!(!first.record().from_cache && !second.record().from_cache);

    call_once(&mut svc, create("k-1", "a.md", 0)).await.unwrap();
    let hit = call_once(&mut svc, create("k-1", "a.md", 0)).await.unwrap();
    assert!(hit.record().from_cache, "a caller's key still deduplicates");
    let mut hooked = keyless();
    hooked.set_hook_idempotency_key("from-hook");
    call_once(&mut svc, hooked.clone()).await.unwrap();
    let hit = call_once(&mut svc, hooked).await.unwrap();
    assert!(hit.record().from_cache, "a hook's key still deduplicates");
    assert_eq!(runs.load(Ordering::SeqCst), 4);

    // Derivation back on: identical keyless calls are deduplicated again.
    control.set_derive_idempotency_keys(true);
    call_once(&mut svc, keyless()).await.unwrap();
    let hit = call_once(&mut svc, keyless()).await.unwrap();
    assert!(hit.record().from_cache);
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_in_shadow_mode_runs_every_call_at_once() {
    use ShadowLayer::RateLimit;
    let control = switches(&[("TOOL_RELIABILITY_SHADOW", "rate_limit")]);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(registry(&control)))
        .service(tool.service());
    let start = tokio::time::Instant::now();
    let mut seen = Vec::new();
    for (name, n) in [("fetch", 1), ("fetch", 2), ("fetch", 3), ("fetch", 4)] {
        let outcome = call_once(&mut svc, call("web", name, json!({"n": n}))).await;
        seen.push(verdicts(&outcome));
    }
    for n in 1..=3 {
        let outcome = call_once(&mut svc, call("web", "fetch_patiently", json!({"n": n}))).await;
        seen.push(verdicts(&outcome));
    }
    let limit = vec![(RateLimit, ShadowVerdict::WouldLimit)];
    let wait = vec![(RateLimit, ShadowVerdict::WouldWait)];
    assert_eq!(
        seen,
        [vec![], vec![], limit.clone(), limit, vec![], vec![], wait]
    );
    assert_eq!(tool.runs(), 7);
    assert_eq!(tokio::time::Instant::now(), start, "no call waited");

    // The quota was drawn on as when enforcing.
    control.set_shadow(RateLimit, false);
    let refused = call_once(&mut svc, call("web", "fetch", json!({"n": 5}))).await;
    assert_eq!(code(&refused), Some(ErrorCode::RateLimited));
    assert_eq!(tool.runs(), 7);
}

/// An audit sink that keeps the lines of `events.jsonl`.
#[derive(Clone, Default)]
struct EventLines(Arc<Mutex<Vec<Value>>>);

impl AuditSink for EventLines {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> io::Result<()> {
        if stream == AuditStream::Events {
            let value = serde_json::from_slice(line).map_err(io::Error::other)?;
            self.0.lock().unwrap().push(value);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_trace_layer_logs_and_audits_each_shadow_decision() {
    let (captured, _guard) = capture();
    let lines = EventLines::default();
    let audit = AuditLog::with_sink(lines.clone(), 64, Redactor::default());
    let control = switches(&[("TOOL_RELIABILITY_SHADOW", "rate_limit,breaker")]);
    let registry = registry(&control);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(TraceLayer::new().audit(audit.clone()))
        .layer(RateLimitLayer::new(registry.clone()))
        .layer(CircuitBreakerLayer::new(registry))
        .service(tool.service());
    for n in 0..2 {
        call_once(&mut svc, call("web", "fetch", json!({"n": n})))
            .await
            .unwrap();
    }
    let mut over = call("web", "fetch", json!({"n": 2}));
    over.envelope_mut().request_id = "req-over".into();
    call_once(&mut svc, over).await.unwrap();
    audit.shutdown();

    let shadow: Vec<_> = captured
        .events()
        .into_iter()
        .filter(|e| e.fields.get("event").map(String::as_str) == Some("tool_call_shadow"))
        .collect();
    assert_eq!(shadow.len(), 1, "{shadow:?}");
    assert_eq!(shadow[0].level, tracing::Level::INFO);
    let field = |name: &str| shadow[0].fields.get(name).map(String::as_str);
    assert_eq!(field("layer"), Some("rate_limit"));
    assert_eq!(field("decision"), Some("would_limit"));
    assert_eq!(field("toolName"), Some("fetch"));
    assert_eq!(field("requestId"), Some("req-over"));

    let steps: Vec<Value> = lines
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line["type"] == "step.shadow")
        .cloned()
        .collect();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["runId"], "req-over");
    assert_eq!(steps[0]["tool"], "web::fetch");
    assert_eq!(
        steps[0]["payload"],
        json!({"layer": "rate_limit", "decision": "would_limit"})
    );
}

#[cfg(feature = "metrics")]
mod metrics_series {
    use std::collections::BTreeMap;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;
    use tower_toolcall::trace::ToolMetrics;

    use super::*;

    /// Counter values by `name{label=value,…}`.
    fn counters(recorder: &DebuggingRecorder) -> BTreeMap<String, u64> {
        support::metrics_series::series(recorder)
            .into_iter()
            .filter_map(|(kind, name, value)| match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => Some((name, n)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_breaker_in_shadow_mode_counts_what_it_would_have_done() {
        let recorder = DebuggingRecorder::new();
        let tool = ModeTool::default();
        support::metrics_series::run_recorded(&recorder, async {
            let control = switches(&[("TOOL_RELIABILITY_SHADOW", "breaker")]);
            let registry = registry(&control);
            let mut svc = ServiceBuilder::new()
                .layer(TraceLayer::new().on_event(ToolMetrics::new(&registry)))
                .layer(CircuitBreakerLayer::new(registry))
                .service(tool.service());
            for n in 0..5 {
                let outcome = call_once(&mut svc, write("down", n)).await;
                assert_eq!(code(&outcome), Some(ErrorCode::UpstreamUnavailable));
            }
        });
        assert_eq!(tool.runs(), 5, "the breaker let every call through");
        let series = counters(&recorder);
        let shadow = |decision: &str| {
            series
                .get(&format!(
                    "toolcall_tool_shadow_decisions_total{{decision={decision},layer=breaker}}"
                ))
                .copied()
        };
        assert_eq!(shadow("would_open"), Some(1));
        assert_eq!(shadow("would_reject"), Some(3));
        assert_eq!(
            series.get("toolcall_tool_calls_total{status=retriable_error,tool=vault::write}"),
            Some(&5)
        );
    }
}

#[test]
fn the_earlier_name_of_key_derivation_still_works_and_warns() {
    let (captured, _guard) = capture();
    let control = switches(&[("TOOL_RELIABLE_DERIVE_IDEMPOTENCY", "off")]);
    assert!(!control.derives_idempotency_keys());
    let warnings: Vec<_> = captured
        .events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].fields.get("replacement").map(String::as_str),
        Some("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY")
    );

    let quiet = switches(&[("TOOL_RELIABILITY_DERIVE_IDEMPOTENCY", "off")]);
    assert!(!quiet.derives_idempotency_keys());
    assert_eq!(
        captured
            .events()
            .iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .count(),
        1,
        "the current name warns of nothing"
    );
}

/// Calls of `search` in session `session` of tenant `acme`.
fn in_session(session: &str, n: u64) -> ToolCall {
    ToolCall::builder("web", "search")
        .tenant("acme")
        .session(session)
        .actor("user-7")
        .params(json!({"mode": "ok", "n": n}))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn at_a_rollout_of_0_percent_the_breaker_never_fails_a_call() {
    breaker_lets_every_call_through(switches(&[("TOOL_RELIABILITY_ROLLOUT_PERCENT", "0")])).await;
}

#[tokio::test(start_paused = true)]
async fn at_a_rollout_of_0_percent_every_layer_of_the_stack_shadows() {
    use ShadowLayer::{Breaker, Idempotency, LoopDetect, RateLimit};
    let control = switches(&[("TOOL_RELIABILITY_ROLLOUT_PERCENT", "0")]);
    assert_eq!(control.rollout_percent(), 0);
    let tool = ModeTool::default();
    let mut svc = support::stacked(&full_stack(&registry(&control)), tool.service());
    let has = |outcome: &Result<ToolOutput, ToolError>, layer, verdict| {
        verdicts(outcome).contains(&(layer, verdict))
    };

    // A loop is not stopped: every repeat runs, the record says what would have happened.
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(call_once(&mut svc, search("ok", 8)).await);
    }
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(tool.runs(), 5, "every repeat ran");
    assert!(has(&outcomes[3], LoopDetect, ShadowVerdict::WouldBlock));
    assert!(has(&outcomes[4], LoopDetect, ShadowVerdict::WouldBlock));
    // A finished read runs again whatever the mode: nothing to shadow.
    assert!(!has(&outcomes[1], Idempotency, ShadowVerdict::WouldReplay));
    assert!(outcomes.iter().all(|o| !record(o).from_cache));

    // A write re-sent within the window runs again; its record says it would have replayed.
    call_once(&mut svc, write("ok", 50)).await.unwrap();
    let resent = call_once(&mut svc, write("ok", 50)).await;
    assert!(!record(&resent).from_cache);
    assert!(has(&resent, Idempotency, ShadowVerdict::WouldReplay));

    // A burst over the rate limit runs at once.
    let mut burst = Vec::new();
    for n in 10..14 {
        burst.push(call_once(&mut svc, call("web", "fetch", json!({"n": n}))).await);
    }
    assert!(burst.iter().all(Result::is_ok));
    assert!(has(&burst[2], RateLimit, ShadowVerdict::WouldLimit));

    // A breaker that opened lets the next call through.
    for n in 0..2 {
        let outcome = call_once(&mut svc, write("down", n)).await;
        assert_eq!(code(&outcome), Some(ErrorCode::UpstreamUnavailable));
    }
    let after = call_once(&mut svc, write("down", 2)).await;
    assert_eq!(code(&after), Some(ErrorCode::UpstreamUnavailable));
    assert!(has(&after, Breaker, ShadowVerdict::WouldReject));
    assert_eq!(tool.runs(), 5 + 2 + 4 + 3);

    // Rolled out to every session at run time, the same stack enforces.
    control.set_rollout_percent(100).unwrap();
    let refused = call_once(&mut svc, write("down", 3)).await;
    assert_eq!(code(&refused), Some(ErrorCode::CircuitOpen));
    let limited = call_once(&mut svc, call("web", "fetch", json!({"n": 14}))).await;
    assert_eq!(code(&limited), Some(ErrorCode::RateLimited));
    assert_eq!(tool.runs(), 14);
}

/// Four identical calls in `session` through loop detection: whether the fourth was
/// refused (the session enforced) or let through in shadow mode.
async fn fourth_repeat_refused<S>(svc: &mut S, session: &str, n: u64) -> bool
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    for _ in 0..3 {
        assert!(call_once(svc, in_session(session, n)).await.is_ok());
    }
    let fourth = call_once(svc, in_session(session, n)).await;
    match code(&fourth) {
        Some(ErrorCode::LoopDetected) => true,
        None => {
            assert_eq!(
                verdicts(&fourth),
                [(ShadowLayer::LoopDetect, ShadowVerdict::WouldBlock)]
            );
            false
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn at_a_rollout_of_100_percent_every_session_is_enforced() {
    let control = switches(&[("TOOL_RELIABILITY_ROLLOUT_PERCENT", "100")]);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(registry(&control)))
        .service(tool.service());
    for i in 0..50 {
        let session = format!("session-{i}");
        assert!(
            fourth_repeat_refused(&mut svc, &session, 1).await,
            "{session}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_rollout_of_10_percent_enforces_about_a_tenth_of_the_sessions_always_the_same() {
    let control = switches(&[("TOOL_RELIABILITY_ROLLOUT_PERCENT", "10")]);
    let tool = ModeTool::default();
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(registry(&control)))
        .service(tool.service());
    let mut enforced = Vec::new();
    for i in 0..1000 {
        let session = format!("session-{i}");
        if fourth_repeat_refused(&mut svc, &session, 1).await {
            enforced.push(session);
        }
    }
    assert!(
        (50..=150).contains(&enforced.len()),
        "{} of 1000 sessions enforced",
        enforced.len()
    );
    // The same sessions get the same answer, call after call.
    for i in 0..1000 {
        let session = format!("session-{i}");
        let refused = fourth_repeat_refused(&mut svc, &session, 2).await;
        assert_eq!(refused, enforced.contains(&session), "{session}");
        assert_eq!(
            control.enforces(&in_session(&session, 3)),
            refused,
            "{session}"
        );
    }
    // Another tenant's session of the same key is decided on its own.
    let other_tenant = (0..1000)
        .filter(|i| control.enforces_session(Some("globex"), &format!("session-{i}")))
        .count();
    assert!((50..=150).contains(&other_tenant), "{other_tenant}");
    let same = (0..1000)
        .filter(|i| {
            let session = format!("session-{i}");
            control.enforces_session(Some("globex"), &session) == enforced.contains(&session)
        })
        .count();
    assert!(same < 1000, "the tenant is part of the hash");
    // Raising the share keeps the sessions already enforced.
    control.set_rollout_percent(20).unwrap();
    assert!(enforced
        .iter()
        .all(|session| control.enforces_session(Some("acme"), session)));
}

#[test]
fn the_rollout_variable_is_read_and_refused_when_bad() {
    let parse = |value: &'static str| {
        ReliabilityControl::from_lookup(move |name| {
            (name == "TOOL_RELIABILITY_ROLLOUT_PERCENT").then(|| value.to_owned())
        })
    };
    assert_eq!(ReliabilityControl::new().rollout_percent(), 100);
    assert_eq!(parse("10").unwrap().rollout_percent(), 10);
    assert_eq!(parse(" 0 ").unwrap().rollout_percent(), 0);
    assert_eq!(parse("25%").unwrap().rollout_percent(), 25);
    for bad in ["101", "-5", "ten", "", "12.5"] {
        let error = parse(bad).unwrap_err();
        assert_eq!(error.field(), "TOOL_RELIABILITY_ROLLOUT_PERCENT", "{bad:?}");
        let message = error.to_string();
        assert!(message.contains("from 0 to 100"), "{message}");
    }
    let control = ReliabilityControl::new();
    assert!(control.set_rollout_percent(101).is_err());
    assert_eq!(
        control.rollout_percent(),
        100,
        "a refused value changes nothing"
    );
}
