//! The wire contract: the types on the wire and the vocabulary every layer speaks.
//!
//! - [`envelope`]: the [`ToolCall`](envelope::ToolCall) envelope of contract version 1.1, its
//!   parts and its parser; [`result`]: the [`ToolResult`](result::ToolResult) envelope made
//!   from a call's outcome (both public as `tower_toolcall::envelope`);
//! - [`error`]: [`ToolError`](error::ToolError) and its stable [`ErrorCode`](error::ErrorCode)s,
//!   and the [`ConfigError`](error::ConfigError) of bad configuration;
//! - [`outcome`]: what a tool returns ([`ToolOutput`](outcome::ToolOutput)); `record`: the
//!   [`CallRecord`](outcome::CallRecord) every layer writes in;
//! - [`registry`]: the tools, their risk, schemas and per-layer policy;
//! - [`control`]: the operator's switches (kill switch, shadow mode, rollout);
//! - [`classify`]: the one verdict on an outcome that every layer reads;
//! - [`canonical`]: canonical JSON of params, and the keys derived from it;
//! - [`time`]: durations in milliseconds, as the records count them;
//! - [`event`]: what layers report as it happens ([`LayerEvent`](event::LayerEvent)), and the
//!   [`EventSink`](event::EventSink)s that hear it.
//!
//! The modules stand in layers, each importing only modules below it (the nearest in
//! brackets), so that a change low in the contract is seen by all above it and none of it
//! depends on a layer:
//!
//! ```text
//! event        what layers report, and its sinks    (registry, envelope, outcome)
//! result       the result envelope                  (classify, envelope, outcome)
//! classify     the verdict on an outcome            (registry, outcome)
//! registry     tools and their policy               (control, envelope)
//! control      the operator's switches              (envelope, error, record)
//! envelope     the call envelope                    (canonical, time, error)
//! canonical, time, outcome                          (error)
//! error        ToolError, ErrorCode, ConfigError    (record)
//! record       CallRecord and its parts, ShadowLayer
//! ```
//!
//! Everything above the contract (the layers, the stack, the adapters) imports it; the
//! contract imports nothing above it. Its public types are what callers, tools and stored
//! records depend on: change them only compatibly (a new field of a `#[non_exhaustive]`
//! record, a new variant, a new constructor), never their wire form.

pub mod canonical;
pub(crate) mod chunks;
pub mod classify;
pub mod control;
pub(crate) mod envelope;
pub(crate) mod error;
pub mod event;
pub(crate) mod json_size;
pub(crate) mod outcome;
mod record;
pub mod registry;
pub(crate) mod result;
mod serde_message;
pub mod time;
