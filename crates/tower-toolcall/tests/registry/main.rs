//! The tool registry: loading from TOML and JSON, errors that name the field, lookups.

use serde_json::json;
use tower_toolcall::envelope::DedupeMode;
use tower_toolcall::registry::{
    BreakerSettings, ClassifyOverrides, IdempotencySettings, JitterKind, KeyScope, LayerSetting,
    LoopDetectSettings, LoopMode, OnLimit, OnStoreError, ParamsMismatch, RateLimitKey,
    RateLimitSettings, RetrySettings, RiskLevel, TimeoutSettings, ToolDescriptor, ToolPolicy,
    ToolRegistry, UnclassifiedAs, ValidateSettings,
};

const TOML: &str = r#"
open = false
denied = ["agents.tools.shell::*", "vault::deleteFile"]

[unregistered.retry]
max_attempts = 1

[[tools]]
namespace = "agents.tools.web"
name = "search"
risk = "read-only"
idempotent = true
description = "web search"
attempt_timeout_ms = 0
"#;

#[test]
fn a_toml_registry_loads_with_every_section() {
    let text = r#"
        denied = ["agents.tools.shell::*", "vault::deleteFile"]

        [unregistered]
        retry = { max_attempts = 1 }

        [[tools]]
        namespace = "agents.tools.web"
        name = "search"
        risk = "read-only"
        idempotent = true
        input_schema = { type = "object", required = ["query"] }

        [tools.policy]
        loop_detect = { max_repeats = 6, mode = "chance_then_break" }
        idempotency = { scope = "global", dedupe_mode = "bestEffort" }
        timeout = { attempt_timeout_ms = 5000 }
        classify = { terminal_http_statuses = [503] }

        [[tools]]
        namespace = "vault"
        name = "createFile"
        risk = "writes"
        confirmation_required = true

        [tools.policy]
        retry = "off"
        breaker = { consecutive_failures = 3, cooldown_ms = 10000 }
    "#;
    let registry = ToolRegistry::from_toml_str(text).unwrap();
    assert_eq!(registry.len(), 2);
    assert!(!registry.is_open());
    let search = registry.get("agents.tools.web", "search").unwrap();
    let d = search.descriptor();
    assert_eq!(d.risk, RiskLevel::ReadOnly);
    assert!(d.idempotent && search.has_input_schema());
    let loop_detect = d.policy.loop_detect.overrides().unwrap();
    assert_eq!(loop_detect.max_repeats, Some(6));
    assert_eq!(loop_detect.mode, Some(LoopMode::ChanceThenBreak));
    assert_eq!(
        d.policy.idempotency.overrides().unwrap().scope,
        Some(KeyScope::Global)
    );
    assert_eq!(d.attempt_timeout(), Some(std::time::Duration::from_secs(5)));
    assert_eq!(d.policy.classify.terminal_http_statuses, vec![503]);

    let create = registry.get("vault", "createFile").unwrap().descriptor();
    assert!(create.policy.retry.is_off());
    assert!(create.confirmation_required);
    assert_eq!(
        create
            .policy
            .breaker
            .overrides()
            .unwrap()
            .consecutive_failures,
        Some(3)
    );
    assert!(registry.is_denied("agents.tools.shell", "exec"));
    assert!(registry.is_denied("vault", "deleteFile"));
    assert!(!registry.is_denied("vault", "createFile"));
    assert_eq!(
        registry
            .unregistered_policy()
            .retry
            .overrides()
            .unwrap()
            .max_attempts,
        Some(1)
    );
}

#[test]
fn json_and_toml_describe_the_same_registry() {
    let json = r#"{
        "open": true,
        "tools": [{
            "namespace": "agents.tools.web", "name": "search", "risk": "read-only",
            "policy": {"retry": {"max_attempts": 2}, "rate_limit": "off"}
        }]
    }"#;
    let toml = r#"
        open = true
        [[tools]]
        namespace = "agents.tools.web"
        name = "search"
        risk = "read-only"
        [tools.policy]
        retry = { max_attempts = 2 }
        rate_limit = "off"
    "#;
    let from_json = ToolRegistry::from_json_str(json).unwrap();
    let from_toml = ToolRegistry::from_toml_str(toml).unwrap();
    assert!(from_json.is_open() && from_toml.is_open());
    assert_eq!(
        from_json
            .get("agents.tools.web", "search")
            .unwrap()
            .descriptor(),
        from_toml
            .get("agents.tools.web", "search")
            .unwrap()
            .descriptor()
    );
}

#[test]
fn a_wrong_type_is_refused_naming_the_field() {
    let err = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "a"
        name = "b"
        risk = "read-only"
        idempotent = "yes"
        "#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].idempotent", "{err}");

    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "read-only",
            "policy": {"retry": {"max_attempts": "three"}}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.retry.max_attempts", "{err}");

    let err = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "a"
        name = "b"
        risk = "dangerous"
        "#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].risk", "{err}");
    assert!(err.to_string().contains("dangerous"), "{err}");
}

#[test]
fn an_unknown_layer_name_is_refused_naming_it() {
    let err = ToolRegistry::from_toml_str(
        r#"
        [[tools]]
        namespace = "a"
        name = "b"
        risk = "read-only"
        [tools.policy]
        retyr = "off"
        "#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.retyr", "{err}");
    assert!(
        err.problem().contains("expected one of `validate`"),
        "{err}"
    );

    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "read-only",
            "policy": {"breaker": {"cooldown": 5}}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.breaker.cooldown", "{err}");
    assert!(err.problem().contains("`cooldown_ms`"), "{err}");

    let err = ToolRegistry::from_json_str(
        r#"{"tools": [{"namespace": "a", "name": "b", "risk": "read-only",
            "policy": {"retry": "sometimes"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.retry", "{err}");
    assert!(err.to_string().contains("\"off\""), "{err}");

    let err = ToolRegistry::from_toml_str("tols = []").unwrap_err();
    assert!(err.to_string().contains("tols"), "{err}");
}

#[test]
fn a_table_already_read_loads_as_its_text_does() {
    for text in [
        TOML,
        "open = \"yes\"",
        "unknown = 1",
        "[[tools]]\nnamespace = \"a\"\nname = \"b\"\nrisk = 1",
        "[[tools]]\nnamespace = \"a\"\nname = \"b\"\nrisk = \"dangerous\"",
        "[[tools]]\nnamespace = \"a\"\nrisk = \"writes\"",
        "[[tools]]\nnamespace = \"a\"\nname = \"b\"\nrisk = \"writes\"\n\
         [tools.policy]\nretry = { max_attempts = 0 }",
    ] {
        let table: toml::Table = toml::from_str(text).unwrap();
        let (read, from_text) = (
            ToolRegistry::from_toml_table(&table),
            ToolRegistry::from_toml_str(text),
        );
        match (read, from_text) {
            (Ok(read), Ok(from_text)) => {
                assert_eq!(read.len(), from_text.len(), "{text}");
                let descriptors = |r: &ToolRegistry| {
                    r.tools()
                        .map(|t| t.descriptor().clone())
                        .collect::<Vec<_>>()
                };
                assert_eq!(descriptors(&read), descriptors(&from_text), "{text}");
            }
            (read, from_text) => {
                assert_eq!(read.unwrap_err(), from_text.unwrap_err(), "{text}");
            }
        }
    }
}

#[test]
fn a_missing_field_is_named() {
    let err =
        ToolRegistry::from_json_str(r#"{"tools": [{"namespace": "a", "name": "b"}]}"#).unwrap_err();
    assert_eq!(err.field(), "tools[0].risk", "{err}");
    assert_eq!(err.problem(), "is required");
}

#[test]
fn out_of_range_overrides_are_refused_naming_the_field() {
    let cases = [
        (
            r#"{"retry": {"max_attempts": 0}}"#,
            "tools[0].policy.retry.max_attempts",
        ),
        (
            r#"{"retry": {"base_delay_ms": 500, "max_delay_ms": 100}}"#,
            "tools[0].policy.retry.max_delay_ms",
        ),
        (
            r#"{"breaker": {"failure_rate_percent": 150}}"#,
            "tools[0].policy.breaker.failure_rate_percent",
        ),
        (
            r#"{"breaker": {"min_calls": 30, "sample_size": 20}}"#,
            "tools[0].policy.breaker.min_calls",
        ),
        (
            r#"{"loop_detect": {"max_repeats": 1}}"#,
            "tools[0].policy.loop_detect.max_repeats",
        ),
        (
            r#"{"rate_limit": {"per_second": 0}}"#,
            "tools[0].policy.rate_limit.per_second",
        ),
        (
            r#"{"classify": {"terminal_codes": ["NOPE"]}}"#,
            "tools[0].policy.classify.terminal_codes[0]",
        ),
        (
            r#"{"classify": {"retriable_http_statuses": [700]}}"#,
            "tools[0].policy.classify.retriable_http_statuses[0]",
        ),
    ];
    for (policy, field) in cases {
        let text = format!(
            r#"{{"tools": [{{"namespace": "a", "name": "b", "risk": "writes", "policy": {policy}}}]}}"#
        );
        let err = ToolRegistry::from_json_str(&text).unwrap_err();
        assert_eq!(err.field(), field, "{policy}: {err}");
    }
}

#[test]
fn a_tool_s_loop_detect_policy_may_not_set_the_whole_layer_s_fields() {
    let whole_layer = [
        ("cycles", "false"),
        ("cycle_repetitions", "4"),
        ("max_cycle_length", "3"),
        ("repeated_failures", "false"),
        ("min_backoff_ms", "500"),
        ("patient_poll_gap_ms", "10000"),
        ("result_aware_polling", "false"),
        ("max_sessions", "10"),
        ("max_session_bytes", "1048576"),
    ];
    for (name, value) in whole_layer {
        let policy: ToolPolicy =
            serde_json::from_str(&format!(r#"{{"loop_detect": {{"{name}": {value}}}}}"#)).unwrap();
        let err = policy.check().unwrap_err();
        assert_eq!(err.field(), format!("loop_detect.{name}"), "{err}");
        assert_eq!(
            err.problem(),
            "is set for the whole layer, in the layer's settings, not in a tool's policy; \
             remove it here"
        );
        let text = format!(
            r#"{{"tools": [{{"namespace": "a", "name": "b", "risk": "writes",
                "policy": {{"loop_detect": {{"{name}": {value}}}}}}}]}}"#
        );
        let err = ToolRegistry::from_json_str(&text).unwrap_err();
        assert_eq!(err.field(), format!("tools[0].policy.loop_detect.{name}"));
    }
    // What a tool sets is accepted.
    let policy: ToolPolicy = serde_json::from_str(
        r#"{"loop_detect": {"enabled": true, "max_repeats": 2, "ttl_secs": 60, "mode": "chance",
            "max_failures": 2, "poll_budget_secs": 0, "poller": true, "ignore_members": ["n"]}}"#,
    )
    .unwrap();
    assert!(policy.check().is_ok());
}

#[test]
fn an_invalid_schema_is_refused_when_the_registry_is_built() {
    let err = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("a", "b", RiskLevel::ReadOnly)
                .with_input_schema(json!({"type": "strnig"})),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[0].input_schema", "{err}");
    assert!(err.problem().contains("not a valid JSON Schema"), "{err}");

    let err = ToolRegistry::builder()
        .tool(ToolDescriptor::new("a", "ok", RiskLevel::ReadOnly))
        .tool(
            ToolDescriptor::new("a", "b", RiskLevel::ReadOnly)
                .with_output_schema(json!({"properties": {"x": {"minimum": "zero"}}})),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[1].output_schema", "{err}");

    // A remote reference cannot be fetched: the registry refuses it rather than reach out.
    let err = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("a", "b", RiskLevel::ReadOnly)
                .with_input_schema(json!({"$ref": "https://example.com/schema.json"})),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[0].input_schema", "{err}");
}

#[test]
fn duplicates_bad_deny_patterns_and_empty_names_are_refused() {
    let err = ToolRegistry::builder()
        .tool(ToolDescriptor::new("a", "b", RiskLevel::ReadOnly))
        .tool(ToolDescriptor::new("a", "b", RiskLevel::Writes))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[1]");
    assert!(err.problem().contains("a::b"));

    let err = ToolRegistry::builder().deny("shell").build().unwrap_err();
    assert_eq!(err.field(), "denied[0]");

    let err = ToolRegistry::builder()
        .tool(ToolDescriptor::new("a", " ", RiskLevel::ReadOnly))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[0].name");
}

#[test]
fn files_load_by_extension() {
    let dir = std::env::temp_dir().join(format!("tower-toolcall-registry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml_path = dir.join("tools.toml");
    std::fs::write(&toml_path, TOML.replace("attempt_timeout_ms = 0\n", "")).unwrap();
    let registry = ToolRegistry::from_path(&toml_path).unwrap();
    assert_eq!(registry.len(), 1);

    // A field that does not exist at the top of a descriptor.
    std::fs::write(&toml_path, TOML).unwrap();
    let err = ToolRegistry::from_path(&toml_path).unwrap_err();
    assert_eq!(err.field(), "tools[0].attempt_timeout_ms", "{err}");
    assert!(err.problem().contains("unknown field"), "{err}");

    let yaml = dir.join("tools.yaml");
    std::fs::write(&yaml, "tools: []").unwrap();
    let err = ToolRegistry::from_path(&yaml).unwrap_err();
    assert!(err.to_string().contains(".json or .toml"), "{err}");
    let err = ToolRegistry::from_path(dir.join("missing.json")).unwrap_err();
    assert!(err.to_string().contains("cannot read"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn descriptors_serialize_back_to_what_loads() {
    let descriptor = ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
        .with_idempotent(true)
        .with_attempt_timeout(std::time::Duration::from_secs(3))
        .with_input_schema(json!({"type": "object"}));
    let text = serde_json::to_string(&json!({ "tools": [descriptor] })).unwrap();
    let registry = ToolRegistry::from_json_str(&text).unwrap();
    assert_eq!(
        registry.get("vault", "createFile").unwrap().descriptor(),
        &descriptor
    );
    assert!(matches!(descriptor.policy.retry, LayerSetting::Default));
}

#[test]
fn a_policy_written_with_setters_is_the_policy_read_from_toml() {
    let text = r#"
        [unregistered]
        retry = "off"
        loop_detect = { max_repeats = 3 }

        [[tools]]
        namespace = "vault"
        name = "createFile"
        risk = "writes"
        idempotent = true
        description = "creates a file"
        confirmation_required = true

        [tools.policy]
        validate = { max_params_bytes = 4096, check_output = true }
        loop_detect = { max_repeats = 6, ttl_secs = 30, mode = "chance_then_break", poller = false }
        rate_limit = { per_second = 5, burst = 10, key = "tool_session", on_limit = "wait", max_wait_ms = 250 }
        retry = { max_attempts = 3, base_delay_ms = 50, max_delay_ms = 800, deadline_ms = 5000, jitter = "percent", jitter_percent = 20, forwards_idempotency_key = true }
        breaker = { consecutive_failures = 3, failure_rate_percent = 40, sample_size = 10, min_calls = 5, window_ms = 60000, cooldown_ms = 10000, half_open_probes = 2, close_after_successes = 3 }
        timeout = { attempt_timeout_ms = 2500 }

        [tools.policy.idempotency]
        scope = "global"
        dedupe_mode = "bestEffort"
        derive_key = false
        done_ttl_ms = 60000
        failed_ttl_ms = 5000
        inflight_lease_ms = 30000
        on_params_mismatch = "independent"
        on_store_error = "fail_open"

        [tools.policy.classify]
        retriable_codes = ["CONFLICT"]
        terminal_codes = ["UPSTREAM_UNAVAILABLE"]
        retriable_http_statuses = [409]
        terminal_http_statuses = [503]
        unclassified = "retriable"

        [[tools]]
        namespace = "agents.tools.web"
        name = "search"
        risk = "read-only"

        [tools.policy]
        validate = "off"
        loop_detect = "off"
        rate_limit = "on"
        idempotency = "off"
        breaker = "off"
    "#;
    let policy = ToolPolicy::default()
        .with_validate(
            ValidateSettings::default()
                .with_max_params_bytes(4096)
                .with_check_output(true),
        )
        .with_loop_detect({
            let mut loops = LoopDetectSettings::default();
            loops.max_repeats = Some(6);
            loops.ttl_secs = Some(30);
            loops.mode = Some(LoopMode::ChanceThenBreak);
            loops.poller = Some(false);
            loops
        })
        .with_rate_limit(
            RateLimitSettings::default()
                .with_per_second(5)
                .with_burst(10)
                .with_key(RateLimitKey::ToolSession)
                .with_on_limit(OnLimit::Wait)
                .with_max_wait_ms(250),
        )
        .with_idempotency(
            IdempotencySettings::default()
                .with_scope(KeyScope::Global)
                .with_dedupe_mode(DedupeMode::BestEffort)
                .with_derive_key(false)
                .with_done_ttl_ms(60_000)
                .with_failed_ttl_ms(5_000)
                .with_inflight_lease_ms(30_000)
                .with_on_params_mismatch(ParamsMismatch::Independent)
                .with_on_store_error(OnStoreError::FailOpen),
        )
        .with_retry(
            RetrySettings::default()
                .with_max_attempts(3)
                .with_base_delay_ms(50)
                .with_max_delay_ms(800)
                .with_deadline_ms(5_000)
                .with_jitter(JitterKind::Percent)
                .with_jitter_percent(20)
                .with_forwards_idempotency_key(true),
        )
        .with_breaker(
            BreakerSettings::default()
                .with_consecutive_failures(3)
                .with_failure_rate_percent(40)
                .with_sample_size(10)
                .with_min_calls(5)
                .with_window_ms(60_000)
                .with_cooldown_ms(10_000)
                .with_half_open_probes(2)
                .with_close_after_successes(3),
        )
        .with_timeout(TimeoutSettings::default().with_attempt_timeout_ms(2_500))
        .with_classify(
            ClassifyOverrides::default()
                .with_retriable_codes(["CONFLICT"])
                .with_terminal_codes(["UPSTREAM_UNAVAILABLE"])
                .with_retriable_http_statuses([409])
                .with_terminal_http_statuses([503])
                .with_unclassified(UnclassifiedAs::Retriable),
        );
    assert!(policy.check().is_ok());
    let create_file = ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
        .with_idempotent(true)
        .with_description("creates a file")
        .with_confirmation_required(true)
        .with_policy(policy.clone());
    let off = ToolPolicy::default()
        .with_validate(LayerSetting::Off)
        .with_loop_detect(LayerSetting::Off)
        .with_rate_limit(LayerSetting::Default)
        .with_idempotency(LayerSetting::Off)
        .with_breaker(LayerSetting::Off);
    let search = ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
        .with_policy(off.clone());
    let unregistered = ToolPolicy::default()
        .with_retry(LayerSetting::Off)
        .with_loop_detect({
            let mut loops = LoopDetectSettings::default();
            loops.max_repeats = Some(3);
            loops
        });

    let from_toml = ToolRegistry::from_toml_str(text).unwrap();
    let tool = |namespace, name| from_toml.get(namespace, name).unwrap().descriptor();
    assert_eq!(tool("vault", "createFile").policy, policy);
    assert_eq!(tool("vault", "createFile"), &create_file);
    assert_eq!(tool("agents.tools.web", "search").policy, off);
    assert_eq!(tool("agents.tools.web", "search"), &search);
    assert_eq!(from_toml.unregistered_policy(), &unregistered);

    // The same registry, built in code.
    let from_code = ToolRegistry::builder()
        .tool(create_file)
        .tool(search)
        .unregistered_policy(unregistered)
        .build()
        .unwrap();
    let listed = |registry: &ToolRegistry| {
        registry
            .tools()
            .map(|tool| tool.descriptor().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(&from_code), listed(&from_toml));
    assert_eq!(
        from_code.unregistered_policy(),
        from_toml.unregistered_policy()
    );
}

#[test]
fn a_setter_replaces_a_layer_setting_and_overrides_become_on() {
    let retry = RetrySettings::default().with_max_attempts(2);
    let policy = ToolPolicy::default().with_retry(retry.clone());
    assert_eq!(policy.retry, LayerSetting::On(retry.clone()));
    assert_eq!(policy.retry.overrides(), Some(&retry));
    let policy = policy.with_retry(LayerSetting::Off);
    assert!(policy.retry.is_off());
    let policy = policy.with_retry(LayerSetting::Default);
    assert_eq!(policy, ToolPolicy::default());
    // A setter given twice keeps the last value.
    let twice = RetrySettings::default()
        .with_max_attempts(2)
        .with_max_attempts(4);
    assert_eq!(twice.max_attempts, Some(4));
}

fn registry_of(tools: impl IntoIterator<Item = ToolDescriptor>) -> ToolRegistry {
    tools
        .into_iter()
        .fold(ToolRegistry::builder(), |builder, tool| builder.tool(tool))
        .build()
        .unwrap()
}

#[test]
fn a_call_finds_its_tool_in_each_registry_it_meets_and_again_after_its_tool_changes() {
    let first = registry_of([
        ToolDescriptor::new("vault", "createFile", RiskLevel::Writes),
        ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly),
    ]);
    let second = registry_of([ToolDescriptor::new(
        "vault",
        "createFile",
        RiskLevel::Commands,
    )]);
    let mut call = tower_toolcall::ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .build()
        .unwrap();
    let risk = |registry: &ToolRegistry, call: &tower_toolcall::ToolCall| {
        registry.tool_for(call).map(|tool| tool.descriptor().risk)
    };

    // Each registry answers for itself, however the lookups alternate.
    for _ in 0..2 {
        assert_eq!(risk(&first, &call), Some(RiskLevel::ReadOnly));
        assert_eq!(risk(&second, &call), None);
    }
    // A clone answers as its original; an equal call built apart does too.
    assert_eq!(risk(&first, &call.clone()), Some(RiskLevel::ReadOnly));

    // The call's tool changes: both registries look it up again.
    assert_eq!(risk(&first, &call), Some(RiskLevel::ReadOnly));
    let envelope = call.envelope_mut();
    envelope.tool_namespace = "vault".into();
    envelope.tool_name = "createFile".into();
    assert_eq!(risk(&first, &call), Some(RiskLevel::Writes));
    assert_eq!(risk(&second, &call), Some(RiskLevel::Commands));
    assert_eq!(
        first.policy_for(&call),
        &first
            .get("vault", "createFile")
            .unwrap()
            .descriptor()
            .policy
    );
}

#[test]
fn tools_are_listed_in_the_order_of_their_full_names() {
    let registry = registry_of([
        ToolDescriptor::new("vault", "readFile", RiskLevel::ReadOnly),
        ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly),
        ToolDescriptor::new("vault", "createFile", RiskLevel::Writes),
    ]);
    let names: Vec<&str> = registry.tools().map(|tool| tool.full_name()).collect();
    assert_eq!(
        names,
        [
            "agents.tools.web::search",
            "vault::createFile",
            "vault::readFile"
        ]
    );
}

#[test]
fn a_field_only_the_whole_layer_has_is_refused_in_a_tools_policy() {
    for (section, field) in [
        ("rate_limit", "max_keys = 10"),
        ("rate_limit", "sweep_interval_ms = 1000"),
        ("breaker", "max_breakers = 10"),
        ("breaker", "probe_timeout_ms = 1000"),
    ] {
        let text = format!(
            "[[tools]]\nnamespace = \"web\"\nname = \"search\"\nrisk = \"read-only\"\n\
             [tools.policy.{section}]\n{field}\n"
        );
        let err = ToolRegistry::from_toml_str(&text).unwrap_err();
        let name = field.split(' ').next().unwrap();
        assert_eq!(err.field(), format!("tools[0].policy.{section}.{name}"));
        assert!(err.problem().contains("whole layer"), "{err}");
    }
    // The same fields are the layer's own settings.
    use tower_toolcall::registry::{BreakerSettings, RateLimitSettings};
    use tower_toolcall::{CircuitBreakerLayer, RateLimitLayer};
    RateLimitLayer::builder(ToolRegistry::open())
        .settings(RateLimitSettings::default().with_max_keys(10))
        .build()
        .unwrap();
    CircuitBreakerLayer::builder(ToolRegistry::open())
        .settings(
            BreakerSettings::default()
                .with_max_breakers(10)
                .with_probe_timeout_ms(1_000),
        )
        .build()
        .unwrap();
    // A risk class's preset is per tool too.
    let err = CircuitBreakerLayer::builder(ToolRegistry::open())
        .read_only(BreakerSettings::default().with_max_breakers(10))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "breaker.read_only.max_breakers");
}
