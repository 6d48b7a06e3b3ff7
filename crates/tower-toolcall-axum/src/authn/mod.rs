//! Who calls: bearer authentication for the HTTP routes of a tool server, as the MCP
//! authorization specification asks of a resource server.
//!
//! [`Authentication`] checks the `Authorization: Bearer` header of every request behind its
//! [`layer`](Authentication::layer) (the header only: never a query string or a body), and
//! puts the caller's [`Principal`] in the request's extensions, where
//! [`ToolRouter`](crate::ToolRouter) and an MCP server read it. Its modes:
//!
//! - [`ApiKeys`]: each key stands for one principal;
//! - [`JwtVerifier`] (feature `jwt`): tokens checked against the issuer's JWKS, and mapped
//!   to a principal by their claims; a verified token's principal is kept until the token
//!   expires, so that a call costs no signature check after the first.
//!
//! A request without a token, or with one that is refused, is answered `401` with
//! `WWW-Authenticate: Bearer` and, when the server says where its [`ProtectedResource`]
//! metadata is (RFC 9728), `resource_metadata="…"`, from which an MCP client finds the
//! authorization server. A token without a scope the server requires is answered `403` with
//! `error="insufficient_scope"` and the scopes needed. No answer or log line repeats a token.
//!
//! ```
//! use tower_toolcall::Principal;
//! use tower_toolcall_axum::authn::{ApiKeys, Authentication};
//!
//! let keys = ApiKeys::new().with_key("k-alice-0123456789", Principal::new("alice"));
//! let auth = Authentication::new(keys);
//! let app: axum::Router = axum::Router::new()
//!     .route("/whoami", axum::routing::get(|principal: axum::Extension<Principal>| async move {
//!         principal.id().to_owned()
//!     }))
//!     .layer(auth.layer());
//! # let _ = app;
//! ```

mod api_keys;
#[cfg(feature = "jwt")]
#[cfg_attr(docsrs, doc(cfg(feature = "jwt")))]
mod jwt;
mod resource;

pub use api_keys::ApiKeys;
/// The signature algorithms of JWTs (`jsonwebtoken`'s), for [`JwtVerifierBuilder::algorithms`].
#[cfg(feature = "jwt")]
pub use jsonwebtoken::Algorithm as JwtAlgorithm;
#[cfg(feature = "jwt")]
pub use jwt::{
    ClaimNames, JwtVerifier, JwtVerifierBuilder, DEFAULT_JWKS_MIN_REFRESH, DEFAULT_JWKS_TTL,
    DEFAULT_LEEWAY,
};
pub use resource::ProtectedResource;

use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tower::{Layer, Service};
use tower_toolcall::Principal;

use super::auth::{strip_bearer, RefusalLog};

/// The most principals of verified tokens kept, by default.
pub const DEFAULT_VERIFIED_TOKENS: usize = 10_000;

/// Why a request was refused: the status it is answered with, and what it is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthRefusal {
    status: StatusCode,
    reason: &'static str,
    description: Cow<'static, str>,
    path: String,
}

impl AuthRefusal {
    /// `401` (no valid token) or `403` (a valid token without the scope needed).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// `missing_token`, `invalid_token` or `insufficient_scope`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// What the client was told (never the token).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The path of the request refused (at most 128 characters of it).
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// A token refused, with what its sender is told.
#[derive(Debug)]
pub(crate) struct Invalid(Cow<'static, str>);

impl Invalid {
    pub(crate) fn token(description: impl Into<Cow<'static, str>>) -> Self {
        Invalid(description.into())
    }

    #[cfg(test)]
    pub(crate) fn description(&self) -> &str {
        &self.0
    }
}

/// Told of each refusal logged.
type ReportFn = dyn Fn(&AuthRefusal) + Send + Sync;

/// How tokens are checked.
#[derive(Clone, Debug)]
enum Verifier {
    ApiKeys(Arc<ApiKeys>),
    #[cfg(feature = "jwt")]
    Jwt(JwtVerifier),
}

impl From<ApiKeys> for Verifier {
    fn from(keys: ApiKeys) -> Self {
        Verifier::ApiKeys(Arc::new(keys))
    }
}

#[cfg(feature = "jwt")]
impl From<JwtVerifier> for Verifier {
    fn from(verifier: JwtVerifier) -> Self {
        Verifier::Jwt(verifier)
    }
}

/// Bearer authentication for HTTP routes (see [the module](self)). Clones share the
/// verifier, the cache of verified tokens and the log of refusals.
#[derive(Clone)]
pub struct Authentication {
    inner: Arc<Inner>,
}

struct Inner {
    verifier: Verifier,
    metadata_url: Option<String>,
    required_scopes: Vec<String>,
    /// The principals of verified tokens (JWTs only: an API key is checked at once).
    #[cfg_attr(not(feature = "jwt"), allow(dead_code))]
    verified: quick_cache::sync::Cache<[u8; 32], (Principal, u64)>,
    refusals: RefusalLog,
    on_refusal: Option<Box<ReportFn>>,
}

impl fmt::Debug for Authentication {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authentication")
            .field("verifier", &self.inner.verifier)
            .field("metadata_url", &self.inner.metadata_url)
            .field("required_scopes", &self.inner.required_scopes)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Authentication`].
#[must_use]
pub struct AuthenticationBuilder {
    verifier: Verifier,
    metadata_url: Option<String>,
    required_scopes: Vec<String>,
    capacity: usize,
    on_refusal: Option<Box<ReportFn>>,
}

impl fmt::Debug for AuthenticationBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthenticationBuilder")
            .field("verifier", &self.verifier)
            .finish_non_exhaustive()
    }
}

impl Authentication {
    /// Authentication by `keys`, with the defaults.
    pub fn new(keys: ApiKeys) -> Self {
        Authentication::api_keys(keys).build()
    }

    /// Authentication by API keys.
    pub fn api_keys(keys: ApiKeys) -> AuthenticationBuilder {
        AuthenticationBuilder::of(keys.into())
    }

    /// Authentication by JWTs, checked by `verifier`.
    #[cfg(feature = "jwt")]
    #[cfg_attr(docsrs, doc(cfg(feature = "jwt")))]
    pub fn jwt(verifier: JwtVerifier) -> AuthenticationBuilder {
        AuthenticationBuilder::of(verifier.into())
    }

    /// The layer that authenticates every request of the routes it wraps.
    pub fn layer(&self) -> AuthLayer {
        AuthLayer { auth: self.clone() }
    }

    /// The principal of the request with these headers, or its refusal.
    pub async fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<Principal, AuthRefusal> {
        let refused = |status, reason, description: Cow<'static, str>| AuthRefusal {
            status,
            reason,
            description,
            path: String::new(),
        };
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let token = match (values.next(), values.next()) {
            (None, _) => {
                return Err(refused(
                    StatusCode::UNAUTHORIZED,
                    "missing_token",
                    "this route needs `Authorization: Bearer <token>`".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(refused(
                    StatusCode::UNAUTHORIZED,
                    "invalid_token",
                    "send one Authorization header".into(),
                ))
            }
            (Some(value), None) => strip_bearer(value.as_bytes())
                .and_then(|token| std::str::from_utf8(token).ok())
                .map(str::trim)
                .filter(|token| !token.is_empty())
                .ok_or_else(|| {
                    refused(
                        StatusCode::UNAUTHORIZED,
                        "invalid_token",
                        "the Authorization header must be `Bearer <token>`".into(),
                    )
                })?,
        };
        let principal = self.verify(token).await.map_err(|Invalid(description)| {
            refused(StatusCode::UNAUTHORIZED, "invalid_token", description)
        })?;
        let missing: Vec<&str> = self
            .inner
            .required_scopes
            .iter()
            .filter(|scope| !principal.has_scope(scope))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(refused(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                format!("the token lacks the scope {}", missing.join(" ")).into(),
            ));
        }
        Ok(principal)
    }

    async fn verify(&self, token: &str) -> Result<Principal, Invalid> {
        match &self.inner.verifier {
            Verifier::ApiKeys(keys) => keys
                .principal_of(token)
                .cloned()
                .ok_or_else(|| Invalid::token("the API key is not one of this server's")),
            #[cfg(feature = "jwt")]
            Verifier::Jwt(verifier) => {
                use sha2::Digest as _;
                let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
                let now = unix_now();
                if let Some((principal, exp)) = self.inner.verified.get(&digest) {
                    if now < exp {
                        return Ok(principal);
                    }
                    self.inner.verified.remove(&digest);
                }
                let (principal, exp) = verifier.verify(token).await?;
                self.inner.verified.insert(digest, (principal.clone(), exp));
                Ok(principal)
            }
        }
    }

    /// The answer to a refused request, and its log line (sampled) and report.
    fn refuse(&self, mut refusal: AuthRefusal, path: &str) -> Response {
        refusal.path = path.chars().take(128).collect();
        if let Some(suppressed) = self.inner.refusals.sample(Instant::now()) {
            tracing::info!(
                target: "tower_toolcall::auth",
                event = "auth_refused",
                path = %refusal.path,
                reason = refusal.reason,
                suppressed,
                "{}",
                refusal.description
            );
            if let Some(report) = &self.inner.on_refusal {
                report(&refusal);
            }
        }
        let mut challenge = String::from("Bearer");
        let mut params = Vec::new();
        if refusal.reason != "missing_token" {
            params.push(format!("error=\"{}\"", refusal.reason));
            params.push(format!(
                "error_description=\"{}\"",
                quoted(&refusal.description)
            ));
        }
        if refusal.reason == "insufficient_scope" {
            params.push(format!(
                "scope=\"{}\"",
                quoted(&self.inner.required_scopes.join(" "))
            ));
        }
        if let Some(url) = &self.inner.metadata_url {
            params.push(format!("resource_metadata=\"{}\"", quoted(url)));
        }
        if !params.is_empty() {
            challenge.push(' ');
            challenge.push_str(&params.join(", "));
        }
        let code = if refusal.status == StatusCode::FORBIDDEN {
            "FORBIDDEN"
        } else {
            "UNAUTHORIZED"
        };
        let mut response = (
            refusal.status,
            Json(serde_json::json!({
                "error": {"code": code, "reason": refusal.reason, "message": refusal.description}
            })),
        )
            .into_response();
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

impl AuthenticationBuilder {
    fn of(verifier: Verifier) -> Self {
        AuthenticationBuilder {
            verifier,
            metadata_url: None,
            required_scopes: Vec::new(),
            capacity: DEFAULT_VERIFIED_TOKENS,
            on_refusal: None,
        }
    }

    /// Where the server's [`ProtectedResource`] metadata is: named in every `401`'s
    /// `WWW-Authenticate` as `resource_metadata`.
    pub fn metadata_url(mut self, url: impl Into<String>) -> Self {
        self.metadata_url = Some(url.into());
        self
    }

    /// Scopes every token must have; a valid token without one of them is answered `403`
    /// with `error="insufficient_scope"`.
    pub fn required_scopes<I, S>(mut self, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.required_scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// How many verified tokens' principals are kept (default [`DEFAULT_VERIFIED_TOKENS`]).
    pub fn verified_tokens(mut self, tokens: usize) -> Self {
        self.capacity = tokens.max(1);
        self
    }

    /// Called for refused requests, as often as they are logged (at most once a second in
    /// a flood): for an audit of refusals.
    pub fn on_refusal(mut self, report: impl Fn(&AuthRefusal) + Send + Sync + 'static) -> Self {
        self.on_refusal = Some(Box::new(report));
        self
    }

    /// The authentication.
    pub fn build(self) -> Authentication {
        Authentication {
            inner: Arc::new(Inner {
                verifier: self.verifier,
                metadata_url: self.metadata_url,
                required_scopes: self.required_scopes,
                verified: quick_cache::sync::Cache::new(self.capacity),
                refusals: RefusalLog::default(),
                on_refusal: self.on_refusal,
            }),
        }
    }
}

/// A value of a quoted-string parameter: quotes and backslashes escaped, controls dropped.
fn quoted(value: &str) -> String {
    value
        .chars()
        .filter(|c| !c.is_control())
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

#[cfg(feature = "jwt")]
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The layer of [`Authentication::layer`].
#[derive(Clone, Debug)]
pub struct AuthLayer {
    auth: Authentication,
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            auth: self.auth.clone(),
            inner,
        }
    }
}

/// The service of [`AuthLayer`]: a request with a valid token goes on with its
/// [`Principal`] in its extensions; any other is answered `401` or `403`.
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    auth: Authentication,
    inner: S,
}

impl<S> Service<Request> for AuthService<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let auth = self.auth.clone();
        // The clone that was made ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            match auth.authenticate(request.headers()).await {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(refusal) => Ok(auth.refuse(refusal, request.uri().path())),
            }
        })
    }
}
