//! Hooks (TR-12): before and after each attempt exactly once, and once on every short-circuit
//! path, through the whole recommended stack.

#[path = "../support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::{call_once, ScriptedTool, Step};
use tower::Service;
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::hooks::ToolHooks;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{ErrorCode, ShortCircuit, ToolCall, ToolError, ToolOutput, ToolStack};

/// One firing of a hook: the attempt number the hook saw, or the short-circuit path, and the
/// error code of the outcome (`None` for a success).
#[derive(Clone, Debug, PartialEq)]
enum Fired {
    Before {
        attempt: u32,
    },
    After {
        attempt: u32,
        code: Option<ErrorCode>,
    },
    ShortCircuit {
        path: ShortCircuit,
        code: Option<ErrorCode>,
    },
}

use Fired::{After, Before};

fn short_circuit(path: ShortCircuit, code: Option<ErrorCode>) -> Fired {
    Fired::ShortCircuit { path, code }
}

/// Hooks that note every firing; optionally deny every attempt, or tag the call of each.
#[derive(Debug, Default)]
struct Recorder {
    fired: Mutex<Vec<Fired>>,
    deny_with: Option<ToolError>,
    tag_attempts: bool,
}

impl Recorder {
    fn fired(&self) -> Vec<Fired> {
        self.fired.lock().unwrap().clone()
    }

    /// How many times each hook fired: (before, after, short-circuit).
    fn before_after_short_circuit(&self) -> (usize, usize, usize) {
        let fired = self.fired();
        let count = |pick: fn(&Fired) -> bool| fired.iter().filter(|f| pick(f)).count();
        (
            count(|f| matches!(f, Before { .. })),
            count(|f| matches!(f, After { .. })),
            count(|f| matches!(f, Fired::ShortCircuit { .. })),
        )
    }

    fn forget(&self) {
        self.fired.lock().unwrap().clear();
    }

    fn note(&self, fired: Fired) {
        self.fired.lock().unwrap().push(fired);
    }
}

fn code_of(outcome: &Result<ToolOutput, ToolError>) -> Option<ErrorCode> {
    outcome.as_ref().err().map(ToolError::code)
}

impl ToolHooks for Recorder {
    fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
        self.note(Before {
            attempt: call.attempt(),
        });
        if let Some(error) = &self.deny_with {
            return Err(error.clone());
        }
        if self.tag_attempts {
            let tag = format!("attempt-{}", call.attempt());
            let control = &mut call.envelope_mut().control;
            control.request_tags = Some(vec![tag]);
            control.from_hook = Some("recorder".into());
        }
        Ok(())
    }

    fn after_attempt(&self, call: &ToolCall, outcome: &Result<ToolOutput, ToolError>) {
        self.note(After {
            attempt: call.attempt(),
            code: code_of(outcome),
        });
    }

    fn on_short_circuit(
        &self,
        _call: &ToolCall,
        path: ShortCircuit,
        outcome: &Result<ToolOutput, ToolError>,
    ) {
        self.note(short_circuit(path, code_of(outcome)));
    }
}

fn registry() -> ToolRegistry {
    ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true},
            {"namespace": "web", "name": "slow", "risk": "read-only", "idempotent": true,
             "policy": {"timeout": {"attempt_timeout_ms": 1000}, "retry": {"max_attempts": 2}}},
            {"namespace": "web", "name": "echo", "risk": "read-only",
             "policy": {"idempotency": "off", "loop_detect": {"max_repeats": 2}}},
            {"namespace": "web", "name": "quota", "risk": "read-only",
             "policy": {"rate_limit": {"per_second": 1, "burst": 1, "on_limit": "reject"}}},
            {"namespace": "web", "name": "flaky", "risk": "read-only", "idempotent": true,
             "policy": {"retry": {"max_attempts": 3},
                        "breaker": {"consecutive_failures": 1, "cooldown_ms": 60000}}},
            {"namespace": "vault", "name": "createFile", "risk": "writes",
             "input_schema": {"type": "object", "required": ["path"],
                              "properties": {"path": {"type": "string"}}}}
        ]}"#,
    )
    .unwrap()
}

/// The recommended stack as the crate's builder assembles it, `hooks` at both ends:
/// `Trace(hooks) → EnvelopeValidate → LoopDetect → RateLimit → Idempotency → Bulkhead →
/// Retry → CircuitBreaker → Timeout → HookLayer(hooks) → tool`.
fn stack(
    registry: ToolRegistry,
    hooks: &Arc<Recorder>,
    tool: &ScriptedTool,
) -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send,
> + Clone
       + Send {
    let stack = ToolStack::builder(registry)
        .hooks(hooks.clone())
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap();
    support::stacked(&stack, tool.service())
}

fn call(namespace: &str, name: &str, params: serde_json::Value) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-42")
        .actor("user-7")
        .params(params)
        .build()
        .unwrap()
}

fn keyed(name: &str, key: &str, params: serde_json::Value) -> ToolCall {
    ToolCall::builder("web", name)
        .session("sess-42")
        .actor("user-7")
        .idempotency_key(key)
        .params(params)
        .build()
        .unwrap()
}

fn unavailable() -> Step {
    Step::Fail(ToolError::from_http_status(503, "upstream unavailable"))
}

/// Makes `first`, which runs the tool, then `second`, which the stack refuses on `path` with
/// `code` without running it: the hooks see that one short circuit and nothing else.
async fn refused_after_one_call(
    first: ToolCall,
    second: ToolCall,
    path: ShortCircuit,
    code: ErrorCode,
) {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry(), &hooks, &tool);

    call_once(&mut svc, first).await.unwrap();
    hooks.forget();
    let err = call_once(&mut svc, second).await.unwrap_err();
    assert_eq!(err.code(), code);
    assert_eq!(tool.calls(), 1);
    assert_eq!(hooks.fired(), [short_circuit(path, Some(code))]);
}

#[tokio::test(start_paused = true)]
async fn a_successful_call_fires_one_before_and_one_after() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry(), &hooks, &tool);

    call_once(&mut svc, call("web", "search", json!({"q": 1})))
        .await
        .unwrap();
    assert_eq!(tool.calls(), 1);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: None
            }
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_tried_three_times_fires_for_each_attempt_numbered_one_to_three() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::new([unavailable(), unavailable(), Step::Ok]);
    let mut svc = stack(registry(), &hooks, &tool);

    let output = call_once(&mut svc, call("web", "search", json!({"q": 1})))
        .await
        .unwrap();
    assert_eq!(output.record().attempts, Some(3));
    assert_eq!(tool.calls(), 3);
    let failed = Some(ErrorCode::UpstreamUnavailable);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: failed
            },
            Before { attempt: 2 },
            After {
                attempt: 2,
                code: failed
            },
            Before { attempt: 3 },
            After {
                attempt: 3,
                code: None
            },
        ]
    );
    assert_eq!(hooks.before_after_short_circuit(), (3, 3, 0));

    // The tool receives the numbered calls; the number is not part of a call's identity.
    let received = tool.received();
    let numbers: Vec<u32> = received.iter().map(ToolCall::attempt).collect();
    assert_eq!(numbers, [1, 2, 3]);
    assert!(received.windows(2).all(|pair| pair[0] == pair[1]));
}

#[tokio::test(start_paused = true)]
async fn a_call_refused_by_validation_fires_one_short_circuit() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry(), &hooks, &tool);

    let err = call_once(&mut svc, call("vault", "createFile", json!({"path": 42})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert_eq!(tool.calls(), 0);
    assert_eq!(
        hooks.fired(),
        [short_circuit(
            ShortCircuit::ValidationRejected,
            Some(ErrorCode::ValidationError)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_blocked_as_a_loop_fires_one_short_circuit() {
    refused_after_one_call(
        call("web", "echo", json!({"say": "again"})),
        call("web", "echo", json!({"say": "again"})),
        ShortCircuit::LoopBlocked,
        ErrorCode::LoopDetected,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_call_over_its_rate_limit_fires_one_short_circuit() {
    refused_after_one_call(
        call("web", "quota", json!({"n": 1})),
        call("web", "quota", json!({"n": 2})),
        ShortCircuit::RateLimited,
        ErrorCode::RateLimited,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cache_hit_fires_one_short_circuit_and_no_attempt() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry(), &hooks, &tool);

    call_once(&mut svc, keyed("search", "k-1", json!({"q": 1})))
        .await
        .unwrap();
    let again = call_once(&mut svc, keyed("search", "k-1", json!({"q": 1})))
        .await
        .unwrap();
    assert!(again.record().from_cache);
    assert_eq!(tool.calls(), 1);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: None
            },
            short_circuit(ShortCircuit::CacheHit, None),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_that_joins_a_running_one_fires_one_short_circuit() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::After(Duration::from_secs(1), Box::new(Step::Ok)));
    let mut first = stack(registry(), &hooks, &tool);
    let mut second = first.clone();

    let (ran, joined) = tokio::join!(
        call_once(&mut first, keyed("search", "k-join", json!({"q": 1}))),
        call_once(&mut second, keyed("search", "k-join", json!({"q": 1}))),
    );
    let (ran, joined) = (ran.unwrap(), joined.unwrap());
    assert!(!ran.record().from_cache);
    assert_eq!(
        joined.record().short_circuit,
        Some(ShortCircuit::InflightJoin)
    );
    assert_eq!(tool.calls(), 1);
    assert_eq!(hooks.before_after_short_circuit(), (1, 1, 1));
    assert!(hooks
        .fired()
        .contains(&short_circuit(ShortCircuit::InflightJoin, None)));
}

#[tokio::test(start_paused = true)]
async fn a_key_reused_with_other_params_fires_one_short_circuit() {
    refused_after_one_call(
        keyed("search", "k-2", json!({"q": 1})),
        keyed("search", "k-2", json!({"q": 2})),
        ShortCircuit::KeyConflict,
        ErrorCode::IdempotencyKeyReused,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_breaker_that_opens_mid_retry_fires_the_attempt_and_one_short_circuit() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(unavailable());
    let mut svc = stack(registry(), &hooks, &tool);

    // Attempt 1 fails and opens the breaker; attempt 2 is refused and not retried.
    let err = call_once(&mut svc, call("web", "flaky", json!({"n": 1})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(err.record().attempts, Some(1));
    assert_eq!(err.record().retried_by.len(), 1);
    assert_eq!(err.record().short_circuit, Some(ShortCircuit::BreakerOpen));
    assert_eq!(tool.calls(), 1);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: Some(ErrorCode::UpstreamUnavailable)
            },
            short_circuit(ShortCircuit::BreakerOpen, Some(ErrorCode::CircuitOpen)),
        ]
    );

    // While it is open, a call fires the short-circuit alone.
    hooks.forget();
    let err = call_once(&mut svc, call("web", "flaky", json!({"n": 2})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert!(err.is_rejected());
    assert_eq!(tool.calls(), 1);
    assert_eq!(hooks.before_after_short_circuit(), (0, 0, 1));
    assert_eq!(
        hooks.fired(),
        [short_circuit(
            ShortCircuit::BreakerOpen,
            Some(ErrorCode::CircuitOpen)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_denying_hook_stops_the_tool_and_the_caller_gets_its_error() {
    let hooks = Arc::new(Recorder {
        deny_with: Some(ToolError::new(
            ErrorCode::PolicyDenied,
            "searching is paused for this actor",
        )),
        ..Recorder::default()
    });
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry(), &hooks, &tool);

    let err = call_once(&mut svc, call("web", "search", json!({"q": 1})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PolicyDenied);
    assert_eq!(err.message(), "searching is paused for this actor");
    assert!(err.is_rejected(), "the tool never ran");
    assert!(err.is_not_processed());
    assert_eq!(tool.calls(), 0);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: Some(ErrorCode::PolicyDenied)
            }
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_annotating_hook_changes_what_the_tool_receives_on_every_attempt() {
    let hooks = Arc::new(Recorder {
        tag_attempts: true,
        ..Recorder::default()
    });
    let tool = ScriptedTool::new([unavailable(), Step::Ok]);
    let mut svc = stack(registry(), &hooks, &tool);

    let sent = call("web", "search", json!({"q": 1}));
    assert_eq!(sent.control().request_tags, None);
    call_once(&mut svc, sent).await.unwrap();

    let received = tool.received();
    assert_eq!(received.len(), 2);
    for (n, call) in received.iter().enumerate() {
        let tag = format!("attempt-{}", n + 1);
        assert_eq!(call.control().request_tags, Some(vec![tag]));
        assert_eq!(call.control().from_hook.as_deref(), Some("recorder"));
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_cut_short_by_their_timeout_still_fire_one_after_each() {
    let hooks = Arc::new(Recorder::default());
    let tool = ScriptedTool::always(Step::Hang);
    let mut svc = stack(registry(), &hooks, &tool);

    let err = call_once(&mut svc, call("web", "slow", json!({"q": 1})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RetryExhausted);
    assert_eq!(tool.calls(), 2);
    let cancelled = Some(ErrorCode::Cancelled);
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: cancelled
            },
            Before { attempt: 2 },
            After {
                attempt: 2,
                code: cancelled
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn with_reliability_switched_off_the_hooks_still_fire() {
    let control = ReliabilityControl::new();
    let registry = registry().with_control(control.clone());
    let hooks = Arc::new(Recorder {
        tag_attempts: true,
        ..Recorder::default()
    });
    let tool = ScriptedTool::always(Step::Ok);
    let mut svc = stack(registry, &hooks, &tool);

    control.set_enabled(false);
    call_once(&mut svc, call("web", "search", json!({"q": 1})))
        .await
        .unwrap();
    assert_eq!(tool.calls(), 1);
    assert_eq!(
        tool.received()[0].control().from_hook.as_deref(),
        Some("recorder")
    );
    assert_eq!(
        hooks.fired(),
        [
            Before { attempt: 1 },
            After {
                attempt: 1,
                code: None
            }
        ]
    );
}
