//! The tool registry: loading from TOML and JSON, errors that name the field, lookups.

use serde_json::json;
use tower_toolcall::registry::{
    KeyScope, LayerSetting, LoopMode, RiskLevel, ToolDescriptor, ToolRegistry,
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
