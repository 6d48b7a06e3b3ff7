//! Without the `schema` feature: every schema is refused when the registry is built.

use serde_json::Value;

use crate::contract::error::ConfigError;

/// A schema that never compiles.
pub(in crate::contract::registry) struct Schema {}

impl Schema {
    /// Refuses every schema: the crate was built without the `schema` feature.
    pub(in crate::contract::registry) fn compile(
        field: &str,
        _schema: &Value,
    ) -> Result<Schema, ConfigError> {
        Err(ConfigError::new(
            field,
            "needs the `schema` feature of tower-toolcall to be checked; turn it on, or \
             validate params before the stack and leave the schema out",
        ))
    }

    /// Never called: no schema compiles without the `schema` feature.
    pub(in crate::contract::registry) fn violations(
        &self,
        _instance: &Value,
        _root: &str,
    ) -> Option<Vec<String>> {
        None
    }
}

#[cfg(test)]
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
