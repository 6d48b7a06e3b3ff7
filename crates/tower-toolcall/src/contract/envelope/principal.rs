//! [`Principal`]: who a call is from, as an edge's authentication established it.

use std::fmt::Write as _;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::call::{Priority, MAX_IDENTIFIER_BYTES};

/// The authenticated caller of a call: a user or service account (`id`), its tenant, its
/// roles and the scopes of its token, as an edge's authentication established them (an API
/// key's entry, a verified token's claims).
///
/// An edge binds a call to it with [`ToolCall::bind_principal`](super::ToolCall::bind_principal):
/// then the call's actor and tenant are the principal's, whatever the request said, and
/// nothing of the call (keys, derived keys, loop session, quotas) reaches another principal's.
/// An edge that authenticates HTTP requests puts it in the request's extensions for the
/// routes behind to read.
///
/// ```
/// use tower_toolcall::Principal;
///
/// let alice = Principal::new("alice").with_tenant("acme").with_roles(["reader"]);
/// assert_eq!(alice.id(), "alice");
/// assert_eq!(alice.tenant(), Some("acme"));
/// assert!(alice.has_role("reader"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    inner: Arc<Parts>,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Parts {
    id: String,
    tenant: Option<String>,
    roles: Vec<String>,
    scopes: Vec<String>,
    /// The highest `priority` the principal's calls may claim.
    max_priority: Priority,
    /// What scopes a session under this principal: a digest of the tenant and the id.
    scope: String,
}

impl Principal {
    /// The caller `id`: a user or service account, unique within its tenant.
    pub fn new(id: impl Into<String>) -> Self {
        Principal::of(Parts {
            id: id.into(),
            tenant: None,
            roles: Vec::new(),
            scopes: Vec::new(),
            max_priority: Priority::High,
            scope: String::new(),
        })
    }

    /// The principal of `parts`, its session scope drawn from its tenant and id.
    fn of(parts: Parts) -> Self {
        let Parts { id, tenant, .. } = &parts;
        let mut hasher = Sha256::new();
        // Length-prefixed parts: no two (tenant, id) pairs give the same digest input.
        for part in [tenant.as_deref(), Some(id.as_str())] {
            match part {
                Some(part) => {
                    hasher.update((part.len() as u64).to_be_bytes());
                    hasher.update(part.as_bytes());
                }
                None => hasher.update(u64::MAX.to_be_bytes()),
            }
        }
        let digest = hasher.finalize();
        let mut scope = String::from("p-");
        for byte in &digest[..12] {
            let _ = write!(scope, "{byte:02x}");
        }
        Principal {
            inner: Arc::new(Parts { scope, ..parts }),
        }
    }

    fn rebuilt(self, change: impl FnOnce(&mut Parts)) -> Self {
        let mut parts = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Parts {
            id: shared.id.clone(),
            tenant: shared.tenant.clone(),
            roles: shared.roles.clone(),
            scopes: shared.scopes.clone(),
            max_priority: shared.max_priority,
            scope: String::new(),
        });
        change(&mut parts);
        Principal::of(parts)
    }

    /// The caller's tenant.
    pub fn with_tenant(self, tenant: impl Into<String>) -> Self {
        let tenant = tenant.into();
        self.rebuilt(|parts| parts.tenant = Some(tenant))
    }

    /// The caller's roles (an API key's entry, a token's roles claim).
    pub fn with_roles<I, S>(self, roles: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let roles = roles.into_iter().map(Into::into).collect();
        self.rebuilt(|parts| parts.roles = roles)
    }

    /// The scopes the caller's token was granted (its `scope` claim).
    pub fn with_scopes<I, S>(self, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let scopes = scopes.into_iter().map(Into::into).collect();
        self.rebuilt(|parts| parts.scopes = scopes)
    }

    /// The highest `payload.callHints.priority` the caller's calls may claim (`high`, no cap,
    /// unless set): a bound call that asks for more is scheduled at this priority. An edge
    /// that serves callers it does not trust to rank their own calls above others' caps them.
    ///
    /// ```
    /// use tower_toolcall::envelope::Priority;
    /// use tower_toolcall::{Principal, ToolCall};
    ///
    /// let mallory = Principal::new("mallory").with_max_priority(Priority::Normal);
    /// let mut call = ToolCall::builder("web", "fetch").session("s").actor("u")
    ///     .priority(Priority::High).build()?;
    /// call.bind_principal(mallory);
    /// assert_eq!(call.priority(), Priority::Normal);
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn with_max_priority(self, max: Priority) -> Self {
        self.rebuilt(|parts| parts.max_priority = max)
    }

    /// The highest priority the caller's calls may claim.
    pub fn max_priority(&self) -> Priority {
        self.inner.max_priority
    }

    /// The caller's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The caller's tenant, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.inner.tenant.as_deref()
    }

    /// The caller's roles.
    pub fn roles(&self) -> &[String] {
        &self.inner.roles
    }

    /// The scopes of the caller's token.
    pub fn scopes(&self) -> &[String] {
        &self.inner.scopes
    }

    /// Whether the caller has the role `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.inner.roles.iter().any(|r| r == role)
    }

    /// Whether the caller's token was granted the scope `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.inner.scopes.iter().any(|s| s == scope)
    }

    /// The session key of `session` under this principal: a digest of the principal's
    /// tenant and id, then `session` (or, when the two would be longer than an identifier
    /// may be, a digest of it). No session of one principal is another's, whatever the
    /// sessions are called; an empty `session` is the principal's one session. A session
    /// key under this principal already is kept as it is.
    pub fn session_key(&self, session: &str) -> String {
        let scope = &self.inner.scope;
        if session.is_empty() {
            return scope.clone();
        }
        let under = session
            .strip_prefix(scope.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if under {
            return session.to_owned();
        }
        if scope.len() + 1 + session.len() <= MAX_IDENTIFIER_BYTES {
            return format!("{scope}/{session}");
        }
        let digest = Sha256::digest(session.as_bytes());
        let mut key = format!("{scope}/#");
        for byte in &digest[..16] {
            let _ = write!(key, "{byte:02x}");
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_two_principals_never_meet() {
        let alice = Principal::new("alice");
        let bob = Principal::new("bob");
        assert_ne!(alice.session_key("s-1"), bob.session_key("s-1"));
        assert_ne!(alice.session_key(""), bob.session_key(""));
        // The same id in two tenants is two principals.
        let acme = Principal::new("alice").with_tenant("acme");
        let other = Principal::new("alice").with_tenant("other");
        assert_ne!(acme.session_key("s"), other.session_key("s"));
        assert_ne!(acme.session_key("s"), alice.session_key("s"));
        // A tenant and an id that run together differently are not confused.
        let a = Principal::new("b-c").with_tenant("a");
        let b = Principal::new("c").with_tenant("a-b");
        assert_ne!(a.session_key("s"), b.session_key("s"));
        assert_eq!(
            alice.session_key("s-1"),
            Principal::new("alice").session_key("s-1")
        );
    }

    #[test]
    fn a_long_session_is_digested_within_the_identifier_limit() {
        let alice = Principal::new("alice");
        let long = "x".repeat(MAX_IDENTIFIER_BYTES);
        let key = alice.session_key(&long);
        assert!(key.len() <= MAX_IDENTIFIER_BYTES, "{key}");
        assert_ne!(key, alice.session_key(&format!("{long}y")));
        let short = alice.session_key("s-1");
        assert!(
            short.ends_with("/s-1") && short.starts_with("p-"),
            "{short}"
        );
        assert_eq!(alice.session_key(&short), short, "scoped once");
        let bob = Principal::new("bob");
        assert_ne!(
            bob.session_key(&short),
            short,
            "another's session is scoped again"
        );
    }

    #[test]
    fn roles_and_scopes_are_kept_through_changes() {
        let p = Principal::new("svc")
            .with_roles(["reader", "writer"])
            .with_scopes(["mcp:tools"])
            .with_tenant("acme");
        assert!(p.has_role("writer") && !p.has_role("admin"));
        assert!(p.has_scope("mcp:tools"));
        assert_eq!(p.tenant(), Some("acme"));
        assert_eq!(
            p.session_key("s"),
            Principal::new("svc").with_tenant("acme").session_key("s")
        );
    }
}
