//! Which idempotency key a call has, and the store key it is kept under.
//!
//! Precedence: the caller's `payload.idempotencyKey`, then a key a hook put on the call, then
//! (when derivation is on) the key derived from the tool, the canonical params, the session
//! and the actor. The store key puts the tenant first, then the tool, then the scope:
//!
//! ```text
//! <tenant>/<namespace>::<name>/s/<sessionKey>/<actorId>/<idempotencyKey>   session scope
//! <tenant>/<namespace>::<name>/g/<idempotencyKey>                           global scope
//! ```
//!
//! with `/<paramsDigest>` appended when a reused key with other params counts as another key.
//! Each part has `%`, `/`, `{` and `}` percent-encoded, so parts never run into each other and
//! a store key never closes a Redis Cluster hash tag. A call without a tenant has an empty
//! first part.

use std::cell::RefCell;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::canonical::{self, CanonicalOptions};
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::registry::KeyScope;

/// Where a call's idempotency key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// `payload.idempotencyKey`.
    Caller,
    /// A hook put it on the call.
    Hook,
    /// Derived from the tool, the canonical params, the session and the actor.
    Derived,
}

impl KeySource {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            KeySource::Caller => "caller",
            KeySource::Hook => "hook",
            KeySource::Derived => "derived",
        }
    }
}

/// The call's idempotency key by precedence, or `None` when it has none and derivation is off.
///
/// Derivation uses the canonical form cached in the params, so a layer that canonicalized
/// them before (loop detection) has already paid for it. In global scope the derived key
/// leaves the session and the actor out (empty parts), so that identical calls of every
/// session share it.
pub(crate) fn idempotency_key(
    call: &ToolCall,
    derive: bool,
    scope: KeyScope,
    options: &CanonicalOptions,
) -> Result<Option<(Arc<str>, KeySource)>, ToolError> {
    if let Some(key) = call.idempotency_key().filter(|k| !k.trim().is_empty()) {
        return Ok(Some((Arc::from(key), KeySource::Caller)));
    }
    if let Some(key) = call
        .envelope()
        .hook_idempotency_key
        .as_deref()
        .filter(|k| !k.trim().is_empty())
    {
        return Ok(Some((Arc::from(key), KeySource::Hook)));
    }
    if !derive {
        return Ok(None);
    }
    let canonical = call.params().canonical(options)?;
    let (session_key, actor_id) = match scope {
        KeyScope::Session => (call.session_key(), call.actor_id()),
        KeyScope::Global => ("", ""),
    };
    let key = canonical::derived_key_hex(
        call.tool_namespace(),
        call.tool_name(),
        &canonical,
        session_key,
        actor_id,
    );
    Ok(Some((Arc::from(key.as_str()), KeySource::Derived)))
}

/// The store key of `idempotency_key` for `call` in `scope`; `distinct_by` (the params digest)
/// is appended when a reused key with other params counts as another key.
pub(crate) fn store_key(
    call: &ToolCall,
    idempotency_key: &str,
    scope: KeyScope,
    distinct_by: Option<&str>,
) -> Arc<str> {
    thread_local! {
        /// Where store keys are written before the one shared copy is made.
        static STORE_KEY: RefCell<String> = const { RefCell::new(String::new()) };
    }
    STORE_KEY.with_borrow_mut(|out| {
        out.clear();
        write_store_key(out, call, idempotency_key, scope, distinct_by);
        Arc::from(out.as_str())
    })
}

fn write_store_key(
    out: &mut String,
    call: &ToolCall,
    idempotency_key: &str,
    scope: KeyScope,
    distinct_by: Option<&str>,
) {
    push_part(out, call.tenant_id().unwrap_or_default());
    out.push('/');
    push_part(out, call.tool_namespace());
    out.push_str("::");
    push_part(out, call.tool_name());
    match scope {
        KeyScope::Session => {
            out.push_str("/s/");
            push_part(out, call.session_key());
            out.push('/');
            push_part(out, call.actor_id());
        }
        KeyScope::Global => out.push_str("/g"),
    }
    out.push('/');
    push_part(out, idempotency_key);
    if let Some(digest) = distinct_by {
        out.push('/');
        push_part(out, digest);
    }
}

/// The store-key prefix of every record of `tenant` (`None`: calls without a tenant), for
/// [`DedupeStore::flush_prefix`](super::DedupeStore::flush_prefix).
///
/// ```
/// use tower_toolcall::idempotency::tenant_prefix;
///
/// assert_eq!(tenant_prefix(Some("acme")), "acme/");
/// assert_eq!(tenant_prefix(Some("a/b")), "a%2Fb/");
/// assert_eq!(tenant_prefix(None), "/");
/// ```
pub fn tenant_prefix(tenant: Option<&str>) -> String {
    let mut out = String::new();
    push_part(&mut out, tenant.unwrap_or_default());
    out.push('/');
    out
}

/// A short hash that names a store key in results and logs without revealing it: the first
/// 16 hex digits of its SHA-256.
///
/// ```
/// use tower_toolcall::idempotency::key_fingerprint;
///
/// let fp = key_fingerprint("acme/vault::createFile/s/sess-42/user-7/create-foo-1");
/// assert_eq!(fp.len(), 16);
/// assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
/// ```
pub fn key_fingerprint(store_key: &str) -> String {
    let digest = Sha256::digest(store_key.as_bytes());
    canonical::hex_lower(&digest[..8])
}

/// What results and logs name a key by: for a key derived from the params (a SHA-256
/// already, which reveals nothing) its first 16 hex digits, for another key the
/// [`key_fingerprint`] of its store key.
pub(crate) fn fingerprint(store_key: &str, idempotency_key: &str, derived: bool) -> String {
    match idempotency_key.get(..16) {
        Some(prefix) if derived => prefix.to_owned(),
        _ => key_fingerprint(store_key),
    }
}

/// Appends `part`, with `%`, `/`, `{` and `}` percent-encoded.
fn push_part(out: &mut String, part: &str) {
    // No early exit, so that the compiler vectorizes the scan.
    if !part.bytes().fold(false, |any, b| any | needs_escape(b)) {
        out.push_str(part);
        return;
    }
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b'/' | b'{' | b'}')
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(tenant: Option<&str>, session: &str) -> ToolCall {
        let mut builder = ToolCall::builder("vault", "createFile")
            .session(session)
            .actor("user-7")
            .params(json!({"path": "a.md"}));
        if let Some(tenant) = tenant {
            builder = builder.tenant(tenant);
        }
        builder.build().unwrap()
    }

    #[test]
    fn store_keys_are_scoped_and_prefixed_by_the_tenant() {
        let c = call(Some("acme"), "sess-42");
        assert_eq!(
            &*store_key(&c, "k1", KeyScope::Session, None),
            "acme/vault::createFile/s/sess-42/user-7/k1"
        );
        assert_eq!(
            &*store_key(&c, "k1", KeyScope::Global, Some("abc")),
            "acme/vault::createFile/g/k1/abc"
        );
        assert_eq!(
            &*store_key(&call(None, "s"), "k1", KeyScope::Global, None),
            "/vault::createFile/g/k1"
        );
    }

    #[test]
    fn separators_in_parts_cannot_forge_another_key() {
        // Session "a/b" with actor "user-7" must not equal session "a" with a key "b/…".
        let forged = store_key(&call(None, "a/b"), "k", KeyScope::Session, None);
        assert_eq!(&*forged, "/vault::createFile/s/a%2Fb/user-7/k");
        let braces = store_key(&call(Some("{t}"), "s"), "100%", KeyScope::Global, None);
        assert_eq!(&*braces, "%7Bt%7D/vault::createFile/g/100%25");
    }

    #[test]
    fn precedence_is_caller_then_hook_then_derived() {
        let opts = CanonicalOptions::default();
        let mut c = call(None, "s");
        let session = KeyScope::Session;
        let (derived, source) = idempotency_key(&c, true, session, &opts).unwrap().unwrap();
        assert_eq!(source, KeySource::Derived);
        let canonical = c.params().canonical(&opts).unwrap();
        assert_eq!(
            *derived,
            canonical::derive_key("vault", "createFile", &canonical, "s", "user-7")
        );
        let (global, _) = idempotency_key(&c, true, KeyScope::Global, &opts)
            .unwrap()
            .unwrap();
        assert_eq!(
            *global,
            canonical::derive_key("vault", "createFile", &canonical, "", "")
        );
        assert_eq!(idempotency_key(&c, false, session, &opts).unwrap(), None);

        c.envelope_mut().hook_idempotency_key = Some("from-hook".into());
        assert_eq!(
            idempotency_key(&c, true, session, &opts).unwrap(),
            Some(("from-hook".into(), KeySource::Hook))
        );
        c.envelope_mut().payload.idempotency_key = Some("from-caller".into());
        assert_eq!(
            idempotency_key(&c, false, session, &opts).unwrap(),
            Some(("from-caller".into(), KeySource::Caller))
        );
    }
}
