//! [`LruMap`]: a hash map that remembers the order in which its entries were used, so that
//! the least recently used one can be found and dropped in O(1).
//!
//! Entries live in a slab of slots linked into a list from the least to the most recently
//! used; a hash table of slot numbers finds a key's slot. Each slot keeps its key's hash, so
//! that the table never hashes a stored key again, and dropping the oldest entry finds it by
//! its slot number without reading its key. Freed slots are reused, so a map that stays at its
//! capacity allocates nothing more.
//!
//! Each entry may carry an approximate size in bytes ([`LruMap::set_bytes`]), and the map
//! keeps their sum ([`LruMap::bytes`]), so that its users can bound the map in bytes as well
//! as in entries.
//!
//! An entry may also be held outside the order of use ([`LruMap::insert_unordered`]): it is
//! found by its key like any other, but it is never the oldest and never dropped to make
//! room, until [`LruMap::place_newest`] puts it in the order.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;
use serde_json::Value;

/// The hasher of maps keyed by strings that callers choose (sessions, actors, idempotency
/// keys, the names of unregistered tools). It must resist collisions crafted to slow the maps
/// down: foldhash's `quality` hasher is keyed by a seed drawn at random per process and per
/// map, and neither its hashes nor the maps' order are ever observable from outside (results
/// and logs name keys by SHA-256 fingerprints or not at all), so inputs that collide cannot be
/// chosen. It hashes a 150-byte key several times faster than SipHash.
pub(crate) type CallerKeyHasher = foldhash::quality::RandomState;

/// The end of the list.
const NIL: usize = usize::MAX;

/// A hash map ordered by use; see the [module docs](self). `S` hashes the keys.
pub(crate) struct LruMap<K, V, S = RandomState> {
    /// Slot numbers, by the hash of their key.
    index: HashTable<usize>,
    hasher: S,
    slots: Vec<Slot<K, V>>,
    /// Slots that hold no entry, ready for reuse.
    free: Vec<usize>,
    /// The least recently used entry.
    oldest: usize,
    /// The most recently used entry.
    newest: usize,
    /// The sum of the entries' sizes.
    bytes: usize,
}

/// Where an entry lives in the map, as [`LruMap::find_slot`] found it; valid until the map
/// next changes which entries it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotId(usize);

struct Slot<K, V> {
    entry: Option<(K, V)>,
    /// The hash of the entry's key.
    hash: u64,
    /// Toward the least recently used end.
    older: usize,
    /// Toward the most recently used end.
    newer: usize,
    /// The entry's size, as [`LruMap::set_bytes`] gave it.
    bytes: usize,
}

impl<K: Hash + Eq, V> LruMap<K, V> {
    /// An empty map.
    pub(crate) fn new() -> Self {
        LruMap::with_hasher(RandomState::new())
    }
}

impl<K: Hash + Eq, V, S: BuildHasher> LruMap<K, V, S> {
    /// An empty map whose keys are hashed by `hasher`.
    pub(crate) fn with_hasher(hasher: S) -> Self {
        LruMap {
            index: HashTable::new(),
            hasher,
            slots: Vec::new(),
            free: Vec::new(),
            oldest: NIL,
            newest: NIL,
            bytes: 0,
        }
    }

    /// How many entries the map holds.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The sum of the sizes of the entries the map holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sets the size of the entry of `slot` (0 until set).
    pub(crate) fn set_bytes(&mut self, slot: SlotId, bytes: usize) {
        let slot = &mut self.slots[slot.0];
        self.bytes = self.bytes - slot.bytes + bytes;
        slot.bytes = bytes;
    }

    /// Removes the least recently used entry and returns it, unless it is the entry of
    /// `keep`.
    pub(crate) fn pop_oldest_except(&mut self, keep: SlotId) -> Option<(K, V)> {
        if self.oldest == keep.0 {
            return None;
        }
        self.pop_oldest()
    }

    /// The slot of `key`, if the map holds it.
    fn find<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_hashed(self.hasher.hash_one(key), key)
    }

    /// The slot of `key`, whose hash is `hash`, if the map holds it.
    fn find_hashed<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slots = &self.slots;
        self.index
            .find(hash, |&slot| {
                slots[slot].hash == hash
                    && matches!(&slots[slot].entry, Some((k, _)) if k.borrow() == key)
            })
            .copied()
    }

    /// The hash of `key`, for the `*_hashed` and slot methods, so that an operation that
    /// looks a key up and then inserts it hashes it once.
    pub(crate) fn hash_key<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.hasher.hash_one(key)
    }

    /// The slot of `key`, whose hash is `hash` (see [`hash_key`](Self::hash_key)), if the
    /// map holds it; its order of use is left as it is.
    pub(crate) fn find_slot<Q>(&self, hash: u64, key: &Q) -> Option<SlotId>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_hashed(hash, key).map(SlotId)
    }

    /// The slot of `key`, if the map holds it; its order of use is left as it is.
    pub(crate) fn slot_of<Q>(&self, key: &Q) -> Option<SlotId>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key).map(SlotId)
    }

    /// The value in `slot`.
    pub(crate) fn value(&self, slot: SlotId) -> &V {
        let (_, value) = self.slots[slot.0]
            .entry
            .as_ref()
            .expect("a found slot holds an entry");
        value
    }

    /// The value in `slot`, to change; its order of use is left as it is.
    pub(crate) fn value_mut(&mut self, slot: SlotId) -> &mut V {
        let (_, value) = self.slots[slot.0]
            .entry
            .as_mut()
            .expect("a found slot holds an entry");
        value
    }

    /// Inserts `key`, which the map does not hold and whose hash is `hash`, outside the
    /// order of use: [`oldest`](Self::oldest) and [`pop_oldest`](Self::pop_oldest) pass it
    /// by until [`place_newest`](Self::place_newest) puts it in the order.
    pub(crate) fn insert_unordered(&mut self, hash: u64, key: K, value: V) -> SlotId {
        debug_assert!(self.find_hashed(hash, &key).is_none(), "the key is new");
        SlotId(self.occupy(hash, key, value))
    }

    /// Makes the entry of `slot` the most recently used one, whether or not it was in the
    /// order of use.
    pub(crate) fn place_newest(&mut self, slot: SlotId) {
        let slot = slot.0;
        if slot != self.newest {
            self.unlink(slot);
            self.link_newest(slot);
        }
    }

    /// Takes the entry of `slot` out of the order of use, where it is never the oldest.
    pub(crate) fn take_out_of_order(&mut self, slot: SlotId) {
        self.unlink(slot.0);
    }

    /// Removes the entry of `slot`; returns it.
    pub(crate) fn remove_at(&mut self, slot: SlotId) -> (K, V) {
        self.remove_slot(slot.0)
    }

    /// The value of `key`, which becomes the most recently used entry.
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(key)?;
        if slot != self.newest {
            self.unlink(slot);
            self.link_newest(slot);
        }
        self.slots[slot].entry.as_mut().map(|(_, v)| v)
    }

    /// Inserts `key` as the most recently used entry; returns the value it replaces.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = self.hasher.hash_one(&key);
        if let Some(slot) = self.find_hashed(hash, &key) {
            self.unlink(slot);
            self.link_newest(slot);
            let (_, old) = self.slots[slot].entry.as_mut()?;
            return Some(std::mem::replace(old, value));
        }
        let slot = self.occupy(hash, key, value);
        self.link_newest(slot);
        None
    }

    /// Puts an entry in a free slot (a new one when none is free) and in the index, outside
    /// the order of use; returns the slot.
    fn occupy(&mut self, hash: u64, key: K, value: V) -> usize {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot].entry = Some((key, value));
                self.slots[slot].hash = hash;
                self.slots[slot].bytes = 0;
                slot
            }
            None => {
                self.slots.push(Slot {
                    entry: Some((key, value)),
                    hash,
                    older: NIL,
                    newer: NIL,
                    bytes: 0,
                });
                self.slots.len() - 1
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, slot, |&slot| slots[slot].hash);
        slot
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(key)?;
        Some(self.remove_slot(slot).1)
    }

    /// Keeps the entries for which `keep` is true, in their order; returns how many it
    /// removed.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) -> usize {
        let mut removed = 0;
        for slot in 0..self.slots.len() {
            if matches!(&self.slots[slot].entry, Some((k, v)) if !keep(k, v)) {
                self.remove_slot(slot);
                removed += 1;
            }
        }
        removed
    }

    /// The least recently used entry, left in place.
    pub(crate) fn oldest(&self) -> Option<(&K, &V)> {
        let (k, v) = self.slots.get(self.oldest)?.entry.as_ref()?;
        Some((k, v))
    }

    /// Removes the least recently used entry and returns it.
    pub(crate) fn pop_oldest(&mut self) -> Option<(K, V)> {
        if self.oldest == NIL {
            return None;
        }
        Some(self.remove_slot(self.oldest))
    }

    /// Removes the entry of `slot` from the table (found by its slot number, its key unread)
    /// and from the list.
    fn remove_slot(&mut self, slot: usize) -> (K, V) {
        if let Ok(found) = self
            .index
            .find_entry(self.slots[slot].hash, |&other| other == slot)
        {
            found.remove();
        }
        self.unlink(slot);
        self.free.push(slot);
        self.bytes -= std::mem::take(&mut self.slots[slot].bytes);
        self.slots[slot]
            .entry
            .take()
            .expect("an indexed slot holds an entry")
    }

    /// `true` when the entry of `slot` is in the order of use.
    fn is_linked(&self, slot: usize) -> bool {
        let Slot { older, newer, .. } = self.slots[slot];
        older != NIL || newer != NIL || self.oldest == slot
    }

    /// Takes `slot` out of the order of use; a slot outside it is left alone.
    fn unlink(&mut self, slot: usize) {
        if !self.is_linked(slot) {
            return;
        }
        let (older, newer) = (self.slots[slot].older, self.slots[slot].newer);
        match older {
            NIL => self.oldest = newer,
            older => self.slots[older].newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            newer => self.slots[newer].older = older,
        }
        self.slots[slot].older = NIL;
        self.slots[slot].newer = NIL;
    }

    fn link_newest(&mut self, slot: usize) {
        self.slots[slot].older = self.newest;
        self.slots[slot].newer = NIL;
        match self.newest {
            NIL => self.oldest = slot,
            newest => self.slots[newest].newer = slot,
        }
        self.newest = slot;
    }
}

/// The approximate heap size of `value`: each value's own size, and the bytes of its strings
/// and member names. It walks the value without recursion, whatever its depth.
pub(crate) fn json_bytes(value: &Value) -> usize {
    let mut bytes = 0;
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        bytes += std::mem::size_of::<Value>();
        match value {
            Value::String(s) => bytes += s.len(),
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => {
                for (name, member) in map {
                    bytes += std::mem::size_of::<String>() + name.len();
                    pending.push(member);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    bytes
}

impl<K, V, S> fmt::Debug for LruMap<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LruMap")
            .field("len", &self.index.len())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::LruMap;

    fn keys_oldest_first(map: &mut LruMap<String, u32>) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((k, _)) = map.pop_oldest() {
            out.push(k);
        }
        out
    }

    #[test]
    fn use_moves_an_entry_to_the_newest_end() {
        let mut map = LruMap::new();
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(map.insert(k.to_owned(), i as u32), None);
        }
        assert_eq!(map.oldest().map(|(k, _)| k.as_str()), Some("a"));
        *map.get_mut("a").unwrap() += 10;
        assert_eq!(map.insert("b".to_owned(), 7), Some(1));
        assert_eq!(map.oldest(), Some((&"c".to_owned(), &2)));
        assert_eq!(keys_oldest_first(&mut map), ["c", "a", "b"]);
        assert_eq!(map.len(), 0);
        assert!(map.oldest().is_none());
    }

    #[test]
    fn removed_slots_are_reused_and_order_survives() {
        let mut map = LruMap::new();
        for i in 0..5u32 {
            map.insert(i.to_string(), i);
        }
        assert_eq!(map.remove("2"), Some(2));
        assert_eq!(map.remove("2"), None);
        assert_eq!(map.remove("0"), Some(0));
        assert_eq!(map.remove("4"), Some(4));
        map.insert("x".to_owned(), 9);
        map.insert("y".to_owned(), 10);
        assert_eq!(map.slots.len(), 5, "freed slots are reused");
        assert_eq!(map.len(), 4);
        assert_eq!(map.get_mut("missing"), None);
        assert_eq!(keys_oldest_first(&mut map), ["1", "3", "x", "y"]);
    }

    #[test]
    fn a_lookup_keeps_the_order_and_retain_keeps_the_rest_in_order() {
        let mut map = LruMap::new();
        for i in 0..6u32 {
            map.insert(i.to_string(), i);
        }
        let slot = map.slot_of("0").unwrap();
        assert_eq!(map.value(slot), &0);
        assert_eq!(map.slot_of("9"), None);
        assert_eq!(map.oldest().map(|(k, _)| k.as_str()), Some("0"));
        assert_eq!(map.retain(|_, v| v % 2 == 1), 3);
        assert_eq!(map.len(), 3);
        assert_eq!(map.slot_of("2"), None);
        map.insert("x".to_owned(), 7);
        assert_eq!(keys_oldest_first(&mut map), ["1", "3", "5", "x"]);
    }

    #[test]
    fn unordered_entries_are_found_but_never_popped_until_placed() {
        let mut map = LruMap::new();
        map.insert("a".to_owned(), 1);
        let hash = map.hash_key("pinned");
        let pinned = map.insert_unordered(hash, "pinned".to_owned(), 2);
        map.insert("b".to_owned(), 3);
        assert_eq!(map.len(), 3);
        assert_eq!(map.find_slot(hash, "pinned"), Some(pinned));
        assert_eq!(map.find_slot(map.hash_key("b"), "pinned"), None);
        *map.value_mut(pinned) += 10;
        assert_eq!(*map.value(pinned), 12);
        assert_eq!(map.pop_oldest(), Some(("a".to_owned(), 1)));
        assert_eq!(map.pop_oldest(), Some(("b".to_owned(), 3)));
        assert_eq!(map.pop_oldest(), None, "the unordered entry is passed by");
        assert_eq!(map.len(), 1);

        map.insert("c".to_owned(), 4);
        map.place_newest(pinned);
        assert_eq!(map.oldest().map(|(k, _)| k.as_str()), Some("c"));
        map.take_out_of_order(pinned);
        map.take_out_of_order(pinned);
        map.insert("d".to_owned(), 5);
        assert_eq!(keys_oldest_first(&mut map), ["c", "d"]);
        assert_eq!(map.remove_at(pinned), ("pinned".to_owned(), 12));
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn sizes_are_summed_and_leave_with_their_entries() {
        let mut map = LruMap::new();
        for (key, bytes) in [("a", 10), ("b", 20), ("c", 30)] {
            map.insert(key.to_owned(), 0u32);
            let slot = map.slot_of(key).unwrap();
            map.set_bytes(slot, bytes);
        }
        assert_eq!(map.bytes(), 60);
        let c = map.slot_of("c").unwrap();
        map.set_bytes(c, 5);
        assert_eq!(map.bytes(), 35);
        assert_eq!(map.pop_oldest().map(|(k, _)| k), Some("a".to_owned()));
        assert_eq!(map.bytes(), 25);
        map.remove("b");
        assert_eq!(map.bytes(), 5);
        assert_eq!(map.pop_oldest_except(c), None, "c is the oldest");
        map.insert("d".to_owned(), 1);
        assert_eq!(map.retain(|k, _| k == "d"), 1);
        assert_eq!((map.len(), map.bytes()), (1, 0));
    }

    #[test]
    fn json_sizes_count_strings_and_names_at_any_depth() {
        use serde_json::{json, Value};
        let value_size = std::mem::size_of::<Value>();
        assert_eq!(super::json_bytes(&json!(null)), value_size);
        assert_eq!(super::json_bytes(&json!("abcd")), value_size + 4);
        let object = json!({"ab": ["xyz", 1]});
        assert_eq!(
            super::json_bytes(&object),
            4 * value_size + std::mem::size_of::<String>() + 2 + 3
        );
        let mut deep = json!(1);
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert_eq!(super::json_bytes(&deep), 100_001 * value_size);
        // Taken apart from the leaf up, without a recursive drop.
        let mut parts = Vec::new();
        while let Value::Array(mut items) = deep {
            deep = items.pop().unwrap();
            parts.push(items);
        }
    }

    #[test]
    fn a_single_entry_is_both_ends() {
        let mut map = LruMap::new();
        map.insert("only".to_owned(), 1);
        assert!(map.get_mut("only").is_some());
        assert_eq!(map.pop_oldest(), Some(("only".to_owned(), 1)));
        assert_eq!(map.pop_oldest(), None);
        map.insert("again".to_owned(), 2);
        assert_eq!(map.oldest(), Some((&"again".to_owned(), &2)));
    }
}
