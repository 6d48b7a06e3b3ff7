//! The [`JsonToolCall`] extractor: a `ToolCall` read from a JSON body, with the
//! `Idempotency-Key` and `traceparent` headers put into it.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;

use tower_toolcall::envelope::{
    ToolCall, ToolResult, MAX_IDEMPOTENCY_KEY_BYTES, MAX_TRACEPARENT_BYTES,
};
use tower_toolcall::{ErrorCode, ToolError};

/// The `Idempotency-Key` request header (IETF draft `draft-ietf-httpapi-idempotency-key-header`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The W3C `traceparent` request header.
pub const TRACEPARENT: &str = "traceparent";

/// Extracts a [`ToolCall`] from a JSON body.
///
/// The request's `Content-Type` must be JSON: `application/json` (with parameters such as
/// `charset=utf-8`, or not) or a `+json` type. Any other, or none, is refused before the body
/// is read — a `text/plain` POST is what a web page may send to a local gateway without a
/// CORS preflight. [`ToolRouter`](super::ToolRouter) answers it `415 Unsupported Media
/// Type`. The body is read within the route's body limit (axum's
/// [`DefaultBodyLimit`](axum::extract::DefaultBodyLimit), 2 MiB unless the router says
/// otherwise; [`ToolRouter`](super::ToolRouter) sets its own) and parsed with
/// [`ToolCall::from_json`]. Then the headers go into the call:
///
/// - `Idempotency-Key` becomes `payload.idempotencyKey`. The header is a structured-field
///   string (`"abc"`); a bare token is taken too. A body that carries another key is refused:
///   header and body that disagree are a client error (400), as the IETF draft says.
/// - `traceparent` becomes `trace.traceparent`, the call's trace parent, over any the body has:
///   it is what the HTTP hop propagated. It has at most
///   [`MAX_TRACEPARENT_BYTES`](tower_toolcall::envelope::MAX_TRACEPARENT_BYTES).
///
/// Each of the two headers may be sent once: a request with two is refused, rather than one
/// of them chosen silently.
///
/// Bad input is rejected with a [`ToolResult`] envelope ([`ToolResult::rejected`]) whose
/// error names the field: `VALIDATION_ERROR` (400) for a malformed body or header,
/// `PAYLOAD_TOO_LARGE` (413) for a body over the limit. Its `requestId` and `toolName` are
/// those of the body when they can be read.
///
/// ```
/// use axum::body::Body;
/// use axum::extract::FromRequest;
/// use axum::http::Request;
/// use serde_json::json;
/// use tower_toolcall_axum::JsonToolCall;
/// use tower_toolcall::ToolCall;
///
/// # tokio_test::block_on(async {
/// let call = ToolCall::builder("web", "search").session("s").actor("u").build().unwrap();
/// let request = Request::post("/v1/tools/call")
///     .header("content-type", "application/json")
///     .header("idempotency-key", "\"search-1\"")
///     .body(Body::from(call.to_json()))
///     .unwrap();
/// let JsonToolCall(call) = JsonToolCall::from_request(request, &()).await.unwrap();
/// assert_eq!(call.idempotency_key(), Some("search-1"));
///
/// let bad = Request::post("/v1/tools/call")
///     .header("content-type", "application/json")
///     .body(Body::from(r#"{"toolName": 3}"#))
///     .unwrap();
/// let rejected = JsonToolCall::from_request(bad, &()).await.unwrap_err();
/// assert!(rejected.error.unwrap().message.contains("toolName"));
///
/// let text = Request::post("/v1/tools/call")
///     .header("content-type", "text/plain")
///     .body(Body::from(call.to_json()))
///     .unwrap();
/// let rejected = JsonToolCall::from_request(text, &()).await.unwrap_err();
/// assert_eq!(rejected.error.unwrap().details.unwrap()["field"], "content-type");
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct JsonToolCall(pub ToolCall);

impl<S: Send + Sync> FromRequest<S> for JsonToolCall {
    type Rejection = ToolResult;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        json_content_type(req.headers()).map_err(ToolResult::rejected)?;
        // Only the two headers the call takes in are kept; the body consumes the request.
        let key_header = single_header(req.headers(), IDEMPOTENCY_KEY)
            .map_err(ToolResult::rejected)?
            .cloned();
        let traceparent_header = single_header(req.headers(), TRACEPARENT)
            .map_err(ToolResult::rejected)?
            .cloned();
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let error = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ToolError::rejected(
                    ErrorCode::PayloadTooLarge,
                    "the request body is larger than the limit; send smaller params",
                )
            } else {
                ToolError::rejected(
                    ErrorCode::ValidationError,
                    format!("the request body could not be read: {rejection}"),
                )
            };
            ToolResult::rejected(error)
        })?;
        let call = ToolCall::from_json(&bytes).map_err(|e| rejected(e, &bytes))?;
        with_headers(call, key_header.as_ref(), traceparent_header.as_ref())
            .map_err(|e| rejected(e, &bytes))
            .map(JsonToolCall)
    }
}

/// Whether the request's `Content-Type` is JSON: `application/json` or `application/*+json`,
/// with any parameters.
pub(super) fn json_content_type(headers: &HeaderMap) -> Result<(), ToolError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase())
        .and_then(|essence| {
            let subtype = essence.strip_prefix("application/")?.to_owned();
            Some(subtype == "json" || (subtype.ends_with("+json") && subtype.len() > 5))
        })
        .unwrap_or(false);
    if is_json {
        Ok(())
    } else {
        Err(header_error(
            header::CONTENT_TYPE.as_str(),
            "must be `application/json`; send the call as JSON with that content type",
        ))
    }
}

/// The value of a header that may be sent once; a second value is refused, not ignored.
fn single_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a HeaderValue>, ToolError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(header_error(name, "is sent more than once; send it once"));
    }
    Ok(first)
}

/// Puts the values of the `Idempotency-Key` and `traceparent` headers into `call`.
fn with_headers(
    mut call: ToolCall,
    key_header: Option<&HeaderValue>,
    traceparent_header: Option<&HeaderValue>,
) -> Result<ToolCall, ToolError> {
    let key = key_header
        .map(|value| idempotency_key(value.as_bytes()))
        .transpose()?;
    let traceparent = traceparent_header
        .map(|value| {
            if value.len() > MAX_TRACEPARENT_BYTES {
                return Err(header_error(
                    TRACEPARENT,
                    &format!("must have at most {MAX_TRACEPARENT_BYTES} bytes"),
                ));
            }
            value
                .to_str()
                .map(str::to_owned)
                .map_err(|_| header_error(TRACEPARENT, "must be visible ASCII"))
        })
        .transpose()?;
    if key.is_none() && traceparent.is_none() {
        return Ok(call);
    }
    if let (Some(key), Some(body)) = (&key, call.idempotency_key()) {
        if key != body {
            return Err(ToolError::invalid_field(
                "payload.idempotencyKey",
                format!(
                    "must equal the `Idempotency-Key` header when both are sent, got {body:?} \
                     in the body and {key:?} in the header; send one, or the same key in both"
                ),
            ));
        }
    }
    let envelope = call.envelope_mut();
    if let Some(key) = key {
        envelope.payload.idempotency_key = Some(key);
    }
    if let Some(traceparent) = traceparent {
        envelope.trace.traceparent = Some(traceparent);
    }
    call.check()?;
    Ok(call)
}

/// The key of an `Idempotency-Key` header: a structured-field string, or a bare token.
fn idempotency_key(value: &[u8]) -> Result<String, ToolError> {
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|t| t.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .ok_or_else(|| header_error(IDEMPOTENCY_KEY, "must be visible ASCII"))?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            let inner = quoted
                .strip_suffix('"')
                .ok_or_else(|| header_error(IDEMPOTENCY_KEY, "has an unterminated string"))?;
            unescape(inner)?
        }
        None => text.trim().to_owned(),
    };
    if key.is_empty() {
        return Err(header_error(IDEMPOTENCY_KEY, "must not be empty"));
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(header_error(
            IDEMPOTENCY_KEY,
            &format!("must have at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
        ));
    }
    Ok(key)
}

/// The content of a structured-field string: `\"` and `\\` are its only escapes.
fn unescape(inner: &str) -> Result<String, ToolError> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(header_error(IDEMPOTENCY_KEY, "has a bad escape")),
            },
            '"' => return Err(header_error(IDEMPOTENCY_KEY, "has an unescaped quote")),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn header_error(header: &str, problem: &str) -> ToolError {
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!("invalid tool call: the `{header}` header {problem}"),
    )
    .with_details(serde_json::json!({ "field": header, "in": "header" }))
}

/// The rejected result of `error`, with the body's `requestId` and `toolName` when they can
/// be read.
fn rejected(error: ToolError, body: &[u8]) -> ToolResult {
    let mut result = ToolResult::rejected(error);
    if let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) {
        if let Some(Value::String(id)) = body.get("requestId") {
            result.request_id = id.clone();
        }
        if let Some(Value::String(name)) = body.get("toolName") {
            result.tool_name = name.clone();
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_a_structured_string_or_a_token() {
        assert_eq!(idempotency_key(br#""abc-1""#).unwrap(), "abc-1");
        assert_eq!(idempotency_key(br#""a\"b""#).unwrap(), "a\"b");
        assert_eq!(idempotency_key(b"abc-1").unwrap(), "abc-1");
        for bad in [&b"\"\""[..], b"\"open", b"caf\xc3\xa9", b"\"a\\nb\""] {
            let error = idempotency_key(bad).unwrap_err();
            assert_eq!(error.details().unwrap()["field"], IDEMPOTENCY_KEY);
        }
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1);
        assert!(idempotency_key(long.as_bytes()).is_err());
    }
}
