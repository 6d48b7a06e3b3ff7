//! The run's events: a bounded stream for the UI, the lossless audit, and the turn trace.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use tower_toolcall::trace::{AuditLog, ExecutionEvent};

/// The events of one run, as a [`Stream`]; it ends when the run has finished.
///
/// The stream is bounded: when its reader falls behind and the buffer is full, new events
/// are dropped (and counted, see [`dropped`](EventStream::dropped)) rather than slow the
/// run's tools. The run's audit directory, when there is one, gets every event.
#[derive(Debug)]
pub struct EventStream {
    receiver: mpsc::Receiver<ExecutionEvent>,
    dropped: Arc<AtomicU64>,
}

impl EventStream {
    /// Events dropped so far because the reader was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Stream for EventStream {
    type Item = ExecutionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx)
    }
}

/// Where the run's events go.
#[derive(Debug)]
pub(crate) struct Emitter {
    run_id: String,
    started: Instant,
    stream: Option<mpsc::Sender<ExecutionEvent>>,
    dropped: Arc<AtomicU64>,
    pub(crate) audit: Option<AuditLog>,
    /// Every event, kept for a replay to compare.
    pub(crate) kept: Option<Vec<ExecutionEvent>>,
}

impl Emitter {
    pub(crate) fn new(run_id: String, capacity: usize) -> (Emitter, EventStream) {
        let (sender, receiver) = mpsc::channel(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        (
            Emitter {
                run_id,
                started: Instant::now(),
                stream: Some(sender),
                dropped: dropped.clone(),
                audit: None,
                kept: None,
            },
            EventStream { receiver, dropped },
        )
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Restarts the run's clock.
    pub(crate) fn start_clock(&mut self, now: Instant) {
        self.started = now;
    }

    /// Milliseconds since the run started.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `true` when anything listens; events are not even built otherwise.
    pub(crate) fn listening(&self) -> bool {
        self.audit.is_some()
            || self.kept.is_some()
            || self.stream.as_ref().is_some_and(|s| !s.is_closed())
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends the event `make` builds, if anything listens.
    pub(crate) fn emit(&mut self, make: impl FnOnce(&str) -> ExecutionEvent) {
        if !self.listening() {
            return;
        }
        let mut event = make(&self.run_id);
        event.elapsed_ms = Some(self.elapsed_ms());
        event.timestamp = Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
        if let Some(kept) = &mut self.kept {
            kept.push(event.clone());
        }
        if let Some(audit) = &self.audit {
            audit.record_event(event.clone());
        }
        if let Some(stream) = &self.stream {
            match stream.try_send(event) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => self.stream = None,
            }
        }
    }

    /// Ends the stream.
    pub(crate) fn close(&mut self) {
        self.stream = None;
    }
}
