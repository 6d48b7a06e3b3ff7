//! The wire format: the [`ToolCall`] envelope (contract version 1.1), its parts, and the
//! [`ToolResult`] envelope.
//!
//! Both serialize to camelCase JSON exactly as the contract describes. Required fields of a
//! call: `contractVersion` (`"1.1"`), `requestId`, `toolName`, `toolNamespace`,
//! `target.sessionKey`, `target.actorId`, `payload.version` (`"1.0"`) and `payload.params`
//! (an object). The sections `transport`, `control` and `trace` may be absent; the layers
//! then use the tool's policy. Unknown members are ignored.
//!
//! [`ToolCall::from_json`] takes I-JSON (RFC 7493) only, in known and unknown members alike:
//! an object where the contract says object (never the array of its fields that serde would
//! take for a struct), no member name twice in one object, valid Unicode, and numbers that a
//! double can hold. Identifiers have at most [`MAX_IDENTIFIER_BYTES`] bytes, the idempotency
//! key at most [`MAX_IDEMPOTENCY_KEY_BYTES`].

mod builder;
mod call;
mod ijson;
mod into_result;
pub(crate) mod params;
mod parse;
mod result;

pub use builder::ToolCallBuilder;
pub use call::{
    BreakerScope, CallEnvelope, CallHints, Control, DedupeMode, Iteration, Payload, RetryBudget,
    RunLink, Target, ToolCall, TraceContext, Transport, CONTRACT_VERSION,
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_IDENTIFIER_BYTES, MAX_TRACEPARENT_BYTES, PAYLOAD_VERSION,
};
pub use into_result::{ResultEnvelope, ResultEnvelopeFuture, ResultEnvelopeLayer};
pub use params::Params;
pub use result::{ResultError, ResultStatus, ToolResult};
