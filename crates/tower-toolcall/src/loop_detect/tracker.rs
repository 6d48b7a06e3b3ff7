//! The tracked sessions: a bounded map from session key to [`SessionHistory`].
//!
//! Sessions idle for longer than their window are dropped (all their calls have expired);
//! when the map is at its capacity, in sessions or in bytes, the least recently used sessions
//! make room, and the evictions are counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::detector::SessionHistory;
use hashlink::LruCache;

use crate::bounds::CallerKeyHasher;

/// One session's history, shared with the responses still in flight.
pub(super) type SharedHistory = Arc<Mutex<SessionHistory>>;

/// Locks a mutex, ignoring poisoning: the data behind it is consistent after every step.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
pub(super) struct Tracker {
    sessions: Mutex<Sessions>,
    capacity: usize,
    max_bytes: usize,
    evicted: AtomicU64,
}

/// What a session takes in memory besides its key: its entry, its history and room for the
/// calls the history keeps (8 with the default rules).
const SESSION_BYTES: usize = std::mem::size_of::<TrackedSession>()
    + std::mem::size_of::<Mutex<SessionHistory>>()
    + 16 * std::mem::size_of::<(Instant, u64, u64)>();

/// The tracked sessions, the least recently used first, and the sum of their sizes.
#[derive(Debug)]
struct Sessions {
    map: LruCache<Arc<str>, TrackedSession, CallerKeyHasher>,
    bytes: usize,
}

impl Sessions {
    fn pop_oldest(&mut self) -> Option<TrackedSession> {
        let (_, session) = self.map.remove_lru()?;
        self.bytes -= session.bytes;
        Some(session)
    }

    fn remove(&mut self, key: &str) -> Option<TrackedSession> {
        let session = self.map.remove(key)?;
        self.bytes -= session.bytes;
        Some(session)
    }
}

#[derive(Debug)]
struct TrackedSession {
    last_seen: Instant,
    ttl: Duration,
    history: SharedHistory,
    /// The session's size: its key and [`SESSION_BYTES`].
    bytes: usize,
}

impl TrackedSession {
    fn is_idle(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_seen) >= self.ttl
    }
}

impl Tracker {
    pub(super) fn new(capacity: usize, max_bytes: usize) -> Self {
        Tracker {
            sessions: Mutex::new(Sessions {
                map: LruCache::with_hasher(usize::MAX, CallerKeyHasher::default()),
                bytes: 0,
            }),
            capacity,
            max_bytes,
            evicted: AtomicU64::new(0),
        }
    }

    /// The history of `session`, seen at `now` with a window of `ttl`; created when the
    /// session is new.
    pub(super) fn session(&self, session: &str, now: Instant, ttl: Duration) -> SharedHistory {
        let mut sessions = lock(&self.sessions);
        // The least recently used sessions are the idle ones, so this looks at one session
        // unless some are due.
        while (sessions.map.iter().next()).is_some_and(|(_, s)| s.is_idle(now)) {
            sessions.pop_oldest();
        }
        if let Some(tracked) = sessions.map.get_mut(session) {
            tracked.last_seen = now;
            tracked.ttl = ttl;
            return tracked.history.clone();
        }
        if sessions.map.len() >= self.capacity && sessions.pop_oldest().is_some() {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let history = SharedHistory::default();
        let bytes = session.len() + SESSION_BYTES;
        sessions.map.insert(
            Arc::from(session),
            TrackedSession {
                last_seen: now,
                ttl,
                history: history.clone(),
                bytes,
            },
        );
        sessions.bytes += bytes;
        // Older sessions make room, down to this one alone.
        while sessions.bytes > self.max_bytes && sessions.map.len() > 1 {
            sessions.pop_oldest();
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        history
    }

    /// The history of `session`, if it is tracked; it is not seen by this.
    pub(super) fn get(&self, session: &str) -> Option<SharedHistory> {
        let sessions = lock(&self.sessions);
        sessions
            .map
            .peek(session)
            .map(|tracked| tracked.history.clone())
    }

    /// Forgets `session`.
    pub(super) fn remove(&self, session: &str) -> bool {
        lock(&self.sessions).remove(session).is_some()
    }

    /// How many sessions are tracked.
    pub(super) fn len(&self) -> usize {
        lock(&self.sessions).map.len()
    }

    /// How many sessions were evicted to stay within the capacity.
    pub(super) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sessions_are_dropped_and_full_maps_evict() {
        let tracker = Tracker::new(3, usize::MAX);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let a = tracker.session("a", t0, ttl);
        assert!(Arc::ptr_eq(&a, &tracker.session("a", t0, ttl)));
        tracker.session("b", t0 + Duration::from_secs(5), ttl);
        tracker.session("c", t0 + Duration::from_secs(6), ttl);
        tracker.session("d", t0 + Duration::from_secs(7), ttl);
        assert_eq!(tracker.len(), 3);
        assert_eq!(tracker.evicted(), 1, "a was the least recently used");
        // At 15 s, b (seen at 5 s) has been idle for its whole window.
        let b = tracker.session("b", t0 + Duration::from_secs(15), ttl);
        assert_eq!(tracker.len(), 3, "b was dropped as idle and tracked afresh");
        assert_eq!(
            tracker.evicted(),
            1,
            "dropping idle sessions is not eviction"
        );
        assert!(!Arc::ptr_eq(&a, &b));
        tracker.session("z", t0 + Duration::from_secs(40), ttl);
        assert_eq!(tracker.len(), 1);
        assert!(tracker.remove("z"));
        assert!(!tracker.remove("z"));
        assert_eq!(tracker.len(), 0);
    }

    #[test]
    fn sessions_beyond_the_bound_in_bytes_are_evicted_oldest_first() {
        let max_bytes = 10 * (1000 + SESSION_BYTES);
        let tracker = Tracker::new(1_000_000, max_bytes);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(600);
        let key = |i: usize| format!("{i:04}{}", "k".repeat(996));
        for i in 0..1000 {
            tracker.session(&key(i), t0, ttl);
            assert!(lock(&tracker.sessions).bytes <= max_bytes, "after {i}");
        }
        assert_eq!(tracker.len(), 10);
        assert_eq!(tracker.evicted(), 990);
        let newest = tracker.session(&key(999), t0, ttl);
        assert!(Arc::ptr_eq(&newest, &tracker.session(&key(999), t0, ttl)));
        assert!(tracker.remove(&key(990)));
        assert!(!tracker.remove(&key(989)), "evicted");
    }
}
