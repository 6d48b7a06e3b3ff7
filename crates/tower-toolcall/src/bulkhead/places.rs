//! A tool's places: the calls running now, the calls waiting for a place, and the refusals.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use priority_semaphore::{AcquireFuture, Permit, PrioritySemaphore};

use crate::envelope::Priority;

/// The places of one tool, shared by every clone of the layer.
#[derive(Debug)]
pub(super) struct ToolPlaces {
    /// One permit per place; waiters by priority, then in the order they began to wait.
    semaphore: Arc<PrioritySemaphore>,
    pub(super) max_concurrent: usize,
    pub(super) max_queued: usize,
    /// The retry-after of a refused call.
    pub(super) retry_after: Duration,
    /// Calls holding a [`QueueTicket`].
    queued: AtomicUsize,
    /// Calls refused because every place was taken and the queue was full.
    refused: AtomicU64,
}

impl ToolPlaces {
    pub(super) fn new(max_concurrent: usize, max_queued: usize, retry_after: Duration) -> Self {
        ToolPlaces {
            semaphore: Arc::new(PrioritySemaphore::new(max_concurrent)),
            max_concurrent,
            max_queued,
            retry_after,
            queued: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// A place at once, if one is free and no call waits for one.
    pub(super) fn try_enter(&self) -> Option<Permit> {
        self.semaphore.try_acquire(0).ok()
    }

    /// A place in the queue, if it is not full; the ticket gives it back when dropped.
    pub(super) fn join_queue(self: &Arc<Self>) -> Option<QueueTicket> {
        let max = self.max_queued;
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < max).then_some(queued + 1)
            })
            .ok()?;
        Some(QueueTicket(self.clone()))
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

    pub(super) fn count_refusal(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
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

/// A call's place in its tool's queue, given back when dropped: when the call gets a place,
/// leaves at its deadline, or is cancelled.
#[derive(Debug)]
pub(super) struct QueueTicket(Arc<ToolPlaces>);

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}
