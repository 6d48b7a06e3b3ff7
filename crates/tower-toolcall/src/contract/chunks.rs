//! The chunks of one call's streamed answer: what the tool sends, kept in a bounded window that every reader
//! reads from its own place.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures_util::Stream;
use serde_json::Value;
use tokio::time::Instant;

use crate::contract::json_size::json_bytes;

/// How many bytes of chunks (by their approximate size in memory) a call keeps for readers
/// that have not read them yet, and for a duplicate that joins the stream from its start:
/// 1 MiB. Older chunks beyond it are let go; a reader that had not read them skips them.
pub const REPLAY_BYTES: usize = 1 << 20;

/// One chunk of a streamed answer: its place in the stream, from 0, and its content.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Chunk {
    /// Its place in the stream: 0 for the first chunk the tool sent.
    pub index: u32,
    /// What the tool sent; shared by every reader of the stream.
    pub content: Arc<Value>,
}

/// What the chunks of one call share: the window of chunks not yet let go, what was sent in
/// all, and the readers waiting for the next one.
#[derive(Debug)]
pub(crate) struct ChunkTap {
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// The index of `chunks[0]`.
    base: u32,
    chunks: VecDeque<(Arc<Value>, usize)>,
    /// The bytes of `chunks`.
    kept_bytes: usize,
    /// Chunks and bytes the tool sent in all.
    sent: u32,
    sent_bytes: u64,
    /// When the last chunk was sent.
    last_at: Option<Instant>,
    /// The readers waiting for a chunk, by reader id.
    waiting: Vec<(u64, Waker)>,
    next_reader: u64,
}

impl ChunkTap {
    pub(crate) fn new() -> Arc<ChunkTap> {
        Arc::new(ChunkTap {
            state: Mutex::new(Window::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        // A reader or the sender never panics while it holds the lock; a poisoned window is
        // still whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends one chunk to every reader.
    pub(crate) fn push(&self, content: Arc<Value>) {
        let bytes = json_bytes(&content);
        let waiting = {
            let mut window = self.lock();
            window.chunks.push_back((content, bytes));
            window.kept_bytes += bytes;
            window.sent = window.sent.saturating_add(1);
            window.sent_bytes = window.sent_bytes.saturating_add(bytes as u64);
            window.last_at = Some(Instant::now());
            while window.kept_bytes > REPLAY_BYTES && window.chunks.len() > 1 {
                let (_, let_go) = window.chunks.pop_front().expect("more than one chunk");
                window.kept_bytes -= let_go;
                window.base += 1;
            }
            std::mem::take(&mut window.waiting)
        };
        for (_, waker) in waiting {
            waker.wake();
        }
    }

    /// Chunks the tool sent, and their bytes.
    pub(crate) fn sent(&self) -> (u32, u64) {
        let window = self.lock();
        (window.sent, window.sent_bytes)
    }

    /// When the last chunk was sent; `None` before the first.
    pub(crate) fn last_sent_at(&self) -> Option<Instant> {
        self.lock().last_at
    }

    /// A reader from the first chunk (or the oldest one kept).
    pub(crate) fn reader(self: &Arc<Self>) -> ChunkStream {
        let id = {
            let mut window = self.lock();
            window.next_reader += 1;
            window.next_reader
        };
        ChunkStream {
            tap: self.clone(),
            cursor: Cursor {
                id,
                next: 0,
                skipped: 0,
            },
        }
    }
}

/// The tool's end of a call's stream, from [`ToolCall::chunks`](crate::ToolCall::chunks):
/// each [`send`](ChunkSender::send) hands one chunk to the caller at once. It never waits for
/// a reader; a call whose caller asked for no chunks has a sender that drops them, so a tool
/// sends its chunks the same way whoever calls it.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::ToolCall;
///
/// let mut call = ToolCall::builder("agents.tools.docs", "summarize").session("s").actor("u").build()?;
/// assert!(!call.chunks().is_streaming());
/// let mut chunks = call.stream_chunks();
/// call.chunks().send(json!("The first part"));
/// let chunk = chunks.try_next().expect("sent");
/// assert_eq!((chunk.index, &*chunk.content), (0, &json!("The first part")));
/// # Ok::<(), tower_toolcall::ToolError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ChunkSender {
    tap: Option<Arc<ChunkTap>>,
}

impl ChunkSender {
    pub(crate) fn new(tap: Option<Arc<ChunkTap>>) -> Self {
        ChunkSender { tap }
    }

    /// Sends one chunk of the answer. The tool still answers the call with its whole result
    /// when it is done: the layers judge, store and compare that one.
    pub fn send(&self, content: Value) {
        if let Some(tap) = &self.tap {
            tap.push(Arc::new(content));
        }
    }

    /// Whether a caller reads the chunks; `false` when they are dropped.
    pub fn is_streaming(&self) -> bool {
        self.tap.is_some()
    }
}

/// The caller's end of a call's stream, from
/// [`ToolCall::stream_chunks`](crate::ToolCall::stream_chunks): the chunks in the order the
/// tool sent them, each once. It does not end by itself: the call's future ending is the end
/// of the stream, after the chunks still unread ([`Streamed`](crate::stream::Streamed) reads both).
#[derive(Debug)]
pub struct ChunkStream {
    tap: Arc<ChunkTap>,
    cursor: Cursor,
}

/// Where a reader is in the stream.
#[derive(Debug)]
struct Cursor {
    id: u64,
    next: u32,
    skipped: u32,
}

impl Cursor {
    fn take(&mut self, window: &Window) -> Option<Chunk> {
        if self.next < window.base {
            self.skipped += window.base - self.next;
            self.next = window.base;
        }
        let (content, _) = window.chunks.get((self.next - window.base) as usize)?;
        let chunk = Chunk {
            index: self.next,
            content: content.clone(),
        };
        self.next += 1;
        Some(chunk)
    }
}

impl ChunkStream {
    /// The next chunk if one was sent and not read yet.
    pub fn try_next(&mut self) -> Option<Chunk> {
        let window = self.tap.lock();
        self.cursor.take(&window)
    }

    /// Chunks this reader never got: they were let go from the window
    /// ([`REPLAY_BYTES`]) before it read them.
    pub fn skipped(&self) -> u32 {
        self.cursor.skipped
    }

    /// Chunks the tool sent in all, and their approximate size in bytes.
    pub fn sent(&self) -> (u32, u64) {
        self.tap.sent()
    }
}

impl Stream for ChunkStream {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        let this = &mut *self;
        let mut window = this.tap.lock();
        if let Some(chunk) = this.cursor.take(&window) {
            return Poll::Ready(Some(chunk));
        }
        let id = this.cursor.id;
        match window.waiting.iter_mut().find(|(waiter, _)| *waiter == id) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => window.waiting.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        let id = self.cursor.id;
        self.tap.lock().waiting.retain(|(waiter, _)| *waiter != id);
    }
}
