use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::policy::{LayerSetting, TimeoutSettings, ToolPolicy};

/// How much harm a tool can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RiskLevel {
    /// Reads only; repeating it is harmless.
    ReadOnly,
    /// Writes data (files, messages, records).
    Writes,
    /// Runs commands.
    Commands,
}

impl RiskLevel {
    /// `true` for `writes` and `commands`.
    pub fn is_mutating(self) -> bool {
        !matches!(self, RiskLevel::ReadOnly)
    }

    /// The name as it is written in files and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            RiskLevel::ReadOnly => "read-only",
            RiskLevel::Writes => "writes",
            RiskLevel::Commands => "commands",
        }
    }
}

/// Everything the layers need to know about one tool.
///
/// In a registry file every field but `namespace`, `name` and `risk` may be left out.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall::registry::{RiskLevel, ToolDescriptor};
///
/// let write = ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
///     .with_input_schema(json!({
///         "type": "object",
///         "required": ["path", "content"],
///         "properties": {"path": {"type": "string"}, "content": {"type": "string"}}
///     }))
///     .with_confirmation_required(true)
///     .with_attempt_timeout(Duration::from_secs(5));
/// assert_eq!(write.attempt_timeout(), Some(Duration::from_secs(5)));
/// assert!(write.risk.is_mutating());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ToolDescriptor {
    /// The tool's namespace, e.g. `agents.tools.web`.
    pub namespace: String,
    /// The tool's name, e.g. `search`.
    pub name: String,
    /// What the tool can do: `read-only`, `writes` or `commands`.
    pub risk: RiskLevel,
    /// Running the tool twice with the same params has the effect of running it once.
    #[serde(default)]
    pub idempotent: bool,
    /// A human description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema the params must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// JSON Schema the output content must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Calls of a `writes` or `commands` tool need `control.confirmationId`.
    #[serde(default)]
    pub confirmation_required: bool,
    /// The tool may send its answer in chunks as it makes it (see
    /// [`stream`](crate::stream)); callers that list tools are told so.
    #[serde(default)]
    pub streaming: bool,
    /// Per-layer settings.
    #[serde(default)]
    pub policy: ToolPolicy,
}

impl ToolDescriptor {
    /// A descriptor with no schema and every layer at its defaults.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, risk: RiskLevel) -> Self {
        ToolDescriptor {
            namespace: namespace.into(),
            name: name.into(),
            risk,
            idempotent: false,
            description: None,
            input_schema: None,
            output_schema: None,
            confirmation_required: false,
            streaming: false,
            policy: ToolPolicy::default(),
        }
    }

    /// Whether running the tool again does no harm: it is read-only or idempotent (SPEC §6).
    /// Such a tool's call may be stopped, or repeated, without a reason from the call.
    ///
    /// ```
    /// use tower_toolcall::registry::{RiskLevel, ToolDescriptor};
    ///
    /// assert!(ToolDescriptor::new("web", "search", RiskLevel::ReadOnly).repeat_is_safe());
    /// assert!(ToolDescriptor::new("kv", "put", RiskLevel::Writes).with_idempotent(true).repeat_is_safe());
    /// assert!(!ToolDescriptor::new("pay", "charge", RiskLevel::Writes).repeat_is_safe());
    /// ```
    pub fn repeat_is_safe(&self) -> bool {
        !self.risk.is_mutating() || self.idempotent
    }

    /// Marks the tool idempotent.
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Says whether the tool sends its answer in chunks.
    pub fn with_streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Sets the input JSON Schema.
    pub fn with_input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// Sets the output JSON Schema.
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Requires `control.confirmationId` on calls of a mutating tool.
    pub fn with_confirmation_required(mut self, required: bool) -> Self {
        self.confirmation_required = required;
        self
    }

    /// Sets the time one attempt may take (`policy.timeout.attempt_timeout_ms`).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        let ms = crate::contract::time::millis(timeout);
        match &mut self.policy.timeout {
            LayerSetting::On(t) => t.attempt_timeout_ms = Some(ms),
            other => {
                *other = LayerSetting::On(TimeoutSettings::default().with_attempt_timeout_ms(ms))
            }
        }
        self
    }

    /// Sets the whole policy.
    pub fn with_policy(mut self, policy: ToolPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The time one attempt may take, when the policy sets it.
    pub fn attempt_timeout(&self) -> Option<Duration> {
        self.policy
            .timeout
            .overrides()
            .and_then(|t| t.attempt_timeout_ms)
            .map(Duration::from_millis)
    }

    /// `namespace::name`.
    pub fn full_name(&self) -> String {
        format!("{}::{}", self.namespace, self.name)
    }
}
