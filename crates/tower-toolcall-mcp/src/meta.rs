//! What a `tools/call` request says in its `_meta`, and what a result says in its own: the
//! members the stack reads from a client and the facts it writes back.

use rmcp::model::{MetaObject, RequestMetaObject};
use serde_json::Value;

use tower_toolcall::envelope::{json_kind, MAX_IDEMPOTENCY_KEY_BYTES, MAX_IDENTIFIER_BYTES};
use tower_toolcall::{ErrorCode, ToolError};

/// The `_meta` member of a `tools/call` that carries the call's idempotency key.
pub const IDEMPOTENCY_KEY_META: &str = "idempotencyKey";

/// The `_meta` member of a `tools/call` that carries the user's confirmation of the call
/// (the envelope's `control.confirmationId`).
pub const CONFIRMATION_ID_META: &str = "confirmationId";

/// The `_meta` members read as a call's idempotency key unless the server is told otherwise,
/// in this order: [`IDEMPOTENCY_KEY_META`], then the members clients already send for it
/// (`io.opengsd/idempotency-key`, and Claude Code's `claudecode/toolUseId`, the same for
/// every re-send of one tool use).
pub const DEFAULT_IDEMPOTENCY_KEY_MEMBERS: [&str; 3] = [
    IDEMPOTENCY_KEY_META,
    "io.opengsd/idempotency-key",
    "claudecode/toolUseId",
];

/// The prefix of the `_meta` members a stacked server writes on its results.
pub const RESULT_META_PREFIX: &str = "rs.tower-toolcall/";

/// The `_meta` member of an `isError` result that a stack wrote: `{"code", "message",
/// "retriable", "retryAfterMs"?, "details"?}`. The text block stays the message the model
/// reads; this member is for programs (a client behind its own stack reads the error back).
pub const ERROR_META: &str = "rs.tower-toolcall/error";

/// The `_meta` member that is `true` on a result answered from the idempotency cache: the
/// tool did not run again.
pub const FROM_CACHE_META: &str = "rs.tower-toolcall/fromCache";

/// The `_meta` of a request, as the client sent it: the params' own members first, then the
/// request context's (where rmcp puts the members it lifted out of the params).
#[derive(Clone, Copy)]
pub(crate) struct RequestMeta<'a> {
    sources: [Option<&'a RequestMetaObject>; 2],
}

impl<'a> RequestMeta<'a> {
    pub(crate) fn new(
        params: Option<&'a RequestMetaObject>,
        context: &'a RequestMetaObject,
    ) -> Self {
        RequestMeta {
            sources: [params, Some(context)],
        }
    }

    /// The `_meta` of a request read from its params alone (no rmcp context lifted any
    /// member out of them).
    pub(crate) fn of_params(params: Option<&'a RequestMetaObject>) -> Self {
        RequestMeta {
            sources: [params, None],
        }
    }

    fn get(&self, member: &str) -> Option<&'a Value> {
        self.sources
            .iter()
            .flatten()
            .find_map(|meta| meta.get(member))
    }

    /// The string value of `member`, up to `max_bytes`; a `VALIDATION_ERROR` naming
    /// `_meta.<member>` for another JSON type or a longer string.
    pub(crate) fn text(
        &self,
        member: &str,
        max_bytes: usize,
    ) -> Result<Option<&'a str>, ToolError> {
        match self.get(member) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.len() <= max_bytes => Ok(Some(text)),
            Some(Value::String(text)) => Err(invalid_member(
                member,
                format!(
                    "is {} bytes, over the limit of {max_bytes}; send a shorter string",
                    text.len()
                ),
            )),
            Some(other) => Err(invalid_member(
                member,
                format!(
                    "must be a string, not {}; send it as a JSON string",
                    json_kind(other)
                ),
            )),
        }
    }

    /// The call's idempotency key: the first of `members` the request carries.
    pub(crate) fn idempotency_key(&self, members: &[String]) -> Result<Option<&'a str>, ToolError> {
        for member in members {
            if let Some(key) = self.text(member, MAX_IDEMPOTENCY_KEY_BYTES)? {
                return Ok(Some(key));
            }
        }
        Ok(None)
    }

    /// The user's confirmation of the call.
    pub(crate) fn confirmation_id(&self) -> Result<Option<&'a str>, ToolError> {
        self.text(CONFIRMATION_ID_META, MAX_IDENTIFIER_BYTES)
    }

    /// The W3C `traceparent`.
    pub(crate) fn traceparent(&self) -> Option<&'a str> {
        self.sources
            .iter()
            .flatten()
            .find_map(|meta| meta.get_traceparent())
    }
}

/// A `VALIDATION_ERROR` for `_meta.<member>`, in the words an MCP client can act on.
fn invalid_member(member: &str, problem: String) -> ToolError {
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!("invalid tool call: `_meta.{member}` {problem}"),
    )
    .with_details(serde_json::json!({ "field": format!("_meta.{member}") }))
}

/// `meta` with `member` set to `value`.
pub(crate) fn with_member(meta: Option<MetaObject>, member: &str, value: Value) -> MetaObject {
    let mut meta = meta.unwrap_or_default();
    meta.insert(member.to_owned(), value);
    meta
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(value: Value) -> RequestMetaObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_first_key_member_present_is_the_key() {
        let members: Vec<String> = DEFAULT_IDEMPOTENCY_KEY_MEMBERS.map(String::from).into();
        let params = meta(json!({"claudecode/toolUseId": "toolu_1"}));
        let context = meta(json!({}));
        let read = RequestMeta::new(Some(&params), &context);
        assert_eq!(read.idempotency_key(&members).unwrap(), Some("toolu_1"));

        let both = meta(json!({"claudecode/toolUseId": "toolu_1", "idempotencyKey": "k-1"}));
        let read = RequestMeta::new(Some(&both), &context);
        assert_eq!(read.idempotency_key(&members).unwrap(), Some("k-1"));
    }

    #[test]
    fn a_key_that_is_not_a_string_is_refused_by_its_name() {
        let members = vec![IDEMPOTENCY_KEY_META.to_owned()];
        let context = meta(json!({}));
        for (value, said) in [
            (json!(42), "must be a string, not a number"),
            (json!({"k": 1}), "must be a string, not an object"),
            (
                json!("k".repeat(256)),
                "is 256 bytes, over the limit of 255",
            ),
        ] {
            let params = meta(json!({ "idempotencyKey": value }));
            let err = RequestMeta::new(Some(&params), &context)
                .idempotency_key(&members)
                .unwrap_err();
            assert_eq!(err.code(), ErrorCode::ValidationError);
            assert!(
                err.message().contains("`_meta.idempotencyKey`"),
                "{}",
                err.message()
            );
            assert!(err.message().contains(said), "{}", err.message());
            assert_eq!(err.details().unwrap()["field"], "_meta.idempotencyKey");
        }
    }
}
