//! Observability and safety: redaction of secrets before anything is logged or stored.

mod redact;

pub use redact::{Redactor, RedactorBuilder, REDACTED};
