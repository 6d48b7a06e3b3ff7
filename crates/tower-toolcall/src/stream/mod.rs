//! Streamed answers: a tool that sends its answer in chunks as it makes it, and a caller
//! that reads them while the call runs.
//!
//! A tool sends chunks through [`ToolCall::chunks`](crate::ToolCall::chunks) and still
//! answers the call with its whole result when it is done; a caller that wants the chunks
//! asks for them with [`ToolCall::stream_chunks`](crate::ToolCall::stream_chunks) before it
//! makes the call, and reads them with the call's future as one [`Streamed`] stream. A caller
//! that asks for none gets the whole result, and the tool's chunks cost one branch each. A
//! tool that streams says so in its descriptor
//! ([`ToolDescriptor::streaming`](crate::registry::ToolDescriptor::streaming)), for the
//! callers that list tools.
//!
//! The layers keep their meaning, because every one of them judges the whole result:
//!
//! - validation, policy, loop detection, rate limits and the bulkhead decide before the tool
//!   runs, so before the first chunk; loop detection compares the whole result;
//! - [`RetryLayer`](crate::RetryLayer) retries a call only while no chunk was sent: once one
//!   reached the caller, a failure is final (a new attempt would send the caller its first
//!   chunks again); and it never hedges a call whose caller reads chunks;
//! - [`TimeoutLayer`](crate::TimeoutLayer) bounds the wait for the first chunk by the attempt
//!   timeout, and each gap between chunks by the tool's idle timeout
//!   (`policy.timeout.idle_timeout_ms`, by default the attempt timeout): a stream that keeps
//!   sending is not cut by the attempt timeout, one that stalls is. The retry layer's
//!   deadline and the call's `control.deadlineAtMs` still bound the whole call;
//! - the breaker counts the call's outcome once, when it ends;
//! - [`IdempotencyLayer`](crate::IdempotencyLayer) stores the whole result, within the
//!   store's byte bounds, and a duplicate gets it whole; a duplicate that asked for chunks
//!   and arrives while the first call runs (in this process) gets every chunk from the first,
//!   once each, then the result;
//! - the audit writes one record per call, with the chunks and their bytes
//!   ([`CallRecord::chunks`](crate::CallRecord)).
//!
//! Chunks are kept for readers in a window of [`REPLAY_BYTES`]: a reader that falls further
//! behind skips the chunks let go ([`ChunkStream::skipped`]) and still gets the whole result
//! at the end. The tool never waits for a reader, so a slow or vanished caller never holds a
//! tool up, and a caller that goes away does not stop a call that runs detached
//! ([`detach`](crate::detach)).
//!
//! ```
//! use futures_util::StreamExt;
//! use serde_json::json;
//! use tower::{Layer, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::stream::{StreamPart, Streamed};
//! use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
//!
//! # tokio_test::block_on(async {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.docs", "summarize", RiskLevel::ReadOnly).with_streaming(true))
//!     .build()?;
//! let stack = ToolStack::builder(registry).build()?;
//! let summarize = stack.layer(tool_fn(|call: ToolCall| async move {
//!     let mut whole = String::new();
//!     for part in ["Tower ", "layers ", "compose."] {
//!         call.chunks().send(json!(part));
//!         whole.push_str(part);
//!     }
//!     Ok(ToolOutput::new(json!(whole)))
//! }));
//!
//! let mut call = ToolCall::builder("agents.tools.docs", "summarize").session("s").actor("u").build()?;
//! let chunks = call.stream_chunks();
//! let mut parts = std::pin::pin!(Streamed::new(summarize.oneshot(call), chunks));
//! let mut text = String::new();
//! while let Some(part) = parts.next().await {
//!     match part {
//!         StreamPart::Chunk(chunk) => text.push_str(chunk.content.as_str().unwrap()),
//!         StreamPart::Done(answer) => assert_eq!(answer?.content, json!(text)),
//!         _ => unreachable!(),
//!     }
//! }
//! assert_eq!(text, "Tower layers compose.");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod relay;
mod streamed;

pub(crate) use crate::contract::chunks::ChunkTap;
pub use crate::contract::chunks::{Chunk, ChunkSender, ChunkStream, REPLAY_BYTES};
pub(crate) use relay::Relay;
pub use streamed::{StreamPart, Streamed};
