//! Run with: `cargo bench -p tower-toolcall --bench resilience`, then `python3 crates/tower-toolcall/benches/medians.py resilience`.
//!
//! The cost of the resilience layers on the paths every call takes, against the bare tool call
//! and against the same paths through other crates, all measured in one run:
//!
//! - `bare`: the tool alone;
//! - `tower_stack`: tower's `ConcurrencyLimit` + `Retry` (a policy that never retries) +
//!   `Timeout`;
//! - `ours_stack`: `RetryLayer` + `CircuitBreakerLayer` + `TimeoutLayer` on the success path;
//! - `ours_breaker_closed` / `ours_breaker_open`: our keyed per-tool breaker alone, letting a
//!   call through, and failing it fast;
//! - `tower_resilience_closed` / `_open` and `failsafe_closed` / `_open`: their breakers on the
//!   same two paths.
//!
//! Every variant is driven the same way: inside a current-thread tokio runtime's context
//! (tower's `Timeout` needs one), each call waits for readiness and its future is polled once
//! with `now_or_never`: every future here is ready at its first poll.

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use futures::future::{self, FutureExt};
use serde_json::{json, Value};
use tower::retry::Policy;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{BreakerSettings, RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{
    tool_fn, CircuitBreakerLayer, ErrorCode, RetryLayer, TimeoutLayer, ToolCall, ToolError,
    ToolOutput,
};

const HOUR: Duration = Duration::from_secs(3600);

fn call() -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(json!({"query": "tower middleware retry", "limit": 10}))
        .build()
        .unwrap()
}

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(
            "agents.tools.web",
            "search",
            RiskLevel::ReadOnly,
        ))
        .tool(ToolDescriptor::new(
            "agents.tools.web",
            "fetch",
            RiskLevel::ReadOnly,
        ))
        .tool(ToolDescriptor::new(
            "vault",
            "createFile",
            RiskLevel::Writes,
        ))
        .tool(ToolDescriptor::new(
            "vault",
            "readFile",
            RiskLevel::ReadOnly,
        ))
        .build()
        .unwrap()
}

/// The tool: answers at once, with a 503 while `failing` is set.
fn tool(
    failing: Arc<AtomicBool>,
) -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send,
> + Clone
       + Send {
    tool_fn(move |call: ToolCall| {
        let fail = failing.load(Ordering::Relaxed);
        async move {
            if fail {
                Err(ToolError::from_http_status(503, "down"))
            } else {
                Ok(ToolOutput::new(Value::Bool(
                    call.params().as_map().is_empty(),
                )))
            }
        }
    })
}

fn healthy() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// One call: readiness, then the call's future, each polled once.
fn call_once<S>(svc: &mut S, call: ToolCall) -> Result<S::Response, S::Error>
where
    S: Service<ToolCall>,
{
    svc.ready()
        .now_or_never()
        .expect("ready at once")?
        .call(call)
        .now_or_never()
        .expect("answered at once")
}

/// Opens a breaker in front of a tool that fails while `failing` is set, then lets the tool
/// recover: the breaker keeps failing calls fast.
fn open<S: Service<ToolCall>>(svc: &mut S, failing: &AtomicBool, calls: usize) {
    failing.store(true, Ordering::Relaxed);
    for _ in 0..calls {
        let _ = call_once(svc, call());
    }
    failing.store(false, Ordering::Relaxed);
}

/// tower's retry policy that never retries, cloning the request as a retrying policy must.
#[derive(Clone, Copy)]
struct NeverRetry;

impl Policy<ToolCall, ToolOutput, BoxError> for NeverRetry {
    type Future = future::Ready<()>;

    fn retry(
        &mut self,
        _call: &mut ToolCall,
        _result: &mut Result<ToolOutput, BoxError>,
    ) -> Option<Self::Future> {
        None
    }

    fn clone_request(&mut self, call: &ToolCall) -> Option<ToolCall> {
        Some(call.clone())
    }
}

/// failsafe's breaker as a tower service.
#[derive(Clone)]
struct Failsafe<S, B> {
    inner: S,
    breaker: B,
}

impl<S, B> Service<ToolCall> for Failsafe<S, B>
where
    S: Service<ToolCall>,
    B: failsafe::futures::CircuitBreaker,
{
    type Response = S::Response;
    type Error = failsafe::Error<S::Error>;
    type Future = failsafe::futures::ResponseFuture<
        S::Future,
        B::FailurePolicy,
        B::Instrument,
        failsafe::Any,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        self.breaker.call(self.inner.call(call))
    }
}

fn failsafe_breaker() -> impl failsafe::futures::CircuitBreaker + Clone {
    failsafe::Config::new()
        .failure_policy(failsafe::failure_policy::consecutive_failures(
            5,
            failsafe::backoff::constant(HOUR),
        ))
        .build()
}

fn tower_resilience_layer() -> tower_resilience::circuitbreaker::CircuitBreakerLayer<
    tower_resilience::circuitbreaker::DefaultClassifier,
> {
    tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .consecutive_failures(5)
        .wait_duration_in_open(HOUR)
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _context = runtime.enter();
    let call = call();
    let mut group = c.benchmark_group("resilience");

    let mut bare = tool(healthy());
    group.bench_function("bare", |b| {
        b.iter(|| black_box(call_once(&mut bare, black_box(call.clone())).unwrap()))
    });

    let mut tower_stack = ServiceBuilder::new()
        .concurrency_limit(1024)
        .retry(NeverRetry)
        .timeout(Duration::from_secs(30))
        .service(tool(healthy()));
    group.bench_function("tower_stack", |b| {
        b.iter(|| black_box(call_once(&mut tower_stack, black_box(call.clone())).unwrap()))
    });

    let registry = registry();
    let mut ours_stack = ServiceBuilder::new()
        .layer(RetryLayer::new(registry.clone()))
        .layer(CircuitBreakerLayer::new(registry.clone()))
        .layer(TimeoutLayer::new(registry.clone()))
        .service(tool(healthy()));
    group.bench_function("ours_stack", |b| {
        b.iter(|| black_box(call_once(&mut ours_stack, black_box(call.clone())).unwrap()))
    });

    let ours_breaker = || {
        CircuitBreakerLayer::builder(registry.clone())
            .read_only(BreakerSettings::default().with_cooldown_ms(3_600_000))
            .build()
            .unwrap()
    };
    let mut closed = ours_breaker().layer(tool(healthy()));
    group.bench_function("ours_breaker_closed", |b| {
        b.iter(|| black_box(call_once(&mut closed, black_box(call.clone())).unwrap()))
    });
    let failing = healthy();
    let mut opened = ours_breaker().layer(tool(failing.clone()));
    open(&mut opened, &failing, 8);
    let refused = call_once(&mut opened, call.clone()).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::CircuitOpen);
    group.bench_function("ours_breaker_open", |b| {
        b.iter(|| black_box(call_once(&mut opened, black_box(call.clone())).unwrap_err()))
    });

    let mut closed = tower_resilience_layer().layer(tool(healthy()));
    group.bench_function("tower_resilience_closed", |b| {
        b.iter(|| black_box(call_once(&mut closed, black_box(call.clone())).unwrap()))
    });
    let failing = healthy();
    let mut opened = tower_resilience_layer().layer(tool(failing.clone()));
    open(&mut opened, &failing, 5);
    assert!(matches!(
        call_once(&mut opened, call.clone()),
        Err(tower_resilience::circuitbreaker::CircuitBreakerError::OpenCircuit)
    ));
    group.bench_function("tower_resilience_open", |b| {
        b.iter(|| black_box(call_once(&mut opened, black_box(call.clone())).unwrap_err()))
    });

    let mut closed = Failsafe {
        inner: tool(healthy()),
        breaker: failsafe_breaker(),
    };
    group.bench_function("failsafe_closed", |b| {
        b.iter(|| black_box(call_once(&mut closed, black_box(call.clone())).unwrap()))
    });
    let failing = healthy();
    let mut opened = Failsafe {
        inner: tool(failing.clone()),
        breaker: failsafe_breaker(),
    };
    open(&mut opened, &failing, 5);
    assert!(matches!(
        call_once(&mut opened, call.clone()),
        Err(failsafe::Error::Rejected)
    ));
    group.bench_function("failsafe_open", |b| {
        b.iter(|| black_box(call_once(&mut opened, black_box(call.clone())).unwrap_err()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
