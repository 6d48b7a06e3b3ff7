//! The stack's errors in MCP's own words: the fields they name are the ones an MCP client
//! sends (`arguments`, `_meta`), not the envelope's.

use serde_json::Value;

use tower_toolcall::ToolError;

/// Each envelope field a message may name, and what an MCP client sends for it. Longer
/// names first, so that a name is rewritten before a prefix of it could be.
const FIELDS: [(&str, &str); 4] = [
    ("payload.idempotencyKey", "_meta.idempotencyKey"),
    ("control.confirmationId", "_meta.confirmationId"),
    ("trace.traceparent", "_meta.traceparent"),
    ("payload.params", "arguments"),
];

/// `text` with the envelope's field names as an MCP client knows them.
fn reworded(text: &str) -> Option<String> {
    if !FIELDS.iter().any(|(field, _)| text.contains(field)) {
        return None;
    }
    let mut text = text.to_owned();
    for (field, mcp) in FIELDS {
        text = text.replace(field, mcp);
    }
    Some(text)
}

/// The strings of `value`, reworded; `None` when none of them names a field.
fn reworded_value(value: &Value) -> Option<Value> {
    match value {
        Value::String(text) => reworded(text).map(Value::String),
        Value::Array(items) => {
            let mut changed = false;
            let items = items
                .iter()
                .map(|item| match reworded_value(item) {
                    Some(new) => {
                        changed = true;
                        new
                    }
                    None => item.clone(),
                })
                .collect();
            changed.then_some(Value::Array(items))
        }
        Value::Object(members) => {
            let mut changed = false;
            let members = members
                .iter()
                .map(|(name, member)| {
                    let member = match reworded_value(member) {
                        Some(new) => {
                            changed = true;
                            new
                        }
                        None => member.clone(),
                    };
                    (name.clone(), member)
                })
                .collect();
            changed.then_some(Value::Object(members))
        }
        _ => None,
    }
}

/// `err` with its message and details in MCP's words: `arguments.<path>` for the params,
/// `_meta.confirmationId` for the confirmation, `_meta.idempotencyKey` for the key.
pub(crate) fn in_mcp_words(err: ToolError) -> ToolError {
    let details = err.details().and_then(reworded_value);
    let mut err = match reworded(err.message()) {
        Some(message) => err.with_message(message),
        None => err,
    };
    if let Some(details) = details {
        err = err.with_details(details);
    }
    err
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tower_toolcall::ErrorCode;

    use super::*;

    #[test]
    fn envelope_fields_become_what_an_mcp_client_sends() {
        let err = ToolError::new(
            ErrorCode::ValidationError,
            "invalid tool call: `payload.params` does not match the input schema of notes::search: \
             `payload.params.query`: \"query\" is a required property; fix the params and call again",
        )
        .with_details(json!({
            "field": "payload.params",
            "violations": ["`payload.params.query`: required", "other"]
        }));
        let err = in_mcp_words(err);
        assert_eq!(
            err.message(),
            "invalid tool call: `arguments` does not match the input schema of notes::search: \
             `arguments.query`: \"query\" is a required property; fix the params and call again"
        );
        assert_eq!(
            err.details().unwrap(),
            &json!({"field": "arguments", "violations": ["`arguments.query`: required", "other"]})
        );

        let denied = ToolError::new(
            ErrorCode::PolicyDenied,
            "ask for it and send its id as `control.confirmationId`",
        );
        assert_eq!(
            in_mcp_words(denied).message(),
            "ask for it and send its id as `_meta.confirmationId`"
        );
    }

    #[test]
    fn a_message_naming_no_field_is_left_as_it_is() {
        let err = ToolError::new(ErrorCode::LoopDetected, "change your approach")
            .with_details(json!({"repeats": 4}));
        let err = in_mcp_words(err);
        assert_eq!(err.message(), "change your approach");
        assert_eq!(err.details().unwrap(), &json!({"repeats": 4}));
    }
}
