//! [`ParamsDigest`]: the params digest a record keeps, computed when it is first read.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::canonical;

/// The longest canonical params a record keeps in place of their digest. Longer ones are
/// hashed when the record is written, so that a record never holds more than this.
pub(crate) const DEFERRED_DIGEST_MAX_CANONICAL: usize = 512;

/// `hex(sha256(canonical_json(params)))` of the call that claimed a key: a later call with
/// the same idempotency key must have the same digest.
///
/// A record claimed under a key derived from the params rarely needs the digest: a
/// duplicate derived from the same params finds the record under the same key, and the key
/// already hashes them. Such a record keeps the canonical params (when they are short) and
/// hashes them the first time the digest is read: to compare it with another call's, to
/// serialize the record, or to print it.
///
/// It reads as a `&str` (it dereferences to one) and serializes as the hex string.
///
/// ```
/// use tower_toolcall::idempotency::ParamsDigest;
///
/// let digest = ParamsDigest::from("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
/// assert!(digest.starts_with("9f86d0"));
/// assert_eq!(
///     serde_json::to_string(&digest).unwrap(),
///     r#""9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08""#
/// );
/// ```
#[derive(Clone)]
pub struct ParamsDigest(Repr);

#[derive(Clone)]
enum Repr {
    /// The digest, known.
    Hex(Arc<str>),
    /// The canonical params, hashed when the digest is first read.
    Deferred {
        canonical: Arc<str>,
        hex: OnceLock<Arc<str>>,
    },
}

impl ParamsDigest {
    /// The digest of `canonical` (canonical params), computed when it is first read.
    pub(crate) fn of_canonical(canonical: Arc<str>) -> ParamsDigest {
        ParamsDigest(Repr::Deferred {
            canonical,
            hex: OnceLock::new(),
        })
    }

    /// The lowercase hex digest.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Hex(hex) => hex,
            Repr::Deferred { canonical, hex } => {
                hex.get_or_init(|| canonical::params_digest_shared(canonical))
            }
        }
    }

    /// The shared allocation the digest keeps: the digest, or the canonical params it is
    /// computed from. The memory store reads it ahead of dropping an evicted record.
    pub(crate) fn shared_allocation(&self) -> &Arc<str> {
        match &self.0 {
            Repr::Hex(hex) => hex,
            Repr::Deferred { canonical, .. } => canonical,
        }
    }
}

impl Deref for ParamsDigest {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ParamsDigest {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<Arc<str>> for ParamsDigest {
    fn from(hex: Arc<str>) -> Self {
        ParamsDigest(Repr::Hex(hex))
    }
}

impl From<&str> for ParamsDigest {
    fn from(hex: &str) -> Self {
        ParamsDigest(Repr::Hex(Arc::from(hex)))
    }
}

impl From<String> for ParamsDigest {
    fn from(hex: String) -> Self {
        ParamsDigest(Repr::Hex(Arc::from(hex)))
    }
}

impl PartialEq for ParamsDigest {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            // Equal canonical params have equal digests: no need to hash them.
            (Repr::Deferred { canonical: a, .. }, Repr::Deferred { canonical: b, .. })
                if Arc::ptr_eq(a, b) || a == b =>
            {
                true
            }
            _ => self.as_str() == other.as_str(),
        }
    }
}

impl Eq for ParamsDigest {}

impl PartialEq<str> for ParamsDigest {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl fmt::Debug for ParamsDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ParamsDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ParamsDigest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ParamsDigest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Arc::<str>::deserialize(deserializer).map(ParamsDigest::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANONICAL: &str = r#"{"path":"a.md"}"#;

    #[test]
    fn a_deferred_digest_reads_as_the_digest_of_its_canonical_params() {
        let deferred = ParamsDigest::of_canonical(Arc::from(CANONICAL));
        let known = ParamsDigest::from(canonical::params_digest(CANONICAL));
        assert_eq!(deferred.as_str(), known.as_str());
        assert_eq!(deferred, known);
        assert_eq!(known, deferred);
        assert_eq!(
            serde_json::to_string(&deferred).unwrap(),
            serde_json::to_string(&known).unwrap()
        );
        let back: ParamsDigest =
            serde_json::from_str(&serde_json::to_string(&deferred).unwrap()).unwrap();
        assert_eq!(back, deferred);
    }

    #[test]
    fn deferred_digests_of_other_params_differ() {
        let a = ParamsDigest::of_canonical(Arc::from(CANONICAL));
        let b = ParamsDigest::of_canonical(Arc::from(r#"{"path":"b.md"}"#));
        assert_ne!(a, b);
        assert_ne!(a, ParamsDigest::from(canonical::params_digest("{}")));
    }
}
