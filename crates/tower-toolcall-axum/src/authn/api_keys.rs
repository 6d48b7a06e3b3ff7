//! [`ApiKeys`]: static bearer keys, each standing for one principal.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_toolcall::Principal;

/// Bearer API keys, each mapped to the [`Principal`] it stands for.
///
/// Only the SHA-256 digest of each key is kept; a presented key's digest is compared with
/// every stored digest in constant time, so that neither the answer's timing nor a memory
/// dump gives a key away. Give the secrets from an environment variable or a file (the
/// gateway's `key_env` and `key_file`), or only their digests (`key_sha256`).
///
/// ```
/// use tower_toolcall::Principal;
/// use tower_toolcall_axum::authn::ApiKeys;
///
/// let keys = ApiKeys::new()
///     .with_key("k-alice-0123456789", Principal::new("alice").with_tenant("acme"))
///     .with_key("k-bob-0123456789", Principal::new("bob"));
/// assert_eq!(keys.principal_of("k-alice-0123456789").unwrap().id(), "alice");
/// assert!(keys.principal_of("k-nobody").is_none());
/// ```
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<([u8; 32], Principal)>,
}

impl ApiKeys {
    /// No keys: every token is refused.
    pub fn new() -> Self {
        ApiKeys::default()
    }

    /// Admits `secret` as `principal`.
    pub fn with_key(self, secret: impl AsRef<[u8]>, principal: Principal) -> Self {
        self.with_digest(Sha256::digest(secret.as_ref()).into(), principal)
    }

    /// Admits the key whose SHA-256 digest is `sha256` as `principal`.
    pub fn with_digest(mut self, sha256: [u8; 32], principal: Principal) -> Self {
        self.keys.push((sha256, principal));
        self
    }

    /// Admits the key whose SHA-256 digest is written `sha256_hex` (64 hexadecimal digits,
    /// as `sha256sum` prints it) as `principal`; `None` when it is not such a digest.
    pub fn with_digest_hex(self, sha256_hex: &str, principal: Principal) -> Option<Self> {
        Some(self.with_digest(parse_sha256(sha256_hex)?, principal))
    }

    /// How many keys are admitted.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is admitted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The principal `presented` stands for, if it is one of the keys.
    pub fn principal_of(&self, presented: impl AsRef<[u8]>) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(presented.as_ref()).into();
        // Every digest is compared, in constant time, whichever matches.
        let mut found = None;
        for (stored, principal) in &self.keys {
            if bool::from(stored.ct_eq(&digest)) {
                found = Some(principal);
            }
        }
        found
    }
}

impl fmt::Debug for ApiKeys {
    /// The principals, never the digests.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(_, principal)| principal.id()))
            .finish()
    }
}

/// Decodes a SHA-256 digest written as 64 hexadecimal digits.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_admits_its_key_and_debug_shows_no_digest() {
        let digest: [u8; 32] = Sha256::digest(b"the-secret").into();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let keys = ApiKeys::new()
            .with_digest_hex(&hex, Principal::new("ci"))
            .unwrap();
        assert_eq!(keys.principal_of("the-secret").unwrap().id(), "ci");
        assert!(keys.principal_of("the-secreT").is_none());
        assert!(keys.principal_of("").is_none());
        assert_eq!(format!("{keys:?}"), r#"["ci"]"#);
        assert!(parse_sha256("abc").is_none());
        assert!(parse_sha256(&"zz".repeat(32)).is_none());
    }
}
