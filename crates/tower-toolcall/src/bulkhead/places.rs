//! A set of places, a tool's or a namespace's: the calls running now, the calls waiting for
//! a place, and the refusals.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use priority_semaphore::{AcquireFuture, Permit, PrioritySemaphore};

use crate::envelope::Priority;

/// Whose places they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// One tool's (or every unregistered tool's).
    Tool,
    /// Every registered tool's of one namespace, together.
    Namespace,
}

/// The places of one tool or one namespace, shared by every clone of the layer.
#[derive(Debug)]
pub(super) struct Places {
    /// One permit per place; waiters by priority, then in the order they began to wait.
    semaphore: Arc<PrioritySemaphore>,
    pub(super) scope: Scope,
    pub(super) max_concurrent: usize,
    pub(super) max_queued: usize,
    /// The retry-after of a refused call.
    pub(super) retry_after: Duration,
    /// Calls holding a [`QueueTicket`].
    queued: AtomicUsize,
    /// Calls refused because every place was taken and the queue was full.
    refused: AtomicU64,
}

/// What a call finds at a set of places.
pub(super) enum Entry {
    /// A free place, which it holds.
    Place(Permit),
    /// Every place taken: it waits, holding its place in the queue.
    Queue(QueueTicket),
    /// Every place taken and the queue full: it is refused (and counted).
    Full,
}

impl Places {
    pub(super) fn new(
        scope: Scope,
        max_concurrent: usize,
        max_queued: usize,
        retry_after: Duration,
    ) -> Self {
        Places {
            semaphore: Arc::new(PrioritySemaphore::new(max_concurrent)),
            scope,
            max_concurrent,
            max_queued,
            retry_after,
            queued: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether `other` has the same scope and limits.
    pub(super) fn is_like(&self, other: &Places) -> bool {
        (
            self.scope,
            self.max_concurrent,
            self.max_queued,
            self.retry_after,
        ) == (
            other.scope,
            other.max_concurrent,
            other.max_queued,
            other.retry_after,
        )
    }

    /// A place at once if one is free and no call waits for one; else a place in the queue
    /// if it is not full; else a refusal, counted.
    pub(super) fn enter(self: &Arc<Self>) -> Entry {
        if let Ok(permit) = self.semaphore.try_acquire(0) {
            return Entry::Place(permit);
        }
        let max = self.max_queued;
        let joined = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < max).then_some(queued + 1)
            });
        if joined.is_ok() {
            return Entry::Queue(QueueTicket(self.clone()));
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Entry::Full
    }

    /// Waits for a place, before the calls of lower `priority` and after those of the same
    /// priority that began to wait earlier. Dropping the future leaves the queue.
    pub(super) fn wait(&self, priority: Priority) -> AcquireFuture {
        let rank = match priority {
            Priority::Low => 0,
            Priority::High => 2,
            _ => 1,
        };
        self.semaphore.acquire(rank)
    }

    pub(super) fn in_use(&self) -> usize {
        self.max_concurrent
            .saturating_sub(self.semaphore.available_permits())
    }

    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// A call's place in a queue, given back when dropped: when the call gets a place, leaves
/// at its deadline, or is cancelled.
#[derive(Debug)]
pub(super) struct QueueTicket(Arc<Places>);

impl QueueTicket {
    /// The places whose queue it is.
    pub(super) fn places(&self) -> &Arc<Places> {
        &self.0
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The places of a tool's calls: its own, then its namespace's; at least one of them.
#[derive(Debug)]
pub(super) struct Limits {
    pub(super) tool: Option<Arc<Places>>,
    pub(super) namespace: Option<Arc<Places>>,
}

/// The places a call holds, each given back when the call ends or is dropped.
#[derive(Debug, Default)]
pub(super) struct Held {
    tool: Option<Permit>,
    namespace: Option<Permit>,
}

impl Held {
    /// Holds `permit`, a place of the places of `scope`.
    pub(super) fn hold(&mut self, scope: Scope, permit: Permit) {
        match scope {
            Scope::Tool => self.tool = Some(permit),
            Scope::Namespace => self.namespace = Some(permit),
        }
    }

    pub(super) fn holds_any(&self) -> bool {
        self.tool.is_some() || self.namespace.is_some()
    }
}
