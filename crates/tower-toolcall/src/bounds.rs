//! What the crate's bounded maps share: the hasher of keys that callers choose, and the
//! approximate size of JSON values they keep; and the random seed of keyed hashes and
//! jitter.

/// The hasher of maps keyed by strings that callers choose (sessions, actors, idempotency
/// keys, the names of unregistered tools). It must resist collisions crafted to slow the maps
/// down: foldhash's `quality` hasher is keyed by a seed drawn at random per process and per
/// map, and neither its hashes nor the maps' order are ever observable from outside (results
/// and logs name keys by SHA-256 fingerprints or not at all), so inputs that collide cannot be
/// chosen. It hashes a 150-byte key several times faster than SipHash.
pub(crate) type CallerKeyHasher = foldhash::quality::RandomState;

/// A fresh random seed from the process's random hash keys (each call gets other keys).
pub(crate) fn entropy_seed() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(0u8)
}

pub(crate) use crate::contract::json_size::json_bytes;
