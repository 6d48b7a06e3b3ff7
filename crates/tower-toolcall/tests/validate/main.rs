//! EnvelopeValidateLayer: every rejection is terminal and never reaches the tool (TR-1).

#[path = "../support/mod.rs"]
mod support;

use serde_json::{json, Value};
use support::{search_call, Counter};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry, ValidateSettings};
use tower_toolcall::{
    tool_fn, EnvelopeValidateLayer, ErrorClass, ErrorCode, ToolCall, ToolError, ToolOutput,
};

fn file_schema() -> Value {
    json!({
        "type": "object",
        "required": ["path", "content"],
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "content": {"type": "string"},
            "mode": {"enum": ["create", "overwrite"]}
        },
        "additionalProperties": false
    })
}

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_idempotent(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string"}}
                })),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                .with_input_schema(file_schema())
                .with_output_schema(json!({
                    "type": "object",
                    "required": ["path", "etag"],
                    "properties": {"etag": {"type": "string"}}
                }))
                .with_confirmation_required(true),
        )
        .deny("agents.tools.shell::*")
        .build()
        .unwrap()
}

async fn run<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready().await?.call(call).await
}

fn file_call(params: Value, confirmation: Option<&str>) -> ToolCall {
    let builder = ToolCall::builder("vault", "createFile")
        .session("sess-42")
        .actor("user-7")
        .params(params);
    match confirmation {
        Some(id) => builder.confirmation_id(id),
        None => builder,
    }
    .build()
    .unwrap()
}

/// Makes a valid call invalid in one field.
type Breakage = fn(&mut ToolCall);

fn assert_rejected(err: &ToolError, code: ErrorCode) {
    assert_eq!(err.code(), code, "{err}");
    assert_eq!(err.class(), ErrorClass::Terminal, "{err}");
    assert!(err.is_not_processed(), "{err}");
    assert!(err.is_rejected(), "{err}");
}

#[tokio::test]
async fn malformed_envelopes_never_reach_the_tool_and_valid_calls_do() {
    let counter = Counter::default();
    let mut svc = ServiceBuilder::new()
        .layer(EnvelopeValidateLayer::new(registry()))
        .service(counter.tool());

    let breakages: [(&str, Breakage); 6] = [
        ("contractVersion", |c| {
            c.envelope_mut().contract_version = "1.0".into()
        }),
        ("toolName", |c| c.envelope_mut().tool_name = String::new()),
        ("target.sessionKey", |c| {
            c.envelope_mut().target.session_key = " ".into()
        }),
        ("target.actorId", |c| {
            c.envelope_mut().target.actor_id = String::new()
        }),
        ("payload.version", |c| {
            c.envelope_mut().payload.version = "2.0".into()
        }),
        ("requestId", |c| c.envelope_mut().request_id = String::new()),
    ];
    for (field, breakage) in breakages {
        let mut call = search_call(json!({"query": "tower"}));
        breakage(&mut call);
        let err = run(&mut svc, call).await.unwrap_err();
        assert_rejected(&err, ErrorCode::ValidationError);
        assert!(
            err.message().contains(&format!("`{field}`")),
            "{field}: {err}"
        );
    }
    assert_eq!(counter.get(), 0, "no malformed call reached the tool");

    let out = run(&mut svc, search_call(json!({"query": "tower"})))
        .await
        .unwrap();
    assert_eq!(out.content["echo"]["query"], "tower");
    assert_eq!(counter.get(), 1);
}

#[tokio::test]
async fn unknown_tools_are_not_found_in_a_closed_registry_and_pass_in_an_open_one() {
    let counter = Counter::default();
    let call = ToolCall::builder("agents.tools.mail", "send")
        .session("s")
        .actor("u")
        .build()
        .unwrap();
    let mut closed = EnvelopeValidateLayer::new(registry()).layer(counter.tool());
    let err = run(&mut closed, call.clone()).await.unwrap_err();
    assert_rejected(&err, ErrorCode::NotFound);
    assert!(err.message().contains("agents.tools.mail::send"));
    assert_eq!(counter.get(), 0);

    let mut open = EnvelopeValidateLayer::new(ToolRegistry::open()).layer(counter.tool());
    run(&mut open, call).await.unwrap();
    assert_eq!(counter.get(), 1);
}

#[tokio::test]
async fn denied_tools_are_refused_registered_or_not() {
    let counter = Counter::default();
    let open_denying = ToolRegistry::builder()
        .open(true)
        .deny("agents.tools.shell::*")
        .deny("agents.tools.web::search")
        .build()
        .unwrap();
    let mut svc = EnvelopeValidateLayer::new(open_denying).layer(counter.tool());
    for (ns, name) in [
        ("agents.tools.shell", "exec"),
        ("agents.tools.web", "search"),
    ] {
        let call = ToolCall::builder(ns, name)
            .session("s")
            .actor("u")
            .build()
            .unwrap();
        let err = run(&mut svc, call).await.unwrap_err();
        assert_rejected(&err, ErrorCode::PolicyDenied);
        assert!(err.message().contains(&format!("{ns}::{name}")));
    }
    let other = ToolCall::builder("agents.tools.web", "fetch")
        .session("s")
        .actor("u")
        .build()
        .unwrap();
    run(&mut svc, other).await.unwrap();
    assert_eq!(counter.get(), 1);
}

#[tokio::test]
async fn mutating_tools_that_need_confirmation_refuse_calls_without_one() {
    let counter = Counter::default();
    let mut svc = EnvelopeValidateLayer::new(registry()).layer(counter.tool());
    let params = json!({"path": "XYZ/Foo.md", "content": "hello"});
    let err = run(&mut svc, file_call(params.clone(), None))
        .await
        .unwrap_err();
    assert_rejected(&err, ErrorCode::PolicyDenied);
    assert!(err.message().contains("control.confirmationId"), "{err}");
    assert_eq!(counter.get(), 0);

    let result = run(&mut svc, file_call(params, Some("confirm-1"))).await;
    // The counting tool echoes the params, which the output schema refuses: the call ran.
    assert_eq!(result.unwrap_err().code(), ErrorCode::InternalError);
    assert_eq!(counter.get(), 1);

    // A read-only tool flagged for confirmation needs none: nothing it does needs approval.
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_confirmation_required(true),
        )
        .build()
        .unwrap();
    let mut svc = EnvelopeValidateLayer::new(registry).layer(counter.tool());
    run(&mut svc, search_call(json!({}))).await.unwrap();
    assert_eq!(counter.get(), 2);
}

#[tokio::test]
async fn params_failing_the_schema_list_every_failing_path_without_their_values() {
    let counter = Counter::default();
    let mut svc = EnvelopeValidateLayer::new(registry()).layer(counter.tool());
    let params = json!({"path": 42, "mode": "append", "secret": "sk-live-0123456789abcdef"});
    let err = run(&mut svc, file_call(params, Some("c")))
        .await
        .unwrap_err();
    assert_rejected(&err, ErrorCode::ValidationError);
    let message = err.message();
    assert!(
        message.contains("input schema of vault::createFile"),
        "{message}"
    );
    for path in [
        "`payload.params.path`",
        "`payload.params.mode`",
        "`payload.params`",
    ] {
        assert!(message.contains(path), "{path} missing in: {message}");
    }
    assert!(
        !message.contains("sk-live"),
        "values are never echoed: {message}"
    );
    assert!(
        !message.contains("append"),
        "values are never echoed: {message}"
    );
    let violations = err.details().unwrap()["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 4, "{violations:?}");
    assert_eq!(counter.get(), 0);
}

#[tokio::test]
async fn params_over_the_size_or_depth_limit_are_refused() {
    let counter = Counter::default();
    let mut svc = EnvelopeValidateLayer::builder(registry())
        .settings(ValidateSettings::default().with_max_params_bytes(64))
        .build()
        .unwrap()
        .layer(counter.tool());
    let err = run(&mut svc, search_call(json!({"query": "x".repeat(100)})))
        .await
        .unwrap_err();
    assert_rejected(&err, ErrorCode::PayloadTooLarge);
    assert_eq!(err.details().unwrap()["bytes"], 112);
    assert_eq!(err.details().unwrap()["limit"], 64);
    // Exactly at the limit passes: {"query":"…"} with 52 characters is 64 bytes.
    run(&mut svc, search_call(json!({"query": "x".repeat(52)})))
        .await
        .unwrap();
    assert_eq!(counter.get(), 1);

    let mut nested = json!({"leaf": 1});
    for _ in 0..70 {
        nested = json!({"n": nested});
    }
    let mut svc = EnvelopeValidateLayer::new(ToolRegistry::open()).layer(counter.tool());
    let err = run(&mut svc, search_call(nested)).await.unwrap_err();
    assert_rejected(&err, ErrorCode::ValidationError);
    assert!(err.message().contains("deeper than 64 levels"));
    assert_eq!(counter.get(), 1);
}

#[tokio::test]
async fn per_tool_overrides_raise_the_limit_or_switch_the_checks_off() {
    let counter = Counter::default();
    let registry = ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "agents.tools.web", "name": "search", "risk": "read-only",
             "input_schema": {"type": "object", "required": ["query"]},
             "policy": {"validate": {"max_params_bytes": 1000}}},
            {"namespace": "agents.tools.web", "name": "fetch", "risk": "read-only",
             "input_schema": {"type": "object", "required": ["url"]},
             "policy": {"validate": "off"}}
        ], "denied": ["agents.tools.web::blocked"]}"#,
    )
    .unwrap();
    let mut svc = EnvelopeValidateLayer::builder(registry)
        .settings(ValidateSettings::default().with_max_params_bytes(64))
        .build()
        .unwrap()
        .layer(counter.tool());
    run(&mut svc, search_call(json!({"query": "x".repeat(500)})))
        .await
        .unwrap();

    let fetch = |params: Value| {
        ToolCall::builder("agents.tools.web", "fetch")
            .session("s")
            .actor("u")
            .params(params)
            .build()
            .unwrap()
    };
    // Validation off: no schema, no size limit for this tool…
    run(&mut svc, fetch(json!({"no_url": "x".repeat(500)})))
        .await
        .unwrap();
    assert_eq!(counter.get(), 2);
    // …but the envelope itself is still checked.
    let mut broken = fetch(json!({}));
    broken.envelope_mut().payload.version = "0.9".into();
    assert_eq!(
        run(&mut svc, broken).await.unwrap_err().code(),
        ErrorCode::ValidationError
    );
    assert_eq!(counter.get(), 2);
}

#[tokio::test]
async fn outputs_failing_the_output_schema_become_internal_errors() {
    let calls = Counter::default();
    let calls_in_tool = calls.clone();
    let tool = tool_fn(move |call: ToolCall| {
        let calls = calls_in_tool.clone();
        async move {
            calls.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let path = call.params().as_map()["path"].clone();
            if path == "good.md" {
                Ok(ToolOutput::new(json!({"path": path, "etag": "abc"})))
            } else {
                Ok(ToolOutput::new(json!({"path": path, "etag": 7})))
            }
        }
    });
    let mut svc = EnvelopeValidateLayer::new(registry()).layer(tool.clone());
    let good = json!({"path": "good.md", "content": "x"});
    let bad = json!({"path": "bad.md", "content": "x"});
    let out = run(&mut svc, file_call(good, Some("c"))).await.unwrap();
    assert_eq!(out.content["etag"], "abc");
    let err = run(&mut svc, file_call(bad.clone(), Some("c")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InternalError);
    assert_eq!(err.class(), ErrorClass::Terminal);
    assert!(err.message().contains("`output.content.etag`"), "{err}");
    assert!(!err.is_not_processed(), "the tool did run");
    assert_eq!(calls.get(), 2);

    let mut unchecked = EnvelopeValidateLayer::builder(registry())
        .settings(ValidateSettings::default().with_check_output(false))
        .build()
        .unwrap()
        .layer(tool);
    run(&mut unchecked, file_call(bad, Some("c")))
        .await
        .unwrap();
    assert_eq!(calls.get(), 3);
}

#[tokio::test]
async fn tool_errors_pass_through_unchanged() {
    let tool = tool_fn(|_call: ToolCall| async {
        Err::<ToolOutput, _>(ToolError::from_http_status(503, "search backend is down"))
    });
    let mut svc = EnvelopeValidateLayer::new(registry()).layer(tool);
    let err = run(&mut svc, search_call(json!({"query": "q"})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(err.message(), "search backend is down");
}

#[tokio::test]
async fn readiness_is_the_inner_service_readiness() {
    let (mock, mut handle) = tower_test::mock::pair::<ToolCall, ToolOutput>();
    let mock = mock.map_err(|e| ToolError::new(ErrorCode::InternalError, e.to_string()));
    let mut svc = tower_test::mock::Spawn::new(EnvelopeValidateLayer::new(registry()).layer(mock));
    handle.allow(0);
    tokio_test::assert_pending!(svc.poll_ready());
    handle.allow(1);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let response = svc.call(search_call(json!({"query": "tower"})));
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.params().as_map()["query"], "tower");
    send.send_response(ToolOutput::new(json!("ok")));
    assert_eq!(response.await.unwrap().content, json!("ok"));
}

#[test]
fn a_size_limit_below_two_bytes_is_a_configuration_error() {
    let err = EnvelopeValidateLayer::builder(ToolRegistry::open())
        .settings(ValidateSettings::default().with_max_params_bytes(1))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "validate.max_params_bytes");
}
