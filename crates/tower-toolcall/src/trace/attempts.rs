//! The audit log's events of each attempt, written as the attempt reaches the tool and as
//! it comes back.

use serde_json::json;

use super::audit::{AuditLog, ExecutionEvent};
use super::event_kind::{EventKind, EventLevel};
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::hooks::ToolHooks;
use crate::outcome::ToolOutput;

/// Writes `step.started` to an [`AuditLog`] before each attempt reaches the tool and
/// `step.finished` or `step.failed` after it; made by [`AuditLog::attempt_hooks`].
///
/// Put it innermost, around the tool, with a [`HookLayer`](crate::HookLayer), so that only
/// attempts that really reach the tool are written: [`ToolStack`](crate::ToolStack) does so
/// for the audit log of its trace layer. A call that a layer refused, or answered from a
/// record, has no attempt events; the trace layer writes one `step.refused` or
/// `step.cached` event for it instead.
///
/// ```
/// use tower::{Layer, ServiceBuilder};
/// use tower_toolcall::trace::{AuditLog, TraceLayer};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::{tool_fn, HookLayer, RetryLayer, ToolCall, ToolOutput};
///
/// let audit = AuditLog::builder(std::env::temp_dir().join("audit-doc")).build()?;
/// let svc = ServiceBuilder::new()
///     .layer(TraceLayer::new().audit(audit.clone()))
///     .layer(RetryLayer::new(ToolRegistry::open()))
///     .layer(HookLayer::new(audit.attempt_hooks()))
///     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::default()) }));
/// # let _ = svc;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct AuditAttempts {
    audit: AuditLog,
}

impl AuditAttempts {
    pub(super) fn new(audit: AuditLog) -> Self {
        AuditAttempts { audit }
    }
}

impl ToolHooks for AuditAttempts {
    fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
        self.audit.record_event(
            ExecutionEvent::new(EventKind::StepStarted, call, "attempt started")
                .attempt(call.attempt()),
        );
        Ok(())
    }

    fn after_attempt(&self, call: &ToolCall, outcome: &Result<ToolOutput, ToolError>) {
        let event = match outcome {
            Ok(_) => ExecutionEvent::new(EventKind::StepFinished, call, "attempt succeeded"),
            Err(error) => ExecutionEvent::new(EventKind::StepFailed, call, "attempt failed")
                .level(EventLevel::Warn)
                .payload(json!({
                    "errorCode": error.code().as_str(),
                    "retriable": crate::classify::decided_retriable(error),
                })),
        };
        self.audit.record_event(event.attempt(call.attempt()));
    }
}
