//! The breakers made on demand — those of unregistered tools and of their namespaces — in a
//! map of bounded size. When it is full, the breakers idle the longest are evicted, closed
//! ones first; a breaker in use, or one an operator forced open, is never evicted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
#[cfg(test)]
use std::time::Duration;

use tokio::time::Instant;

use super::cell::BreakerCell;
use crate::bounds::CallerKeyHasher;
use crate::event::BreakerKey;
use crate::outcome::BreakerState;

/// The share of the map evicted at once when it is full, so that a full map does not scan
/// on every insertion.
const EVICT_DIVISOR: usize = 8;

#[derive(Debug)]
pub(crate) struct BreakerMap {
    capacity: usize,
    inner: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    /// namespace → name → breaker, so that a call is looked up without allocating.
    tools: HashMap<String, HashMap<String, Arc<BreakerCell>, CallerKeyHasher>, CallerKeyHasher>,
    dependencies: HashMap<String, Arc<BreakerCell>, CallerKeyHasher>,
    len: usize,
}

impl BreakerMap {
    pub(crate) fn new(capacity: usize) -> Self {
        BreakerMap {
            capacity,
            inner: Mutex::new(Maps::default()),
        }
    }

    /// The breaker of the tool `namespace::name`, made by `make` when there is none.
    pub(crate) fn tool(
        &self,
        namespace: &str,
        name: &str,
        make: impl FnOnce() -> BreakerCell,
    ) -> Arc<BreakerCell> {
        let mut maps = self.lock();
        if let Some(cell) = maps.tools.get(namespace).and_then(|names| names.get(name)) {
            return cell.clone();
        }
        let cell = Arc::new(make());
        if self.make_room(&mut maps) {
            maps.tools
                .entry(namespace.to_owned())
                .or_default()
                .insert(name.to_owned(), cell.clone());
            maps.len += 1;
        }
        cell
    }

    /// The breaker of the dependency `namespace`, made by `make` when there is none.
    pub(crate) fn dependency(
        &self,
        namespace: &str,
        make: impl FnOnce() -> BreakerCell,
    ) -> Arc<BreakerCell> {
        let mut maps = self.lock();
        if let Some(cell) = maps.dependencies.get(namespace) {
            return cell.clone();
        }
        let cell = Arc::new(make());
        if self.make_room(&mut maps) {
            maps.dependencies.insert(namespace.to_owned(), cell.clone());
            maps.len += 1;
        }
        cell
    }

    /// The breaker with `key`, if the map holds it.
    pub(crate) fn find(&self, key: &BreakerKey) -> Option<Arc<BreakerCell>> {
        let maps = self.lock();
        match key {
            BreakerKey::Tool { namespace, name } => maps.tools.get(namespace)?.get(name).cloned(),
            BreakerKey::Dependency { namespace } => maps.dependencies.get(namespace).cloned(),
            BreakerKey::Global => None,
        }
    }

    /// Every breaker the map holds.
    pub(crate) fn cells(&self) -> Vec<Arc<BreakerCell>> {
        let maps = self.lock();
        maps.tools
            .values()
            .flat_map(HashMap::values)
            .chain(maps.dependencies.values())
            .cloned()
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes room for one more breaker; `false` when every breaker is in use, in which case
    /// the new one serves its call without being kept.
    fn make_room(&self, maps: &mut Maps) -> bool {
        if maps.len < self.capacity {
            return true;
        }
        // Idle breakers (held by the map alone), closed ones first, then the least recently
        // used; never one forced open, which only an operator's reset ends.
        let mut idle: Vec<(bool, Option<Instant>, BreakerKey)> = maps
            .tools
            .values()
            .flat_map(HashMap::values)
            .chain(maps.dependencies.values())
            .filter(|cell| Arc::strong_count(cell) == 1)
            .filter_map(|cell| {
                let (last_used, state) = cell.idle_since();
                (state != BreakerState::ForcedOpen)
                    .then(|| (state != BreakerState::Closed, last_used, cell.key().clone()))
            })
            .collect();
        if idle.is_empty() {
            tracing::warn!(
                capacity = self.capacity,
                "every circuit breaker made on demand is in use or forced open; a new one is \
                 not kept"
            );
            return false;
        }
        idle.sort();
        let evict = (self.capacity / EVICT_DIVISOR).clamp(1, idle.len());
        for (_, _, key) in idle.into_iter().take(evict) {
            let removed = match &key {
                BreakerKey::Tool { namespace, name } => {
                    let names = maps.tools.get_mut(namespace);
                    let removed = names.and_then(|names| names.remove(name));
                    if maps.tools.get(namespace).is_some_and(HashMap::is_empty) {
                        maps.tools.remove(namespace);
                    }
                    removed
                }
                BreakerKey::Dependency { namespace } => maps.dependencies.remove(namespace),
                BreakerKey::Global => None,
            };
            if removed.is_some() {
                maps.len -= 1;
            }
        }
        tracing::debug!(evicted = evict, "evicted idle circuit breakers");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::admin::Events;
    use crate::breaker::state::{Admission, BreakerConfig, CallOutcome};

    fn cell(name: &str) -> BreakerCell {
        BreakerCell::new(
            BreakerKey::tool("ns", name),
            BreakerConfig::default().with_consecutive_failures(1),
            Arc::new(Events::default()),
        )
    }

    fn used(cell: &BreakerCell, outcome: CallOutcome) {
        let Admission::Admitted(ticket) = cell.admit() else {
            panic!("closed breakers admit");
        };
        cell.record(ticket, outcome);
    }

    #[tokio::test(start_paused = true)]
    async fn evicts_idle_closed_breakers_first_and_never_one_in_use() {
        let map = BreakerMap::new(3);
        let open = map.tool("ns", "open", || cell("open"));
        used(&open, CallOutcome::Failure);
        drop(open);
        tokio::time::advance(Duration::from_secs(1)).await;
        let busy = map.tool("ns", "busy", || cell("busy"));
        tokio::time::advance(Duration::from_secs(1)).await;
        used(
            &map.tool("ns", "idle", || cell("idle")),
            CallOutcome::Success,
        );
        assert_eq!(map.len(), 3);

        // Full: the open breaker is older, but the idle closed one goes first.
        let new = map.tool("ns", "new", || cell("new"));
        assert_eq!(map.len(), 3);
        assert!(map.find(&BreakerKey::tool("ns", "idle")).is_none());
        assert!(map.find(&BreakerKey::tool("ns", "open")).is_some());

        // With no idle closed one left, the idle open one goes; never one in use.
        map.tool("ns", "newer", || cell("newer"));
        assert!(map.find(&BreakerKey::tool("ns", "open")).is_none());
        assert!(map.find(&BreakerKey::tool("ns", "busy")).is_some());
        assert!(map.find(&BreakerKey::tool("ns", "new")).is_some());

        // Every breaker in use: a new one serves its call but is not kept.
        let held: Vec<_> = map.cells();
        let transient = map.tool("ns", "extra", || cell("extra"));
        assert_eq!(map.len(), 3);
        assert!(map.find(transient.key()).is_none());
        drop((held, busy, new));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_open_breaker_is_never_evicted() {
        let map = BreakerMap::new(2);
        map.tool("ns", "forced", || cell("forced")).force_open();
        tokio::time::advance(Duration::from_secs(1)).await;
        // Many new breakers pass through; the forced-open one stays.
        for n in 0..100 {
            let name = format!("t{n}");
            map.tool("ns", &name, || cell(&name));
        }
        let forced = map.find(&BreakerKey::tool("ns", "forced")).unwrap();
        assert_eq!(forced.status().state, BreakerState::ForcedOpen);
        drop(forced);

        // A map full of forced-open breakers keeps them all and does not keep a new one.
        map.tool("ns", "forced-2", || cell("forced-2")).force_open();
        assert!(map.find(&BreakerKey::tool("ns", "forced-2")).is_some());
        let transient = map.tool("ns", "extra", || cell("extra"));
        assert!(map.find(transient.key()).is_none());
        assert!(map.find(&BreakerKey::tool("ns", "forced")).is_some());
        assert_eq!(map.len(), 2);
    }
}
