//! [`EnvelopeValidateLayer`]: refuses malformed, unknown, denied, unconfirmed, oversized and
//! schema-violating calls before anything else sees them.
//!
//! Checks, in order, each a rejection that never reaches the inner service and leaves nothing
//! behind:
//!
//! 1. the envelope's invariants (contract and payload version, required fields, retry budget)
//!    → `VALIDATION_ERROR`;
//! 2. a denied tool (`denied` in the registry) → `POLICY_DENIED`;
//! 3. a tool the registry does not know, when it is closed → `NOT_FOUND`;
//! 4. a `writes` or `commands` tool whose descriptor requires confirmation, called without
//!    `control.confirmationId` → `POLICY_DENIED`, whose details are
//!    `{"reason": "confirmation_required"}` ([`CONFIRMATION_REQUIRED`]: an edge that issues
//!    confirmation ids knows its refusal by it);
//! 5. params nested deeper than the canonical depth limit → `VALIDATION_ERROR`, or larger than
//!    the size limit (1 MiB of canonical JSON by default) → `PAYLOAD_TOO_LARGE`;
//! 6. params that fail the tool's input JSON Schema → `VALIDATION_ERROR` listing the failing
//!    paths.
//!
//! Optionally, output content that fails the tool's output schema becomes an
//! `INTERNAL_ERROR` listing the paths. Every rejection is terminal.
//!
//! A tool whose policy sets `validate = "off"` skips steps 5 and 6 and the output check;
//! 1 to 4 always apply, unless the operator turned every layer off
//! (`TOOL_RELIABILITY_ENABLED=false`, see [`control`](crate::control)): then no check
//! applies and every call reaches the inner service as it came.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{tool_fn, EnvelopeValidateLayer, ErrorCode, ToolCall, ToolOutput};
//!
//! # tokio_test::block_on(async {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
//!         .with_input_schema(json!({"type": "object", "required": ["query"]})))
//!     .build()
//!     .unwrap();
//! let mut svc = ServiceBuilder::new()
//!     .layer(EnvelopeValidateLayer::new(registry))
//!     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!([]))) }));
//!
//! let bad = ToolCall::builder("agents.tools.web", "search")
//!     .session("s").actor("u").params(json!({"q": "oops"})).build().unwrap();
//! let err = svc.ready().await.unwrap().call(bad).await.unwrap_err();
//! assert_eq!(err.code(), ErrorCode::ValidationError);
//! assert!(err.message().contains("payload.params"));
//! # });
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::{EnvelopeValidateLayer, EnvelopeValidateLayerBuilder, DEFAULT_MAX_PARAMS_BYTES};
pub use service::EnvelopeValidate;

/// The `reason` in the details of the refusal of a call that needs the user's confirmation
/// and carries no `control.confirmationId`.
pub const CONFIRMATION_REQUIRED: &str = "confirmation_required";
