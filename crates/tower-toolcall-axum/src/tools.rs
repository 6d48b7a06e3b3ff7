//! `GET /v1/tools`: the registered tools, their schemas and their capabilities.

use serde_json::{json, Value};

use tower_toolcall::registry::{ToolDescriptor, ToolRegistry};

/// The listing `GET /v1/tools` answers: `{"tools": [...]}`, one entry per registered tool,
/// in the registry's order.
///
/// Each entry has the tool's `namespace`, `name`, `risk`, `description`, `inputSchema`,
/// `outputSchema` and `confirmationRequired`, and its `capabilities` as its policy declares
/// them, so that an agent can ask before it calls (seed 003 §5.5):
///
/// | capability | members |
/// |---|---|
/// | `idempotency` | `enabled` (the layer is on for the tool), `idempotent` (the tool says it is), `header` (`Idempotency-Key`), `policy` (the tool's overrides) |
/// | `caching` | `enabled`: a duplicate call is answered from the dedupe store |
/// | `retry` | `enabled`, `policy` (the tool's overrides) |
/// | `timeout` | `enabled`, `attemptTimeoutMs` when the tool sets one |
/// | `streaming` | `supported`: the tool sends its answer in chunks, which `POST /v1/tools/call` streams as server-sent events to a caller that asks |
///
/// ```
/// use tower_toolcall_axum::tool_listing;
/// use tower_toolcall::registry::ToolRegistry;
///
/// let registry = ToolRegistry::from_json_str(
///     r#"{"tools": [{"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true}]}"#,
/// )?;
/// let listing = tool_listing(&registry);
/// assert_eq!(listing["tools"][0]["name"], "search");
/// assert_eq!(listing["tools"][0]["capabilities"]["idempotency"]["idempotent"], true);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tool_listing(registry: &ToolRegistry) -> Value {
    let tools: Vec<Value> = registry
        .tools()
        .map(|tool| describe(tool.descriptor()))
        .collect();
    json!({ "tools": tools })
}

fn describe(tool: &ToolDescriptor) -> Value {
    let policy = &tool.policy;
    let idempotency_on = !policy.idempotency.is_off();
    json!({
        "namespace": tool.namespace,
        "name": tool.name,
        "risk": tool.risk.as_str(),
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "confirmationRequired": tool.confirmation_required,
        "capabilities": {
            "idempotency": {
                "enabled": idempotency_on,
                "idempotent": tool.idempotent,
                "header": "Idempotency-Key",
                "policy": policy.idempotency.overrides(),
            },
            "caching": { "enabled": idempotency_on },
            "retry": {
                "enabled": !policy.retry.is_off(),
                "policy": policy.retry.overrides(),
            },
            "timeout": {
                "enabled": !policy.timeout.is_off(),
                "attemptTimeoutMs": tool.attempt_timeout().map(crate::millis),
            },
            "streaming": { "supported": tool.streaming },
        },
    })
}
