//! Observability and safety: a `tracing` span and log events per call, redaction of
//! secrets before anything is logged or stored, and the audit log.
//!
//! [`TraceLayer`] opens one span per call, named `execute_tool` with `otel.name =
//! "execute_tool {tool}"` and the OpenTelemetry GenAI attributes `gen_ai.operation.name`,
//! `gen_ai.tool.name` and `gen_ai.tool.call.id`, plus `requestId`, `sessionKey`,
//! `correlationId`, and `error.type` when the call fails. Inside it, the event
//! `tool_call_start` (DEBUG) and, at the end, `tool_call_end` or — when a layer refused the
//! call instead of running the tool — `tool_call_blocked` (INFO), each with the contract's
//! field set, a redacted error message, and the short-circuit `path` when a layer answered.
//! Put it outermost, just inside [`ResultEnvelopeLayer`](crate::ResultEnvelopeLayer), so that
//! it sees every call.
//!
//! With [`TraceLayer::hooks`], the layer calls the application's
//! [`ToolHooks::on_short_circuit`](crate::ToolHooks::on_short_circuit) once for every call a
//! layer answered without running the tool (see [`hooks`](crate::hooks)).
//!
//! Layers in shadow mode (see [`control`](crate::control)) decide without enforcing: each
//! decision in the call's record is logged as one more INFO event, `tool_call_shadow`, with
//! `layer` (`breaker`, `loop_detect`, `idempotency`, `rate_limit`), `decision`
//! (`would_reject`, `would_open`, `would_block`, `would_replay`, …), `toolName` and
//! `requestId`; counted by the metrics; and written to the audit log as a `step.shadow`
//! event.
//!
//! With the feature `opentelemetry`, a well-formed W3C `traceparent` in the envelope
//! (`trace.traceparent`) becomes the remote parent of the call's span for
//! [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry), so that the span joins
//! the caller's trace; a malformed one is ignored (and logged at DEBUG) and the call starts a
//! new trace. Without an OpenTelemetry layer in the subscriber this changes nothing.
//!
//! With an [`AuditLog`], the layer also writes each call to `calls.jsonl`, its result to
//! `results.jsonl`, and its run events to `events.jsonl`, all redacted, without file I/O on
//! the call path: `run.started` when the call arrives; `step.shadow` per shadow decision;
//! for a call that a layer refused, `step.refused`, and for one answered from an
//! idempotency record (completed or joined in flight), `step.cached`, each with the `path`
//! it took; then `run.finished`, `run.failed` or `run.blocked`. The attempts that reach the
//! tool are written by the log's [attempt hooks](AuditLog::attempt_hooks), around the tool:
//! one `step.started` before each attempt and one `step.finished` or `step.failed` after it.
//! [`ToolStack`](crate::ToolStack) puts them there; a stack built by hand adds
//! `HookLayer::new(audit.attempt_hooks())` innermost.

mod attempts;
mod audit;
mod event_kind;
mod events;
mod future;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod service;
#[cfg(feature = "opentelemetry")]
mod traceparent;

pub use crate::redact::{Redactor, RedactorBuilder, REDACTED};
pub use attempts::AuditAttempts;
pub use audit::{AuditLog, AuditLogBuilder, AuditSink, AuditStats, AuditStream, ExecutionEvent};
pub use event_kind::{EventKind, EventLevel};
pub use future::ResponseFuture;
pub use layer::TraceLayer;
#[cfg(feature = "metrics")]
pub use metrics::{ToolMetrics, ToolMetricsBuilder, DURATION_BUCKETS};
pub use service::Trace;
