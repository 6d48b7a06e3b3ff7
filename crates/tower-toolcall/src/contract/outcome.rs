//! What a tool returns ([`ToolOutput`]) and the per-call [`CallRecord`] that every layer
//! enriches on the way out, so that one conversion at the edge produces the whole
//! [`ToolResult`](crate::ToolResult) envelope.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::contract::error::ToolError;
pub use crate::contract::record::{
    BreakerState, CacheMatch, CallRecord, HedgeRecord, MatchedOn, RetryClamp, RetryRecord,
    ShadowDecision, ShadowVerdict, ShortCircuit,
};

/// The successful output of a tool: its `content` and optional `metadata`.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::ToolOutput;
///
/// let out = ToolOutput::new(json!({"hits": 3})).with_metadata("source", json!("docs.rs"));
/// assert_eq!(out.content, json!({"hits": 3}));
/// assert_eq!(out.metadata.unwrap()["source"], "docs.rs");
/// ```
///
/// The [`CallRecord`] the layers enrich is kept out of line and allocated only when a layer
/// writes to it, so that an output stays small as it moves through the stack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolOutput {
    /// What the tool produced.
    pub content: Value,
    /// Data about the output (timestamps, etags, sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(skip)]
    record: Option<Box<CallRecord>>,
}

impl ToolOutput {
    /// An output with `content` and no metadata.
    pub fn new(content: Value) -> Self {
        ToolOutput {
            content,
            metadata: None,
            record: None,
        }
    }

    /// What the layers recorded about the call.
    pub fn record(&self) -> &CallRecord {
        static EMPTY: CallRecord = CallRecord::EMPTY;
        self.record.as_deref().unwrap_or(&EMPTY)
    }

    /// Mutable access to the record, for layers.
    pub fn record_mut(&mut self) -> &mut CallRecord {
        self.record.get_or_insert_with(Box::default)
    }

    /// Takes the record out, leaving an empty one.
    pub fn take_record(&mut self) -> CallRecord {
        self.record.take().map(|record| *record).unwrap_or_default()
    }

    /// Replaces the record.
    pub fn with_record(mut self, record: CallRecord) -> Self {
        self.record = Some(Box::new(record));
        self
    }

    /// Adds one metadata member.
    pub fn with_metadata(mut self, name: impl Into<String>, value: Value) -> Self {
        self.metadata
            .get_or_insert_with(Map::new)
            .insert(name.into(), value);
        self
    }
}

/// How many times the tool ran for a call that ended with `outcome`: the count the retry
/// layer wrote, else none for a call that was [rejected](ToolError::is_rejected), else one.
pub(crate) fn attempts_of(outcome: &Result<ToolOutput, ToolError>) -> u32 {
    match outcome {
        Ok(output) => output.record().attempts.unwrap_or(1),
        Err(error) => error.attempts(),
    }
}

/// The record of a call's outcome, whichever way it ended.
pub(crate) fn record_of(outcome: &Result<ToolOutput, ToolError>) -> &CallRecord {
    match outcome {
        Ok(output) => output.record(),
        Err(error) => error.record(),
    }
}

/// The record of an outcome, success or error, for a layer to write in.
pub(crate) fn outcome_record_mut(outcome: &mut Result<ToolOutput, ToolError>) -> &mut CallRecord {
    match outcome {
        Ok(output) => output.record_mut(),
        Err(error) => error.record_mut(),
    }
}
