//! Turning malformed envelopes into `VALIDATION_ERROR`s that name the field.

use std::fmt;

use super::call::{CallEnvelope, CONTRACT_VERSION, PAYLOAD_VERSION};
use crate::error::{ErrorCode, ToolError};
use crate::serde_message::{missing_field, strip_position};

/// The invariants that types alone do not hold.
pub(crate) fn check_envelope(env: &CallEnvelope) -> Result<(), ToolError> {
    if env.contract_version != CONTRACT_VERSION {
        return Err(ToolError::invalid_field(
            "contractVersion",
            format_args!(
                "must be \"{CONTRACT_VERSION}\", got {:?}",
                env.contract_version
            ),
        ));
    }
    non_empty("requestId", &env.request_id)?;
    non_empty("toolName", &env.tool_name)?;
    non_empty("toolNamespace", &env.tool_namespace)?;
    non_empty("target.sessionKey", &env.target.session_key)?;
    non_empty("target.actorId", &env.target.actor_id)?;
    if env.payload.version != PAYLOAD_VERSION {
        return Err(ToolError::invalid_field(
            "payload.version",
            format_args!(
                "must be \"{PAYLOAD_VERSION}\", got {:?}",
                env.payload.version
            ),
        ));
    }
    if let Some(key) = &env.payload.idempotency_key {
        non_empty("payload.idempotencyKey", key)?;
    }
    if let Some(budget) = &env.transport.retry_budget {
        if budget.max_attempts == 0 {
            return Err(ToolError::invalid_field(
                "transport.retryBudget.maxAttempts",
                "must be at least 1, got 0",
            ));
        }
    }
    Ok(())
}

fn non_empty(field: &str, value: &str) -> Result<(), ToolError> {
    if value.chars().all(char::is_whitespace) {
        Err(ToolError::invalid_field(field, "must not be empty"))
    } else {
        Ok(())
    }
}

pub(crate) fn from_json_error(err: serde_path_to_error::Error<serde_json::Error>) -> ToolError {
    if matches!(
        err.inner().classify(),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof
    ) {
        return not_json(err.inner());
    }
    let path = err.path().to_string();
    field_error(&path, err.inner())
}

pub(crate) fn from_value_error(err: serde_path_to_error::Error<serde_json::Error>) -> ToolError {
    let path = err.path().to_string();
    field_error(&path, err.inner())
}

pub(crate) fn not_json(err: &serde_json::Error) -> ToolError {
    let problem = strip_position(&err.to_string()).to_owned();
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!(
            "invalid tool call: the body is not valid JSON ({problem} at line {}, column {}); \
             send one JSON object",
            err.line(),
            err.column()
        ),
    )
}

/// Maps a serde error at `path` to a message that names the field.
fn field_error(path: &str, err: &serde_json::Error) -> ToolError {
    let message = err.to_string();
    let problem = strip_position(&message);
    if let Some(missing) = missing_field(problem) {
        let field = join(path, missing);
        return ToolError::invalid_field(&field, "is required");
    }
    if path == "." {
        return ToolError::invalid_field("", Problem(problem))
            .with_message(format!("invalid tool call: {problem}"));
    }
    ToolError::invalid_field(path, Problem(problem))
}

struct Problem<'a>(&'a str);

impl fmt::Display for Problem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        if p.starts_with("must ") || p.starts_with("is ") {
            f.write_str(p)
        } else {
            write!(f, "is invalid: {p}")
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path == "." || path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}
