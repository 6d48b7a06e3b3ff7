//! A schema compiled by `jsonschema`.

use serde_json::Value;

use crate::contract::error::ConfigError;

/// The most schema violations listed in one error message.
const MAX_LISTED_VIOLATIONS: usize = 8;

/// A compiled schema.
pub(in crate::contract::registry) struct Schema {
    validator: jsonschema::Validator,
}

impl Schema {
    /// Compiles `schema`, the value of the descriptor's `field`.
    pub(in crate::contract::registry) fn compile(
        field: &str,
        schema: &Value,
    ) -> Result<Schema, ConfigError> {
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

    /// What `instance` breaks of the schema, its paths under `root`; `None` when nothing is
    /// broken.
    pub(in crate::contract::registry) fn violations(
        &self,
        instance: &Value,
        root: &str,
    ) -> Option<Vec<String>> {
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
}

/// `/items/0/path` under `payload.params` → `payload.params.items[0].path`.
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
