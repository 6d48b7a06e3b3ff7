//! The dedupe record: what a store keeps about one idempotency key, and the serde form of a
//! stored output or error.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorClass, ErrorCode, ToolError};
use crate::outcome::ToolOutput;

/// What a store keeps about one idempotency key (JSON-serializable, camelCase).
///
/// Its strings are shared ([`Arc<str>`]), so that a store hands out copies of a record
/// without copying them.
///
/// `version` is the fencing token: every claim of a key gives it a larger version, and a
/// store refuses to finalize, cancel or renew a record whose version is not the caller's, so
/// a holder whose lease ran out cannot overwrite the result of the one that took over.
///
/// ```
/// use tower_toolcall::idempotency::{DedupeRecord, RecordState};
///
/// let json = r#"{
///     "key": "/vault::createFile/s/sess-42/user-7/create-foo-1",
///     "tool": "vault::createFile",
///     "idempotencyKey": "create-foo-1",
///     "state": "done",
///     "createdAtMs": 1734372720000,
///     "updatedAtMs": 1734372720150,
///     "expiresAtMs": 1734459120150,
///     "ttlMs": 86400000,
///     "request": {
///         "sessionKey": "sess-42",
///         "actorId": "user-7",
///         "requestId": "01J9Z8Q4V6K3T2M1N0P9R8S7T6",
///         "paramsDigest": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
///     },
///     "payload": {"content": {"etag": "abc123"}},
///     "version": 1734372720000123
/// }"#;
/// let record: DedupeRecord = serde_json::from_str(json).unwrap();
/// assert_eq!(record.state, RecordState::Done);
/// assert_eq!(record.payload.unwrap().content["etag"], "abc123");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DedupeRecord {
    /// The store key: tenant, tool, scope and idempotency key.
    pub key: Arc<str>,
    /// `namespace::name` of the tool.
    pub tool: Arc<str>,
    /// The idempotency key the call carried, a hook gave it, or was derived for it.
    pub idempotency_key: Arc<str>,
    /// Where the execution stands.
    pub state: RecordState,
    /// When the key was claimed, in Unix milliseconds of the store's clock.
    pub created_at_ms: u64,
    /// When the record last changed.
    pub updated_at_ms: u64,
    /// When the store forgets the record.
    pub expires_at_ms: u64,
    /// How long the record is kept from its last change.
    pub ttl_ms: u64,
    /// The call that claimed the key.
    pub request: RecordRequest,
    /// How the execution went, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<Execution>,
    /// The output, when the state is `done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<ToolOutput>,
    /// The error, when the state is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StoredError>,
    /// The end of the in-flight lease, when the state is `inflight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_until_ms: Option<u64>,
    /// The fencing token (optimistic concurrency control).
    pub version: u64,
    /// The idempotency key was derived from the canonical params of the claim, so a derived
    /// claim that finds this record under the same key has the same params. Not stored: a
    /// record read back from a shared store has `false`, and its params digest is compared.
    #[serde(skip)]
    pub key_derived_from_params: bool,
}

/// Where the execution of a key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordState {
    /// The tool is running under a lease.
    Inflight,
    /// The tool succeeded; the output is kept.
    Done,
    /// The tool failed; the error is kept.
    Failed,
    /// The caller went away before the tool finished; the key is free.
    Cancelled,
}

impl DedupeRecord {
    /// What results and logs name the record's key by, without revealing it: for a key
    /// derived from the params (a SHA-256 already) its first 16 hex digits, for another key
    /// the [`key_fingerprint`](super::key_fingerprint) of its store key.
    pub fn fingerprint(&self) -> String {
        super::key::fingerprint(
            &self.key,
            &self.idempotency_key,
            self.key_derived_from_params,
        )
    }
}

impl RecordState {
    /// The state's name as it is stored.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordState::Inflight => "inflight",
            RecordState::Done => "done",
            RecordState::Failed => "failed",
            RecordState::Cancelled => "cancelled",
        }
    }

    /// Parses the stored name.
    pub fn parse(state: &str) -> Option<RecordState> {
        [
            RecordState::Inflight,
            RecordState::Done,
            RecordState::Failed,
            RecordState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == state)
    }

    /// `true` for `done` and `failed`: the record holds a result.
    pub fn is_settled(self) -> bool {
        matches!(self, RecordState::Done | RecordState::Failed)
    }
}

/// `request` of a record: the call that claimed the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RecordRequest {
    /// `target.sessionKey` of the call.
    pub session_key: Arc<str>,
    /// `target.actorId` of the call.
    pub actor_id: Arc<str>,
    /// `requestId` of the call.
    pub request_id: Arc<str>,
    /// `toolCallId` of the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<Arc<str>>,
    /// `hex(sha256(canonical_json(params)))`: a later call with the same key must match it.
    pub params_digest: Arc<str>,
}

/// `execution` of a record: the attempts the execution made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Execution {
    /// How many times the tool ran.
    pub attempt_count: u32,
    /// One entry per attempt, oldest first.
    pub attempts: Vec<AttemptRecord>,
}

/// One attempt of an execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AttemptRecord {
    /// When the attempt started, in Unix milliseconds.
    pub started_at_ms: u64,
    /// When it ended.
    pub finished_at_ms: u64,
    /// How it ended.
    pub status: AttemptStatus,
    /// Whether its error was retriable.
    pub retriable: bool,
    /// Its error code, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptStatus {
    /// The attempt succeeded.
    Success,
    /// The attempt failed.
    Error,
}

impl Execution {
    /// The execution of one call that started at `started_at_ms` and ended at
    /// `finished_at_ms` with `outcome`.
    ///
    /// The attempts are rebuilt from the call's record: one per `retriedBy` entry (each
    /// lasting its latency, followed by its delay), and the last one ending with the outcome.
    pub fn from_outcome(
        outcome: &Result<ToolOutput, ToolError>,
        started_at_ms: u64,
        finished_at_ms: u64,
    ) -> Execution {
        let record = crate::outcome::record_of(outcome);
        let mut attempts = Vec::with_capacity(record.retried_by.len() + 1);
        let mut at = started_at_ms;
        for retry in &record.retried_by {
            let finished = at.saturating_add(retry.latency_ms).min(finished_at_ms);
            attempts.push(AttemptRecord {
                started_at_ms: at,
                finished_at_ms: finished,
                status: AttemptStatus::Error,
                retriable: true,
                error_code: Some(retry.reason_code.clone()),
            });
            at = finished.saturating_add(retry.delay_ms).min(finished_at_ms);
        }
        attempts.push(AttemptRecord {
            started_at_ms: at,
            finished_at_ms,
            status: if outcome.is_ok() {
                AttemptStatus::Success
            } else {
                AttemptStatus::Error
            },
            retriable: outcome.as_ref().err().is_some_and(ToolError::is_retriable),
            error_code: outcome.as_ref().err().map(|e| e.code().as_str().to_owned()),
        });
        let counted = record.attempts.unwrap_or(0);
        Execution {
            attempt_count: counted.max(u32::try_from(attempts.len()).unwrap_or(u32::MAX)),
            attempts,
        }
    }
}

/// `error` of a record: a [`ToolError`] in a form that survives JSON.
///
/// Everything a caller can see of the error comes back: code, message, class, whether the
/// request was processed, HTTP status, retry-after and details. The call record and the
/// error's source do not.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall::idempotency::StoredError;
/// use tower_toolcall::{ErrorCode, ToolError};
///
/// let error = ToolError::from_http_status(503, "search backend is down")
///     .with_retry_after(Duration::from_secs(2))
///     .with_details(json!({"region": "eu"}));
/// let json = serde_json::to_string(&StoredError::from_error(&error)).unwrap();
/// let back = serde_json::from_str::<StoredError>(&json).unwrap().to_error();
/// assert_eq!(back.code(), ErrorCode::UpstreamUnavailable);
/// assert_eq!(back.class(), error.class());
/// assert!(back.is_not_processed());
/// assert_eq!(back.http_status(), Some(503));
/// assert_eq!(back.retry_after(), Some(Duration::from_secs(2)));
/// assert_eq!(back.details(), error.details());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StoredError {
    /// The stable error code, e.g. `"NOT_FOUND"`.
    pub code: String,
    /// The message.
    pub message: String,
    /// Trying again will not help.
    pub terminal: bool,
    /// A later attempt may succeed.
    #[serde(rename = "shouldRetriable")]
    pub retriable: bool,
    /// The error's class.
    #[serde(with = "ErrorClassDef")]
    pub class: ErrorClass,
    /// The request is known not to have been processed.
    #[serde(default)]
    pub not_processed: bool,
    /// The HTTP status of the upstream answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The retry-after hint, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Structured details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "ErrorClass", rename_all = "snake_case")]
enum ErrorClassDef {
    Retriable,
    Terminal,
    Unclassified,
}

impl StoredError {
    /// The stored form of `error`.
    pub fn from_error(error: &ToolError) -> StoredError {
        let retriable = error.is_retriable();
        StoredError {
            code: error.code().as_str().to_owned(),
            message: error.message().to_owned(),
            terminal: !retriable,
            retriable,
            class: error.class(),
            not_processed: error.is_not_processed(),
            http_status: error.http_status(),
            retry_after_ms: error.retry_after().map(crate::time::millis),
            details: error.details().cloned(),
        }
    }

    /// The error again. A code this version does not know becomes `INTERNAL_ERROR`, with
    /// the stored code kept in the details as `storedCode`.
    pub fn to_error(&self) -> ToolError {
        let (code, message): (ErrorCode, Cow<'static, str>) = match ErrorCode::parse(&self.code) {
            Some(code) => (code, self.message.clone().into()),
            None => (ErrorCode::InternalError, self.message.clone().into()),
        };
        let mut error = ToolError::new(code, message)
            .with_class(self.class)
            .not_processed(self.not_processed);
        if let Some(status) = self.http_status {
            error = error.with_http_status(status);
        }
        if let Some(ms) = self.retry_after_ms {
            error = error.with_retry_after(Duration::from_millis(ms));
        }
        let details = match (ErrorCode::parse(&self.code), &self.details) {
            (Some(_), details) => details.clone(),
            (None, Some(Value::Object(map))) => {
                let mut map = map.clone();
                map.insert("storedCode".to_owned(), Value::String(self.code.clone()));
                Some(Value::Object(map))
            }
            (None, _) => Some(serde_json::json!({ "storedCode": self.code })),
        };
        if let Some(details) = details {
            error = error.with_details(details);
        }
        error
    }
}
