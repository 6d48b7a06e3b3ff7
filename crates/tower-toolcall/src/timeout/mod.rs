//! [`TimeoutLayer`]: bounds each attempt of a tool call.
//!
//! An attempt that has not answered within its timeout is dropped and answered with a
//! `TIMEOUT` error, which is retriable: a [`RetryLayer`](crate::RetryLayer) outside tries again
//! when that is safe, and a [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) in between
//! counts it against the tool.
//!
//! The timeout of an attempt is, for the call's tool:
//!
//! - `policy.timeout.attempt_timeout_ms` of its descriptor (set by
//!   [`ToolDescriptor::with_attempt_timeout`](crate::registry::ToolDescriptor::with_attempt_timeout)),
//!   else the layer's default (30 s unless its settings say otherwise);
//! - narrowed by the call's `payload.callHints.timeoutMs`, which may shorten it, never lengthen
//!   it;
//! - none at all when the tool's policy sets `timeout = "off"`, or when the operator turned
//!   every layer off (`TOOL_RELIABILITY_ENABLED=false`, see [`control`](crate::control)):
//!   the calls pass untouched.
//!
//! The clock of an attempt starts when the attempt first waits: an attempt that answers at
//! once costs no timer. Time is tokio's, so paused time drives the layer in tests.
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{tool_fn, ErrorCode, TimeoutLayer, ToolCall, ToolOutput};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
//!         .with_attempt_timeout(Duration::from_secs(2)))
//!     .build()
//!     .unwrap();
//! let mut svc = ServiceBuilder::new()
//!     .layer(TimeoutLayer::new(registry))
//!     .service(tool_fn(|_call: ToolCall| async {
//!         tokio::time::sleep(Duration::from_secs(5)).await;
//!         Ok(ToolOutput::new(json!([])))
//!     }));
//! let call = ToolCall::builder("agents.tools.web", "search")
//!     .session("s").actor("u").build().unwrap();
//! let err = svc.ready().await.unwrap().call(call).await.unwrap_err();
//! assert_eq!(err.code(), ErrorCode::Timeout);
//! assert!(err.is_retriable());
//! # }
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::{TimeoutLayer, TimeoutLayerBuilder};
pub use service::Timeout;
