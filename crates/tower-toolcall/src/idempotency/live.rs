//! The streams of the calls running in this process, by store key: a duplicate that asked
//! for chunks and joins a running call reads that call's chunks from the first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::bounds::CallerKeyHasher;
use crate::stream::{ChunkTap, Relay};

/// The chunk streams of running calls whose callers read chunks.
#[derive(Debug, Default)]
pub(super) struct LiveStreams {
    running: Mutex<HashMap<Arc<str>, Weak<ChunkTap>, CallerKeyHasher>>,
}

impl LiveStreams {
    /// Makes `tap`, the stream of the call that holds `key`, readable by the calls that join
    /// it, until the returned guard drops.
    pub(super) fn publish(self: &Arc<Self>, key: &Arc<str>, tap: &Arc<ChunkTap>) -> Published {
        self.lock().insert(key.clone(), Arc::downgrade(tap));
        Published {
            streams: self.clone(),
            key: key.clone(),
            tap: Arc::downgrade(tap),
        }
    }

    /// A relay from the stream of the call running under `key` to `to`, the stream of a call
    /// that joins it; `None` when that call's caller reads no chunks.
    pub(super) fn relay(&self, key: &str, to: &Arc<ChunkTap>) -> Option<Relay> {
        let from = self.lock().get(key)?.upgrade()?;
        Relay::new(&from, to)
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Weak<ChunkTap>, CallerKeyHasher>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps a running call's stream readable; dropped when the call ends.
#[derive(Debug)]
pub(super) struct Published {
    streams: Arc<LiveStreams>,
    key: Arc<str>,
    tap: Weak<ChunkTap>,
}

impl Drop for Published {
    fn drop(&mut self) {
        let mut running = self.streams.lock();
        // A later call may hold the key now: remove this call's stream only.
        if running
            .get(&self.key)
            .is_some_and(|tap| tap.ptr_eq(&self.tap))
        {
            running.remove(&self.key);
        }
    }
}
