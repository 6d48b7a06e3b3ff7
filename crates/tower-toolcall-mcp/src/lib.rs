//! MCP for [`tower_toolcall`], with the official SDK `rmcp`: the stack on every MCP tool
//! call, in both directions. The core speaks `ToolCall`, `ToolOutput` and `ToolError`; this
//! crate converts at the edge.
//!
//! - **Server side.** [`McpServer`] is an rmcp [`ServerHandler`](rmcp::ServerHandler) (over
//!   stdio and streamable HTTP, in both protocol versions) that puts every `tools/call` of a
//!   wrapped handler, or of any `Service<ToolCall>` ([`McpServer::over`]), through a stack.
//!   The principal comes from the server's authentication ([`Principal`]), never from what
//!   a client says about itself; the session from the operator's `_meta` member or the
//!   transport session the server issued, scoped by the principal; the idempotency key from
//!   `_meta` ([`DEFAULT_IDEMPOTENCY_KEY_MEMBERS`]),
//!   scoped by the caller rather than the connection. An error is an `isError` result in
//!   MCP's words, its code in `_meta` ([`ERROR_META`]) and no structured content. Served over
//!   [`McpServer::progress_events`], the tools' progress notifications are logged as
//!   `tool_call_progress` events of the call. A [`ToolList`] can be
//!   [replaced](ToolList::replace) under a running server, which tells its clients (a
//!   `notifications/tools/list_changed` per 2025-11-25 session, per 2026-07-28
//!   `subscriptions/listen` stream).
//! - **Proxies.** Over an [`McpClient`], [`McpServer::over`] is a proxy: a [`ProgressRelay`]
//!   sends the upstream's progress on to the client that asked for it; a client's
//!   cancellation stops the calls of tools that are safe to repeat
//!   ([`ToolList::stop_repeatable_when_cancelled`]) and reaches the upstream; the upstream's
//!   tool list changes are seen by [`McpClient::tool_list_changes`].
//! - **Client side.** [`McpClient`] is a `Service<ToolCall>` over a remote MCP server, so an
//!   agent's outgoing calls get the same stack: an `isError` answer is terminal and not a
//!   health failure ([`IsError`]), a server that exits or loses its session is connected to
//!   again ([`McpClient::spawn`], [`McpClient::connect`]) while its tools fail fast; a client
//!   served with [`ClientEvents`] logs the server's progress notifications as
//!   `tool_call_progress` events of the call, and sees its tool list changes.
//! - **Policy.** [`descriptor_for`] and [`registry_for`] turn the tools' annotations into
//!   descriptors (`readOnlyHint` → read-only, `idempotentHint` → idempotent,
//!   `destructiveHint` → confirmation required), believed only from a [`Trust::Trusted`]
//!   server, and let an operator's registry file override any of them.
//! - **Line limit.** Over stdio (or any newline-delimited JSON-RPC stream), serve the server
//!   over [`stdio_transport`] or [`line_transport`]: an incoming line longer than their bound
//!   ([`DEFAULT_MAX_LINE_BYTES`], 4 MiB, by default; configurable, at least 4 KiB) is read
//!   through without being kept, logged and dropped; its request gets no answer (its id is in
//!   the dropped line) and the connection goes on serving the next lines. rmcp's own bound,
//!   which a transport made from a bare reader and writer gets, is 16 MiB, and such a line
//!   costs far more in memory and time, once parsed, than the stack needs to refuse it.
//!
//! ```
//! use std::sync::Arc;
//! use rmcp::model::{CallToolRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations};
//! use rmcp::{ServerHandler, ServiceExt};
//! use tower_toolcall_mcp::{
//!     line_transport, registry_for, McpClient, McpServer, Trust, DEFAULT_MAX_LINE_BYTES,
//! };
//! use tower_toolcall::ToolStack;
//!
//! struct Notes;
//!
//! impl ServerHandler for Notes {
//!     fn get_info(&self) -> ServerConfig {
//!         ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
//!     }
//!
//!     async fn call_tool(
//!         &self,
//!         request: CallToolRequestParams,
//!         _context: rmcp::service::RequestContext<rmcp::RoleServer>,
//!     ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
//!         let text = format!("no notes match {:?}", request.arguments.unwrap_or_default());
//!         Ok(rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)]).into())
//!     }
//! }
//!
//! # tokio_test::block_on(async {
//! let tools = [Tool::new("search", "Searches the notes", Arc::new(serde_json::Map::new()))
//!     .annotate(ToolAnnotations::new().read_only(true))];
//! let stack = ToolStack::builder(registry_for("notes", &tools, Trust::Trusted, None)?).build()?;
//!
//! let (server_end, client_end) = tokio::io::duplex(64 * 1024);
//! tokio::spawn(async move {
//!     let (read, write) = tokio::io::split(server_end);
//!     let transport = line_transport(read, write, DEFAULT_MAX_LINE_BYTES)?;
//!     let running = McpServer::new(Notes, "notes", stack).serve(transport).await?;
//!     running.waiting().await?;
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
//! });
//! let client = ().serve(client_end).await?;
//! let result = client
//!     .call_tool(CallToolRequestParams::new("search").with_arguments(serde_json::json!({"q": "tower"}).as_object().unwrap().clone()))
//!     .await?;
//! assert_eq!(result.is_error, Some(false));
//! # let _ = McpClient::new(client.peer().clone());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Feature flags
//!
//! | feature | default | what it brings |
//! |---|---|---|
//! | `schema` | yes | the tools' input and output schemas in their descriptors, checked by `tower-toolcall`'s `schema` feature (which it turns on) |
//! | `http` | no | rmcp's streamable-HTTP client transport for [`McpClient`] (`rmcp::transport::StreamableHttpClientTransport`, on `reqwest` without TLS: enable one of `reqwest`'s TLS features for `https`) |

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod convert;
mod identity;
mod in_flight;
mod lines;
mod meta;
mod policy;
mod progress;
mod server;
mod wording;

#[cfg(feature = "http")]
pub use client::{pooled_http_client, pooled_http_client_builder, DEFAULT_HTTP_IDLE_TIMEOUT};
pub use client::{
    ClientEvents, McpClient, UpstreamState, UpstreamStats, DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_RECONNECT_BACKOFF, DEFAULT_RECONNECT_TIMEOUT,
};
pub use convert::IsError;
pub use lines::{line_transport, stdio_transport, DEFAULT_MAX_LINE_BYTES};
pub use meta::{
    CONFIRMATION_ID_META, DEFAULT_IDEMPOTENCY_KEY_MEMBERS, ERROR_META, FROM_CACHE_META,
    IDEMPOTENCY_KEY_META, RESULT_META_PREFIX,
};
pub use policy::{descriptor_for, registry_for, registry_for_servers, registry_of, Trust};
pub use progress::ProgressRelay;
/// The HTTP client crate of [`McpClient::http_with_client`], as this crate depends on it.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use reqwest;
pub use server::{
    Confirm, HandlerTool, McpServer, SessionAnswer, ToolList, DEFAULT_CONFIRMATION_TIMEOUT,
};
/// The authenticated caller of a request (see [`McpServer`]'s who calls).
pub use tower_toolcall::Principal;

/// The examples of the README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
