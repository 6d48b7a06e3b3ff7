//! A call's future and its chunks read as one stream: the chunks as they come, then the
//! answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use pin_project_lite::pin_project;

use crate::contract::chunks::{Chunk, ChunkStream};

/// One item of a [`Streamed`] call: a chunk, or the call's answer, which comes last.
#[derive(Debug)]
#[non_exhaustive]
pub enum StreamPart<T> {
    /// A chunk the tool sent.
    Chunk(Chunk),
    /// The call's answer: the whole result, or the error that ended it.
    Done(T),
}

pin_project! {
    /// A call's future and the [`ChunkStream`] of the same call, as one [`Stream`]: every
    /// chunk in order, then the call's answer, then the end. A chunk sent before the call
    /// answered always comes before the answer.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use serde_json::json;
    /// use tower::ServiceExt;
    /// use tower_toolcall::stream::{StreamPart, Streamed};
    /// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
    ///
    /// # tokio_test::block_on(async {
    /// let tool = tool_fn(|call: ToolCall| async move {
    ///     for part in ["a", "b"] {
    ///         call.chunks().send(json!(part));
    ///     }
    ///     Ok(ToolOutput::new(json!("ab")))
    /// });
    /// let mut call = ToolCall::builder("agents.tools.docs", "spell").session("s").actor("u").build()?;
    /// let chunks = call.stream_chunks();
    /// let parts: Vec<_> = Streamed::new(tool.oneshot(call), chunks).collect().await;
    /// assert!(matches!(&parts[0], StreamPart::Chunk(c) if *c.content == json!("a")));
    /// assert!(matches!(&parts[1], StreamPart::Chunk(c) if c.index == 1));
    /// assert!(matches!(&parts[2], StreamPart::Done(Ok(out)) if out.content == json!("ab")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[derive(Debug)]
    #[must_use = "streams do nothing unless polled"]
    pub struct Streamed<F>
    where
        F: Future,
    {
        #[pin]
        call: F,
        chunks: ChunkStream,
        answer: Option<F::Output>,
        ended: bool,
    }
}

impl<F: Future> Streamed<F> {
    /// Reads `call`, the future of a call, and `chunks`, the stream of the same call.
    pub fn new(call: F, chunks: ChunkStream) -> Self {
        Streamed {
            call,
            chunks,
            answer: None,
            ended: false,
        }
    }

    /// The chunks of the call: how many were sent, and how many this reader skipped.
    pub fn chunks(&self) -> &ChunkStream {
        &self.chunks
    }
}

impl<F: Future> Stream for Streamed<F> {
    type Item = StreamPart<F::Output>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if this.answer.is_none() {
            if let Poll::Ready(Some(chunk)) = Pin::new(&mut *this.chunks).poll_next(cx) {
                return Poll::Ready(Some(StreamPart::Chunk(chunk)));
            }
            match this.call.as_mut().poll(cx) {
                Poll::Ready(answer) => *this.answer = Some(answer),
                Poll::Pending => return Poll::Pending,
            }
        }
        // The call answered: the chunks it sent before come first.
        if let Some(chunk) = this.chunks.try_next() {
            return Poll::Ready(Some(StreamPart::Chunk(chunk)));
        }
        *this.ended = true;
        Poll::Ready(this.answer.take().map(StreamPart::Done))
    }
}
