//! MCP tool annotations as the crate's per-tool policy, and an operator's registry over them.

use rmcp::model::Tool;
use serde_json::Value;

use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::ConfigError;

/// Whether the annotations of a server's tools may relax the policy.
///
/// The MCP specification says that clients must treat tool annotations as untrusted unless
/// they come from a trusted server. Annotations describe what a tool claims about itself; a
/// claim that makes the policy looser (no confirmation, retries, idempotent) is only believed
/// from a server the operator trusts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Trust {
    /// The operator vouches for the server: its annotations become the policy.
    Trusted,
    /// Anything else: annotations can only make the policy stricter, and MCP's defaults
    /// (`destructiveHint: true`, `idempotentHint: false`) are already the strictest, so every
    /// tool is a confirmed, non-idempotent `commands` tool until an operator's registry file
    /// says otherwise.
    Untrusted,
}

/// The descriptor of an MCP tool in `namespace`, with its input and output schemas (with the
/// `schema` feature, which checks them), its description, and a policy from its annotations.
///
/// From a [`Trust::Trusted`] server, absent hints take MCP's defaults (`readOnlyHint: false`,
/// `destructiveHint: true`, `idempotentHint: false`) and:
///
/// | annotations | risk | idempotent | confirmation required |
/// |---|---|---|---|
/// | `readOnlyHint: true` | `read-only` | `idempotentHint` | no |
/// | `destructiveHint: false` | `writes` | `idempotentHint` | no |
/// | `destructiveHint: true` (or absent) | `commands` | `idempotentHint` | yes |
///
/// So a read-only tool is retried after a transient failure, an idempotent one is retried
/// even though it writes, and a destructive one needs the user's confirmation
/// (`_meta.confirmationId`). From a [`Trust::Untrusted`] server every tool is `commands`,
/// not idempotent, and needs confirmation.
///
/// `openWorldHint` does not change the policy. It says where a tool's effects land (an
/// outside system or the server's own closed domain), not whether running it twice is safe
/// or whether a person must approve it, which is what the other hints and the policy
/// decide. Failures of an open-world tool's outside system already reach the breaker and
/// retry through their error codes, per tool, whatever the hint says.
///
/// ```
/// use std::sync::Arc;
/// use rmcp::model::{Tool, ToolAnnotations};
/// use tower_toolcall_mcp::{descriptor_for, Trust};
/// use tower_toolcall::registry::RiskLevel;
///
/// let tool = Tool::new("search", "Searches the notes", Arc::new(serde_json::Map::new()))
///     .annotate(ToolAnnotations::new().read_only(true));
/// let trusted = descriptor_for("notes", &tool, Trust::Trusted);
/// assert_eq!(trusted.risk, RiskLevel::ReadOnly);
/// assert!(!trusted.confirmation_required);
///
/// let untrusted = descriptor_for("notes", &tool, Trust::Untrusted);
/// assert_eq!(untrusted.risk, RiskLevel::Commands);
/// assert!(untrusted.confirmation_required);
/// ```
pub fn descriptor_for(namespace: &str, tool: &Tool, trust: Trust) -> ToolDescriptor {
    let hints = tool.annotations.clone().unwrap_or_default();
    let (risk, idempotent, confirm) = match trust {
        Trust::Untrusted => (RiskLevel::Commands, false, true),
        Trust::Trusted => {
            let idempotent = hints.idempotent_hint.unwrap_or(false);
            if hints.read_only_hint.unwrap_or(false) {
                (RiskLevel::ReadOnly, idempotent, false)
            } else if hints.destructive_hint.unwrap_or(true) {
                (RiskLevel::Commands, idempotent, true)
            } else {
                (RiskLevel::Writes, idempotent, false)
            }
        }
    };
    let mut descriptor = ToolDescriptor::new(namespace, tool.name.as_ref(), risk)
        .with_idempotent(idempotent)
        .with_confirmation_required(confirm);
    // Without the `schema` feature a registry refuses schemas it cannot check; the server
    // still checks its own inputs.
    if cfg!(feature = "schema") {
        descriptor = descriptor.with_input_schema(Value::Object((*tool.input_schema).clone()));
        if let Some(output) = &tool.output_schema {
            descriptor = descriptor.with_output_schema(Value::Object((**output).clone()));
        }
    }
    if let Some(description) = &tool.description {
        descriptor = descriptor.with_description(description.as_ref());
    }
    descriptor
}

/// A registry of a server's `tools` in `namespace`, each described by [`descriptor_for`],
/// under an operator's registry.
///
/// A tool the operator's registry describes takes the operator's descriptor whole (its risk,
/// idempotence, confirmation and every layer's policy), with the MCP tool's schemas where
/// the operator gave none. The operator's other tools, deny rules for the server's tools,
/// `open` flag, unregistered policy and switches are kept. Without an operator registry, the
/// annotations alone decide.
///
/// ```
/// use std::sync::Arc;
/// use rmcp::model::{Tool, ToolAnnotations};
/// use tower_toolcall_mcp::{registry_for, Trust};
/// use tower_toolcall::registry::{RiskLevel, ToolRegistry};
///
/// let tools = [Tool::new("rm", "Deletes a note", Arc::new(serde_json::Map::new()))
///     .annotate(ToolAnnotations::new().destructive(true))];
/// let operator = ToolRegistry::from_json_str(r#"{"tools": [
///     {"namespace": "notes", "name": "rm", "risk": "writes", "idempotent": true}
/// ]}"#)?;
/// let registry = registry_for("notes", &tools, Trust::Trusted, Some(&operator))?;
/// let rm = registry.get("notes", "rm").unwrap().descriptor();
/// assert_eq!(rm.risk, RiskLevel::Writes);
/// assert!(!rm.confirmation_required && rm.idempotent);
/// assert!(registry.get("notes", "rm").unwrap().has_input_schema());
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
pub fn registry_for(
    namespace: &str,
    tools: &[Tool],
    trust: Trust,
    operator: Option<&ToolRegistry>,
) -> Result<ToolRegistry, ConfigError> {
    registry_for_servers([(namespace, tools, trust)], operator)
}

/// [`registry_for`] of several servers at once, each `(namespace, tools, trust)`: one
/// registry for a gateway in front of many servers, under one operator's registry.
///
/// ```
/// use std::sync::Arc;
/// use rmcp::model::{Tool, ToolAnnotations};
/// use tower_toolcall_mcp::{registry_for_servers, Trust};
///
/// let now = [Tool::new("now", "The time", Arc::new(serde_json::Map::new()))
///     .annotate(ToolAnnotations::new().read_only(true))];
/// let send = [Tool::new("send", "Sends a mail", Arc::new(serde_json::Map::new()))];
/// let registry = registry_for_servers(
///     [("time", &now[..], Trust::Trusted), ("mail", &send[..], Trust::Untrusted)],
///     None,
/// )?;
/// assert_eq!(registry.len(), 2);
/// assert!(registry.get("mail", "send").unwrap().descriptor().confirmation_required);
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
pub fn registry_for_servers<'a, I>(
    servers: I,
    operator: Option<&ToolRegistry>,
) -> Result<ToolRegistry, ConfigError>
where
    I: IntoIterator<Item = (&'a str, &'a [Tool], Trust)>,
{
    let mut builder = match operator {
        Some(operator) => ToolRegistry::builder()
            .open(operator.is_open())
            .unregistered_policy(operator.unregistered_policy().clone())
            .control(operator.control().clone()),
        None => ToolRegistry::builder(),
    };
    let mut served = std::collections::HashSet::new();
    for (namespace, tools, trust) in servers {
        for tool in tools {
            let name = tool.name.as_ref();
            served.insert((namespace, name));
            let from_mcp = descriptor_for(namespace, tool, trust);
            let descriptor = match operator.and_then(|operator| operator.get(namespace, name)) {
                Some(registered) => {
                    let mut descriptor = registered.descriptor().clone();
                    if descriptor.input_schema.is_none() {
                        descriptor.input_schema = from_mcp.input_schema;
                    }
                    if descriptor.output_schema.is_none() {
                        descriptor.output_schema = from_mcp.output_schema;
                    }
                    descriptor
                }
                None => from_mcp,
            };
            if operator.is_some_and(|operator| operator.is_denied(namespace, name)) {
                builder = builder.deny(format!("{namespace}::{name}"));
            }
            builder = builder.tool(descriptor);
        }
    }
    for registered in operator.iter().flat_map(|operator| operator.tools()) {
        let descriptor = registered.descriptor();
        if !served.contains(&(descriptor.namespace.as_str(), descriptor.name.as_str())) {
            builder = builder.tool(descriptor.clone());
        }
    }
    builder.build().map_err(|e| e.within("mcp"))
}
