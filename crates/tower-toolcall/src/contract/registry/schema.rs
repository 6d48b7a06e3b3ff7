//! A tool's JSON Schema, compiled once when the registry is built (feature `schema`).
//!
//! Without the feature, a registry that gives a tool a schema is refused when it is built,
//! rather than left unchecked: validate params elsewhere, or turn the feature on.

use serde_json::Value;

use crate::contract::error::ConfigError;

/// The most schema violations listed in one error message.
#[cfg(feature = "schema")]
const MAX_LISTED_VIOLATIONS: usize = 8;

/// A compiled schema.
pub(super) struct Schema {
    #[cfg(feature = "schema")]
    validator: jsonschema::Validator,
}

impl Schema {
    /// Compiles `schema`, the value of the descriptor's `field`.
    #[cfg(feature = "schema")]
    pub(super) fn compile(field: &str, schema: &Value) -> Result<Schema, ConfigError> {
        let validator = jsonschema::validator_for(schema).map_err(|e| {
            let at = e.instance_path().to_string();
            let problem = if at.is_empty() {
                format!("is not a valid JSON Schema: {e}")
            } else {
                format!("is not a valid JSON Schema: at {at}: {e}")
            };
            ConfigError::new(field, problem)
        })?;
        Ok(Schema { validator })
    }

    /// Refuses every schema: the crate was built without the `schema` feature.
    #[cfg(not(feature = "schema"))]
    pub(super) fn compile(field: &str, _schema: &Value) -> Result<Schema, ConfigError> {
        Err(ConfigError::new(
            field,
            "needs the `schema` feature of tower-toolcall to be checked; turn it on, or \
             validate params before the stack and leave the schema out",
        ))
    }

    /// What `instance` breaks of the schema, its paths under `root`; `None` when nothing is
    /// broken.
    #[cfg(feature = "schema")]
    pub(super) fn violations(&self, instance: &Value, root: &str) -> Option<Vec<String>> {
        if self.validator.is_valid(instance) {
            return None;
        }
        Some(
            self.validator
                .iter_errors(instance)
                .take(MAX_LISTED_VIOLATIONS)
                .map(|e| {
                    let path = dotted(root, &e.instance_path().to_string());
                    format!("`{path}` {}", e.masked())
                })
                .collect(),
        )
    }

    /// Never called: no schema compiles without the `schema` feature.
    #[cfg(not(feature = "schema"))]
    pub(super) fn violations(&self, _instance: &Value, _root: &str) -> Option<Vec<String>> {
        None
    }
}

pub(super) fn list(violations: &[String]) -> String {
    violations.join("; ")
}

pub(super) fn violation_details(field: &str, violations: &[String]) -> Value {
    serde_json::json!({ "field": field, "violations": violations })
}

/// `/items/0/path` under `payload.params` → `payload.params.items[0].path`.
#[cfg(feature = "schema")]
fn dotted(root: &str, pointer: &str) -> String {
    let mut out = root.to_owned();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push('[');
            out.push_str(&segment);
            out.push(']');
        } else {
            out.push('.');
            out.push_str(&segment);
        }
    }
    out
}

#[cfg(all(test, not(feature = "schema")))]
mod tests {
    use serde_json::json;

    use crate::contract::registry::{RiskLevel, ToolDescriptor, ToolRegistry};

    #[test]
    fn without_the_feature_a_schema_is_refused_naming_the_field() {
        let error = ToolRegistry::builder()
            .tool(
                ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                    .with_input_schema(json!({"type": "object"})),
            )
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("input_schema"), "{error}");
        assert!(error.to_string().contains("`schema` feature"), "{error}");
        let plain = ToolRegistry::builder()
            .tool(ToolDescriptor::new(
                "vault",
                "createFile",
                RiskLevel::Writes,
            ))
            .build();
        assert!(plain.is_ok());
    }
}
