//! [`ProtectedResource`]: the OAuth 2.0 Protected Resource Metadata (RFC 9728) of a server
//! whose routes need a bearer token, as the MCP authorization specification asks.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// The well-known path of protected-resource metadata (RFC 9728 §3).
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// What an MCP client reads to find where to get a token for this server: the resource
/// (this server's URL, the audience of its tokens), its authorization servers and scopes.
///
/// [`router`](ProtectedResource::router) serves the document at
/// `/.well-known/oauth-protected-resource` and at that path followed by the resource's own
/// path (`…/oauth-protected-resource/mcp` for `https://tools.example.com/mcp`), the two
/// places clients look; [`metadata_url`](ProtectedResource::metadata_url) is the one a `401`
/// names.
///
/// ```
/// use tower_toolcall_axum::authn::ProtectedResource;
///
/// let resource = ProtectedResource::new("https://tools.example.com/mcp")
///     .authorization_servers(["https://auth.example.com"])
///     .scopes(["mcp:tools"]);
/// assert_eq!(
///     resource.metadata_url(),
///     "https://tools.example.com/.well-known/oauth-protected-resource/mcp"
/// );
/// assert_eq!(resource.document()["resource"], "https://tools.example.com/mcp");
/// assert_eq!(resource.document()["bearer_methods_supported"][0], "header");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectedResource {
    resource: String,
    authorization_servers: Vec<String>,
    scopes: Vec<String>,
    name: Option<String>,
}

impl ProtectedResource {
    /// The metadata of `resource`: this server's URL (scheme, host, port and path).
    pub fn new(resource: impl Into<String>) -> Self {
        ProtectedResource {
            resource: resource.into(),
            authorization_servers: Vec::new(),
            scopes: Vec::new(),
            name: None,
        }
    }

    /// The issuers of this server's tokens.
    pub fn authorization_servers<I, S>(mut self, servers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.authorization_servers = servers.into_iter().map(Into::into).collect();
        self
    }

    /// The scopes a client may ask for.
    pub fn scopes<I, S>(mut self, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// A name people read.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The resource's URL.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The document (RFC 9728 §2): `resource`, `authorization_servers`,
    /// `scopes_supported`, `bearer_methods_supported` (`header`: tokens only in the
    /// `Authorization` header) and `resource_name`.
    pub fn document(&self) -> Value {
        let mut document = json!({
            "resource": self.resource,
            "bearer_methods_supported": ["header"],
        });
        if !self.authorization_servers.is_empty() {
            document["authorization_servers"] = json!(self.authorization_servers);
        }
        if !self.scopes.is_empty() {
            document["scopes_supported"] = json!(self.scopes);
        }
        if let Some(name) = &self.name {
            document["resource_name"] = json!(name);
        }
        document
    }

    /// The URL of the document for this resource: the well-known path inserted between the
    /// resource's origin and its path (RFC 9728 §3.1).
    pub fn metadata_url(&self) -> String {
        let (origin, path) = split_origin(&self.resource);
        format!("{origin}{WELL_KNOWN}{path}")
    }

    /// The routes that serve the document (without authentication).
    pub fn router(&self) -> Router {
        let document = self.document();
        let (_, path) = split_origin(&self.resource);
        let serve = {
            let document = document.clone();
            move || async move { Json(document) }
        };
        let mut router = Router::new().route(WELL_KNOWN, get(serve.clone()));
        if !path.is_empty() && path != "/" {
            router = router.route(&format!("{WELL_KNOWN}{path}"), get(serve));
        }
        router
    }
}

/// `https://host:port` and `/path` of a URL (the path without a trailing `/`).
fn split_origin(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => {
            let (origin, path) = url.split_at(after_scheme + i);
            (origin, path.trim_end_matches('/'))
        }
        None => (url, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_url_inserts_the_well_known_path() {
        let root = ProtectedResource::new("http://127.0.0.1:8080");
        assert_eq!(
            root.metadata_url(),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource"
        );
        let mcp = ProtectedResource::new("http://127.0.0.1:8080/mcp/");
        assert_eq!(
            mcp.metadata_url(),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"
        );
    }
}
