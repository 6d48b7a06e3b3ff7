//! Reading serde's error messages, so that errors can name the field in their own words.

/// serde_json appends " at line L column C"; the field path says more than the position.
pub(crate) fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    }
}

/// The field of serde's "missing field `x`" message.
pub(crate) fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
}
