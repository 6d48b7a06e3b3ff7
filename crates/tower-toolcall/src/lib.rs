//! Tower middleware that makes AI-agent tool calls reliable.
//!
//! Agents call tools (search the web, write a file, send a message, run a command) through a
//! gateway. Under client retries, reconnects, flaky dependencies and models that loop, those
//! calls run twice, run forever, or hammer a dead service. `tower-toolcall` puts every call
//! in one envelope, [`ToolCall`], and offers independent [`tower`] layers around any
//! `Service<ToolCall, Response = ToolOutput, Error = ToolError>`:
//!
//! | layer | what it does |
//! |---|---|
//! | [`EnvelopeValidateLayer`] | refuses malformed, unknown, denied, unconfirmed, oversized and schema-violating calls |
//! | [`LoopDetectLayer`] | stops a model that repeats the same call, cycles through calls, or retries a failing call ([`loop_detect`]) |
//! | [`RateLimitLayer`] | holds each tool (or tool and tenant, or tool and session) to a quota of calls a second: `RATE_LIMITED` or a wait |
//! | [`IdempotencyLayer`] | runs each idempotency key at most once: in-flight joins, cached results, key-reuse conflicts, memory and Redis stores |
//! | [`BulkheadLayer`] | runs at most `max_concurrent` calls of a tool (or of a namespace's tools together) at once; the others wait in a bounded queue by `priority`, then arrival, or are refused with `RATE_LIMITED` ([`bulkhead`]) |
//! | [`RetryLayer`] | retries failures the [classifier](classify) calls retriable, when a repeat is safe, with jittered backoff, deadlines and a global retry budget |
//! | [`CircuitBreakerLayer`] | fails calls fast while a tool or its dependency keeps failing, and probes its recovery |
//! | [`TimeoutLayer`] | bounds each attempt by the tool's timeout, narrowed by the call's hint |
//! | [`ResultEnvelopeLayer`] | answers every call with a complete [`ToolResult`] envelope |
//! | [`TraceLayer`] | a `tracing` span and events per call, metrics, redaction and the audit log ([`trace`]) |
//! | [`HookLayer`] | runs the application's [`ToolHooks`] before and after every attempt; with [`TraceLayer::hooks`](trace::TraceLayer::hooks), once on every short-circuit path ([`hooks`]) |
//! | [`ToolStack`] | all of the above in the recommended order, as one layer built from one registry ([`stack`]) |
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{
//!     tool_fn, EnvelopeValidateLayer, ResultEnvelopeLayer, ResultStatus, ToolCall, ToolOutput,
//! };
//!
//! # tokio_test::block_on(async {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
//!         .with_input_schema(json!({
//!             "type": "object",
//!             "required": ["query"],
//!             "properties": {"query": {"type": "string", "minLength": 1}}
//!         })))
//!     .build()?;
//!
//! let search = tool_fn(|call: ToolCall| async move {
//!     Ok(ToolOutput::new(json!({"hits": [], "query": call.params().as_map().get("query")})))
//! });
//! let mut stack = ServiceBuilder::new()
//!     .layer(ResultEnvelopeLayer::new())
//!     .layer(EnvelopeValidateLayer::new(registry))
//!     .service(search);
//!
//! let call = ToolCall::from_json(br#"{
//!     "contractVersion": "1.1",
//!     "requestId": "01J9Z8Q4V6K3T2M1N0P9R8S7T7",
//!     "toolName": "search",
//!     "toolNamespace": "agents.tools.web",
//!     "target": {"sessionKey": "sess-42", "actorId": "user-7"},
//!     "payload": {"version": "1.0", "params": {"query": "rust tower retry"}}
//! }"#)?;
//! let result = stack.ready().await.unwrap().call(call).await.unwrap();
//! assert_eq!(result.status, ResultStatus::Success);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # The envelope
//!
//! [`ToolCall`] and [`ToolResult`] serialize to the camelCase JSON of contract version 1.1
//! (see [`envelope`]). A `ToolCall` is cheap to clone: the envelope and its params sit behind
//! [`Arc`](std::sync::Arc)s. [`ToolError`] is the one error type of every layer and tool, with
//! a stable [`ErrorCode`]; each layer records what it did in the outcome's [`CallRecord`], and
//! [`ToolResult::from_outcome`] turns the outcome into the result envelope.
//!
//! # Tools and their policy
//!
//! A [`ToolRegistry`](registry::ToolRegistry) describes each tool once: its risk level,
//! whether it is idempotent, its JSON Schemas, and per-layer settings, any of which may be
//! `"off"`. It loads from TOML or JSON; bad files are refused with the field named. In code, a
//! policy is written with by-value setters:
//! `ToolPolicy::default().with_retry(RetrySettings::default().with_max_attempts(3))`.
//!
//! The crate's records, policies and configurations are `#[non_exhaustive]`, so that a new
//! field or variant is not a breaking change: build them with their constructors and `with_*`
//! setters, and give a `match` over one of their enums a `_` arm.
//!
//! # The whole stack
//!
//! [`ToolStack`] assembles every layer in the order that makes them work together, hands each
//! the same registry (and with it the operator switches), and gives one hooks object to the
//! two places that need it. Outermost first: `Trace → EnvelopeValidate → LoopDetect →
//! RateLimit → Idempotency → Bulkhead → Retry → CircuitBreaker → Timeout → Hook → tool`. Loop
//! detection sees every repeat the model issues before the idempotency cache answers it;
//! idempotency wraps the whole retried execution as one record, and answers a duplicate
//! before it takes a place in the bulkhead; a call holds its place across its retries, and
//! neither retry nor the breaker sees a bulkhead's refusal; the breaker sits inside retry, so
//! that it counts each attempt and an open breaker stops the retries; the timeout bounds each
//! attempt. Any layer can be left out ([`StackLayer`]) or tuned through its own builder with
//! its settings (the type a tool's policy uses for that layer), and each stays usable alone.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RetrySettings, ToolRegistry};
//! use tower_toolcall::*;
//!
//! # tokio_test::block_on(async {
//! let retry = RetrySettings::default().with_max_attempts(3);
//! let stack = ToolStack::builder(ToolRegistry::open())
//!     .retry(|layer| layer.settings(retry))
//!     .build()?;
//! let mut service = ServiceBuilder::new()
//!     .layer(ResultEnvelopeLayer::new())
//!     .layer(stack.clone())
//!     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("done"))) }));
//!
//! let call = || {
//!     ToolCall::builder("vault", "createFile")
//!         .session("s")
//!         .actor("u")
//!         .idempotency_key("create-1")
//!         .params(json!({"path": "a.md"}))
//!         .build()
//!         .unwrap()
//! };
//! let first = service.ready().await?.call(call()).await?;
//! let again = service.ready().await?.call(call()).await?;
//! assert!(!first.from_cache && again.from_cache);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # A whole turn
//!
//! The executor of the crate `tower-toolcall-executor` runs the model's plan for a turn over
//! any `Service<ToolCall>`, normally the stack: references resolved before dispatch, `foreach` expanded lazily, independent
//! steps side by side, a turn deadline with partial results, cascading skips, defaults and
//! alternatives, confirmation, a bounded stream of events, an audit directory per run and a
//! deterministic replay of it.
//!
//! # Redaction and audit
//!
//! [`trace::Redactor`] replaces secret-looking members and credential-shaped values before
//! anything is logged; [`trace::AuditLog`] writes `calls.jsonl`, `results.jsonl` and
//! `events.jsonl` off the call path.
//!
//! # Operator switches
//!
//! A [`control::ReliabilityControl`] carried by the registry holds the kill switch
//! (`TOOL_RELIABILITY_ENABLED=false` makes every layer a pass-through), breaker enforcement,
//! key derivation and shadow mode per layer; read from the environment when the stack is
//! built, flipped at run time through any clone of the handle.
//!
//! # A fleet of replicas
//!
//! With the crate `tower-toolcall-redis`, replicas behind a load balancer share what would
//! otherwise be per process: rate-limit quotas (a [`rate_limit::RateLimitStore`]),
//! loop-detection histories (a [`loop_detect::LoopStore`]) and operator actions (a
//! [`stack::FleetActions`]), on top of the idempotency records (a
//! [`idempotency::DedupeStore`]). What a layer does while its store is unreachable is its
//! [`shared_store::FailurePolicy`].
//!
//! # Canonical params
//!
//! [`canonical`] writes params as RFC 8785 canonical JSON after removing nulls, volatile
//! members and surrounding white space, and derives idempotency keys from it.
//!
//! # Feature flags
//!
//! | feature | default | what it brings |
//! |---|---|---|
//! | `schema` | yes | params and outputs checked against the tools' JSON Schemas (`jsonschema`) |
//! | `toml` | yes | [`ToolRegistry::from_toml_str`](registry::ToolRegistry::from_toml_str) |
//! | `metrics` | no | `trace::ToolMetrics`: series of every call through the `metrics` facade |
//! | `opentelemetry` | no | the call's W3C `traceparent` as the remote parent of its span, for `tracing-opentelemetry` |
//! | `axum` | no | `IntoResponse` for [`ToolResult`]: its status from the error code, `Retry-After`, the envelope as JSON (the tool router, the extractor and the admin API are the crate `tower-toolcall-axum`'s) |
//! | `tonic` | no | `grpc`: `ToolError` as a gRPC `Status` and back |
//! | `full` | no | every feature |

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bounds;
pub mod breaker;
mod breaker_view;
pub mod bulkhead;
mod contract;
pub mod detach;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod grpc;
pub mod hooks;
pub mod idempotency;
pub mod loop_detect;
mod middleware;
pub mod rate_limit;
mod redact;
mod resend;
#[cfg(feature = "axum")]
mod response;
pub mod retry;
pub mod shared_store;
mod spans;
pub mod stack;
mod stack_part;
pub mod stream;
pub mod timeout;
mod tool_fn;
mod tool_table;
pub mod trace;
pub mod validate;

pub use contract::time;
pub use contract::{canonical, classify, control, event, registry};
pub(crate) use contract::{error, outcome};

// The public `envelope` joins the call envelope and the result envelope, which stand at two
// levels of the contract: the result is made with the classifier, which reads the registry,
// which reads calls.
pub mod envelope {
    //! The wire format: the [`ToolCall`] envelope (contract version 1.1), its parts, and the
    //! [`ToolResult`] envelope.
    //!
    //! Both serialize to camelCase JSON exactly as the contract describes. Required fields of a
    //! call: `contractVersion` (`"1.1"`), `requestId`, `toolName`, `toolNamespace`,
    //! `target.sessionKey`, `target.actorId`, `payload.version` (`"1.0"`) and `payload.params`
    //! (an object). The sections `transport`, `control` and `trace` may be absent; the layers
    //! then use the tool's policy. Unknown members are ignored.
    //!
    //! [`ToolCall::from_json`] takes I-JSON (RFC 7493) only, in known and unknown members alike:
    //! an object where the contract says object (never the array of its fields that serde would
    //! take for a struct), no member name twice in one object, valid Unicode, and numbers that a
    //! double can hold. Identifiers have at most [`MAX_IDENTIFIER_BYTES`] bytes, the idempotency
    //! key at most [`MAX_IDEMPOTENCY_KEY_BYTES`].

    pub use crate::contract::envelope::*;
    pub use crate::contract::result::{
        ChunkContent, ChunkEnvelope, FinalChunk, ResultEnvelope, ResultEnvelopeFuture,
        ResultEnvelopeLayer, ResultError, ResultStatus, StreamTally, ToolResult,
    };
}

pub use envelope::{
    BreakerScope, CallEnvelope, DedupeMode, Params, Principal, Priority, ResultEnvelopeLayer,
    ResultStatus, ToolCall, ToolResult,
};
pub use error::{ConfigError, ErrorClass, ErrorCode, ToolError, UnknownErrorCode};
pub use hooks::{HookLayer, ToolHooks};
pub use idempotency::IdempotencyLayer;
pub use loop_detect::LoopDetectLayer;
pub use outcome::{
    BreakerState, CacheMatch, CallRecord, HedgeRecord, MatchedOn, RetryClamp, RetryRecord,
    ShadowDecision, ShadowVerdict, ShortCircuit, ToolOutput,
};
pub use tool_fn::{tool_fn, BoxToolFuture, ToolFn};
pub use validate::EnvelopeValidateLayer;

pub use breaker::CircuitBreakerLayer;
pub use bulkhead::BulkheadLayer;
pub use rate_limit::RateLimitLayer;
pub use retry::RetryLayer;
pub use stack::{StackLayer, ToolStack, ToolStackBuilder, ToolStackService};
pub use timeout::TimeoutLayer;
pub use trace::TraceLayer;
