//! Which idempotency key a call has, and the store key it is kept under.
//!
//! Precedence: the caller's `payload.idempotencyKey`, then a key a hook put on the call, then
//! (when derivation is on) the key derived from the tool, the canonical params, the session
//! and the actor. The store key puts the tenant first, then the tool, then the scope:
//!
//! ```text
//! <tenant>/<namespace>::<name>/s/<sessionKey>/<actorId>/<idempotencyKey>   session scope
//! <tenant>/<namespace>::<name>/a/<actorId>/<idempotencyKey>                 actor scope
//! <tenant>/<namespace>::<name>/g/<idempotencyKey>                           global scope
//! ```
//!
//! A caller's key is kept in the tool's scope, or in a wider one when the edge that read it
//! says so ([`ToolCall::set_caller_key_scope`]): an MCP client's key is scoped by its actor,
//! as its session is only as long as its connection.
//!
//! with `/<paramsDigest>` appended when a reused key with other params counts as another key.
//! Each part has `%`, `/`, `{` and `}` percent-encoded (`%25`, `%2F`, `%7B`, `%7D`), and the
//! namespace and the name `:` as well (`%3A`), so parts never run into each other: two
//! different tuples of parts never give the same store key (the namespace `x::y` with the
//! name `z` is not the namespace `x` with the name `y::z`), and a store key never closes a
//! Redis Cluster hash tag. Parts without those characters are written as they are. A call
//! without a tenant has an empty first part.

use std::cell::RefCell;
use std::sync::Arc;

pub use crate::canonical::key_fingerprint;
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
    if let Some(key) = call.hook_idempotency_key().filter(|k| !k.trim().is_empty()) {
        return Ok(Some((Arc::from(key), KeySource::Hook)));
    }
    if !derive {
        return Ok(None);
    }
    let canonical = call.params().canonical(options)?;
    let (session_key, actor_id) = match scope {
        KeyScope::Session => (call.session_key(), call.actor_id()),
        KeyScope::Actor => ("", call.actor_id()),
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

/// The scope a key from `source` is kept in, for a tool whose keys are in `scope`: a
/// caller's key in the wider of the tool's scope and the one its edge set on the call.
pub(crate) fn scope_of(call: &ToolCall, source: KeySource, scope: KeyScope) -> KeyScope {
    let width = |scope: KeyScope| match scope {
        KeyScope::Session => 0,
        KeyScope::Actor => 1,
        KeyScope::Global => 2,
    };
    match call.caller_key_scope() {
        Some(edge) if source == KeySource::Caller && width(edge) > width(scope) => edge,
        _ => scope,
    }
}

/// `scope`, narrowed to the actor for a call bound to a principal
/// ([`ToolCall::bind_principal`]): an authenticated caller's keys never reach another's.
pub(crate) fn within_principal(call: &ToolCall, scope: KeyScope) -> KeyScope {
    match scope {
        KeyScope::Global if call.principal().is_some() => KeyScope::Actor,
        scope => scope,
    }
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
    push_tool_part(out, call.tool_namespace());
    out.push_str("::");
    push_tool_part(out, call.tool_name());
    match scope {
        KeyScope::Session => {
            out.push_str("/s/");
            push_part(out, call.session_key());
            out.push('/');
            push_part(out, call.actor_id());
        }
        KeyScope::Actor => {
            out.push_str("/a/");
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

/// Whether `fingerprint` names `store_key`: it is the key's [`key_fingerprint`], or the first
/// 16 hex digits of an idempotency key derived from the params (64 hex digits, the last part
/// of the store key), as [`DedupeRecord::fingerprint`](super::DedupeRecord::fingerprint)
/// writes them. The rule of [`DedupeStore::find_by_fingerprint`](super::DedupeStore::find_by_fingerprint).
///
/// ```
/// use tower_toolcall::idempotency::{fingerprint_matches, key_fingerprint};
///
/// let key = "acme/vault::createFile/s/sess-42/user-7/create-foo-1";
/// assert!(fingerprint_matches(key, &key_fingerprint(key)));
/// assert!(!fingerprint_matches(key, "0123456789abcdef"));
/// ```
pub fn fingerprint_matches(store_key: &str, fingerprint: &str) -> bool {
    if fingerprint.len() != 16 {
        return false;
    }
    let last = store_key.rsplit('/').next().unwrap_or_default();
    let derived = last.len() == 64 && last.bytes().all(|b| b.is_ascii_hexdigit());
    (derived && last.starts_with(fingerprint)) || key_fingerprint(store_key) == fingerprint
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

/// What each part of a store key escapes besides `%`: the `/` between parts, and the braces
/// that would close a Redis Cluster hash tag.
const PART_ESCAPES: canonical::Escapes = canonical::Escapes::new(b"/{}");

/// What the tool's namespace and name escape besides `%`: [`PART_ESCAPES`] and the `:` of the
/// `::` between them.
const TOOL_PART_ESCAPES: canonical::Escapes = canonical::Escapes::new(b"/{}:");

/// Appends `part`, with `%`, `/`, `{` and `}` percent-encoded.
fn push_part(out: &mut String, part: &str) {
    out.push_str(&canonical::escape_part(part, &PART_ESCAPES));
}

/// Appends the tool's namespace or name, with `%`, `/`, `{`, `}` and `:` percent-encoded.
fn push_tool_part(out: &mut String, part: &str) {
    out.push_str(&canonical::escape_part(part, &TOOL_PART_ESCAPES));
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Strategy;
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
    fn an_actor_scoped_key_leaves_the_session_out() {
        let one = store_key(&call(Some("acme"), "conn-1"), "k1", KeyScope::Actor, None);
        let other = store_key(&call(Some("acme"), "conn-2"), "k1", KeyScope::Actor, None);
        assert_eq!(&*one, "acme/vault::createFile/a/user-7/k1");
        assert_eq!(one, other);
    }

    #[test]
    fn the_edge_widens_the_scope_of_caller_keys_only() {
        let mut c = call(None, "conn-1");
        assert_eq!(
            scope_of(&c, KeySource::Caller, KeyScope::Session),
            KeyScope::Session
        );
        c.set_caller_key_scope(KeyScope::Actor);
        assert_eq!(
            scope_of(&c, KeySource::Caller, KeyScope::Session),
            KeyScope::Actor
        );
        // A derived key stays in the tool's scope; a wider tool scope stays wider.
        assert_eq!(
            scope_of(&c, KeySource::Derived, KeyScope::Session),
            KeyScope::Session
        );
        assert_eq!(
            scope_of(&c, KeySource::Caller, KeyScope::Global),
            KeyScope::Global
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
    fn colons_in_the_tool_are_escaped_and_only_there() {
        let of = |ns: &str, name: &str| {
            let call = ToolCall::builder(ns, name)
                .session("agent:main")
                .actor("user:7")
                .build()
                .unwrap();
            store_key(&call, "order:1", KeyScope::Session, None)
        };
        assert_eq!(
            &*of("x::y", "z"),
            "/x%3A%3Ay::z/s/agent:main/user:7/order:1"
        );
        assert_eq!(
            &*of("x", "y::z"),
            "/x::y%3A%3Az/s/agent:main/user:7/order:1"
        );
        assert_eq!(&*of("x%3A", "z"), "/x%253A::z/s/agent:main/user:7/order:1");
    }

    #[test]
    fn no_part_can_open_or_close_a_hash_tag() {
        let call = ToolCall::builder("{ns}", "}n{")
            .session("{s")
            .actor("a}")
            .tenant("}{")
            .build()
            .unwrap();
        let key = store_key(&call, "{k}", KeyScope::Session, Some("{d}"));
        assert_eq!(
            &*key,
            "%7D%7B/%7Bns%7D::%7Dn%7B/s/%7Bs/a%7D/%7Bk%7D/%7Bd%7D"
        );
    }

    #[test]
    fn key_sources_have_stable_names() {
        let names = [KeySource::Caller, KeySource::Hook, KeySource::Derived].map(KeySource::as_str);
        assert_eq!(names, ["caller", "hook", "derived"]);
    }

    #[test]
    fn fingerprints_show_a_derived_key_s_prefix_and_hash_any_other_key() {
        let derived = "0123456789abcdef0123456789abcdef";
        assert_eq!(fingerprint("/t::n/g/x", derived, true), "0123456789abcdef");
        assert_eq!(
            fingerprint("/t::n/g/x", derived, false),
            key_fingerprint("/t::n/g/x")
        );
        // A key too short to show is hashed even when derived.
        assert_eq!(
            fingerprint("/t::n/g/short", "short", true),
            key_fingerprint("/t::n/g/short")
        );
        // The first 8 bytes of SHA-256("abc"), in hex.
        assert_eq!(key_fingerprint("abc"), "ba7816bf8f01cfea");
        assert_ne!(key_fingerprint("abd"), key_fingerprint("abc"));
    }

    #[test]
    fn blank_keys_are_no_keys() {
        let opts = CanonicalOptions::default();
        let mut c = call(None, "s");
        c.set_hook_idempotency_key("  ");
        assert_eq!(
            idempotency_key(&c, false, KeyScope::Session, &opts).unwrap(),
            None
        );
        c.envelope_mut().payload.idempotency_key = Some(" ".into());
        let (key, source) = idempotency_key(&c, true, KeyScope::Session, &opts)
            .unwrap()
            .unwrap();
        assert_eq!(source, KeySource::Derived);
        assert_eq!(key.len(), 64);
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

        c.set_hook_idempotency_key("from-hook");
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

    /// Every way to read `text` as parts joined by `separators`, one between each two parts.
    fn readings(text: &str, separators: &[&str]) -> Vec<Vec<String>> {
        let Some((separator, rest)) = separators.split_first() else {
            return vec![vec![text.to_owned()]];
        };
        let mut all = Vec::new();
        for (at, _) in text.char_indices() {
            if let Some(tail) = text[at..].strip_prefix(separator) {
                for mut reading in readings(tail, rest) {
                    reading.insert(0, text[..at].to_owned());
                    all.push(reading);
                }
            }
        }
        all
    }

    /// A part of a key, made of separators, escapes and braces.
    fn part() -> impl Strategy<Value = String> {
        "[x:/%{}3A]{1,4}"
    }

    /// The store key of a call read from `parts` as the shape of `scope` and `digest` lays
    /// them out, or `None` when a part the call needs is empty.
    fn store_key_of(parts: &[String], scope: KeyScope, digest: bool) -> Option<Arc<str>> {
        let (tenant, ns, name, rest) = (&parts[0], &parts[1], &parts[2], &parts[3..]);
        let (session, actor, rest) = match scope {
            KeyScope::Session => (rest[0].as_str(), rest[1].as_str(), &rest[2..]),
            KeyScope::Actor => ("s", rest[0].as_str(), &rest[1..]),
            KeyScope::Global => ("s", "u", rest),
        };
        let mut builder = ToolCall::builder(ns.as_str(), name.as_str())
            .session(session)
            .actor(actor);
        if !tenant.is_empty() {
            builder = builder.tenant(tenant.as_str());
        }
        let call = builder.build().ok()?;
        let distinct_by = digest.then(|| rest[1].as_str());
        Some(store_key(&call, &rest[0], scope, distinct_by))
    }

    proptest::proptest! {
        #[test]
        fn parts_that_join_alike_give_different_store_keys(
            parts in proptest::collection::vec(part(), 7),
            tenant in "[x:/%{}]{0,3}",
        ) {
            // Each text the parts make when joined without escapes, read in every layout,
            // gives tuples of parts that must all get different store keys.
            let [ns, name, session, actor, key, digest] = [1, 2, 3, 4, 5, 6].map(|i| &parts[i]);
            let texts = [
                format!("{tenant}/{ns}::{name}/s/{session}/{actor}/{key}"),
                format!("{tenant}/{ns}::{name}/s/{session}/{actor}/{key}/{digest}"),
                format!("{tenant}/{ns}::{name}/a/{actor}/{key}"),
                format!("{tenant}/{ns}::{name}/a/{actor}/{key}/{digest}"),
                format!("{tenant}/{ns}::{name}/g/{key}"),
                format!("{tenant}/{ns}::{name}/g/{key}/{digest}"),
            ];
            let layouts: [(KeyScope, bool, &[&str]); 6] = [
                (KeyScope::Actor, false, &["/", "::", "/a/", "/"]),
                (KeyScope::Actor, true, &["/", "::", "/a/", "/", "/"]),
                (KeyScope::Session, false, &["/", "::", "/s/", "/", "/"]),
                (KeyScope::Session, true, &["/", "::", "/s/", "/", "/", "/"]),
                (KeyScope::Global, false, &["/", "::", "/g/"]),
                (KeyScope::Global, true, &["/", "::", "/g/", "/"]),
            ];
            let mut seen = std::collections::HashMap::new();
            for text in &texts {
                for &(scope, digest, separators) in &layouts {
                    for reading in readings(text, separators) {
                        let Some(key) = store_key_of(&reading, scope, digest) else {
                            continue;
                        };
                        proptest::prop_assert!(!key.contains(['{', '}']), "{}", key);
                        let tuple = (format!("{scope:?}"), digest, reading);
                        if let Some(other) = seen.insert(key.clone(), tuple.clone()) {
                            proptest::prop_assert_eq!(&other, &tuple, "{}", key);
                        }
                    }
                }
            }
        }

        #[test]
        fn parts_that_join_alike_give_different_derived_keys(
            parts in proptest::collection::vec("[x:%3A]{0,4}", 5),
        ) {
            let text = parts.join("::");
            let mut seen = std::collections::HashMap::new();
            for reading in readings(&text, &["::"; 4]) {
                let key = canonical::derive_key(
                    &reading[0], &reading[1], &reading[2], &reading[3], &reading[4],
                );
                if let Some(other) = seen.insert(key.clone(), reading.clone()) {
                    proptest::prop_assert_eq!(&other, &reading, "{}", key);
                }
            }
        }
    }
}
