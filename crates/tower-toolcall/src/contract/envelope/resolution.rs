//! Which registered tool a call is for, remembered by the call: every layer of a stack looks
//! the call's tool up in the registry it was built from, and the first lookup answers the
//! others.
//!
//! A registry has an id of its own, and numbers its tools. A call remembers one answer: the
//! id of the registry that looked it up, and the number of the tool found there (or that the
//! tool is not registered). A registry that finds another registry's answer looks the tool up
//! by name and remembers its own answer instead.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The id of the next registry built; ids count up from 1. When they run out, registries
/// get [`UNCACHED`] and their answers are not remembered.
static NEXT_REGISTRY_ID: AtomicU32 = AtomicU32::new(1);

/// The id of a registry whose answers calls never remember.
const UNCACHED: u32 = u32::MAX;

/// The tool number that stands for "not registered".
const UNREGISTERED: u32 = u32::MAX;

/// A new registry id, never given before in this process.
pub(crate) fn next_registry_id() -> u32 {
    NEXT_REGISTRY_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| {
            (id != UNCACHED).then(|| id + 1)
        })
        .unwrap_or(UNCACHED)
}

/// A call's remembered answer: the registry id in the high half, the tool number in the low
/// half; 0 before any lookup (no registry has id 0).
#[derive(Debug, Default)]
pub(crate) struct ToolResolution(AtomicU64);

impl ToolResolution {
    /// The answer remembered for registry `registry_id`: `Some(Some(index))` for a registered
    /// tool, `Some(None)` for an unregistered one, `None` when that registry has not looked.
    pub(crate) fn get(&self, registry_id: u32) -> Option<Option<u32>> {
        let packed = self.0.load(Ordering::Relaxed);
        if registry_id == UNCACHED || (packed >> 32) as u32 != registry_id {
            return None;
        }
        let index = packed as u32;
        Some((index != UNREGISTERED).then_some(index))
    }

    /// Remembers the answer of registry `registry_id`, in place of any other.
    pub(crate) fn set(&self, registry_id: u32, index: Option<u32>) {
        if registry_id == UNCACHED {
            return;
        }
        let packed = (u64::from(registry_id) << 32) | u64::from(index.unwrap_or(UNREGISTERED));
        self.0.store(packed, Ordering::Relaxed);
    }

    /// Forgets the answer: the call's tool may have changed.
    pub(crate) fn clear(&mut self) {
        *self.0.get_mut() = 0;
    }
}

impl Clone for ToolResolution {
    fn clone(&self) -> Self {
        ToolResolution(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_only_read_back_by_the_registry_that_gave_it() {
        let resolution = ToolResolution::default();
        assert_eq!(resolution.get(1), None);
        resolution.set(7, Some(3));
        assert_eq!(resolution.get(7), Some(Some(3)));
        assert_eq!(resolution.get(8), None);
        resolution.set(8, None);
        assert_eq!(resolution.get(8), Some(None));
        assert_eq!(resolution.get(7), None, "one answer is kept, the latest");
        let copy = resolution.clone();
        assert_eq!(copy.get(8), Some(None));
    }

    #[test]
    fn an_uncached_registry_never_reads_or_writes_an_answer() {
        let resolution = ToolResolution::default();
        resolution.set(UNCACHED, Some(1));
        assert_eq!(resolution.get(UNCACHED), None);
        resolution.set(5, Some(1));
        resolution.set(UNCACHED, Some(2));
        assert_eq!(resolution.get(5), Some(Some(1)));
    }

    #[test]
    fn clearing_forgets_the_answer() {
        let mut resolution = ToolResolution::default();
        resolution.set(5, Some(0));
        resolution.clear();
        assert_eq!(resolution.get(5), None);
    }

    #[test]
    fn registry_ids_are_fresh_and_never_zero() {
        let (a, b) = (next_registry_id(), next_registry_id());
        assert_ne!(a, 0);
        assert_ne!(a, b);
    }
}
