//! The envelopes of a streamed answer (seed 003 §2.2): one per chunk while the tool streams,
//! then the whole result marked as the last chunk.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ResultStatus, ToolResult};
use crate::contract::chunks::Chunk;
use crate::contract::envelope::ToolCall;

/// How much of an answer came in chunks: `streamed` in a [`ToolResult`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StreamTally {
    /// Chunks the tool sent.
    pub chunks: u32,
    /// Their approximate size in bytes.
    pub bytes: u64,
}

impl StreamTally {
    /// What the tool streamed for `call`: `None` when its caller asked for no chunks or the
    /// tool sent none.
    pub(super) fn of(call: &ToolCall) -> Option<StreamTally> {
        let (chunks, bytes) = call.chunk_tap()?.sent();
        (chunks > 0).then_some(StreamTally { chunks, bytes })
    }
}

/// One chunk of an answer still streaming, as a caller reads it: `status: "partial"`,
/// `isStreaming: true`, its `chunkIndex` from 0, `finalChunk: false`, and the chunk as
/// `output.content`. The answer's last envelope is a [`FinalChunk`].
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::envelope::ChunkEnvelope;
///
/// let chunk: ChunkEnvelope = serde_json::from_value(json!({
///     "requestId": "r1", "toolName": "summarize", "status": "partial",
///     "isStreaming": true, "chunkIndex": 0, "finalChunk": false,
///     "output": {"content": "Tower "}
/// }))?;
/// assert_eq!(*chunk.output.content, json!("Tower "));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ChunkEnvelope {
    /// The call's `requestId`.
    pub request_id: String,
    /// The call's `toolName`.
    pub tool_name: String,
    /// Always `partial`.
    pub status: ResultStatus,
    /// Always `true`: more follows.
    pub is_streaming: bool,
    /// The chunk's place in the answer, from 0.
    pub chunk_index: u32,
    /// Always `false`.
    pub final_chunk: bool,
    /// The chunk.
    pub output: ChunkContent,
}

/// `output` of a [`ChunkEnvelope`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChunkContent {
    /// What the tool sent, shared with every other reader of the stream.
    pub content: Arc<Value>,
}

impl ChunkEnvelope {
    /// The envelope of `chunk`, sent for `call`.
    pub fn new(call: &ToolCall, chunk: &Chunk) -> Self {
        ChunkEnvelope {
            request_id: call.request_id().to_owned(),
            tool_name: call.tool_name().to_owned(),
            status: ResultStatus::Partial,
            is_streaming: true,
            chunk_index: chunk.index,
            final_chunk: false,
            output: ChunkContent {
                content: chunk.content.clone(),
            },
        }
    }
}

/// The last envelope of a streamed answer: the whole [`ToolResult`], with `isStreaming:
/// false`, `finalChunk: true` and the `chunkIndex` after the last chunk's.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::envelope::FinalChunk;
/// use tower_toolcall::ResultStatus;
///
/// let last: FinalChunk = serde_json::from_value(json!({
///     "requestId": "r1", "toolName": "summarize", "status": "success", "fromCache": false,
///     "durationMs": 12, "attempts": 1, "output": {"content": "Tower layers"},
///     "streamed": {"chunks": 2, "bytes": 96},
///     "isStreaming": false, "chunkIndex": 2, "finalChunk": true
/// }))?;
/// assert_eq!(last.result.status, ResultStatus::Success);
/// assert_eq!(last.result.streamed.unwrap().chunks, 2);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct FinalChunk {
    /// The whole result.
    #[serde(flatten)]
    pub result: ToolResult,
    /// Always `false`.
    pub is_streaming: bool,
    /// The number of chunks before it.
    pub chunk_index: u32,
    /// Always `true`.
    pub final_chunk: bool,
}

impl FinalChunk {
    /// `result` as the last envelope, after `chunks` chunks.
    pub fn new(result: ToolResult, chunks: u32) -> Self {
        FinalChunk {
            result,
            is_streaming: false,
            chunk_index: chunks,
            final_chunk: true,
        }
    }
}
