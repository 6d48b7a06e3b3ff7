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

/// What serde_json refuses in well-formed JSON text that I-JSON (RFC 7493) refuses too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotIJson {
    /// A number that no double holds, such as `1e400`.
    Number,
    /// A lone surrogate escape, such as `"\ud800"`, or bytes that are not UTF-8.
    Unicode,
}

/// Which I-JSON rule serde_json's `message` (without its position) says is broken, if any.
pub(crate) fn not_i_json(message: &str) -> Option<NotIJson> {
    match message {
        "number out of range" => Some(NotIJson::Number),
        "lone leading surrogate in hex escape"
        | "unexpected end of hex escape"
        | "invalid unicode code point" => Some(NotIJson::Unicode),
        _ => None,
    }
}
