//! `IntoResponse` for [`ToolResult`]: the status from the error code, `Retry-After` when the
//! result says when to come back, the envelope as JSON.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::envelope::ToolResult;

/// The answer to a call over HTTP: the [`ToolResult`] envelope as a JSON body, with the
/// status [`ToolResult::http_status`] gives (200 for a success, the
/// [status of the error code](crate::ErrorCode::http_status) otherwise) and, when the error
/// has a `retryAfterMs`, a `Retry-After` header in whole seconds, rounded up.
///
/// ```
/// use std::time::Duration;
/// use axum::response::IntoResponse;
/// use tower_toolcall::{ErrorCode, ToolError, ToolResult};
///
/// let error = ToolError::rejected(ErrorCode::CircuitOpen, "search is failing; try later")
///     .with_retry_after(Duration::from_millis(1_200));
/// let response = ToolResult::rejected(error).into_response();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "2");
/// ```
impl IntoResponse for ToolResult {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self
            .error
            .as_ref()
            .and_then(|e| e.retry_after_ms)
            .map(|ms| ms.div_ceil(1000));
        let mut response = (status, Json(self)).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
