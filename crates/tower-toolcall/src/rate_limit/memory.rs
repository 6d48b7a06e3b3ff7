//! Quotas kept by the process, apart from any one layer: what outlives a layer rebuilt with
//! another registry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashlink::LruCache;
use tokio::time::Instant;

use super::store::{Admission, Quota, RateLimitStore};
use crate::shared_store::StoreFuture;

/// The keys an [`InMemoryRateLimitStore`] keeps unless told otherwise.
const DEFAULT_MEMORY_STORE_KEYS: usize = 100_000;

/// Quotas kept in this process, for a [`RateLimitLayer`](super::RateLimitLayer) that is built
/// again while the process runs (a gateway that reloads its configuration, or rebuilds its
/// stack when its tools change): the layers built with one store (clones share it) draw on
/// the same quotas, so that a rebuild never refills them.
///
/// GCRA, as the Redis store keeps it: each key's theoretical arrival time, for at most
/// `max_keys` keys (the least recently used one makes room, with its quota as good as full
/// by then). Time is tokio's.
///
/// ```
/// use std::sync::Arc;
/// use tower_toolcall::rate_limit::{InMemoryRateLimitStore, RateLimitLayer, RateLimitStore};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let quotas: Arc<dyn RateLimitStore> = Arc::new(InMemoryRateLimitStore::default());
/// // Each rebuild of the layer draws on the same quotas.
/// let layer = RateLimitLayer::builder(ToolRegistry::open()).store(quotas.clone()).build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct InMemoryRateLimitStore {
    arrivals: Arc<Mutex<LruCache<String, Instant>>>,
}

impl Default for InMemoryRateLimitStore {
    fn default() -> Self {
        InMemoryRateLimitStore::with_max_keys(DEFAULT_MEMORY_STORE_KEYS)
    }
}

impl InMemoryRateLimitStore {
    /// A store of at most `max_keys` keys (at least 1).
    pub fn with_max_keys(max_keys: usize) -> Self {
        InMemoryRateLimitStore {
            arrivals: Arc::new(Mutex::new(LruCache::new(max_keys.max(1)))),
        }
    }

    /// The keys it keeps now.
    pub fn len(&self) -> usize {
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// `true` when it keeps no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn admit(&self, key: &str, quota: Quota) -> Admission {
        let now = Instant::now();
        let interval = quota.emission_interval();
        let tolerance = interval * quota.burst.max(1).saturating_sub(1);
        let mut arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        // A key seen before is updated in place: no allocation on a call of a known key.
        let Some(stored) = arrivals.get_mut(key) else {
            arrivals.insert(key.to_owned(), now + interval);
            return Admission::Allowed;
        };
        let arrival = (*stored).max(now);
        // The call is allowed once `arrival - tolerance` has passed.
        let wait = arrival
            .saturating_duration_since(now)
            .saturating_sub(tolerance);
        if wait > Duration::ZERO {
            return Admission::RetryAfter(wait);
        }
        *stored = arrival + interval;
        Admission::Allowed
    }
}

impl RateLimitStore for InMemoryRateLimitStore {
    fn acquire(&self, key: &str, quota: Quota) -> StoreFuture<'static, Admission> {
        let admission = self.admit(key, quota);
        Box::pin(std::future::ready(Ok(admission)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let store = InMemoryRateLimitStore::default();
        let quota = Quota {
            per_second: 2,
            burst: 3,
        };
        for _ in 0..3 {
            assert_eq!(store.admit("k", quota), Admission::Allowed);
        }
        assert_eq!(
            store.admit("k", quota),
            Admission::RetryAfter(Duration::from_millis(500))
        );
        // Another key has its own.
        assert_eq!(store.admit("other", quota), Admission::Allowed);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(store.admit("k", quota), Admission::Allowed);
        assert_eq!(
            store.admit("k", quota),
            Admission::RetryAfter(Duration::from_millis(500))
        );
        // Idle long enough, the burst is whole again.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..3 {
            assert_eq!(store.admit("k", quota), Admission::Allowed);
        }
    }

    #[test]
    fn its_keys_are_bounded() {
        let store = InMemoryRateLimitStore::with_max_keys(2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let quota = Quota {
            per_second: 1,
            burst: 1,
        };
        rt.block_on(async {
            for key in ["a", "b", "c"] {
                store.admit(key, quota);
            }
        });
        assert_eq!(store.len(), 2);
    }
}
