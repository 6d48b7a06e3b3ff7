//! MCP tool annotations as the crate's per-tool policy, and an operator's registry over them.

use rmcp::model::Tool;
use serde_json::Value;

use tower_toolcall::registry::{
    IdempotencySettings, LayerSetting, RiskLevel, ToolDescriptor, ToolRegistry,
};
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
    /// Anything else: annotations never loosen a retry, widen a dedupe scope or skip a
    /// confirmation, and MCP's defaults (`destructiveHint: true`, `idempotentHint: false`)
    /// are already the strictest, so every tool is a confirmed, non-idempotent `commands`
    /// tool until an operator's registry file says otherwise; except a tool marked
    /// `readOnlyHint: true` (see [`descriptor_for`]), whose reads must not go stale.
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
/// (`_meta.confirmationId`).
///
/// From a [`Trust::Untrusted`] server every tool is `commands`, not idempotent, and needs
/// confirmation, with one exception, which only avoids a wrong answer: a tool marked
/// `readOnlyHint: true` is a `writes` tool that needs no confirmation, whose derived key
/// never answers from an earlier finished call (its re-send window is 0: it only joins a call
/// still in flight). Believed or not, the hint then loosens nothing: as a write, it is
/// retried only when the request did not reach the tool, and its dedupe scope stays the
/// session's.
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
/// // Untrusted, a read is never answered from an earlier call, and needs no confirmation.
/// let untrusted = descriptor_for("notes", &tool, Trust::Untrusted);
/// assert_eq!(untrusted.risk, RiskLevel::Writes);
/// assert!(!untrusted.confirmation_required && !untrusted.idempotent);
///
/// let delete = Tool::new("delete", "Deletes a note", Arc::new(serde_json::Map::new()));
/// let untrusted = descriptor_for("notes", &delete, Trust::Untrusted);
/// assert_eq!(untrusted.risk, RiskLevel::Commands);
/// assert!(untrusted.confirmation_required);
/// ```
pub fn descriptor_for(namespace: &str, tool: &Tool, trust: Trust) -> ToolDescriptor {
    let hints = tool.annotations.clone().unwrap_or_default();
    let claims_read_only = hints.read_only_hint.unwrap_or(false);
    let (risk, idempotent, confirm) = match trust {
        Trust::Untrusted if claims_read_only => (RiskLevel::Writes, false, false),
        Trust::Untrusted => (RiskLevel::Commands, false, true),
        Trust::Trusted => {
            let idempotent = hints.idempotent_hint.unwrap_or(false);
            if claims_read_only {
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
    if trust == Trust::Untrusted && claims_read_only {
        // Its finished calls never answer a later one: a read after a write sees the write.
        descriptor.policy.idempotency =
            LayerSetting::On(IdempotencySettings::default().with_resend_window_ms(0));
    }
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
    let descriptors = servers.into_iter().flat_map(|(namespace, tools, trust)| {
        tools
            .iter()
            .map(move |tool| descriptor_for(namespace, tool, trust))
    });
    registry_of(descriptors, operator)
}

/// A registry of the descriptors of servers' tools (from [`descriptor_for`], or made by a
/// gateway from its own per-server settings), under an operator's registry, as
/// [`registry_for`] describes: a tool the operator's registry describes takes the operator's
/// descriptor whole, with the given descriptor's schemas where the operator gave none.
///
/// ```
/// use std::sync::Arc;
/// use rmcp::model::Tool;
/// use tower_toolcall_mcp::{descriptor_for, registry_of, Trust};
///
/// let send = Tool::new("send", "Sends a mail", Arc::new(serde_json::Map::new()));
/// // A gateway whose operator waived the confirmation of this server's tools.
/// let waived = descriptor_for("mail", &send, Trust::Untrusted).with_confirmation_required(false);
/// let registry = registry_of([waived], None)?;
/// assert!(!registry.get("mail", "send").unwrap().descriptor().confirmation_required);
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
pub fn registry_of<I>(
    descriptors: I,
    operator: Option<&ToolRegistry>,
) -> Result<ToolRegistry, ConfigError>
where
    I: IntoIterator<Item = ToolDescriptor>,
{
    let mut builder = match operator {
        Some(operator) => ToolRegistry::builder()
            .open(operator.is_open())
            .unregistered_policy(operator.unregistered_policy().clone())
            .control(operator.control().clone()),
        None => ToolRegistry::builder(),
    };
    let mut served = std::collections::HashSet::new();
    for from_mcp in descriptors {
        let (namespace, name) = (from_mcp.namespace.clone(), from_mcp.name.clone());
        let descriptor = match operator.and_then(|operator| operator.get(&namespace, &name)) {
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
        if operator.is_some_and(|operator| operator.is_denied(&namespace, &name)) {
            builder = builder.deny(format!("{namespace}::{name}"));
        }
        builder = builder.tool(descriptor);
        served.insert((namespace, name));
    }
    for registered in operator.iter().flat_map(|operator| operator.tools()) {
        let descriptor = registered.descriptor();
        if !served.contains(&(descriptor.namespace.clone(), descriptor.name.clone())) {
            builder = builder.tool(descriptor.clone());
        }
    }
    builder.build().map_err(|e| e.within("mcp"))
}
