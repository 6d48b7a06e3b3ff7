//! Whose a `tools/call` is: its principal, session and actor, from what the server itself
//! knows (its authentication, the transport sessions it issued), never from what a client
//! says about itself.

use std::sync::Arc;

use super::meta::{RequestMeta, DEFAULT_IDEMPOTENCY_KEY_MEMBERS};
use tower_toolcall::envelope::MAX_IDENTIFIER_BYTES;
use tower_toolcall::{Principal, ToolError};

/// The actor, and the session of requests that have none, of a server without
/// authentication: one user, whatever its clients call themselves.
pub(crate) const SINGLE_USER: &str = "local";

/// Where an [`McpServer`](crate::McpServer) looks for a call's session, actor and key.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    /// The `_meta` member the operator named for the session.
    pub(crate) session_member: Option<Arc<str>>,
    /// The `_meta` member the operator named for the actor (only without a principal).
    pub(crate) actor_member: Option<Arc<str>>,
    /// The `_meta` members read as the idempotency key, in order.
    pub(crate) key_members: Arc<[String]>,
    /// The principal of the requests that carry none (a stdio front's configured user).
    pub(crate) principal: Option<Principal>,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            session_member: None,
            actor_member: None,
            key_members: DEFAULT_IDEMPOTENCY_KEY_MEMBERS.map(String::from).into(),
            principal: None,
        }
    }
}

/// A call's caller: the session and actor to build the call with, the principal to bind it
/// to, and the client's own name (kept as the call's agent, for the audit only).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) session: String,
    pub(crate) actor: String,
    pub(crate) principal: Option<Principal>,
    pub(crate) client: Option<String>,
}

impl Identity {
    /// The principal of a request: the one an HTTP server's authentication put in the
    /// extensions of the request (`http`, over HTTP), else the server's own.
    pub(crate) fn principal(&self, http: Option<&http::request::Parts>) -> Option<Principal> {
        http.and_then(|parts| parts.extensions.get::<Principal>())
            .or(self.principal.as_ref())
            .cloned()
    }

    /// The caller of a request of `principal` (as [`principal`](Identity::principal) found
    /// it) that `meta` is the `_meta` of, in the transport session `transport` the server
    /// issued (a stream transport's connection, or a streamable-HTTP session that began with
    /// `initialize`; none for a request of the stateless protocol), from the client that
    /// named itself `client`.
    ///
    /// Session: the operator's `_meta` member, else the issued session, else none (the
    /// principal's one session, or the single user's); with a principal it is scoped under
    /// the principal. Actor: the principal's id; without one, the operator's `_meta` member,
    /// else the single user. What a client says of itself decides neither: a stateless
    /// request's `Mcp-Session-Id` header is never read, and the client's name is kept as the
    /// call's agent, for the audit.
    pub(crate) fn caller(
        &self,
        meta: &RequestMeta<'_>,
        principal: Option<Principal>,
        transport: Option<&str>,
        client: Option<&str>,
    ) -> Result<Caller, ToolError> {
        let named = |member: &Option<Arc<str>>| -> Result<Option<String>, ToolError> {
            match member {
                Some(member) => Ok(meta
                    .text(member, MAX_IDENTIFIER_BYTES)?
                    .filter(|value| !value.is_empty())
                    .map(str::to_owned)),
                None => Ok(None),
            }
        };
        let client = client
            .filter(|name| !name.is_empty() && name.len() <= MAX_IDENTIFIER_BYTES)
            .map(str::to_owned);
        let session = named(&self.session_member)?.or(transport.map(str::to_owned));
        let (session, actor) = match &principal {
            Some(principal) => (
                principal.session_key(session.as_deref().unwrap_or_default()),
                principal.id().to_owned(),
            ),
            None => (
                session.unwrap_or_else(|| SINGLE_USER.to_owned()),
                named(&self.actor_member)?.unwrap_or_else(|| SINGLE_USER.to_owned()),
            ),
        };
        Ok(Caller {
            session,
            actor,
            principal,
            client,
        })
    }
}
