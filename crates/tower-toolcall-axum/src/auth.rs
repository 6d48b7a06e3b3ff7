//! The admin API's bearer token, compared in constant time.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

/// The most refusals logged per this interval; the others are counted into the next line.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The most characters of a refused request's path that are logged.
const LOGGED_PATH_CHARS: usize = 128;

/// The SHA-256 of the token: comparing digests of a fixed length takes the same time
/// whatever the token's length and however much of it a guess gets right. With it, the log
/// of refusals.
#[derive(Clone)]
pub(super) struct BearerToken {
    digest: Arc<[u8; 32]>,
    refusals: RefusalLog,
}

impl BearerToken {
    pub(super) fn new(token: &str) -> Self {
        BearerToken {
            digest: Arc::new(Sha256::digest(token.as_bytes()).into()),
            refusals: RefusalLog::default(),
        }
    }

    /// Whether the `Authorization` header value is `Bearer <the token>`.
    fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(|v| strip_bearer(v)) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(&*self.digest))
    }
}

/// Samples the log of refused requests: a flood of them writes one line a second, which
/// counts the refusals not logged since the previous line.
#[derive(Clone, Default)]
pub(crate) struct RefusalLog(Arc<Mutex<RefusalWindow>>);

#[derive(Default)]
struct RefusalWindow {
    logged_at: Option<Instant>,
    suppressed: u64,
}

impl RefusalLog {
    /// `Some(refusals not logged since the last line)` when this refusal is to be logged.
    pub(crate) fn sample(&self, now: Instant) -> Option<u64> {
        let mut window = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match window.logged_at {
            Some(at) if now.saturating_duration_since(at) < REFUSAL_LOG_INTERVAL => {
                window.suppressed += 1;
                None
            }
            _ => {
                window.logged_at = Some(now);
                Some(std::mem::take(&mut window.suppressed))
            }
        }
    }
}

pub(crate) fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
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
    if let Some(suppressed) = token.refusals.sample(Instant::now()) {
        let path: String = request
            .uri()
            .path()
            .chars()
            .take(LOGGED_PATH_CHARS)
            .collect();
        tracing::info!(
            target: "tower_toolcall::admin",
            path = %path,
            suppressed,
            "admin request refused: missing or wrong bearer token"
        );
    }
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

    #[tokio::test(start_paused = true)]
    async fn refusals_are_logged_once_a_second_with_the_count_not_logged() {
        let log = RefusalLog::default();
        let mut lines = Vec::new();
        for _ in 0..3 {
            for _ in 0..1_000 {
                if let Some(suppressed) = log.sample(Instant::now()) {
                    lines.push(suppressed);
                }
                tokio::time::advance(Duration::from_micros(500)).await;
            }
            tokio::time::advance(Duration::from_millis(600)).await;
        }
        // 1 000 refusals over 0.5 s, then a pause: one line per second at most.
        assert_eq!(lines, [0, 999, 999]);
    }
}
