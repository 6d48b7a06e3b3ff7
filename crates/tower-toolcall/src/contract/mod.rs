//! The wire contract: the types on the wire and the vocabulary every layer speaks.
//!
//! - [`envelope`]: the [`ToolCall`](envelope::ToolCall) envelope of contract version 1.1, its
//!   parts and its parser;
//! - [`error`]: [`ToolError`](error::ToolError) and its stable [`ErrorCode`](error::ErrorCode)s,
//!   and the [`ConfigError`](error::ConfigError) of bad configuration;
//! - [`outcome`]: what a tool returns ([`ToolOutput`](outcome::ToolOutput)) and the
//!   [`CallRecord`](outcome::CallRecord) every layer writes in;
//! - [`registry`]: the tools, their risk, schemas and per-layer policy;
//! - [`control`]: the operator's switches (kill switch, shadow mode, rollout);
//! - [`classify`]: the one verdict on an outcome that every layer reads;
//! - [`canonical`]: canonical JSON of params, and the keys derived from it;
//! - [`time`]: milliseconds and the call's deadline, as the records count them.
//!
//! Everything above (the layers, the stack, the adapters) imports the contract; the contract
//! imports nothing above it. Its public types are what callers, tools and stored records
//! depend on: change them only compatibly (a new field of a `#[non_exhaustive]` record, a
//! new variant, a new constructor), never their wire form.

pub mod canonical;
pub mod classify;
pub mod control;
pub mod envelope;
pub(crate) mod error;
pub(crate) mod outcome;
pub mod registry;
mod serde_message;
pub(crate) mod time;
