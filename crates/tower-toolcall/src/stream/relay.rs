//! Chunks read from one call's stream and sent on to another's: how a duplicate that joins a
//! running call gets that call's chunks.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use futures_util::future::{select, Either};
use futures_util::StreamExt;

use crate::contract::chunks::{ChunkStream, ChunkTap};

/// Sends the chunks of one stream, from its first, to another.
#[derive(Debug)]
pub(crate) struct Relay {
    from: ChunkStream,
    to: Arc<ChunkTap>,
}

impl Relay {
    /// A relay from `from`'s first chunk to `to`; `None` when they are one stream.
    pub(crate) fn new(from: &Arc<ChunkTap>, to: &Arc<ChunkTap>) -> Option<Relay> {
        (!Arc::ptr_eq(from, to)).then(|| Relay {
            from: from.reader(),
            to: to.clone(),
        })
    }

    /// Awaits `wait`, sending chunks on while it runs and the ones still unread when it ends:
    /// every chunk sent before `wait` ended is sent on, once.
    pub(crate) async fn during<F: Future>(&mut self, wait: F) -> F::Output {
        let output = match select(pin!(wait), pin!(self.forward())).await {
            Either::Left((output, _)) => output,
            Either::Right((never, _)) => match never {},
        };
        while let Some(chunk) = self.from.try_next() {
            self.to.push(chunk.content);
        }
        output
    }

    async fn forward(&mut self) -> Infallible {
        loop {
            match self.from.next().await {
                Some(chunk) => self.to.push(chunk.content),
                // A chunk stream never ends by itself.
                None => std::future::pending::<()>().await,
            }
        }
    }
}
