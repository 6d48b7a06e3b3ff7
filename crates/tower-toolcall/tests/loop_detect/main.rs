//! Loop detection: thresholds, modes, windows, tiers, rules beyond repeats, logs and bounds.

#[path = "../support/mod.rs"]
mod support;

mod corpus;

/// A layer over an open registry with `settings` as its server tier.
fn layer_with(settings: LoopDetectSettings) -> LoopDetectLayer {
    Store::Memory.layer_with(settings)
}

/// Where the sessions' histories are kept: every case of `cases.rs` runs against every
/// store (the crate `tower-toolcall-redis` runs them on Redis).
enum Store {
    /// The layer's own tracker, judging each call synchronously.
    Memory,
    /// `InMemoryLoopStore`, through the `LoopStore` trait as a shared store is.
    MemoryStore,
}

/// Runs each case in the process, without a store and with `InMemoryLoopStore`.
macro_rules! store_suite {
    (#[$memory:meta] $($case:ident),* $(,)?) => {
        support::store_suite!(#[$memory] $($case),*);

        mod memory_store {
            $(
                #[$memory]
                async fn $case() {
                    super::$case(super::Store::MemoryStore).await;
                }
            )*
        }
    };
}

impl Store {
    fn builder(
        &self,
        registry: ToolRegistry,
    ) -> tower_toolcall::loop_detect::LoopDetectLayerBuilder {
        let builder = LoopDetectLayer::builder(registry)
            .on_store_failure(tower_toolcall::shared_store::FailurePolicy::Closed);
        match self {
            Store::Memory => builder,
            Store::MemoryStore => builder.store(Arc::new(
                tower_toolcall::loop_detect::InMemoryLoopStore::new(),
            )),
        }
    }
}

include!("cases.rs");

#[tokio::test]
async fn disabled_detection_tracks_nothing() {
    let counter = Counter::default();
    let layer = layer_with(loops(|s| s.enabled = Some(false)));
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    for i in 0..10 {
        let session = format!("sess-{}", i % 3);
        send(&mut svc, search(&session, json!({"query": "same"})))
            .await
            .unwrap();
    }
    assert_eq!(counter.get(), 10);
    assert_eq!(handle.tracked_sessions(), 0);

    // A session that switches detection on is tracked; switching it off again forgets it.
    handle
        .apply_command("sess-0", "!/set(tool-loop-detection=true)")
        .unwrap();
    let call = search("sess-0", json!({"query": "same"}));
    let (ran, _) = runs_before_refusal(&mut svc, &call).await;
    assert_eq!(ran, 3);
    assert_eq!(handle.tracked_sessions(), 1);
    handle
        .apply_command("sess-0", "!/set(tool-loop-detection=false)")
        .unwrap();
    assert_eq!(handle.tracked_sessions(), 0);
    send(&mut svc, call).await.expect("untracked again");
}

#[tokio::test(start_paused = true)]
async fn the_window_forgets_old_calls() {
    let counter = Counter::default();
    let mut svc = stack(LoopDetectLayer::new(ToolRegistry::open()), &counter);
    let call = search("sess-1", json!({"query": "a"}));

    for _ in 0..3 {
        send(&mut svc, call.clone()).await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(119)).await;
    send(&mut svc, call.clone())
        .await
        .expect_err("119 s later the calls are still in the window");

    let other = search("sess-2", json!({"query": "a"}));
    for _ in 0..3 {
        send(&mut svc, other.clone()).await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(120)).await;
    let (ran, _) = runs_before_refusal(&mut svc, &other).await;
    assert_eq!(ran, 3, "after the window the count starts again");
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_are_dropped_after_their_window() {
    let counter = Counter::default();
    let layer = LoopDetectLayer::new(ToolRegistry::open());
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    for i in 0..10 {
        send(&mut svc, search(&format!("idle-{i}"), json!({"q": i})))
            .await
            .unwrap();
    }
    assert_eq!(handle.tracked_sessions(), 10);
    tokio::time::advance(Duration::from_secs(120)).await;
    send(&mut svc, search("fresh", json!({"q": 0})))
        .await
        .unwrap();
    assert_eq!(handle.tracked_sessions(), 1);
    assert_eq!(handle.evicted_sessions(), 0, "expiry is not eviction");
}

#[tokio::test]
async fn each_detection_logs_the_warn_line_with_its_fields() {
    let (capture, _guard) = capture();
    let counter = Counter::default();
    let mut svc = stack(LoopDetectLayer::new(ToolRegistry::open()), &counter);
    let call = from_model(
        "sess-log",
        json!({"query": "rust tower retry", "page": 2, "filters": {"site": "docs.rs", "lang": "en"}}),
        "openai",
        "gpt-4o",
    );
    runs_before_refusal(&mut svc, &call).await;

    let warnings: Vec<CapturedEvent> = capture
        .events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN)
        .collect();
    assert_eq!(warnings.len(), 1, "one WARN per detection");
    let fields = &warnings[0].fields;
    let signature = r#"{"filters":{"lang":"en","site":"docs.rs"},"page":2"#;
    assert_eq!(signature.chars().count(), 50);
    assert_eq!(
        fields["message"],
        format!(
            "Tool call loop detected in session sess-log: tool=search, repeats=4/4, \
             window=120s, model=gpt-4o, backend=openai, action=break, signature={signature}..."
        )
    );
    let expected: BTreeMap<String, String> = [
        ("session_id", "sess-log"),
        ("tool_name", "search"),
        ("tool_namespace", NS),
        ("repeats", "4"),
        ("max_repeats", "4"),
        ("window_secs", "120"),
        ("model", "gpt-4o"),
        ("backend", "openai"),
        ("action", "break"),
        ("rule", "repeat"),
        ("signature", signature),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .chain([("message".to_owned(), fields["message"].clone())])
    .collect();
    assert_eq!(fields, &expected);

    let events = capture.events();
    let full = events
        .iter()
        .find(|e| {
            e.level == tracing::Level::DEBUG && e.fields["message"] == "loop detection signature"
        })
        .expect("the full signature at DEBUG");
    assert_eq!(
        full.fields["params"],
        r#"{"filters":{"lang":"en","site":"docs.rs"},"page":2,"query":"rust tower retry"}"#
    );
    assert_eq!(full.fields["signature_hash"].len(), 16);
}

#[tokio::test]
async fn logs_never_show_secrets_and_name_unknown_models() {
    let (capture, _guard) = capture();
    let counter = Counter::default();
    let mut svc = stack(LoopDetectLayer::new(ToolRegistry::open()), &counter);
    let secret = "sk-proj-0123456789abcdefghijklmnop";
    let call = search(
        "sess-secret",
        json!({"apiKey": "hunter2", "note": format!("use {secret}"), "q": "x"}),
    );
    runs_before_refusal(&mut svc, &call).await;

    let events = capture.events();
    let warn = events
        .iter()
        .find(|e| e.level == tracing::Level::WARN)
        .expect("a WARN event");
    assert_eq!(
        warn.fields["signature"],
        r#"{"apiKey":"[REDACTED]","note":"use [REDACTED]","q""#
    );
    assert_eq!(warn.fields["model"], "unknown");
    assert_eq!(warn.fields["backend"], "unknown");
    for event in &events {
        for value in event.fields.values() {
            assert!(
                !value.contains("hunter2") && !value.contains(secret),
                "a secret leaked into {event:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_tracker_stays_at_its_cap() {
    let counter = Counter::default();
    let layer = LoopDetectLayer::builder(ToolRegistry::open())
        .settings(loops(|s| s.max_sessions = Some(1_000)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    for session in 0..20_000 {
        let session = format!("sess-{session}");
        for step in ["B", "C", "A", "A", "A"] {
            send(&mut svc, search(&session, json!({"step": step})))
                .await
                .unwrap();
        }
        assert!(handle.tracked_sessions() <= 1_000);
    }
    assert_eq!(counter.get(), 100_000);
    assert_eq!(handle.tracked_sessions(), 1_000);
    assert_eq!(handle.evicted_sessions(), 19_000);

    // The most recent sessions keep their history; the evicted ones start afresh.
    send(&mut svc, search("sess-19999", json!({"step": "A"})))
        .await
        .expect_err("the 4th A of a tracked session");
    send(&mut svc, search("sess-0", json!({"step": "A"})))
        .await
        .expect("an evicted session starts counting again");
}

#[test]
fn every_malformed_command_is_named() {
    let cases = [
        (
            "!/set(tool-loop-speed=3)",
            CommandErrorKind::UnknownKey,
            Some("tool-loop-speed"),
            "unknown setting `tool-loop-speed`",
        ),
        (
            "!/unset(tool-loop-mode, tool-loop-colour)",
            CommandErrorKind::UnknownKey,
            Some("tool-loop-colour"),
            "unknown setting `tool-loop-colour`",
        ),
        (
            "!/set(tool-loop-max-repeats=four)",
            CommandErrorKind::BadNumber,
            Some("tool-loop-max-repeats"),
            "`tool-loop-max-repeats` must be a whole number from 2 to 1000, got \"four\"",
        ),
        (
            "!/set(tool-loop-max-repeats=1)",
            CommandErrorKind::BadNumber,
            Some("tool-loop-max-repeats"),
            "`tool-loop-max-repeats` must be a whole number from 2 to 1000, got 1",
        ),
        (
            "!/set(tool-loop-ttl=-5)",
            CommandErrorKind::BadNumber,
            Some("tool-loop-ttl"),
            "`tool-loop-ttl` must be a whole number of seconds, at least 1, got \"-5\"",
        ),
        (
            "!/set(tool-loop-mode=stop)",
            CommandErrorKind::BadMode,
            Some("tool-loop-mode"),
            "`tool-loop-mode` must be break, chance or chance_then_break, got \"stop\"",
        ),
        (
            "!/set(tool-loop-detection=maybe)",
            CommandErrorKind::BadBool,
            Some("tool-loop-detection"),
            "`tool-loop-detection` must be true or false, got \"maybe\"",
        ),
        (
            "!/set tool-loop-ttl=5)",
            CommandErrorKind::MissingParenthesis,
            None,
            "`!/set` must be followed by `(`",
        ),
        (
            "!/set(tool-loop-ttl=5",
            CommandErrorKind::MissingParenthesis,
            None,
            "missing its closing parenthesis",
        ),
        (
            "!/unset(tool-loop-ttl",
            CommandErrorKind::MissingParenthesis,
            None,
            "`!/unset(` is missing its closing parenthesis `)`",
        ),
        (
            "!/set(tool-loop-ttl)",
            CommandErrorKind::MissingValue,
            Some("tool-loop-ttl"),
            "`tool-loop-ttl` needs a value",
        ),
        (
            "!/unset(tool-loop-ttl=5)",
            CommandErrorKind::UnexpectedValue,
            Some("tool-loop-ttl"),
            "takes setting names only",
        ),
        (
            "!/set(tool-loop-ttl=5, tool-loop-ttl=6)",
            CommandErrorKind::DuplicateKey,
            Some("tool-loop-ttl"),
            "`tool-loop-ttl` is named twice",
        ),
        ("!/set()", CommandErrorKind::Empty, None, "names no setting"),
        (
            "!/set(tool-loop-ttl=5) please",
            CommandErrorKind::TrailingText,
            None,
            "unexpected text after",
        ),
        (
            "set tool-loop-ttl to 5",
            CommandErrorKind::NotACommand,
            None,
            "not a loop detection command",
        ),
        (
            "!/settings(tool-loop-ttl=5)",
            CommandErrorKind::NotACommand,
            None,
            "not a loop detection command",
        ),
    ];
    for (input, kind, key, says) in cases {
        let err = LoopCommand::parse(input).unwrap_err();
        assert_eq!(err.kind(), kind, "{input}: {err}");
        assert_eq!(err.key(), key, "{input}");
        assert!(err.to_string().contains(says), "{input}: {err}");
    }
}

#[test]
fn a_wrong_command_or_setting_changes_nothing() {
    let handle = LoopDetectLayer::new(ToolRegistry::open()).handle();
    handle
        .apply_command("s", "!/set(tool-loop-ttl=30)")
        .unwrap();
    handle
        .apply_command("s", "!/set(tool-loop-ttl=60, tool-loop-mode=stop)")
        .unwrap_err();
    let bad = loops(|s| {
        s.max_repeats = Some(0);
        s.mode = Some(LoopMode::ChanceThenBreak);
    });
    let err = handle.set("s", bad).unwrap_err();
    assert_eq!(err.field(), "max_repeats");
    let err = handle
        .apply("s", &LoopCommand::Set(loops(|s| s.ttl_secs = Some(0))))
        .unwrap_err();
    assert_eq!(err.field(), "ttl_secs");
    assert_eq!(
        handle.session_settings("s"),
        loops(|s| s.ttl_secs = Some(30))
    );
    handle.unset("s", &[LoopSettingKey::Ttl]);
    assert_eq!(handle.sessions_with_settings(), 0);
}

#[test]
fn a_session_sets_only_the_six_settings_its_commands_name() {
    let handle = LoopDetectLayer::new(ToolRegistry::open()).handle();
    type Change = fn(&mut LoopDetectSettings);
    let others: [(&str, Change); 11] = [
        ("poller", |s| s.poller = Some(true)),
        ("ignore_members", |s| s.ignore_members = Some(Vec::new())),
        ("cycles", |s| s.cycles = Some(false)),
        ("cycle_repetitions", |s| s.cycle_repetitions = Some(4)),
        ("max_cycle_length", |s| s.max_cycle_length = Some(3)),
        ("repeated_failures", |s| s.repeated_failures = Some(false)),
        ("min_backoff_ms", |s| s.min_backoff_ms = Some(500)),
        ("patient_poll_gap_ms", |s| {
            s.patient_poll_gap_ms = Some(10_000)
        }),
        ("result_aware_polling", |s| {
            s.result_aware_polling = Some(false)
        }),
        ("max_sessions", |s| s.max_sessions = Some(10)),
        ("max_session_bytes", |s| s.max_session_bytes = Some(1 << 20)),
    ];
    for (field, set) in others {
        let settings = loops(|s| {
            s.max_repeats = Some(3);
            set(s);
        });
        let err = handle.set("s", settings.clone()).unwrap_err();
        assert_eq!(err.field(), field);
        assert_eq!(
            err.problem(),
            "is not set by a session; a session sets only enabled, max_repeats, ttl_secs, \
             mode, max_failures and poll_budget_secs"
        );
        let err = handle.apply("s", &LoopCommand::Set(settings)).unwrap_err();
        assert_eq!(err.field(), field);
        // A model sets the same six.
        let err = LoopDetectLayer::builder(ToolRegistry::open())
            .model("openai", "gpt-4o", loops(set))
            .build()
            .unwrap_err();
        assert_eq!(
            err.field(),
            format!("loop_detect.models[openai/gpt-4o].{field}")
        );
    }
    assert_eq!(handle.sessions_with_settings(), 0, "nothing was set");
    let six = loops(|s| {
        s.enabled = Some(true);
        s.max_repeats = Some(3);
        s.ttl_secs = Some(60);
        s.mode = Some(LoopMode::Break);
        s.max_failures = Some(2);
        s.poll_budget_secs = Some(0);
    });
    handle.set("s", six.clone()).unwrap();
    assert_eq!(handle.session_settings("s"), six);
}

#[test]
fn bad_configuration_is_refused_with_the_field_named() {
    let registry = ToolRegistry::open;
    let cases: Vec<(Result<LoopDetectLayer, tower_toolcall::ConfigError>, &str)> = vec![
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.max_repeats = Some(1)))
                .build(),
            "loop_detect.max_repeats",
        ),
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.ttl_secs = Some(0)))
                .build(),
            "loop_detect.ttl_secs",
        ),
        (
            LoopDetectLayer::builder(registry())
                .model("openai", "gpt-4o", loops(|s| s.max_repeats = Some(5000)))
                .build(),
            "loop_detect.models[openai/gpt-4o].max_repeats",
        ),
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.cycle_repetitions = Some(1)))
                .build(),
            "loop_detect.cycle_repetitions",
        ),
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.max_cycle_length = Some(11)))
                .build(),
            "loop_detect.max_cycle_length",
        ),
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.max_failures = Some(1)))
                .build(),
            "loop_detect.max_failures",
        ),
        (
            LoopDetectLayer::builder(registry())
                .settings(loops(|s| s.max_sessions = Some(0)))
                .build(),
            "loop_detect.max_sessions",
        ),
        (
            LoopDetectLayer::builder(
                ToolRegistry::builder()
                    .tool(
                        ToolDescriptor::new("jobs", "status", RiskLevel::ReadOnly).with_policy(
                            ToolPolicy::default()
                                .with_loop_detect(loops(|s| s.max_repeats = Some(100_000))),
                        ),
                    )
                    .build()
                    .unwrap(),
            )
            .build(),
            "tools[jobs::status].policy.loop_detect.max_repeats",
        ),
    ];
    for (result, field) in cases {
        let err = result.expect_err(field);
        assert_eq!(err.field(), field, "{err}");
    }
}

#[test]
fn the_environment_tier_names_the_variable_it_refuses() {
    let read = |vars: &[(&str, &str)]| {
        LoopDetectSettings::from_env_with(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    };
    let config = read(&[
        ("TOOL_LOOP_DETECTION_ENABLED", "on"),
        ("TOOL_LOOP_MAX_REPEATS", "5"),
        ("TOOL_LOOP_TTL_SECONDS", "60"),
        ("TOOL_LOOP_MODE", "chance"),
    ])
    .unwrap();
    assert_eq!(
        config,
        loops(|s| {
            s.enabled = Some(true);
            s.max_repeats = Some(5);
            s.ttl_secs = Some(60);
            s.mode = Some(LoopMode::ChanceThenBreak);
        })
    );
    for (name, value) in [
        ("TOOL_LOOP_DETECTION_ENABLED", "sometimes"),
        ("TOOL_LOOP_MAX_REPEATS", "0"),
        ("TOOL_LOOP_TTL_SECONDS", "2m"),
        ("TOOL_LOOP_MODE", "halt"),
    ] {
        let err = read(&[(name, value)]).unwrap_err();
        assert_eq!(err.field(), name);
        assert!(err.to_string().contains(value), "{err}");
    }
}

#[tokio::test]
async fn too_deep_params_are_refused_and_leave_nothing_behind() {
    let counter = Counter::default();
    let layer = LoopDetectLayer::new(ToolRegistry::open());
    let handle = layer.handle();
    let mut svc = stack(layer, &counter);
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({ "d": deep });
    }
    let err = send(&mut svc, search("sess-1", deep)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert!(err.message().contains("payload.params"));
    assert_eq!(counter.get(), 0);
    assert_eq!(handle.tracked_sessions(), 0);
}

#[tokio::test]
async fn readiness_is_the_inner_service_s_and_calls_in_flight_count() {
    let (mock, mut mock_handle) = tower_test::mock::pair::<ToolCall, ToolOutput>();
    let layer = LoopDetectLayer::new(ToolRegistry::open());
    let svc = ServiceBuilder::new()
        .layer(layer)
        .map_err(|e: tower::BoxError| ToolError::new(ErrorCode::InternalError, e.to_string()))
        .service(mock);
    let mut svc = tower_test::mock::Spawn::new(svc);

    mock_handle.allow(0);
    assert_pending!(svc.poll_ready());
    mock_handle.allow(4);
    assert_ready_ok!(svc.poll_ready());

    let call = search("sess-1", json!({"query": "slow"}));
    let mut in_flight = Vec::new();
    for _ in 0..3 {
        assert_ready_ok!(svc.poll_ready());
        in_flight.push(tokio_test::task::spawn(svc.call(call.clone())));
    }
    assert_ready_ok!(svc.poll_ready());
    let mut fourth = tokio_test::task::spawn(svc.call(call.clone()));
    let err = tokio_test::assert_ready_err!(fourth.poll());
    assert_eq!(
        err.code(),
        ErrorCode::LoopDetected,
        "three identical calls are in flight"
    );

    for future in &mut in_flight {
        assert_pending!(future.poll());
    }
    for _ in 0..3 {
        let (request, respond) = mock_handle.next_request().await.unwrap();
        assert_eq!(request.request_id(), call.request_id());
        respond.send_response(ToolOutput::new(json!("done")));
    }
    for future in &mut in_flight {
        assert_ready_ok!(future.poll());
    }
}

#[tokio::test]
async fn clones_of_the_layer_share_one_history() {
    let counter = Counter::default();
    let layer = LoopDetectLayer::new(ToolRegistry::open());
    let mut first = stack(layer.clone(), &counter);
    let mut second = stack(layer.clone(), &counter);
    let call = search("sess-1", json!({"q": 1}));
    send(&mut first, call.clone()).await.unwrap();
    send(&mut second, call.clone()).await.unwrap();
    send(&mut first, call.clone()).await.unwrap();
    send(&mut second, call.clone()).await.unwrap_err();
    assert_eq!(layer.handle().tracked_sessions(), 1);
    layer.handle().reset_session("sess-1");
    send(&mut first, call)
        .await
        .expect("a reset session counts afresh");
}

#[tokio::test]
async fn the_canonical_form_is_computed_once_and_shared_with_the_next_layer() {
    let shared = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(ToolRegistry::open()))
        .service(canonical_sharing_tool(shared.clone()));
    send(&mut svc, search("sess-1", json!({"query": "shared"})))
        .await
        .unwrap();
    assert_eq!(
        shared.load(Ordering::SeqCst),
        1,
        "the tool got the cached form"
    );

    // With other options the layer caches its own form, and the next layer's default
    // options compute theirs afresh each time: this is what sharing avoids.
    let layer = LoopDetectLayer::builder(ToolRegistry::open())
        .canonical_options(
            tower_toolcall::canonical::CanonicalOptions::default().with_trim_strings(false),
        )
        .build()
        .unwrap();
    let shared = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(canonical_sharing_tool(shared.clone()));
    send(&mut svc, search("sess-1", json!({"query": "not shared"})))
        .await
        .unwrap();
    assert_eq!(shared.load(Ordering::SeqCst), 0);
}

// The tracker's bound in bytes.

#[tokio::test(start_paused = true)]
async fn sessions_with_long_keys_stay_within_the_bound_in_bytes_and_the_newest_still_breaks() {
    const MAX_BYTES: usize = 64 << 10;
    const KEY_BYTES: usize = 200;
    let layer = LoopDetectLayer::builder(ToolRegistry::open())
        .settings(loops(|s| s.max_session_bytes = Some(MAX_BYTES)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let counter = Counter::default();
    let mut svc = stack(layer, &counter);
    // 2 000 sessions with 200-byte keys: 400 KB of keys alone, far more than the bound.
    let session = |i: usize| format!("{i:05}-{}", "s".repeat(KEY_BYTES - 6));
    for i in 0..2_000 {
        send(&mut svc, search(&session(i), json!({"q": i})))
            .await
            .unwrap();
        assert!(
            handle.tracked_sessions() * KEY_BYTES <= MAX_BYTES,
            "{} sessions after {i}",
            handle.tracked_sessions()
        );
    }
    assert!(
        handle.tracked_sessions() >= 10,
        "{}",
        handle.tracked_sessions()
    );
    assert_eq!(
        handle.evicted_sessions(),
        2_000 - handle.tracked_sessions() as u64
    );
    // The newest session keeps its history: its fourth identical call is a loop.
    let newest = search(&session(1_999), json!({"q": 1_999}));
    let (ran, error) = runs_before_refusal(&mut svc, &newest).await;
    assert_eq!((ran, error.code()), (2, ErrorCode::LoopDetected));
    assert_eq!(counter.get(), 2_000 + 2);

    let err = LoopDetectLayer::builder(ToolRegistry::open())
        .settings(loops(|s| s.max_session_bytes = Some(1024)))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "loop_detect.max_session_bytes");
}

#[tokio::test(start_paused = true)]
async fn a_patient_poll_runs_a_tight_one_stops_and_a_poll_past_its_budget_stops() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(read_only_status()))
        .service(job_status(vec![json!({"state": "running"})], calls.clone()));
    // Every 30 s for 8 minutes, the same answer: a patient poll of a long job.
    for n in 0..17 {
        send(&mut svc, poll("patient"))
            .await
            .unwrap_or_else(|e| panic!("poll {n}: {e}"));
        tokio::time::advance(Duration::from_secs(30)).await;
    }
    // Every second: a tight loop, stopped at its 4th call.
    let (ran, err) = runs_before_refusal(&mut svc, &poll("tight")).await;
    assert_eq!(
        (ran, err.details().unwrap()["rule"].as_str()),
        (3, Some("unchanged_poll"))
    );
    // The patient poll goes on until its answer stayed the same for 10 minutes.
    let mut refused = None;
    for n in 17..30 {
        match send(&mut svc, poll("patient")).await {
            Ok(_) => tokio::time::advance(Duration::from_secs(30)).await,
            Err(e) => {
                refused = Some((n, e));
                break;
            }
        }
    }
    let (n, err) = refused.expect("the budget stops the poll");
    assert_eq!(n, 20, "at 600 s");
    assert_eq!(err.details().unwrap()["unchangedSecs"], 600);
    assert!(err
        .message()
        .contains("Its result has not changed for 600s. Stop polling"));
    // A tool with a shorter budget; `0` would poll without end.
    let short = ToolPolicy::default().with_loop_detect(loops(|s| s.poll_budget_secs = Some(120)));
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(registered(
            "jobs",
            "status",
            RiskLevel::ReadOnly,
            short,
        )))
        .service(job_status(vec![json!({"state": "running"})], calls.clone()));
    let mut ran = 0;
    while send(&mut svc, poll("short")).await.is_ok() {
        ran += 1;
        tokio::time::advance(Duration::from_secs(30)).await;
    }
    assert_eq!(ran, 4, "at 0, 30, 60 and 90 s; refused at 120 s");
}

#[tokio::test(start_paused = true)]
async fn a_session_s_poll_budget_holds_for_it_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = LoopDetectLayer::new(read_only_status());
    let handle = layer.handle();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(job_status(vec![json!({"state": "running"})], calls.clone()));
    handle
        .apply_command("short", "!/set(tool-loop-poll-budget-seconds=90)")
        .unwrap();
    handle
        .apply_command("endless", "!/set(tool-loop-poll-budget-seconds=0)")
        .unwrap();
    // Every 30 s, the same answer, in three sessions at once.
    let mut refused_at = BTreeMap::new();
    for n in 0..30 {
        for session in ["short", "default", "endless"] {
            if refused_at.contains_key(session) {
                continue;
            }
            if let Err(err) = send(&mut svc, poll(session)).await {
                assert_eq!(
                    err.details().unwrap()["rule"],
                    "unchanged_poll",
                    "{session}"
                );
                refused_at.insert(session, n * 30);
            }
        }
        tokio::time::advance(Duration::from_secs(30)).await;
    }
    assert_eq!(
        refused_at,
        BTreeMap::from([("default", 600), ("short", 90)]),
        "the endless session polls on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_with_growing_waits_is_not_refused_and_a_steady_one_is() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(LoopDetectLayer::new(ToolRegistry::open()))
        .service(failing(vec![ErrorCode::UpstreamUnavailable], calls.clone()));
    let call = search("backoff", json!({"q": 1}));
    for wait in [1, 2, 4, 8, 16, 32] {
        let err = send(&mut svc, call.clone()).await.unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::UpstreamUnavailable,
            "after a wait of {wait}"
        );
        tokio::time::advance(Duration::from_secs(wait)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    let steady = search("steady", json!({"q": 1}));
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(send(&mut svc, steady.clone()).await.unwrap_err().code());
        tokio::time::advance(Duration::from_secs(5)).await;
    }
    assert_eq!(codes[3], ErrorCode::LoopDetected);
    assert_eq!(calls.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn a_resend_answered_from_the_record_is_never_a_repeat() {
    use tower::Layer;
    let registry = registered("mail", "send", RiskLevel::Writes, ToolPolicy::default());
    let stack = tower_toolcall::ToolStack::builder(registry)
        .build()
        .unwrap();
    let counter = Counter::default();
    let mut svc = stack.layer(counter.tool());
    // The same caller key, sent six times: one mail, five recorded answers.
    let keyed = ToolCall::builder("mail", "send")
        .session("sess-1")
        .actor("user-7")
        .params(json!({"to": "cfo@acme.io"}))
        .idempotency_key("mail-1")
        .build()
        .unwrap();
    for n in 0..6 {
        let output = send(&mut svc, keyed.clone())
            .await
            .unwrap_or_else(|e| panic!("re-send {n}: {e}"));
        assert_eq!(output.record().from_cache, n > 0);
    }
    assert_eq!(counter.get(), 1);
    // Without a key, identical calls inside the re-send window: the derived key's record.
    let derived = send_mail("sess-2", json!({"to": "cfo@acme.io"}));
    for n in 0..6 {
        send(&mut svc, derived.clone())
            .await
            .unwrap_or_else(|e| panic!("re-send {n}: {e}"));
    }
    assert_eq!(counter.get(), 2);
    // A call that asks for no deduplication, which its tool does not let callers ask for,
    // is still answered from the record, so it is still a re-send.
    let mut unasked = keyed.clone();
    unasked.envelope_mut().transport.dedupe_mode = Some(tower_toolcall::DedupeMode::Disabled);
    for n in 0..6 {
        let output = send(&mut svc, unasked.clone())
            .await
            .unwrap_or_else(|e| panic!("re-send {n}: {e}"));
        assert!(output.record().from_cache);
    }
    assert_eq!(counter.get(), 2);
    // The loop layer alone knows no record: the 4th identical call is refused.
    let mut alone = stack_without_idempotency(&counter);
    let (ran, _) = runs_before_refusal(&mut alone, &keyed).await;
    assert_eq!(ran, 3);
}
