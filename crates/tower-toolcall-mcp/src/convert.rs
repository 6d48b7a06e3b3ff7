//! The edge between MCP's `tools/call` and the crate's types: a call's `_meta`, a
//! `CallToolResult` as an outcome and back, MCP errors as `ToolError`s.

use std::io;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ErrorData, RequestMetaObject,
};
use rmcp::ServiceError;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use tower_toolcall::{ErrorClass, ErrorCode, ToolCall, ToolError, ToolOutput};

use super::meta::{
    with_member, CONFIRMATION_ID_META, ERROR_META, FROM_CACHE_META, IDEMPOTENCY_KEY_META,
};

/// The output metadata member that keeps a result's content blocks when its structured
/// content is the output's content.
const CONTENT_BLOCKS: &str = "mcpContent";

/// What an `isError` result without a stack's facts in its `_meta` means: the tool's own
/// answer, or a failure of it.
///
/// The MCP specification gives `isError` to the tool speaking to the model ("no such
/// timezone"): another attempt fails the same way, and the server is as healthy as before.
/// So by default ([`IsError::Answer`]) such a result is a terminal `UPSTREAM_ERROR` that is
/// neither retried nor counted by a breaker. A server known to report its outages as
/// `isError` results can be told otherwise ([`IsError::Failure`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IsError {
    /// The tool's answer to the model: terminal, not retried, not a health failure.
    #[default]
    Answer,
    /// A failure like any other: an unclassified `UPSTREAM_ERROR`, which the tool's policy
    /// classifies (retriable for read-only and idempotent tools) and a breaker counts.
    Failure,
}

/// The `tools/call` params of a call: its tool name, its params as arguments, and its
/// idempotency key, confirmation and `traceparent` in `_meta`.
pub(crate) fn request_params(call: &ToolCall) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(call.tool_name().to_owned());
    params.arguments = Some(call.params().as_map().clone());
    let mut meta = RequestMetaObject::new();
    if let Some(key) = call.idempotency_key() {
        meta.insert(IDEMPOTENCY_KEY_META.to_owned(), Value::from(key));
    }
    if let Some(confirmation) = &call.control().confirmation_id {
        meta.insert(
            CONFIRMATION_ID_META.to_owned(),
            Value::from(confirmation.as_str()),
        );
    }
    if let Some(traceparent) = &call.trace().traceparent {
        meta.set_traceparent(traceparent.as_str());
    }
    if !meta.is_empty() {
        params.meta = Some(meta);
    }
    params
}

/// A tool's `CallToolResult` as the outcome of the call.
///
/// A success's structured content is the output's content (what the tool's output schema
/// describes), with the content blocks kept in the metadata unless they are the structured
/// content's JSON text, which the output renders again; without structured content, the
/// content blocks are the output's content. An `isError` result is a `ToolError`: the code,
/// class and retry-after that [`result_of`] wrote (in the result's `_meta`, or in the
/// structured content where stacks of earlier versions wrote them), else an `UPSTREAM_ERROR`
/// with the text of the blocks as message, as `is_error` says.
pub(crate) fn outcome_of(
    result: CallToolResult,
    is_error: IsError,
) -> Result<ToolOutput, ToolError> {
    outcome_and_blocks(result, is_error).0
}

/// [`outcome_of`], and the result's content blocks as they were, for a success whose output
/// does not render them again.
pub(crate) fn outcome_and_blocks(
    result: CallToolResult,
    is_error: IsError,
) -> (Result<ToolOutput, ToolError>, Option<Vec<ContentBlock>>) {
    if result.is_error == Some(true) {
        return (Err(error_of(&result, is_error)), None);
    }
    let blocks_as_json = |blocks: &[ContentBlock]| {
        Value::Array(
            blocks
                .iter()
                .filter_map(|block| serde_json::to_value(block).ok())
                .collect(),
        )
    };
    let output = match result.structured_content {
        Some(structured) if renders_as(&structured, &result.content) => {
            return (Ok(ToolOutput::new(structured)), None);
        }
        Some(structured) => {
            let mut output = ToolOutput::new(structured);
            let mut metadata = Map::new();
            metadata.insert(CONTENT_BLOCKS.to_owned(), blocks_as_json(&result.content));
            output.metadata = Some(metadata);
            output
        }
        None => ToolOutput::new(blocks_as_json(&result.content)),
    };
    (Ok(output), Some(result.content))
}

/// `true` when `blocks` are what `CallToolResult::structured` makes of `structured`: its JSON
/// text in one text block, which [`result_of`] writes again from the output alone.
fn renders_as(structured: &Value, blocks: &[ContentBlock]) -> bool {
    structured.is_object()
        && matches!(blocks, [block] if *block == ContentBlock::text(structured.to_string()))
}

fn error_of(result: &CallToolResult, is_error: IsError) -> ToolError {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect();
    let described = result
        .meta
        .as_ref()
        .and_then(|meta| meta.get(ERROR_META))
        .or_else(|| {
            result
                .structured_content
                .as_ref()
                .and_then(|s| s.get("error"))
        })
        .filter(|described| described.is_object());
    let field = |name: &str| described.and_then(|e| e.get(name));
    let message = field("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            if text.is_empty() {
                "the tool failed without a message".to_owned()
            } else {
                text.join("\n")
            }
        });
    let code = field("code")
        .and_then(Value::as_str)
        .and_then(ErrorCode::parse);
    let mut err = match (code, is_error) {
        (Some(code), _) => ToolError::new(code, message),
        (None, IsError::Answer) => ToolError::new(ErrorCode::UpstreamError, message)
            .with_class(ErrorClass::Terminal)
            .with_health_failure(false),
        (None, IsError::Failure) => ToolError::new(ErrorCode::UpstreamError, message),
    };
    match field("retriable").and_then(Value::as_bool) {
        Some(true) => err = err.with_class(ErrorClass::Retriable),
        Some(false) => err = err.with_class(ErrorClass::Terminal),
        None => {}
    }
    if let Some(millis) = field("retryAfterMs").and_then(Value::as_u64) {
        err = err.with_retry_after(Duration::from_millis(millis));
    }
    if let Some(details) = field("details") {
        err = err.with_details(details.clone());
    }
    err
}

/// The `CallToolResult` that answers a call with `outcome`.
///
/// A success gives back the tool's content blocks and structured content. An error is an
/// `isError` result whose text is the error's code and message (written for the model: a
/// stopped loop tells it to change its approach), without structured content (which could
/// not match the tool's output schema, and clients check it), and whose `_meta` carries
/// [`ERROR_META`]: `{"code", "message", "retriable", "retryAfterMs"?, "details"?}`. An answer
/// from the idempotency cache has [`FROM_CACHE_META`] in its `_meta`.
pub(crate) fn result_of(outcome: Result<ToolOutput, ToolError>) -> CallToolResult {
    match outcome {
        Ok(output) => {
            let from_cache = output.record().from_cache;
            cached(success_of(output), from_cache)
        }
        Err(err) => {
            let mut error = json!({
                "code": err.code().as_str(),
                "message": err.message(),
                "retriable": err.is_retriable(),
            });
            if let Some(after) = err.retry_after() {
                error["retryAfterMs"] = json!(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
            }
            if let Some(details) = err.details() {
                error["details"] = details.clone();
            }
            let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
                "{}: {}",
                err.code(),
                err.message()
            ))]);
            result.meta = Some(with_member(result.meta.take(), ERROR_META, error));
            cached(result, err.record().from_cache)
        }
    }
}

/// `result`, saying in its `_meta` that it came from the idempotency cache when it did.
fn cached(mut result: CallToolResult, from_cache: bool) -> CallToolResult {
    if from_cache {
        result.meta = Some(with_member(
            result.meta.take(),
            FROM_CACHE_META,
            json!(true),
        ));
    }
    result
}

/// [`result_of`] for an output made from a tool's result whose content blocks were `blocks`:
/// they answer as they are, without a trip through JSON.
pub(crate) fn result_with_blocks(output: ToolOutput, blocks: Vec<ContentBlock>) -> CallToolResult {
    let structured = output
        .metadata
        .as_ref()
        .is_some_and(|metadata| metadata.contains_key(CONTENT_BLOCKS));
    let mut result = CallToolResult::success(blocks);
    if structured {
        result.structured_content = Some(output.content);
    }
    result
}

fn success_of(output: ToolOutput) -> CallToolResult {
    let ToolOutput {
        content, metadata, ..
    } = output;
    let kept_blocks = metadata
        .and_then(|mut metadata| metadata.remove(CONTENT_BLOCKS))
        .and_then(|blocks| serde_json::from_value::<Vec<ContentBlock>>(blocks).ok());
    match kept_blocks {
        Some(blocks) => {
            let mut result = CallToolResult::success(blocks);
            result.structured_content = Some(content);
            result
        }
        None => match Vec::<ContentBlock>::deserialize(&content) {
            Ok(blocks) => CallToolResult::success(blocks),
            Err(_) => CallToolResult::structured(content),
        },
    }
}

/// A `ToolError` for a JSON-RPC error answered instead of a result: invalid params are a
/// `VALIDATION_ERROR`, an unknown method or tool `NOT_FOUND`, anything else an unclassified
/// `INTERNAL_ERROR`.
pub(crate) fn error_from_mcp(error: &ErrorData) -> ToolError {
    use rmcp::model::ErrorCode as Rpc;
    let code = match error.code {
        Rpc::INVALID_PARAMS => ErrorCode::ValidationError,
        Rpc::METHOD_NOT_FOUND => ErrorCode::NotFound,
        _ => ErrorCode::InternalError,
    };
    ToolError::new(code, error.message.to_string())
}

/// A `ToolError` for a failed request to a remote MCP server, in words a model can read (the
/// transport's own error stays the source, for the logs): its JSON-RPC error, a `TIMEOUT`,
/// `CANCELLED`, or an `UPSTREAM_UNAVAILABLE` for a transport that failed or closed. A request
/// that could not be sent (the connection refused, the server's input closed) did not run;
/// one whose connection closed after it was sent may have run, and is retried only as the
/// tool's policy allows for an outcome unknown.
pub(crate) fn error_from_service(error: ServiceError) -> ToolError {
    match &error {
        ServiceError::McpError(data) => error_from_mcp(data),
        ServiceError::Timeout { timeout } => ToolError::timeout(*timeout),
        ServiceError::Cancelled { .. } => ToolError::new(
            ErrorCode::Cancelled,
            "the request to the MCP server was cancelled",
        ),
        ServiceError::TransportSend(_) if never_sent(&error) => ToolError::new(
            ErrorCode::UpstreamUnavailable,
            "the MCP server cannot be reached; the call did not run",
        )
        .not_processed(true),
        ServiceError::TransportSend(_) => ToolError::new(
            ErrorCode::UpstreamUnavailable,
            "the connection to the MCP server failed while the request was sent; the call may \
             or may not have run",
        ),
        ServiceError::TransportClosed => ToolError::new(
            ErrorCode::UpstreamUnavailable,
            "the connection to the MCP server closed before it answered; the call may or may \
             not have run",
        ),
        _ => ToolError::new(
            ErrorCode::UpstreamError,
            "the MCP server answered with something other than a result",
        ),
    }
    .with_source(error)
}

/// Whether the transport failed before any of the request reached the server: a refused
/// connection, or an input that was already closed.
fn never_sent(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::AddrNotAvailable
            );
        }
        cause = current.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_result_keeps_code_class_and_retry_after() {
        let err = ToolError::new(ErrorCode::RateLimited, "slow down")
            .with_retry_after(Duration::from_millis(250));
        let result = result_of(Err(err));
        assert_eq!(result.is_error, Some(true));
        let back = outcome_of(result, IsError::Answer).unwrap_err();
        assert_eq!(back.code(), ErrorCode::RateLimited);
        assert!(back.is_retriable());
        assert_eq!(back.retry_after(), Some(Duration::from_millis(250)));
        assert_eq!(back.message(), "slow down");
    }

    #[test]
    fn a_plain_error_result_is_the_tools_answer_unless_said_otherwise() {
        let result = CallToolResult::error(vec![ContentBlock::text("no such timezone")]);
        let err = outcome_of(result.clone(), IsError::Answer).unwrap_err();
        assert_eq!(err.code(), ErrorCode::UpstreamError);
        assert_eq!(err.class(), ErrorClass::Terminal);
        assert_eq!(err.health_failure(), Some(false));
        assert_eq!(err.message(), "no such timezone");

        let err = outcome_of(result, IsError::Failure).unwrap_err();
        assert_eq!(err.class(), ErrorClass::Unclassified);
        assert_eq!(err.health_failure(), None);
    }

    #[test]
    fn an_error_result_has_no_structured_content_and_its_facts_in_meta() {
        let err = ToolError::new(ErrorCode::LoopDetected, "change your approach")
            .with_retry_after(Duration::from_millis(1500));
        let result = result_of(Err(err));
        assert_eq!(result.structured_content, None);
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({
                "resultType": "complete",
                "content": [{"type": "text", "text": "LOOP_DETECTED: change your approach"}],
                "isError": true,
                "_meta": {"rs.tower-toolcall/error": {
                    "code": "LOOP_DETECTED",
                    "message": "change your approach",
                    "retriable": false,
                    "retryAfterMs": 1500
                }}
            })
        );
        // Stacks of earlier versions wrote the facts in the structured content.
        let mut legacy = CallToolResult::error(vec![ContentBlock::text("slow")]);
        legacy.structured_content =
            Some(json!({"error": {"code": "RATE_LIMITED", "message": "slow", "retriable": true}}));
        assert_eq!(
            outcome_of(legacy, IsError::Answer).unwrap_err().code(),
            ErrorCode::RateLimited
        );
    }

    #[test]
    fn structured_content_and_blocks_survive_the_round_trip() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("3 hits")]);
        result.structured_content = Some(json!({"hits": 3}));
        let output = outcome_of(result.clone(), IsError::Answer).unwrap();
        assert_eq!(output.content, json!({"hits": 3}));
        assert_eq!(result_of(Ok(output)), result);

        let plain = CallToolResult::success(vec![ContentBlock::text("ok")]);
        let output = outcome_of(plain.clone(), IsError::Answer).unwrap();
        assert_eq!(output.content, json!([{"type": "text", "text": "ok"}]));
        assert_eq!(result_of(Ok(output)), plain);
    }

    #[test]
    fn the_blocks_kept_aside_answer_as_the_json_round_trip_does() {
        let mut structured = CallToolResult::success(vec![ContentBlock::text("3 hits")]);
        structured.structured_content = Some(json!({"hits": 3}));
        let plain = CallToolResult::success(vec![ContentBlock::text("ok")]);
        for result in [structured, plain] {
            let (outcome, blocks) = outcome_and_blocks(result.clone(), IsError::Answer);
            let output = outcome.unwrap();
            assert_eq!(result_with_blocks(output.clone(), blocks.unwrap()), result);
            assert_eq!(result_of(Ok(output)), result);
        }
        let failed = CallToolResult::error(vec![ContentBlock::text("no")]);
        assert!(outcome_and_blocks(failed, IsError::Answer).1.is_none());
    }

    #[test]
    fn blocks_that_are_the_structured_json_are_rendered_again_not_kept() {
        let result = CallToolResult::structured(json!({"hits": 3, "top": ["a", "b"]}));
        let (outcome, blocks) = outcome_and_blocks(result.clone(), IsError::Answer);
        let output = outcome.unwrap();
        assert!(blocks.is_none());
        assert_eq!(output.metadata, None);
        assert_eq!(output.content, json!({"hits": 3, "top": ["a", "b"]}));
        assert_eq!(result_of(Ok(output)), result);

        // Blocks that say something else, or a structured array, are kept as they were.
        let mut described = CallToolResult::structured(json!({"hits": 3}));
        described.content = vec![ContentBlock::text("3 hits")];
        let mut listed = CallToolResult::success(vec![ContentBlock::text("[1,2]")]);
        listed.structured_content = Some(json!([1, 2]));
        for result in [described, listed] {
            let (outcome, blocks) = outcome_and_blocks(result.clone(), IsError::Answer);
            let output = outcome.unwrap();
            assert!(output.metadata.is_some());
            assert_eq!(result_with_blocks(output.clone(), blocks.unwrap()), result);
            assert_eq!(result_of(Ok(output)), result);
        }
    }

    #[test]
    fn meta_members_travel_both_ways() {
        let call = ToolCall::builder("files", "write")
            .session("s")
            .actor("a")
            .idempotency_key("k-1")
            .confirmation_id("c-9")
            .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .params(json!({"path": "a"}))
            .build()
            .unwrap();
        let params = request_params(&call);
        assert_eq!(params.name, "write");
        assert_eq!(params.arguments.as_ref().unwrap()["path"], "a");
        let none = RequestMetaObject::new();
        let meta = crate::meta::RequestMeta::new(params.meta.as_ref(), &none);
        let members = [IDEMPOTENCY_KEY_META.to_owned()];
        assert_eq!(meta.idempotency_key(&members).unwrap(), Some("k-1"));
        assert_eq!(meta.confirmation_id().unwrap(), Some("c-9"));
        assert_eq!(
            meta.traceparent(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                "\\PC{0,12}".prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                let names = "(code|message|retriable|retryAfterMs|details|error|[a-z]{1,6})";
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(names, inner, 0..4)
                        .prop_map(|map| Value::Object(map.into_iter().collect())),
                ]
            })
        }

        proptest! {
            /// What a stacked server writes for an error, a client reads back unchanged.
            #[test]
            fn any_error_survives_the_call_tool_result(
                index in 0..ErrorCode::ALL.len(),
                message in "\\PC{0,60}",
                after in proptest::option::of(0u64..10_000_000),
                retriable in any::<bool>(),
            ) {
                let code = ErrorCode::ALL[index];
                let class = if retriable { ErrorClass::Retriable } else { ErrorClass::Terminal };
                let mut err = ToolError::new(code, message.clone()).with_class(class);
                if let Some(millis) = after {
                    err = err.with_retry_after(Duration::from_millis(millis));
                }
                let back = outcome_of(result_of(Err(err)), IsError::Answer).unwrap_err();
                prop_assert_eq!(back.code(), code);
                prop_assert_eq!(back.message(), message.as_str());
                prop_assert_eq!(back.class(), class);
                prop_assert_eq!(back.retry_after(), after.map(Duration::from_millis));
            }

            /// Any structured content of an error result, from any server, gives a
            /// `ToolError` without a panic; a success keeps its structured content.
            #[test]
            fn any_structured_content_is_read_without_panic(
                structured in json_value(),
                text in "\\PC{0,20}",
            ) {
                let mut failed = CallToolResult::error(vec![ContentBlock::text(text)]);
                failed.structured_content = Some(structured.clone());
                let err = outcome_of(failed, IsError::Answer).unwrap_err();
                let declared = structured
                    .get("error")
                    .and_then(|e| e.get("code"))
                    .and_then(Value::as_str)
                    .and_then(ErrorCode::parse);
                prop_assert_eq!(err.code(), declared.unwrap_or(ErrorCode::UpstreamError));

                let mut done = CallToolResult::success(vec![]);
                done.structured_content = Some(structured.clone());
                let output = outcome_of(done, IsError::Answer).unwrap();
                prop_assert_eq!(&output.content, &structured);
                prop_assert_eq!(result_of(Ok(output)).structured_content, Some(structured));
            }
        }
    }
}
