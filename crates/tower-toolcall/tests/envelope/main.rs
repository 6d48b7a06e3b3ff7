//! The envelope: fixtures, parsing errors, builder, cheap clones, result envelopes.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use support::{envelope_fixtures, search_call, strip_expect};
use tower_toolcall::envelope::{Payload, ResultError};
use tower_toolcall::{
    BreakerState, CacheMatch, DedupeMode, ErrorClass, ErrorCode, MatchedOn, Params, ResultStatus,
    RetryRecord, ToolCall, ToolError, ToolOutput, ToolResult,
};

#[test]
fn every_valid_call_fixture_round_trips() {
    for (name, bytes) in envelope_fixtures("valid-") {
        let original: Value = serde_json::from_slice(&bytes).unwrap();
        let call =
            ToolCall::from_json(&bytes).unwrap_or_else(|e| panic!("{name} must parse, got {e}"));
        let written = serde_json::to_value(&call).unwrap();
        assert_eq!(
            written, original,
            "{name} must serialize to the same JSON value"
        );
        let again = ToolCall::from_json(call.to_json().as_bytes()).unwrap();
        assert_eq!(again, call, "{name} must parse back to the same call");
    }
}

#[test]
fn every_result_fixture_round_trips() {
    for (name, bytes) in envelope_fixtures("result-") {
        let original: Value = serde_json::from_slice(&bytes).unwrap();
        let result: ToolResult =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name} must parse, got {e}"));
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            original,
            "{name} must serialize to the same JSON value"
        );
    }
}

/// The field each invalid fixture's message must name.
fn expected_field(name: &str) -> Option<&'static str> {
    Some(match name {
        "invalid-bad-contract-version.json" => "contractVersion",
        "invalid-empty-tool-name.json" => "toolName",
        "invalid-missing-session-key.json" => "target.sessionKey",
        "invalid-missing-tool-name.json" => "toolName",
        "invalid-negative-timeout.json" => "payload.callHints.timeoutMs",
        "invalid-params-not-object.json" => "payload.params",
        "invalid-payload-version.json" => "payload.version",
        "invalid-unknown-dedupe-mode.json" => "transport.dedupeMode",
        "invalid-zero-max-attempts.json" => "transport.retryBudget.maxAttempts",
        _ => return None,
    })
}

#[test]
fn every_invalid_fixture_is_a_validation_error_naming_the_field() {
    let fixtures = envelope_fixtures("invalid-");
    assert_eq!(fixtures.len(), 10);
    for (name, bytes) in fixtures {
        let (input, expect) = match strip_expect(&bytes) {
            Some(stripped) => stripped,
            None => {
                // Not JSON at all.
                let err = ToolCall::from_json(&bytes).unwrap_err();
                assert_eq!(err.code(), ErrorCode::ValidationError, "{name}");
                assert!(
                    err.message().contains("not valid JSON")
                        && err.message().contains("line 2, column 0"),
                    "{name}: {}",
                    err.message()
                );
                continue;
            }
        };
        assert_eq!(expect["code"], "VALIDATION_ERROR", "{name}");
        let err = ToolCall::from_json(&input).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValidationError, "{name}");
        assert_eq!(err.class(), ErrorClass::Terminal, "{name}");
        let field = expected_field(&name).unwrap_or_else(|| panic!("no expectation for {name}"));
        assert!(
            err.message().contains(&format!("`{field}`")),
            "{name}: the message must name `{field}`: {}",
            err.message()
        );
        assert_eq!(err.details().unwrap()["field"], field, "{name}");
        assert!(err.is_rejected(), "{name}");
    }
}

#[test]
fn invalid_fixture_messages_say_what_is_wrong() {
    let message = |name: &str| {
        let (_, bytes) = envelope_fixtures(name).remove(0);
        let (input, _) = strip_expect(&bytes).unwrap();
        ToolCall::from_json(&input)
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert_eq!(
        message("invalid-missing-session-key"),
        "invalid tool call: `target.sessionKey` is required"
    );
    assert_eq!(
        message("invalid-negative-timeout"),
        "invalid tool call: `payload.callHints.timeoutMs` must not be negative, got -5"
    );
    assert_eq!(
        message("invalid-params-not-object"),
        "invalid tool call: `payload.params` must be a JSON object, got an array"
    );
    assert_eq!(
        message("invalid-zero-max-attempts"),
        "invalid tool call: `transport.retryBudget.maxAttempts` must be at least 1, got 0"
    );
    assert_eq!(
        message("invalid-bad-contract-version"),
        "invalid tool call: `contractVersion` must be \"1.1\", got \"1.0\""
    );
    assert!(message("invalid-unknown-dedupe-mode").contains("sometimes"));
}

#[test]
fn absent_sections_take_defaults_and_present_ones_are_checked() {
    let call = ToolCall::from_json(
        br#"{"contractVersion":"1.1","requestId":"r1","toolName":"search",
             "toolNamespace":"agents.tools.web",
             "target":{"sessionKey":"s","actorId":"u"},
             "payload":{"version":"1.0","params":{}}}"#,
    )
    .unwrap();
    assert_eq!(call.transport().dedupe_mode, None);
    assert_eq!(call.call_hints().timeout_ms, None);
    let err = ToolCall::from_json(
        br#"{"contractVersion":"1.1","requestId":"r1","toolName":"search",
             "toolNamespace":"agents.tools.web",
             "target":{"sessionKey":"s","actorId":"u"},
             "payload":{"version":"1.0","params":{}},
             "control":{"deadlineAtMs":1.5}}"#,
    )
    .unwrap_err();
    assert!(
        err.message().contains("`control.deadlineAtMs`"),
        "{}",
        err.message()
    );
}

#[test]
fn trailing_garbage_and_wrong_types_are_refused() {
    let (_, bytes) = envelope_fixtures("valid-minimal").remove(0);
    let mut with_garbage = bytes.clone();
    with_garbage.extend_from_slice(b" {}");
    let err = ToolCall::from_json(&with_garbage).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);

    let err = ToolCall::from_json(b"[1, 2]").unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);

    let mut value: Value = serde_json::from_slice(&bytes).unwrap();
    value["target"]["sessionKey"] = json!(42);
    let err = ToolCall::from_value(value).unwrap_err();
    assert!(
        err.message().contains("`target.sessionKey`"),
        "{}",
        err.message()
    );
}

#[test]
fn deeply_nested_json_is_an_error_not_a_crash() {
    let mut text = String::from(
        r#"{"contractVersion":"1.1","requestId":"r","toolName":"t","toolNamespace":"n","target":{"sessionKey":"s","actorId":"a"},"payload":{"version":"1.0","params":{"x":"#,
    );
    text.push_str(&"[".repeat(100_000));
    let err = ToolCall::from_json(text.as_bytes()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
}

#[test]
fn json_nested_past_the_parser_names_the_params() {
    let mut text = String::from(
        r#"{"contractVersion":"1.1","requestId":"r","toolName":"t","toolNamespace":"n","target":{"sessionKey":"s","actorId":"a"},"payload":{"version":"1.0","params":{"x":"#,
    );
    text.push_str(&"[".repeat(200));
    text.push_str(&"]".repeat(200));
    text.push_str("}}}");
    let err = ToolCall::from_json(text.as_bytes()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert_eq!(
        err.message(),
        "invalid tool call: `payload.params` nests deeper than 128 levels of JSON; flatten it"
    );
    assert_eq!(err.details().unwrap()["field"], "payload.params");

    let control = r#"{"contractVersion":"1.1","requestId":"r","toolName":"t","toolNamespace":"n","target":{"sessionKey":"s","actorId":"a"},"payload":{"version":"1.0","params":{}},"control":"#;
    let text = format!("{control}{}{}}}", "[".repeat(200), "]".repeat(200));
    let err = ToolCall::from_json(text.as_bytes()).unwrap_err();
    assert!(
        err.message().contains("`control` nests deeper"),
        "{}",
        err.message()
    );
}

#[test]
fn cloning_a_call_shares_its_params() {
    let big: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("k{i}"), json!(i))).collect();
    let call = search_call(Value::Object(big));
    let copy = call.clone();
    assert!(std::ptr::eq(call.params().as_map(), copy.params().as_map()));
    assert!(std::ptr::eq(call.envelope(), copy.envelope()));

    // Changing the envelope of one clone copies the envelope but still shares the params.
    let mut changed = call.clone();
    changed.envelope_mut().control.from_hook = Some("before_tool_call".into());
    assert!(!std::ptr::eq(call.envelope(), changed.envelope()));
    assert!(std::ptr::eq(
        call.params().as_map(),
        changed.params().as_map()
    ));
    assert_eq!(call.control().from_hook, None);
}

#[test]
fn changed_params_forget_their_canonical_form() {
    let opts = tower_toolcall::canonical::CanonicalOptions::default();
    let mut params = Params::from_value(json!({"a": 1})).unwrap();
    let shared = params.clone();
    assert_eq!(&*params.canonical(&opts).unwrap(), r#"{"a":1}"#);
    params.make_mut().insert("b".into(), json!(2));
    assert_eq!(&*params.canonical(&opts).unwrap(), r#"{"a":1,"b":2}"#);
    assert_eq!(&*shared.canonical(&opts).unwrap(), r#"{"a":1}"#);
    // Other options than the cached ones are computed afresh.
    let keep_nulls = opts.clone().with_drop_null_members(false);
    let with_null = Params::from_value(json!({"a": null})).unwrap();
    assert_eq!(&*with_null.canonical(&opts).unwrap(), "{}");
    assert_eq!(&*with_null.canonical(&keep_nulls).unwrap(), r#"{"a":null}"#);
    assert_eq!(with_null.digest(&opts).unwrap().len(), 64);
}

#[test]
fn the_builder_fills_ids_and_refuses_missing_fields() {
    let call = ToolCall::builder("vault", "createFile")
        .session("s")
        .actor("u")
        .params(json!({"path": "a.md"}))
        .dedupe_mode(DedupeMode::Enforced)
        .retry_budget(3, Duration::from_secs(10))
        .timeout(Duration::from_millis(2500))
        .expected_retry_safe(true)
        .confirmation_id("conf-1")
        .baggage("gen_ai.request.model", "gpt-x")
        .build()
        .unwrap();
    assert_eq!(call.request_id().len(), 26, "a ULID");
    assert!(call.request_id().chars().all(|c| c.is_ascii_alphanumeric()));
    let other = ToolCall::builder("vault", "createFile")
        .session("s")
        .actor("u")
        .build()
        .unwrap();
    assert_ne!(call.request_id(), other.request_id());
    assert_eq!(call.call_hints().timeout_ms, Some(2500));
    assert_eq!(call.transport().retry_budget.unwrap().max_attempts, 3);
    let json = serde_json::to_value(&call).unwrap();
    assert_eq!(json["control"]["confirmationId"], "conf-1");
    assert_eq!(json["trace"]["baggage"]["gen_ai.request.model"], "gpt-x");

    let err = ToolCall::builder("vault", "createFile")
        .actor("u")
        .build()
        .unwrap_err();
    assert!(err.message().contains("`target.sessionKey`"));
    let err = ToolCall::builder("vault", "createFile")
        .session("s")
        .actor("u")
        .params(json!("text"))
        .build()
        .unwrap_err();
    assert!(err
        .message()
        .contains("`payload.params` must be a JSON object, got a string"));
    let err = ToolCall::builder("vault", "createFile")
        .session("s")
        .actor("u")
        .retry_budget(0, Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(err
        .message()
        .contains("`transport.retryBudget.maxAttempts`"));
}

#[test]
fn envelope_changes_are_checked_again() {
    let mut call = search_call(json!({}));
    call.envelope_mut().contract_version = "2.0".into();
    let err = call.check().unwrap_err();
    assert!(err.message().contains("`contractVersion`"));
    let mut payload = Payload::new(Params::empty());
    payload.idempotency_key = Some(" ".into());
    let mut envelope = search_call(json!({})).into_envelope();
    envelope.payload = payload;
    let err = ToolCall::from_envelope(envelope).unwrap_err();
    assert!(err
        .message()
        .contains("`payload.idempotencyKey` must not be empty"));
}

#[test]
fn error_constructors_classify() {
    let cases = [
        (400, ErrorCode::ValidationError, ErrorClass::Terminal, false),
        (401, ErrorCode::PolicyDenied, ErrorClass::Terminal, false),
        (403, ErrorCode::PolicyDenied, ErrorClass::Terminal, false),
        (404, ErrorCode::NotFound, ErrorClass::Terminal, false),
        (408, ErrorCode::Timeout, ErrorClass::Retriable, false),
        (413, ErrorCode::PayloadTooLarge, ErrorClass::Terminal, false),
        (422, ErrorCode::ValidationError, ErrorClass::Terminal, false),
        (429, ErrorCode::RateLimited, ErrorClass::Retriable, true),
        (500, ErrorCode::UpstreamError, ErrorClass::Retriable, false),
        (
            502,
            ErrorCode::UpstreamUnavailable,
            ErrorClass::Retriable,
            false,
        ),
        (
            503,
            ErrorCode::UpstreamUnavailable,
            ErrorClass::Retriable,
            true,
        ),
        (
            504,
            ErrorCode::UpstreamUnavailable,
            ErrorClass::Retriable,
            false,
        ),
        (418, ErrorCode::UpstreamError, ErrorClass::Terminal, false),
    ];
    for (status, code, class, not_processed) in cases {
        let err = ToolError::from_http_status(status, "x");
        assert_eq!(err.code(), code, "{status}");
        assert_eq!(err.class(), class, "{status}");
        assert_eq!(err.is_not_processed(), not_processed, "{status}");
        assert_eq!(err.http_status(), Some(status));
    }
    use std::io::{Error, ErrorKind};
    let refused = ToolError::from(Error::new(ErrorKind::ConnectionRefused, "refused"));
    assert_eq!(refused.code(), ErrorCode::UpstreamUnavailable);
    assert!(refused.is_retriable() && refused.is_not_processed());
    assert!(std::error::Error::source(&refused).is_some());
    let reset = ToolError::from_io_error(Error::new(ErrorKind::ConnectionReset, "reset"));
    assert!(reset.is_retriable() && !reset.is_not_processed());
    let timed_out = ToolError::from_io_error(Error::new(ErrorKind::TimedOut, "slow"));
    assert_eq!(timed_out.code(), ErrorCode::Timeout);
    let missing = ToolError::from_io_error(Error::new(ErrorKind::NotFound, "gone"));
    assert_eq!(missing.class(), ErrorClass::Terminal);
    let timeout = ToolError::timeout(Duration::from_millis(1500));
    assert_eq!(timeout.code(), ErrorCode::Timeout);
    assert!(timeout.message().contains("1500 ms"));
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
    }
    assert_eq!(ErrorCode::parse("NOPE"), None);
}

fn call_for_results() -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .request_id("01J9Z8Q4V6K3T2M1N0P9R8S7T7")
        .build()
        .unwrap()
}

#[test]
fn outcomes_become_the_exact_result_envelope() {
    let call = call_for_results();
    let mut error = ToolError::new(
        ErrorCode::RetryExhausted,
        "search failed 4 times: upstream returned 503",
    );
    let record = error.record_mut();
    record.attempts = Some(4);
    record.breaker_state = Some(BreakerState::Closed);
    record.duration = Some(Duration::from_millis(1234));
    record.retried_by = [(1, 143, 12), (2, 377, 11), (3, 611, 13)]
        .into_iter()
        .map(|(attempt, delay_ms, latency_ms)| {
            RetryRecord::new(attempt, delay_ms, "UPSTREAM_UNAVAILABLE", latency_ms)
        })
        .collect();
    let result = ToolResult::from_outcome(&call, Err(error));
    let (_, expected) = envelope_fixtures("result-retry-exhausted").remove(0);
    let expected: Value = serde_json::from_slice(&expected).unwrap();
    assert_eq!(serde_json::to_value(&result).unwrap(), expected);

    let mut output = ToolOutput::new(json!({"path": "XYZ/Foo.md", "etag": "abc123"}))
        .with_metadata("mtime", json!(1734372720000_u64));
    let record = output.record_mut();
    record.from_cache = true;
    record.duration = Some(Duration::from_millis(3));
    record.cache = Some(CacheMatch::new(
        MatchedOn::Completed,
        1520,
        "d19e9387a87e6035",
    ));
    let call = ToolCall::builder("vault", "createFile")
        .session("sess-42")
        .actor("user-7")
        .request_id("01J9Z8Q4V6K3T2M1N0P9R8S7T6")
        .build()
        .unwrap();
    let result = ToolResult::from_outcome(&call, Ok(output));
    let (_, expected) = envelope_fixtures("result-cached-success").remove(0);
    let expected: Value = serde_json::from_slice(&expected).unwrap();
    assert_eq!(serde_json::to_value(&result).unwrap(), expected);
}

#[test]
fn each_error_gets_its_status() {
    let call = call_for_results();
    let status = |error: ToolError| ToolResult::from_outcome(&call, Err(error)).status;
    assert_eq!(
        status(ToolError::new(ErrorCode::CircuitOpen, "open")),
        ResultStatus::CircuitOpen
    );
    assert_eq!(
        status(ToolError::timeout(Duration::from_secs(1))),
        ResultStatus::Timeout
    );
    assert_eq!(
        status(ToolError::new(ErrorCode::Cancelled, "c")),
        ResultStatus::Cancelled
    );
    assert_eq!(
        status(ToolError::from_http_status(503, "down")),
        ResultStatus::RetriableError
    );
    assert_eq!(
        status(ToolError::from_http_status(400, "bad")),
        ResultStatus::Error
    );
    let rejected = ToolResult::from_outcome(
        &call,
        Err(ToolError::rejected(ErrorCode::LoopDetected, "loop")),
    );
    assert_eq!(rejected.attempts, 0);
    assert_eq!(
        rejected.error,
        Some(ResultError::new(ErrorCode::LoopDetected, "loop", false))
    );
}

#[test]
fn the_error_code_is_typed_and_written_as_its_string() {
    let call = call_for_results();
    let result = ToolResult::from_outcome(&call, Err(ToolError::new(ErrorCode::NotFound, "gone")));
    let written = serde_json::to_value(&result).unwrap();
    assert_eq!(written["error"]["code"], "NOT_FOUND");
    let read: ToolResult = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(read.error.as_ref().unwrap().code, ErrorCode::NotFound);
    assert_eq!(read, result);
    for code in ErrorCode::ALL {
        let value = serde_json::to_value(code).unwrap();
        assert_eq!(value, code.as_str());
        assert_eq!(serde_json::from_value::<ErrorCode>(value).unwrap(), code);
    }
    let mut unknown = written;
    unknown["error"]["code"] = json!("SLOW");
    let error = serde_json::from_value::<ToolResult>(unknown).unwrap_err();
    assert!(error.to_string().contains("SLOW"), "{error}");
}

#[test]
fn every_code_has_its_http_status() {
    let table = [
        (ErrorCode::ValidationError, 400),
        (ErrorCode::PolicyDenied, 403),
        (ErrorCode::NotFound, 404),
        (ErrorCode::Conflict, 409),
        (ErrorCode::PreconditionFailed, 412),
        (ErrorCode::Timeout, 504),
        (ErrorCode::Cancelled, 499),
        (ErrorCode::InternalError, 500),
        (ErrorCode::CircuitOpen, 503),
        (ErrorCode::RetryExhausted, 502),
        (ErrorCode::LoopDetected, 409),
        (ErrorCode::RateLimited, 429),
        (ErrorCode::IdempotencyInFlight, 409),
        (ErrorCode::IdempotencyKeyReused, 422),
        (ErrorCode::PayloadTooLarge, 413),
        (ErrorCode::StoreUnavailable, 503),
        (ErrorCode::UpstreamUnavailable, 503),
        (ErrorCode::UpstreamError, 502),
    ];
    assert_eq!(table.len(), ErrorCode::ALL.len());
    for (code, status) in table {
        assert_eq!(code.http_status(), status, "{code}");
    }
    let call = call_for_results();
    let ok = ToolResult::from_outcome(&call, Ok(ToolOutput::new(json!(1))));
    assert_eq!(ok.http_status(), 200);
}

#[test]
fn every_error_with_a_retry_after_keeps_it_in_the_result() {
    let call = call_for_results();
    for code in [
        ErrorCode::CircuitOpen,
        ErrorCode::RateLimited,
        ErrorCode::UpstreamUnavailable,
    ] {
        let error =
            ToolError::rejected(code, "later").with_retry_after(Duration::from_millis(1500));
        let result = ToolResult::from_outcome(&call, Err(error));
        let written = serde_json::to_value(&result).unwrap();
        assert_eq!(written["error"]["retryAfterMs"], 1500, "{code}");
        assert_eq!(
            result.error.unwrap().retry_after(),
            Some(Duration::from_millis(1500))
        );
    }
    let without = ToolResult::from_outcome(&call, Err(ToolError::new(ErrorCode::NotFound, "x")));
    let written = serde_json::to_value(&without).unwrap();
    assert!(written["error"].get("retryAfterMs").is_none());
}

#[test]
fn input_that_never_became_a_call_gets_a_rejected_result() {
    let error = ToolCall::from_json(br#"{"contractVersion": "1.1", "toolName": 3}"#).unwrap_err();
    let result = ToolResult::rejected(error);
    assert_eq!(result.status, ResultStatus::Error);
    assert_eq!(result.attempts, 0);
    assert!(!result.from_cache);
    assert_eq!(result.http_status(), 400);
    let error = result.error.as_ref().unwrap();
    assert_eq!(error.code, ErrorCode::ValidationError);
    assert!(error.terminal);
    assert!(error.message.contains("toolName"), "{}", error.message);
    let written = serde_json::to_value(&result).unwrap();
    assert_eq!(written["error"]["code"], "VALIDATION_ERROR");
    assert_eq!(written["attempts"], 0);
}

/// Any JSON value, up to a modest depth.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("contractVersion".to_owned()),
                    Just("toolName".to_owned()),
                    Just("target".to_owned()),
                    Just("payload".to_owned()),
                    Just("params".to_owned()),
                    Just("sessionKey".to_owned()),
                    ".{0,8}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid envelope with one member replaced by an arbitrary value.
fn arb_mutated_envelope() -> impl Strategy<Value = Value> {
    let paths = prop_oneof![
        Just(vec!["contractVersion"]),
        Just(vec!["requestId"]),
        Just(vec!["toolName"]),
        Just(vec!["target"]),
        Just(vec!["target", "sessionKey"]),
        Just(vec!["payload"]),
        Just(vec!["payload", "params"]),
        Just(vec!["payload", "callHints"]),
        Just(vec!["transport"]),
        Just(vec!["transport", "dedupeMode"]),
        Just(vec!["transport", "retryBudget"]),
        Just(vec!["control"]),
        Just(vec!["trace"]),
    ];
    (paths, arb_json()).prop_map(|(path, replacement)| {
        let (_, bytes) = envelope_fixtures("valid-full").remove(0);
        let mut value: Value = serde_json::from_slice(&bytes).unwrap();
        let mut slot = &mut value;
        for key in &path {
            slot = &mut slot[*key];
        }
        *slot = replacement;
        value
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn arbitrary_json_is_an_error_or_a_call_never_a_panic(value in arb_json()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        match ToolCall::from_json(&bytes) {
            Ok(call) => prop_assert!(call.check().is_ok()),
            Err(err) => prop_assert_eq!(err.code(), ErrorCode::ValidationError),
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    #[test]
    fn mutated_envelopes_are_an_error_naming_a_field_or_a_call(value in arb_mutated_envelope()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        match ToolCall::from_json(&bytes) {
            Ok(call) => {
                // What parses serializes back to what it parsed.
                let again = ToolCall::from_json(call.to_json().as_bytes()).unwrap();
                prop_assert_eq!(again, call);
            }
            Err(err) => {
                prop_assert_eq!(err.code(), ErrorCode::ValidationError);
                prop_assert!(err.message().starts_with("invalid tool call"), "{}", err.message());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Err(err) = ToolCall::from_json(&bytes) {
            prop_assert_eq!(err.code(), ErrorCode::ValidationError);
        }
    }
}

// Only the contract's JSON: I-JSON (RFC 7493) and bounded identifiers.

/// The minimal valid envelope as JSON text, with `extra` spliced in as more members of the
/// top-level object (`extra` starts with a comma, or is empty).
fn minimal_with(extra: &str) -> Vec<u8> {
    format!(
        r#"{{"contractVersion":"1.1","requestId":"r1","toolName":"search",
            "toolNamespace":"agents.tools.web",
            "target":{{"sessionKey":"s","actorId":"u"}},
            "payload":{{"version":"1.0","params":{{}}}}{extra}}}"#
    )
    .into_bytes()
}

/// `from_json` refuses `bytes` with a `VALIDATION_ERROR` naming `field`; returns the message.
#[track_caller]
fn refused_naming(bytes: &[u8], field: &str) -> String {
    let err = ToolCall::from_json(bytes).expect_err("must be refused");
    assert_eq!(err.code(), ErrorCode::ValidationError, "{}", err.message());
    assert_eq!(err.details().unwrap()["field"], field, "{}", err.message());
    assert!(err.is_rejected());
    err.message().to_owned()
}

/// The valid-full fixture with the member at `path` replaced by `value`.
fn full_with(path: &[&str], value: Value) -> Vec<u8> {
    let (_, bytes) = envelope_fixtures("valid-full").remove(0);
    let mut envelope: Value = serde_json::from_slice(&bytes).unwrap();
    let mut slot = &mut envelope;
    for key in path {
        slot = &mut slot[*key];
    }
    *slot = value;
    serde_json::to_vec(&envelope).unwrap()
}

#[test]
fn an_array_where_the_contract_says_object_is_refused() {
    // Each of these arrays lists the members in the order of the struct's fields, which
    // serde's derive accepts for a struct.
    let cases = [
        (vec!["target"], json!([null, "s", "u"]), "target"),
        (vec!["payload"], json!(["1.0", {}]), "payload"),
        (
            vec!["payload", "callHints"],
            json!([true, true, 10]),
            "payload.callHints",
        ),
        (vec!["transport"], json!([]), "transport"),
        (
            vec!["transport", "retryBudget"],
            json!([3, 1000]),
            "transport.retryBudget",
        ),
        (vec!["control"], json!([]), "control"),
        (vec!["trace"], json!([]), "trace"),
    ];
    for (path, array, field) in cases {
        let message = refused_naming(&full_with(&path, array), field);
        assert_eq!(
            message,
            format!("invalid tool call: `{field}` must be a JSON object, got an array")
        );
    }

    // The whole envelope as an array.
    let whole = br#"["1.1","r1",null,"search","agents.tools.web",
        {"sessionKey":"s","actorId":"u"},{"version":"1.0","params":{}}]"#;
    let err = ToolCall::from_json(whole).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert_eq!(
        err.message(),
        "invalid tool call: the envelope must be a JSON object, got an array; send one JSON object"
    );
    let value: Value = serde_json::from_slice(whole).unwrap();
    assert_eq!(
        ToolCall::from_value(value).unwrap_err().message(),
        err.message()
    );
    assert!(serde_json::from_slice::<ToolCall>(whole).is_err());
}

#[test]
fn a_name_where_the_contract_says_string_must_be_a_string() {
    let message = refused_naming(
        &full_with(&["transport", "dedupeMode"], json!({"enforced": null})),
        "transport.dedupeMode",
    );
    assert!(message.contains("expected a string"), "{message}");
    refused_naming(
        &full_with(
            &["transport", "circuitBreakerHint"],
            json!({"global": null}),
        ),
        "transport.circuitBreakerHint",
    );
}

#[test]
fn a_repeated_member_name_is_refused_at_every_depth() {
    let shadow = minimal_with("")
        .iter()
        .map(|&b| b as char)
        .collect::<String>()
        .replace(
            r#""params":{}"#,
            r#""params":{"path":"/safe","path":"/etc/shadow"}"#,
        );
    let message = refused_naming(shadow.as_bytes(), "payload.params.path");
    assert_eq!(
        message,
        "invalid tool call: `payload.params.path` must be unique: the name appears twice in \
         its object; send each member once"
    );

    let cases = [
        (
            r#""params":{"a":{"b":1,"c":2,"b":1}}"#,
            "payload.params.a.b",
        ),
        (
            r#""params":{"a":[0,{"b":1,"b":1}]}"#,
            "payload.params.a[1].b",
        ),
        (
            r#""params":{},"idempotencyKey":"k","idempotencyKey":"k""#,
            "payload.idempotencyKey",
        ),
        (
            r#""params":{},"ignored":{"x":1,"x":2}"#,
            "payload.ignored.x",
        ),
    ];
    let minimal = String::from_utf8(minimal_with("")).unwrap();
    for (params, field) in cases {
        let text = minimal.replace(r#""params":{}"#, params);
        refused_naming(text.as_bytes(), field);
    }
    // Unknown members, which the crate ignores, and known ones at the top.
    refused_naming(&minimal_with(r#","x":1,"x":1"#), "x");
    refused_naming(&minimal_with(r#","requestId":"r2""#), "requestId");
    refused_naming(
        &minimal_with(r#","trace":{"baggage":{"a":"1","a":"2"}}"#),
        "trace.baggage.a",
    );
    let target = minimal.replace(
        r#""actorId":"u""#,
        r#""actorId":"u","tenantId":"a","tenantId":"b""#,
    );
    refused_naming(target.as_bytes(), "target.tenantId");

    // Every entry point that reads JSON text agrees.
    assert!(serde_json::from_str::<ToolCall>(&shadow).is_err());
    let params = serde_json::from_str::<Params>(r#"{"path":"/safe","path":"/etc/shadow"}"#);
    assert!(params.is_err());
}

#[test]
fn json_that_is_not_i_json_is_refused_even_where_the_crate_ignores_it() {
    let message = refused_naming(&minimal_with(r#","x":1e400"#), "x");
    assert_eq!(
        message,
        "invalid tool call: `x` must be a number that a double can hold; send a larger number \
         as a string"
    );
    let in_params = String::from_utf8(minimal_with(""))
        .unwrap()
        .replace(r#""params":{}"#, r#""params":{"n":[1,-1e400]}"#);
    refused_naming(in_params.as_bytes(), "payload.params.n[1]");

    for surrogate in [r#""\ud800""#, r#""\udc00""#, r#""\ud800\u0041""#] {
        let message = refused_naming(&minimal_with(&format!(r#","x":{surrogate}"#)), "x");
        assert!(
            message.starts_with("invalid tool call: `x` must be valid Unicode"),
            "{message}"
        );
    }
    let mut raw = minimal_with(r#","x":"a?b""#);
    let at = raw.iter().position(|&b| b == b'?').unwrap();
    raw[at] = 0xFF;
    let message = refused_naming(&raw, "x");
    assert!(message.contains("must be valid Unicode"), "{message}");

    // An invalid member name is named by the object that holds it.
    let mut raw = minimal_with(r#","trace":{"a?":1}"#);
    let at = raw.iter().position(|&b| b == b'?').unwrap();
    raw[at] = 0xC0;
    let message = refused_naming(&raw, "trace");
    assert!(message.contains("must be valid Unicode"), "{message}");

    // Through serde too.
    assert!(serde_json::from_slice::<ToolCall>(&minimal_with(r#","x":1e400"#)).is_err());
}

/// Each identifier of the envelope, where it is in the JSON, and its limit in bytes.
const IDENTIFIERS: [(&[&str], &str, usize); 7] = [
    (&["requestId"], "requestId", 256),
    (&["toolCallId"], "toolCallId", 256),
    (&["target", "sessionKey"], "target.sessionKey", 256),
    (&["target", "actorId"], "target.actorId", 256),
    (&["target", "tenantId"], "target.tenantId", 256),
    (&["target", "correlationId"], "target.correlationId", 256),
    (
        &["payload", "idempotencyKey"],
        "payload.idempotencyKey",
        255,
    ),
];

#[test]
fn identifiers_longer_than_their_limit_are_refused_when_parsed() {
    for (path, field, limit) in IDENTIFIERS {
        // The limit is in bytes: "é" is two.
        let longest = "é".repeat(limit / 2) + &"x".repeat(limit % 2);
        ToolCall::from_json(&full_with(path, json!(longest)))
            .unwrap_or_else(|e| panic!("{field} of {limit} bytes must pass: {e}"));
        let message = refused_naming(&full_with(path, json!(longest + "x")), field);
        assert_eq!(
            message,
            format!(
                "invalid tool call: `{field}` must be at most {limit} bytes, got {}; send a \
                 shorter identifier, or a digest of a longer one",
                limit + 1
            )
        );
    }
}

#[test]
fn identifiers_longer_than_their_limit_are_refused_when_built_or_changed() {
    let long = "x".repeat(257);
    let base = || {
        ToolCall::builder("agents.tools.web", "search")
            .session("s")
            .actor("u")
    };
    let built = [
        (base().session(&long), "target.sessionKey"),
        (base().actor(&long), "target.actorId"),
        (base().tenant(&long), "target.tenantId"),
        (base().correlation_id(&long), "target.correlationId"),
        (base().request_id(&long), "requestId"),
        (base().tool_call_id(&long), "toolCallId"),
        (
            base().idempotency_key(&long[..256]),
            "payload.idempotencyKey",
        ),
    ];
    for (builder, field) in built {
        let err = builder.build().unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValidationError);
        assert_eq!(err.details().unwrap()["field"], field, "{}", err.message());
    }
    base().idempotency_key(&long[..255]).build().unwrap();

    let mut call = search_call(json!({}));
    call.envelope_mut().target.session_key = long;
    let err = call.check().unwrap_err();
    assert_eq!(err.details().unwrap()["field"], "target.sessionKey");
}

#[test]
fn the_run_link_is_optional_round_trips_and_is_checked() {
    use tower_toolcall::envelope::{Iteration, RunLink};

    for (name, bytes) in envelope_fixtures("valid-") {
        let call = ToolCall::from_json(&bytes).unwrap();
        assert!(call.run_link().is_none(), "{name}");
        assert!(!call.to_json().contains("\"run\""), "{name}");
    }
    let call = ToolCall::builder("travel", "hotels")
        .session("s")
        .actor("u")
        .run_link(
            RunLink::new("run-1", "hotels", "hotels[2]#1")
                .with_iteration(Iteration::new(2, "item", json!({"city": "Lyon"})))
                .with_loop_id("run-1/hotels"),
        )
        .build()
        .unwrap();
    let wire: Value = serde_json::from_str(&call.to_json()).unwrap();
    assert_eq!(
        wire["run"],
        json!({"runId": "run-1", "stepId": "hotels", "callId": "hotels[2]#1", "attempt": 1,
               "iteration": {"index": 2, "itemName": "item", "itemValue": {"city": "Lyon"}},
               "loopId": "run-1/hotels"})
    );
    assert_eq!(
        ToolCall::from_json(call.to_json().as_bytes()).unwrap(),
        call
    );

    let mut bad = wire.clone();
    bad["run"]["attempt"] = json!(0);
    let err = ToolCall::from_value(bad).unwrap_err();
    assert_eq!(err.details().unwrap()["field"], "run.attempt");
    let mut bad = wire.clone();
    bad["run"]["stepId"] = json!(" ");
    let err = ToolCall::from_value(bad).unwrap_err();
    assert_eq!(err.details().unwrap()["field"], "run.stepId");
    let mut bad = wire;
    bad["run"] = json!(["run-1"]);
    let err = ToolCall::from_value(bad).unwrap_err();
    assert_eq!(err.details().unwrap()["field"], "run");
}
