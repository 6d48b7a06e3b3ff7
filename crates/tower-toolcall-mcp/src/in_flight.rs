//! A map of what is in flight, whose entries leave when the work that put them there ends.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Values by key while their work runs; clones share the map.
#[derive(Debug)]
pub(crate) struct InFlight<K, V>(Arc<Mutex<HashMap<K, V>>>);

impl<K, V> Default for InFlight<K, V> {
    fn default() -> Self {
        InFlight(Arc::default())
    }
}

impl<K, V> Clone for InFlight<K, V> {
    fn clone(&self) -> Self {
        InFlight(self.0.clone())
    }
}

impl<K: Hash + Eq + Clone, V: Clone> InFlight<K, V> {
    /// Puts `value` under `key` until the returned entry is dropped.
    pub(crate) fn insert(&self, key: K, value: V) -> Entry<K, V> {
        self.lock().insert(key.clone(), value);
        Entry {
            map: self.clone(),
            key,
        }
    }

    /// Puts `value` under `key` until the returned entry is dropped, unless `key` is already
    /// in flight: then `value` comes back.
    pub(crate) fn insert_new(&self, key: K, value: V) -> Result<Entry<K, V>, V> {
        match self.lock().entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(_) => return Err(value),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(value);
            }
        }
        Ok(Entry {
            map: self.clone(),
            key,
        })
    }

    /// The value under `key`, if its work is still running.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().get(key).cloned()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes its key from the map when dropped.
pub(crate) struct Entry<K: Hash + Eq + Clone, V: Clone> {
    map: InFlight<K, V>,
    key: K,
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Entry<K, V> {
    fn drop(&mut self) {
        self.map.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_leaves_when_dropped() {
        let map = InFlight::<String, u32>::default();
        let entry = map.insert("a".to_owned(), 1);
        assert_eq!(map.clone().get("a"), Some(1));
        drop(entry);
        assert_eq!(map.get("a"), None);
    }

    #[test]
    fn a_key_in_flight_is_not_taken_twice() {
        let map = InFlight::<String, u32>::default();
        let first = map.insert_new("a".to_owned(), 1).unwrap();
        assert_eq!(map.insert_new("a".to_owned(), 2).err(), Some(2));
        assert_eq!(map.get("a"), Some(1));
        drop(first);
        assert!(map.insert_new("a".to_owned(), 3).is_ok());
    }
}
