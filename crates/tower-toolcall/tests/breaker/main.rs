//! CircuitBreakerLayer: when it opens, how it recovers, what it counts, its scopes and its
//! admin handle.

#[path = "../support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_toolcall::event::LayerEvent;

use support::{call_of, call_once, registry_of, ScriptedTool, Step};
use tokio::time::Instant;
use tower::Layer;
use tower_toolcall::breaker::{BreakerKey, CircuitBreakerLayer, TransitionReason};
use tower_toolcall::registry::{
    BreakerSettings, LayerSetting, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{
    BreakerScope, BreakerState, ErrorCode, ResultStatus, ToolCall, ToolError, ToolResult,
};

const VAULT: &str = "vault";
const WEB: &str = "agents.tools.web";

fn create_file() -> ToolDescriptor {
    ToolDescriptor::new(VAULT, "createFile", RiskLevel::Writes)
}

fn unavailable() -> Step {
    Step::Fail(ToolError::from_http_status(503, "vault is down"))
}

/// Records every transition, as (from, to, reason).
#[derive(Clone, Default)]
struct Transitions(Arc<Mutex<Vec<(BreakerState, BreakerState, TransitionReason)>>>);

impl Transitions {
    fn listener(&self) -> impl Fn(&LayerEvent<'_>) + Send + Sync + 'static {
        let seen = self.0.clone();
        move |event: &LayerEvent<'_>| {
            if let LayerEvent::BreakerTransition(event) = event {
                seen.lock()
                    .unwrap()
                    .push((event.from, event.to, event.reason))
            }
        }
    }

    fn get(&self) -> Vec<(BreakerState, BreakerState, TransitionReason)> {
        self.0.lock().unwrap().clone()
    }
}

use BreakerState::{Closed, HalfOpen, Open};

/// Calls `vault::createFile` `n` times, whatever it answers.
async fn create_files<S>(svc: &mut S, n: usize)
where
    S: tower::Service<ToolCall, Response = tower_toolcall::ToolOutput, Error = ToolError>,
{
    for _ in 0..n {
        let _ = call_once(svc, call_of(VAULT, "createFile")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn tr8_five_failures_open_it_and_calls_then_fail_fast_without_the_tool() {
    let tool = ScriptedTool::new(std::iter::repeat_n(unavailable(), 5).chain([Step::Ok]));
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());

    for i in 0..5 {
        let err = call_once(&mut svc, call_of(VAULT, "createFile"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
        let expected = if i < 4 { Closed } else { Open };
        assert_eq!(
            err.record().breaker_state,
            Some(expected),
            "after failure {}",
            i + 1
        );
    }
    assert_eq!(admin.state(VAULT, "createFile"), Open);

    // The tool would succeed now, but the breaker does not let the call through.
    let start = Instant::now();
    let call = call_of(VAULT, "createFile");
    let err = call_once(&mut svc, call.clone()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(tool.calls(), 5, "the tool was not touched");
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert!(err.is_retriable() && err.is_not_processed());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    let result = ToolResult::from_outcome(&call, Err(err));
    assert_eq!(result.status, ResultStatus::CircuitOpen);
    assert_eq!(result.attempts, 0);
    assert_eq!(result.error.unwrap().breaker_state, Some(Open));
}

#[tokio::test(start_paused = true)]
async fn tr9_after_the_cooldown_two_successful_probes_close_it() {
    let tool = ScriptedTool::new(std::iter::repeat_n(unavailable(), 5).chain([Step::Ok]));
    let transitions = Transitions::default();
    let layer = CircuitBreakerLayer::builder(registry_of([create_file()]))
        .on_event(transitions.listener())
        .build()
        .unwrap();
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    create_files(&mut svc, 5).await;

    tokio::time::advance(Duration::from_millis(29_999)).await;
    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_millis(1)));

    tokio::time::advance(Duration::from_millis(1)).await;
    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    assert_eq!(
        out.record().breaker_state,
        Some(HalfOpen),
        "one probe is not enough"
    );
    assert_eq!(tool.calls(), 6, "the probe reached the tool");
    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    assert_eq!(out.record().breaker_state, Some(Closed));
    assert_eq!(admin.state(VAULT, "createFile"), Closed);
    assert_eq!(
        transitions.get(),
        vec![
            (Closed, Open, TransitionReason::ConsecutiveFailures(5)),
            (Open, HalfOpen, TransitionReason::CooldownElapsed),
            (HalfOpen, Closed, TransitionReason::ProbesSucceeded(2)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn tr10_a_failed_probe_reopens_it_and_restarts_the_cooldown() {
    let tool = ScriptedTool::new(std::iter::repeat_n(unavailable(), 5).chain([
        Step::After(Duration::from_secs(10), Box::new(unavailable())),
        Step::Ok,
    ]));
    let transitions = Transitions::default();
    let layer = CircuitBreakerLayer::builder(registry_of([create_file()]))
        .on_event(transitions.listener())
        .build()
        .unwrap();
    let mut svc = layer.layer(tool.service());
    create_files(&mut svc, 5).await;
    tokio::time::advance(Duration::from_secs(30)).await;

    // The probe fails 10 s later, at t = 40 s.
    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(err.record().breaker_state, Some(Open));

    // The cooldown runs from the failed probe: still open at t = 69 s.
    tokio::time::advance(Duration::from_secs(29)).await;
    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(tool.calls(), 6);

    tokio::time::advance(Duration::from_secs(1)).await;
    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    assert_eq!(out.record().breaker_state, Some(HalfOpen));
    assert_eq!(
        transitions.get()[1..],
        [
            (Open, HalfOpen, TransitionReason::CooldownElapsed),
            (HalfOpen, Open, TransitionReason::ProbeFailed),
            (Open, HalfOpen, TransitionReason::CooldownElapsed),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn two_concurrent_calls_when_half_open_make_one_probe_and_one_refusal() {
    let tool = ScriptedTool::new(
        std::iter::repeat_n(unavailable(), 5)
            .chain([Step::After(Duration::from_secs(1), Box::new(Step::Ok))]),
    );
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let mut svc = layer.layer(tool.service());
    create_files(&mut svc, 5).await;
    tokio::time::advance(Duration::from_secs(30)).await;

    let mut first = svc.clone();
    let mut second = svc.clone();
    let (probe, refused) = tokio::join!(
        call_once(&mut first, call_of(VAULT, "createFile")),
        call_once(&mut second, call_of(VAULT, "createFile")),
    );

    assert_eq!(tool.calls(), 6, "only the probe reached the tool");
    assert!(probe.is_ok());
    let refused = refused.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::CircuitOpen);
    assert_eq!(refused.record().breaker_state, Some(HalfOpen));
}

#[tokio::test(start_paused = true)]
async fn half_of_ten_calls_failing_opens_it_by_rate() {
    // A read-only tool needs 8 consecutive failures: alternating ones never get there.
    let search = ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly);
    let tool =
        ScriptedTool::new((0..10).map(|i| if i % 2 == 0 { Step::Ok } else { unavailable() }));
    let transitions = Transitions::default();
    let layer = CircuitBreakerLayer::builder(registry_of([search]))
        .on_event(transitions.listener())
        .build()
        .unwrap();
    let mut svc = layer.layer(tool.service());

    for i in 0..10 {
        let outcome = call_once(&mut svc, call_of(WEB, "search")).await;
        let state = match &outcome {
            Ok(out) => out.record().breaker_state,
            Err(err) => err.record().breaker_state,
        };
        assert_eq!(
            state,
            Some(if i < 9 { Closed } else { Open }),
            "call {}",
            i + 1
        );
    }
    assert_eq!(
        transitions.get(),
        vec![(
            Closed,
            Open,
            TransitionReason::FailureRate {
                failures: 5,
                calls: 10
            }
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn failures_older_than_the_window_do_not_count() {
    let tool = ScriptedTool::always(unavailable());
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());

    create_files(&mut svc, 4).await;
    tokio::time::advance(Duration::from_secs(121)).await;
    create_files(&mut svc, 4).await;
    assert_eq!(
        admin.state(VAULT, "createFile"),
        Closed,
        "8 failures, never 5 within 120 s"
    );
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!(status.window_calls, 4);
    assert_eq!(status.stats.failures, 8);

    let _ = call_once(&mut svc, call_of(VAULT, "createFile")).await;
    assert_eq!(admin.state(VAULT, "createFile"), Open);
}

#[tokio::test(start_paused = true)]
async fn caller_errors_do_not_count() {
    let tool = ScriptedTool::new(
        [400, 401, 403, 404, 409, 413, 422]
            .into_iter()
            .cycle()
            .take(20)
            .map(|s| Step::Fail(ToolError::from_http_status(s, "your fault"))),
    );
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());

    for _ in 0..20 {
        let err = call_once(&mut svc, call_of(VAULT, "createFile"))
            .await
            .unwrap_err();
        assert_ne!(err.code(), ErrorCode::CircuitOpen);
    }
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!(status.state, Closed);
    assert_eq!(status.stats.neutral, 20);
    assert_eq!(status.stats.failures, 0);
    assert_eq!(tool.calls(), 20);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_answers_is_abandoned_after_the_attempt_timeout() {
    let descriptor = create_file().with_attempt_timeout(Duration::from_secs(5));
    let tool = ScriptedTool::new(std::iter::repeat_n(unavailable(), 5).chain([Step::Hang]));
    let transitions = Transitions::default();
    let layer = CircuitBreakerLayer::builder(registry_of([descriptor]))
        .on_event(transitions.listener())
        .build()
        .unwrap();
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    create_files(&mut svc, 5).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let mut prober = svc.clone();
    let probe =
        tokio::spawn(async move { call_once(&mut prober, call_of(VAULT, "createFile")).await });
    tokio::task::yield_now().await;
    assert_eq!(tool.calls(), 6, "the probe is in flight");

    tokio::time::advance(Duration::from_secs(4)).await;
    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(err.record().breaker_state, Some(HalfOpen));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        admin.state(VAULT, "createFile"),
        Open,
        "the silent probe counts as failed"
    );
    let err = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap_err();
    assert_eq!(err.record().breaker_state, Some(Open));
    assert_eq!(
        transitions.get().last(),
        Some(&(HalfOpen, Open, TransitionReason::ProbeAbandoned))
    );
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_caller_gives_up_frees_its_place() {
    let tool = ScriptedTool::new(std::iter::repeat_n(unavailable(), 5).chain([Step::Hang]));
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let mut svc = layer.layer(tool.service());
    create_files(&mut svc, 5).await;
    tokio::time::advance(Duration::from_secs(30)).await;

    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        call_once(&mut svc, call_of(VAULT, "createFile")),
    )
    .await;
    assert!(gave_up.is_err(), "the probe hangs and its caller gives up");
    assert_eq!(tool.calls(), 6);

    let second = tokio::time::timeout(
        Duration::from_secs(1),
        call_once(&mut svc, call_of(VAULT, "createFile")),
    )
    .await;
    assert!(second.is_err(), "a new probe was admitted, and hangs too");
    assert_eq!(tool.calls(), 7);
}

#[tokio::test(start_paused = true)]
async fn results_arriving_after_it_opened_never_extend_the_break() {
    let quick = create_file().with_policy(
        ToolPolicy::default().with_breaker(BreakerSettings::default().with_consecutive_failures(2)),
    );
    let tool = ScriptedTool::new([
        unavailable(),
        Step::After(Duration::from_secs(1), Box::new(unavailable())),
        Step::After(Duration::from_secs(20), Box::new(unavailable())),
        Step::Ok,
    ]);
    let layer = CircuitBreakerLayer::new(registry_of([quick]));
    let admin = layer.admin();
    let svc = layer.layer(tool.service());

    let calls = (0..3).map(|_| {
        let mut svc = svc.clone();
        async move { call_once(&mut svc, call_of(VAULT, "createFile")).await }
    });
    let outcomes = futures::future::join_all(calls).await;
    assert!(outcomes.iter().all(Result::is_err));

    // Opened at t = 1 s; the late failure came at t = 20 s and changed nothing.
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!(status.state, Open);
    assert_eq!(status.stats.late, 1);
    assert_eq!(status.retry_after, Some(Duration::from_secs(11)));
    tokio::time::advance(Duration::from_secs(11)).await;
    let mut svc = svc.clone();
    let out = call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    assert_eq!(out.record().breaker_state, Some(HalfOpen));
}

#[tokio::test(start_paused = true)]
async fn dependency_and_global_scopes_share_a_breaker() {
    let registry = registry_of([
        ToolDescriptor::new(VAULT, "createFile", RiskLevel::Writes),
        ToolDescriptor::new(VAULT, "readFile", RiskLevel::ReadOnly),
        ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly),
    ]);
    let tool = ScriptedTool::always(unavailable());
    let layer = CircuitBreakerLayer::new(registry);
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    let scoped = |ns: &str, name: &str, scope| {
        ToolCall::builder(ns, name)
            .session("s")
            .actor("u")
            .breaker_scope(scope)
            .build()
            .unwrap()
    };

    for _ in 0..5 {
        let _ = call_once(
            &mut svc,
            scoped(VAULT, "createFile", BreakerScope::Dependency),
        )
        .await;
    }
    assert_eq!(
        admin.status(&BreakerKey::dependency(VAULT)).unwrap().state,
        Open
    );
    assert_eq!(
        admin.state(VAULT, "createFile"),
        Closed,
        "the tool's own breaker is apart"
    );
    let err = call_once(
        &mut svc,
        scoped(VAULT, "readFile", BreakerScope::Dependency),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::CircuitOpen,
        "the dependency is down for every tool"
    );
    let other = call_once(&mut svc, scoped(VAULT, "readFile", BreakerScope::Tool)).await;
    assert_ne!(other.unwrap_err().code(), ErrorCode::CircuitOpen);

    for _ in 0..5 {
        let _ = call_once(&mut svc, scoped(WEB, "search", BreakerScope::Global)).await;
    }
    assert_eq!(admin.status(&BreakerKey::Global).unwrap().state, Open);
    let err = call_once(&mut svc, scoped(VAULT, "readFile", BreakerScope::Global))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(tool.calls(), 11);
}

#[tokio::test(start_paused = true)]
async fn presets_follow_the_risk_level() {
    let registry = registry_of([ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly)]);
    let tool = ScriptedTool::always(unavailable());
    let layer = CircuitBreakerLayer::new(registry);
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    for _ in 0..7 {
        let _ = call_once(&mut svc, call_of(WEB, "search")).await;
    }
    assert_eq!(
        admin.state(WEB, "search"),
        Closed,
        "read-only tools take 8 failures"
    );
    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();
    assert_eq!(err.record().breaker_state, Some(Open));
    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();
    assert_eq!(
        err.retry_after(),
        Some(Duration::from_secs(20)),
        "and cool down for 20 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dependency_or_the_global_breaker_held_open_stops_every_call_under_it() {
    let registry = registry_of([
        create_file(),
        ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly),
    ]);
    let tool = ScriptedTool::always(Step::Ok);
    let layer = CircuitBreakerLayer::new(registry);
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());

    // The web server held open: its tools' calls (each under its own tool breaker) stop;
    // another server's run.
    let web = BreakerKey::dependency(WEB);
    admin.force_open(&web);
    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(err.record().breaker_state, Some(BreakerState::ForcedOpen));
    assert!(call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .is_ok());
    assert_eq!(tool.calls(), 1);
    assert!(admin.reset(&web));
    assert!(call_once(&mut svc, call_of(WEB, "search")).await.is_ok());

    // Every call held open, until every breaker is reset.
    admin.force_open(&BreakerKey::Global);
    for (namespace, name) in [(WEB, "search"), (VAULT, "createFile")] {
        let err = call_once(&mut svc, call_of(namespace, name))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::CircuitOpen, "{name}");
    }
    admin.reset_all();
    assert!(call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .is_ok());
    assert_eq!(tool.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn admin_forces_open_resets_and_lists_breakers() {
    let registry = registry_of([
        create_file(),
        ToolDescriptor::new(WEB, "search", RiskLevel::ReadOnly),
    ]);
    let tool = ScriptedTool::always(Step::Ok);
    let layer = CircuitBreakerLayer::new(registry);
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    let key = BreakerKey::tool(WEB, "search");

    admin.force_open(&key);
    let err = call_once(&mut svc, call_of(WEB, "search"))
        .await
        .unwrap_err();
    assert_eq!(err.record().breaker_state, Some(BreakerState::ForcedOpen));
    assert_eq!(err.retry_after(), None);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        admin.state(WEB, "search"),
        BreakerState::ForcedOpen,
        "until reset"
    );
    assert!(admin.reset(&key));
    assert!(call_once(&mut svc, call_of(WEB, "search")).await.is_ok());

    let keys: Vec<String> = admin.snapshot().iter().map(|s| s.key.to_string()).collect();
    assert_eq!(
        keys,
        [
            "tool agents.tools.web::search",
            "tool vault::createFile",
            "dependency agents.tools.web",
            "dependency vault",
            "global",
        ]
    );
    assert_eq!(admin.snapshot()[0].stats.successes, 1);
    assert_eq!(admin.snapshot()[0].stats.rejected, 1);
    assert!(!admin.reset(&BreakerKey::tool("no", "such")));
}

#[test]
fn listeners_run_after_the_lock_is_released() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        rt.block_on(async {
            let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
            let admin = layer.admin();
            let inside = admin.clone();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = seen.clone();
            // Reading the breaker from its own listener takes the breaker's lock again.
            admin.on_event(move |event: &LayerEvent<'_>| {
                if let LayerEvent::BreakerTransition(event) = event {
                    let status = inside.status(&event.key).unwrap();
                    record.lock().unwrap().push(status.state);
                }
            });
            let tool = ScriptedTool::always(unavailable());
            let mut svc = layer.layer(tool.service());
            create_files(&mut svc, 5).await;
            done.send(seen.lock().unwrap().clone()).unwrap();
        });
    });
    let states = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("a listener that needs the breaker's lock must not deadlock");
    assert_eq!(states, vec![Open]);
}

#[tokio::test(start_paused = true)]
async fn a_tool_with_the_breaker_off_is_never_refused() {
    let off = create_file().with_policy(ToolPolicy::default().with_breaker(LayerSetting::Off));
    let tool = ScriptedTool::always(unavailable());
    let layer = CircuitBreakerLayer::new(registry_of([off]));
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    for _ in 0..20 {
        let err = call_once(&mut svc, call_of(VAULT, "createFile"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
        assert_eq!(err.record().breaker_state, None);
    }
    assert_eq!(tool.calls(), 20);
    assert!(admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn breakers_made_on_demand_are_bounded() {
    let tool = ScriptedTool::always(Step::Ok);
    let layer = CircuitBreakerLayer::builder(ToolRegistry::open())
        .settings(BreakerSettings::default().with_max_breakers(8))
        .build()
        .unwrap();
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());
    for i in 0..100 {
        call_once(&mut svc, call_of("plugins", &format!("tool{i}")))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let tools = admin
        .snapshot()
        .into_iter()
        .filter(|s| s.key.scope() == BreakerScope::Tool)
        .count();
    assert!(tools <= 8, "{tools} breakers kept");
    assert!(
        admin
            .status(&BreakerKey::tool("plugins", "tool99"))
            .is_some(),
        "the most recent is kept"
    );
    assert!(
        admin
            .status(&BreakerKey::tool("plugins", "tool0"))
            .is_none(),
        "the oldest went"
    );
    // An unregistered tool still gets a breaker of its own.
    let failing = ScriptedTool::always(unavailable());
    let mut svc = layer.layer(failing.service());
    for _ in 0..5 {
        let _ = call_once(&mut svc, call_of("plugins", "flaky")).await;
    }
    assert_eq!(admin.state("plugins", "flaky"), Open);
}

#[test]
fn invalid_configuration_names_the_field() {
    let open = ToolRegistry::open;
    let err = CircuitBreakerLayer::builder(open())
        .settings(BreakerSettings::default().with_failure_rate_percent(101))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "breaker.failure_rate_percent");
    let err = CircuitBreakerLayer::builder(open())
        .read_only(BreakerSettings::default().with_consecutive_failures(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "breaker.read_only.consecutive_failures");
    let err = CircuitBreakerLayer::builder(open())
        .settings(BreakerSettings::default().with_max_breakers(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "breaker.max_breakers");
    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "writes",
            "policy": {"breaker": {"failure_rate_percent": 150}}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.breaker.failure_rate_percent");
    // Overrides that only clash with the preset are caught when the layer is built.
    let clash = create_file().with_policy(
        ToolPolicy::default().with_breaker(BreakerSettings::default().with_min_calls(30)),
    );
    let err = CircuitBreakerLayer::builder(registry_of([clash]))
        .build()
        .unwrap_err();
    assert_eq!(
        err.field(),
        "tools[vault::createFile].policy.breaker.min_calls"
    );
}

#[tokio::test(start_paused = true)]
async fn throttles_open_no_breaker() {
    let throttled = |i: usize| {
        let error = if i.is_multiple_of(2) {
            ToolError::from_http_status(429, "too many requests")
                .with_retry_after(Duration::from_secs(2))
        } else {
            ToolError::new(ErrorCode::RateLimited, "quota spent for this minute")
        };
        Step::Fail(error)
    };
    let tool = ScriptedTool::new((0..12).map(throttled).chain([Step::Ok]));
    let layer = CircuitBreakerLayer::new(registry_of([create_file()]));
    let admin = layer.admin();
    let mut svc = layer.layer(tool.service());

    for _ in 0..12 {
        let err = call_once(&mut svc, call_of(VAULT, "createFile"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited);
    }
    let status = admin
        .status(&BreakerKey::tool(VAULT, "createFile"))
        .unwrap();
    assert_eq!(status.state, Closed);
    assert_eq!(status.stats.failures, 0);
    call_once(&mut svc, call_of(VAULT, "createFile"))
        .await
        .unwrap();
    assert_eq!(tool.calls(), 13);
}
