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

use serde_json::json;

use super::config::backend_and_model;
use super::detector::{Action, Detection, Limits, Rule, Signature};
use crate::canonical::{canonical_json, CanonicalOptions};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::ShortCircuit;
use crate::redact::{Redactor, REDACTED};

/// How many characters of the canonical params the WARN line shows.
const SIGNATURE_PREFIX_CHARS: usize = 50;
/// Shown for a backend or model the call does not name.
const UNKNOWN: &str = "unknown";

/// The `LOOP_DETECTED` error for a refused call.
///
/// Terminal and rejected: the tool did not run. The message names the tool, the count and the
/// window, says which rule fired when it is not plain repetition, and ends with advice for
/// the model.
pub(super) fn loop_error(call: &ToolCall, detection: &Detection, limits: &Limits) -> ToolError {
    let window = limits.ttl.as_secs();
    let count = detection.count;
    let tool = call.tool_name();
    let (outcome, advice) = match detection.action {
        Action::Break => (
            Cow::Owned(format!(
                "This call was not executed, and neither is any repeat of it within {window}s; \
                 other calls still run."
            )),
            "Hint: change the inputs or the strategy instead of repeating the same call, or ask \
             the user.",
        ),
        Action::Chance => (
            Cow::Borrowed("This call was not executed."),
            "Stop and reflect on why the repeated calls did not bring you closer to the goal, \
             then change your approach: other inputs, another tool, or ask the user. Repeating \
             this exact call stops the session.",
        ),
    };
    let finding = match detection.rule {
        Rule::Repeat => String::new(),
        Rule::UnchangedPoll { for_secs: None } => " Its result did not change between these \
             calls. If you are waiting for it to change, wait longer between calls."
            .to_owned(),
        Rule::UnchangedPoll {
            for_secs: Some(secs),
        } => format!(
            " Its result has not changed for {secs}s. Stop polling: report what you have to the \
             user, or check the job another way."
        ),
        Rule::Cycle { length } => format!(
            " The last {} calls repeat a cycle of {length} calls {count} times.",
            length.saturating_mul(count as usize)
        ),
        Rule::Failures { code } => format!(
            " Each of the last {} identical calls failed with {}. Read the error and change \
             the call, or wait longer before each retry.",
            count.saturating_sub(1),
            code.as_str()
        ),
    };
    let message = format!(
        "Tool call loop detected: '{tool}' invoked with identical params {count} times \
         within {window}s. {outcome}{finding} {advice}"
    );
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
            Rule::UnchangedPoll {
                for_secs: Some(secs),
            } => details["unchangedSecs"] = json!(secs),
            Rule::Repeat | Rule::UnchangedPoll { for_secs: None } => {}
        }
        details
    };
    ToolError::rejected(ErrorCode::LoopDetected, message)
        .short_circuited(ShortCircuit::LoopBlocked)
        .with_details_fn(details)
}

/// Logs a detection: the WARN line, and at DEBUG the full signature.
pub(super) fn log_detection(
    call: &ToolCall,
    detection: &Detection,
    limits: &Limits,
    signature: Signature,
    canonical: &str,
    options: &CanonicalOptions,
    redactor: &Redactor,
) {
    if !tracing::enabled!(tracing::Level::WARN) {
        return;
    }
    let params = redacted_canonical(call, canonical, options, redactor);
    let prefix = match params.char_indices().nth(SIGNATURE_PREFIX_CHARS) {
        Some((end, _)) => &params[..end],
        None => &params[..],
    };
    let (backend, model) = backend_and_model(call);
    let (backend, model) = (backend.unwrap_or(UNKNOWN), model.unwrap_or(UNKNOWN));
    let session_id = &*redactor.redact_identifier(call.session_key());
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
    redactor: &Redactor,
) -> Cow<'a, str> {
    let params = call.params().as_value();
    if !redactor.needs_redaction(params) {
        return Cow::Borrowed(canonical);
    }
    let redacted = redactor.redact_value(params);
    // Redaction only shortens strings and never deepens nesting, so this cannot fail where
    // the unredacted params did not; fall back to the redaction marker all the same.
    Cow::Owned(canonical_json(&redacted, options).unwrap_or_else(|_| REDACTED.to_owned()))
}
