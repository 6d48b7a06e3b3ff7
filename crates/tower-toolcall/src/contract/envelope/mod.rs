//! The call envelope: [`ToolCall`] (contract version 1.1), its parts, its parser and its
//! builder. Public, with the result envelope, as [`tower_toolcall::envelope`](crate::envelope).

mod builder;
mod call;
mod ijson;
pub(crate) mod params;
mod parse;
mod principal;
mod resolution;

pub use builder::ToolCallBuilder;
pub use call::{
    BreakerScope, CallEnvelope, CallHints, CallRetryPolicy, Control, DedupeMode, Iteration,
    KeyScope, Payload, Priority, RetryBudget, RunLink, Target, ToolCall, TraceContext, Transport,
    CONTRACT_VERSION, MAX_IDEMPOTENCY_KEY_BYTES, MAX_IDENTIFIER_BYTES, MAX_TRACEPARENT_BYTES,
    PAYLOAD_VERSION,
};
pub use params::{json_kind, Params};
pub use principal::Principal;
pub(crate) use resolution::next_registry_id;
