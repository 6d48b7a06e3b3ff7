//! A tool's JSON Schema, compiled once when the registry is built (feature `schema`).
//!
//! Without the feature, a registry that gives a tool a schema is refused when it is built,
//! rather than left unchecked: validate params elsewhere, or turn the feature on.

use serde_json::Value;

#[cfg(feature = "schema")]
#[path = "schema/compiled.rs"]
mod imp;
#[cfg(not(feature = "schema"))]
#[path = "schema/refused.rs"]
mod imp;

pub(super) use imp::Schema;

pub(super) fn list(violations: &[String]) -> String {
    violations.join("; ")
}

pub(super) fn violation_details(field: &str, violations: &[String]) -> Value {
    serde_json::json!({ "field": field, "violations": violations })
}
