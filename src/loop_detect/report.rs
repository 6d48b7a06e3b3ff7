//! What a detection says: the error the model gets, and the log lines the operator gets.
//!
//! One WARN event per detection, with the line
//!
//! ```text
//! Tool call loop detected in session {session_id}: tool={tool_name}, repeats={count}/{max_repeats}, window={ttl}s, model={model}, backend={backend}, action={action}, signature={signature[:50]}...
//! ```
//!
//! and the same values as fields. The signature in it is the first 50 characters of the
//! canonical params, with values that look secret replaced by `[REDACTED]`; the full (and
//! equally redacted) params, with the signature's hash, are logged at DEBUG only.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use super::config::backend_and_model;
use super::detector::{Action, Detection, Limits, Rule, Signature};
use crate::canonical::{canonical_json, CanonicalOptions};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};

/// How many characters of the canonical params the WARN line shows.
const SIGNATURE_PREFIX_CHARS: usize = 50;
/// What replaces a secret in logs.
const REDACTED: &str = "[REDACTED]";
/// Shown for a backend or model the call does not name.
const UNKNOWN: &str = "unknown";

/// The `LOOP_DETECTED` error for a refused call.
///
/// Terminal and not processed (attempts 0). The message names the tool, the count and the
/// window, says which rule fired when it is not plain repetition, and ends with advice for
/// the model.
pub(super) fn loop_error(call: &ToolCall, detection: &Detection, limits: &Limits) -> ToolError {
    let window = limits.ttl.as_secs();
    let mut message = String::with_capacity(400);
    let _ = write!(
        message,
        "Tool call loop detected: '{}' invoked with identical params {} times within {window}s.",
        call.tool_name(),
        detection.count,
    );
    message.push_str(match detection.action {
        Action::Break => " Session stopped to prevent unintended looping.",
        Action::Chance => " This call was not executed.",
    });
    let _ = match detection.rule {
        Rule::Repeat => Ok(()),
        Rule::UnchangedPoll => message.write_str(" Its result did not change between these calls."),
        Rule::Cycle { length } => write!(
            message,
            " The last {} calls repeat a cycle of {length} calls {} times.",
            length * detection.count as usize,
            detection.count
        ),
        Rule::Failures { code } => write!(
            message,
            " Each of the last {} identical calls failed with {code}.",
            detection.count
        ),
    };
    message.push_str(match detection.action {
        Action::Break => {
            " Hint: change the inputs or the strategy instead of repeating the same call."
        }
        Action::Chance => {
            " Stop and reflect on why the repeated calls did not bring you closer to the goal, \
             then change your approach: other inputs, another tool, or ask the user. Repeating \
             this exact call stops the session."
        }
    });
    // Made when read: a refused call whose details nobody inspects costs no JSON.
    let (action, rule) = (detection.action, detection.rule);
    let (repeats, max_repeats) = (detection.count, detection.threshold);
    let details = move || {
        let mut details = json!({
            "action": action.as_str(),
            "maxRepeats": max_repeats,
            "repeats": repeats,
            "rule": rule.as_str(),
            "windowSecs": window,
        });
        match rule {
            Rule::Cycle { length } => details["cycleLength"] = json!(length),
            Rule::Failures { code } => details["errorCode"] = json!(code.as_str()),
            Rule::Repeat | Rule::UnchangedPoll => {}
        }
        details
    };
    ToolError::rejected(ErrorCode::LoopDetected, message).with_details_fn(details)
}

/// Logs a detection: the WARN line, and at DEBUG the full signature.
pub(super) fn log_detection(
    call: &ToolCall,
    detection: &Detection,
    limits: &Limits,
    signature: Signature,
    canonical: &str,
    options: &CanonicalOptions,
) {
    if !tracing::enabled!(tracing::Level::WARN) {
        return;
    }
    let params = redacted_canonical(call, canonical, options);
    let prefix = match params.char_indices().nth(SIGNATURE_PREFIX_CHARS) {
        Some((end, _)) => &params[..end],
        None => &params[..],
    };
    let (backend, model) = backend_and_model(call);
    let (backend, model) = (backend.unwrap_or(UNKNOWN), model.unwrap_or(UNKNOWN));
    let session_id = call.session_key();
    let tool_name = call.tool_name();
    let (count, max_repeats) = (detection.count, detection.threshold);
    let window_secs = limits.ttl.as_secs();
    let action = detection.action.as_str();
    tracing::warn!(
        session_id,
        tool_name,
        tool_namespace = call.tool_namespace(),
        repeats = count,
        max_repeats,
        window_secs,
        model,
        backend,
        action,
        rule = detection.rule.as_str(),
        signature = prefix,
        "Tool call loop detected in session {session_id}: tool={tool_name}, \
         repeats={count}/{max_repeats}, window={window_secs}s, model={model}, \
         backend={backend}, action={action}, signature={prefix}..."
    );
    tracing::debug!(
        session_id,
        tool_name,
        tool_namespace = call.tool_namespace(),
        signature_hash = %format_args!("{:016x}", signature.raw()),
        params = %params,
        "loop detection signature"
    );
}

/// The canonical params, with secret-looking members and values replaced.
fn redacted_canonical<'a>(
    call: &ToolCall,
    canonical: &'a str,
    options: &CanonicalOptions,
) -> Cow<'a, str> {
    let params = call.params().as_value();
    if !contains_secret(params) {
        return Cow::Borrowed(canonical);
    }
    let mut redacted = params.clone();
    redact(&mut redacted);
    // Redaction only shortens strings and never deepens nesting, so this cannot fail where
    // the unredacted params did not; fall back to the redaction marker all the same.
    Cow::Owned(canonical_json(&redacted, options).unwrap_or_else(|_| REDACTED.to_owned()))
}

fn contains_secret(value: &Value) -> bool {
    match value {
        Value::String(s) => looks_like_credential(s),
        Value::Array(items) => items.iter().any(contains_secret),
        Value::Object(members) => members
            .iter()
            .any(|(name, v)| (is_secret_name(name) && !v.is_null()) || contains_secret(v)),
        _ => false,
    }
}

fn redact(value: &mut Value) {
    match value {
        Value::String(s) if looks_like_credential(s) => *s = REDACTED.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::Object(members) => redact_members(members),
        _ => {}
    }
}

fn redact_members(members: &mut Map<String, Value>) {
    for (name, v) in members.iter_mut() {
        if is_secret_name(name) && !v.is_null() {
            *v = Value::String(REDACTED.to_owned());
        } else {
            redact(v);
        }
    }
}

/// Member names that hold secrets: `token`, `secret`, `password`, `authorization`,
/// `api_key`, `cookie`, … in any case, with or without separators.
fn is_secret_name(name: &str) -> bool {
    const WORDS: [&str; 11] = [
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "authorization",
        "apikey",
        "cookie",
        "credential",
        "privatekey",
        "accesskey",
    ];
    let folded: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    WORDS.iter().any(|w| folded.contains(w))
}

/// Values that look like credentials: `Bearer` and `Basic` credentials, JWTs, and the key
/// formats of OpenAI (`sk-…`), GitHub (`ghp_…`, `github_pat_…`), AWS (`AKIA…`) and Slack
/// (`xoxb-…`), also inside a longer text.
fn looks_like_credential(text: &str) -> bool {
    let mut words = text
        .split(|c: char| c.is_whitespace() || "\"'`,;()[]{}<>".contains(c))
        .filter(|w| !w.is_empty())
        .peekable();
    while let Some(word) = words.next() {
        let scheme = word.eq_ignore_ascii_case("bearer") || word.eq_ignore_ascii_case("basic");
        if scheme && words.peek().is_some_and(|next| is_token(next, 16)) {
            return true;
        }
        // `key=sk-…`, `token:ghp_…`: look at each side of `=` and `:` too.
        if word.split(['=', ':']).any(is_credential_word) {
            return true;
        }
    }
    false
}

/// At least `min` characters of a token (base64, base64url or JWT alphabet).
fn is_token(word: &str, min: usize) -> bool {
    word.len() >= min
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~+/=".contains(c))
}

fn is_credential_word(word: &str) -> bool {
    let tail_is = |prefix: &str, min: usize, ok: fn(char) -> bool| {
        word.strip_prefix(prefix)
            .is_some_and(|rest| rest.len() >= min && rest.chars().all(ok))
    };
    let token_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let aws_char = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit();
    let jwt = word.starts_with("eyJ")
        && word.split('.').count() == 3
        && word.split('.').all(|part| !part.is_empty());
    jwt || tail_is("sk-", 16, token_char)
        || ["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"]
            .iter()
            .any(|p| tail_is(p, 16, token_char))
        || ["AKIA", "ASIA"].iter().any(|p| tail_is(p, 16, aws_char))
        || ["xoxb-", "xoxp-", "xoxa-", "xoxr-"]
            .iter()
            .any(|p| tail_is(p, 10, token_char))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_found_by_name_and_by_shape() {
        let cases = [
            (json!({"query": "rust tower"}), false),
            (json!({"api_key": "abc"}), true),
            (json!({"X-Api-Key": "abc"}), true),
            (json!({"headers": {"Authorization": "x"}}), true),
            (json!({"accessToken": null}), false),
            (
                json!({"cmd": "curl -H 'Authorization: Bearer 0123456789abcdef.ghi'"}),
                true,
            ),
            (json!({"header": "Basic dXNlcjpwYXNzd29yZDEyMw=="}), true),
            (json!({"query": "basic income, bearer bonds"}), false),
            (json!({"q": "key=sk-abcdefghijklmnop1234"}), true),
            (json!({"key": "sk-proj-abcdefghijklmnop1234"}), true),
            (json!({"items": ["ghp_0123456789abcdefABCDEF"]}), true),
            (json!({"id": "AKIAIOSFODNN7EXAMPLE"}), true),
            (json!({"t": "eyJhbGciOi.eyJzdWIiOi.sig_nature"}), true),
            (json!({"word": "skeleton", "n": "sk-short"}), false),
        ];
        for (params, secret) in cases {
            assert_eq!(contains_secret(&params), secret, "{params}");
        }
    }

    #[test]
    fn redaction_replaces_only_the_secrets() {
        let mut params = json!({
            "query": "weather",
            "auth": {"password": "hunter2", "user": "ann"},
            "notes": ["keep", "sk-abcdefghijklmnopqrstuvwx"],
        });
        redact(&mut params);
        assert_eq!(
            params,
            json!({
                "query": "weather",
                "auth": {"password": "[REDACTED]", "user": "ann"},
                "notes": ["keep", "[REDACTED]"],
            })
        );
    }
}
