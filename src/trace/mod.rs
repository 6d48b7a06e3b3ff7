//! Observability and safety: redaction of secrets before anything is logged or stored, and
//! the audit log.

mod audit;
mod redact;

pub use audit::{AuditLog, AuditLogBuilder, AuditSink, AuditStats, AuditStream, ExecutionEvent};
pub use redact::{Redactor, RedactorBuilder, REDACTED};
