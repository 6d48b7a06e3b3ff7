//! Whose a `tools/call` is: its session, actor and tenant, from what the request carries.
//!
//! A stdio connection is a session, but a streamable-HTTP request under protocol 2026-07-28
//! has none (the protocol is stateless), so the session that loop detection and
//! session-scoped keys need is looked for in a documented order.

use std::sync::Arc;

use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::meta::{RequestMeta, DEFAULT_IDEMPOTENCY_KEY_MEMBERS};
use tower_toolcall::envelope::MAX_IDENTIFIER_BYTES;
use tower_toolcall::ToolError;

/// The actor (and session) of calls whose client is known by nothing at all.
const UNKNOWN_CLIENT: &str = "unknown-mcp-client";

/// The header of a legacy streamable-HTTP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The authenticated caller of a streamable-HTTP request, as the server's authentication put
/// it in the request's extensions (an axum or tower middleware in front of rmcp's
/// `StreamableHttpService`, after it checked the credentials). An [`McpServer`](crate::McpServer)
/// takes the call's actor, its session when the transport has none, and its tenant from it.
///
/// ```
/// use tower_toolcall_mcp::Principal;
///
/// // In an authentication middleware, once the token is checked:
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Principal::new("user-7").with_tenant("acme"));
/// assert_eq!(request.extensions().get::<Principal>().unwrap().id(), "user-7");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    id: String,
    tenant: Option<String>,
}

impl Principal {
    /// The caller `id` (a user or service account).
    pub fn new(id: impl Into<String>) -> Self {
        Principal {
            id: id.into(),
            tenant: None,
        }
    }

    /// The caller's tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The caller's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The caller's tenant, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }
}

/// Where an [`McpServer`](crate::McpServer) looks for a call's session, actor and key.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    /// The `_meta` member the operator named for the session.
    pub(crate) session_member: Option<Arc<str>>,
    /// The `_meta` member the operator named for the actor.
    pub(crate) actor_member: Option<Arc<str>>,
    /// The `_meta` members read as the idempotency key, in order.
    pub(crate) key_members: Arc<[String]>,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            session_member: None,
            actor_member: None,
            key_members: DEFAULT_IDEMPOTENCY_KEY_MEMBERS.map(String::from).into(),
        }
    }
}

/// A call's session, actor and tenant.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) session: String,
    pub(crate) actor: String,
    pub(crate) tenant: Option<String>,
}

impl Identity {
    /// The caller of a request served over the connection `connection` (a stream transport's
    /// one session; not used for HTTP requests).
    ///
    /// Session: the operator's `_meta` member, else the transport's session (the
    /// connection of a stream transport, the legacy `Mcp-Session-Id` header over HTTP), else
    /// the authenticated [`Principal`], else the client's `clientInfo.name`. Actor: the
    /// operator's `_meta` member, else the principal, else the client's name. Tenant: the
    /// principal's.
    pub(crate) fn caller(
        &self,
        meta: &RequestMeta<'_>,
        context: &RequestContext<RoleServer>,
        connection: &str,
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
        let http = context.extensions.get::<http::request::Parts>();
        let principal = http.and_then(|parts| parts.extensions.get::<Principal>());
        let transport_session = match http {
            Some(parts) => parts
                .headers
                .get(SESSION_HEADER)
                .and_then(|value| value.to_str().ok())
                .filter(|id| !id.is_empty() && id.len() <= MAX_IDENTIFIER_BYTES)
                .map(str::to_owned),
            None => Some(connection.to_owned()),
        };
        let client = context
            .client_info()
            .map(|client| client.name)
            .filter(|name| !name.is_empty() && name.len() <= MAX_IDENTIFIER_BYTES);
        let principal_id = principal
            .map(|p| p.id.clone())
            .filter(|id| !id.is_empty() && id.len() <= MAX_IDENTIFIER_BYTES);
        let actor = named(&self.actor_member)?
            .or_else(|| principal_id.clone())
            .or_else(|| client.clone())
            .unwrap_or_else(|| UNKNOWN_CLIENT.to_owned());
        let session = named(&self.session_member)?
            .or(transport_session)
            .or(principal_id)
            .or(client)
            .unwrap_or_else(|| UNKNOWN_CLIENT.to_owned());
        Ok(Caller {
            session,
            actor,
            tenant: principal.and_then(|p| p.tenant.clone()),
        })
    }
}
