//! The admin API's bearer token, compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The SHA-256 of the token: comparing digests of a fixed length takes the same time
/// whatever the token's length and however much of it a guess gets right.
#[derive(Clone)]
pub(super) struct BearerToken(Arc<[u8; 32]>);

impl BearerToken {
    pub(super) fn new(token: &str) -> Self {
        BearerToken(Arc::new(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether the `Authorization` header value is `Bearer <the token>`.
    fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(|v| strip_bearer(v)) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(&*self.0))
    }
}

fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

/// Lets a request through only with the right bearer token; 401 otherwise.
pub(super) async fn require_token(
    State(token): State<BearerToken>,
    request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if token.admits(authorization) {
        return next.run(request).await;
    }
    tracing::info!(
        target: "tower_toolcall::admin",
        path = %request.uri().path(),
        "admin request refused: missing or wrong bearer token"
    );
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(serde_json::json!({
            "error": {
                "code": "UNAUTHORIZED",
                "message": "the admin API needs `Authorization: Bearer <token>` with the right token"
            }
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_is_admitted() {
        let token = BearerToken::new("s3cret-token");
        assert!(token.admits(Some(b"Bearer s3cret-token")));
        assert!(token.admits(Some(b"bearer s3cret-token")));
        assert!(!token.admits(None));
        assert!(!token.admits(Some(b"Bearer s3cret-toke")));
        assert!(!token.admits(Some(b"Bearer s3cret-token ")));
        assert!(!token.admits(Some(b"Basic s3cret-token")));
        assert!(!token.admits(Some(b"s3cret-token")));
    }
}
