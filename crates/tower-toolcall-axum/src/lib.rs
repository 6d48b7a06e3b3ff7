//! Tool calls of [`tower_toolcall`] over HTTP with [axum](https://docs.rs/axum): the tool
//! router, the extractor, the admin API and a server with the limits untrusted clients need.
//!
//! - [`IntoResponse` for `ToolResult`](tower_toolcall::ToolResult#impl-IntoResponse-for-ToolResult),
//!   in the core under its `axum` feature (which this crate turns on): the status from the
//!   error code ([`ErrorCode::http_status`](tower_toolcall::ErrorCode::http_status)),
//!   `Retry-After` when the result says when to come back, the envelope as JSON.
//! - [`JsonToolCall`]: an extractor reading a `ToolCall` from a JSON body within a body limit,
//!   with the `Idempotency-Key` and `traceparent` headers put into it; bad input is answered
//!   with a `ToolResult` envelope (400, naming the field).
//! - [`ToolRouter`]: `POST /v1/tools/call` through any tool service and `GET /v1/tools`.
//! - [`AdminRouter`]: breakers, loop sessions, dedupe records and switches, behind a bearer
//!   token.
//! - [`authn`]: who calls: bearer API keys or JWTs (feature `jwt`), the caller's
//!   [`Principal`](tower_toolcall::Principal) in the request's extensions, and the OAuth
//!   protected-resource metadata an MCP client looks for; [`HostGuard`]: the `Host` and
//!   `Origin` checks every route of a server reachable from a browser needs.
//! - [`serve`]: the router on a TCP listener with a header-read timeout (which also closes
//!   idle connections) and a cap on connections ([`ServeConfig`]).
//!
//! [`ToolRouter`]'s docs say what a gateway facing untrusted clients needs: JSON bodies only,
//! calls detached from their connection, bounded calls in flight, timeouts.
//!
//! The core speaks `ToolCall`, `ToolOutput` and `ToolError`; this crate converts at the edge.
//!
//! ```no_run
//! use serde_json::json;
//! use tower::Layer;
//! use tower_toolcall_axum::{serve, AdminRouter, ServeConfig, ToolRouter};
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = ToolRegistry::from_json_str(
//!     r#"{"tools": [{"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true}]}"#,
//! )?;
//! let stack = ToolStack::builder(registry).build()?;
//! let tools = stack.layer(tool_fn(|call: ToolCall| async move {
//!     match call.tool_name() {
//!         "search" => Ok(ToolOutput::new(json!({"hits": []}))),
//!         other => Err(ToolError::invalid_field("toolName", format!("is unknown: {other}"))),
//!     }
//! }));
//! let mut app = ToolRouter::new(stack.registry().clone(), tools);
//! if let Ok(token) = std::env::var("TOOLCALL_ADMIN_TOKEN") {
//!     app = app.admin(AdminRouter::new(&stack, token)?);
//! }
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let shutdown = async { tokio::signal::ctrl_c().await.ok(); };
//! serve(listener, app.into_router(), ServeConfig::default(), shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! | feature | default | what it brings |
//! |---|---|---|
//! | `jwt` | no | [`authn::JwtVerifier`]: bearer JWTs checked against a JWKS (`jsonwebtoken` with RustCrypto, `reqwest` to fetch the keys) |
//! | `tls` | no | `ServerTls` and `ServeConfig::tls`: [`serve`] over TLS from a certificate and key in PEM files, reloadable (rustls) |
//!
//! `AdminRouter::fleet` needs no feature: it sends the operator's actions to every replica
//! through any `FleetActions`, such as `tower-toolcall-redis`'s `FleetControl`.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod auth;
pub mod authn;
mod confirm;
mod extract;
mod guard;
mod router;
mod serve;
#[cfg(feature = "tls")]
mod tls;
mod tools;

pub use admin::{AdminRouter, MIN_TOKEN_BYTES};
pub use confirm::DEFAULT_CONFIRMATION_TTL;
pub use extract::{JsonToolCall, IDEMPOTENCY_KEY, TRACEPARENT};
pub use guard::{Guarded, HostGuard, LOOPBACK_HOSTS};
pub use router::{
    CallSlots, ToolRouter, ADMIN_PATH, CALL_PATH, DEFAULT_BODY_LIMIT, DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_CALLS_IN_FLIGHT, DEFAULT_UNAVAILABLE_RETRY_AFTER, TOOLS_PATH,
};
pub use serve::{serve, ServeConfig, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
#[cfg(feature = "tls")]
pub use tls::ServerTls;
pub use tools::tool_listing;

use tower_toolcall::time::millis;
