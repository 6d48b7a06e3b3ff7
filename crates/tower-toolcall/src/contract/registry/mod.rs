//! The tool registry: what each tool is, its schemas, and its per-layer policy.
//!
//! Tools are described once, in code or in a TOML or JSON file, and every layer resolves its
//! policy for a call from the same [`ToolRegistry`]. A layer can be switched off for some
//! tools only, or given other numbers for them.
//!
//! A registry is *closed* by default: a call of a tool it does not know is refused with
//! `NOT_FOUND`. An *open* registry lets unknown tools through with the `unregistered` policy.
//! Schemas are compiled when the registry is built, so an invalid schema is a
//! [`ConfigError`] then, not a surprise at call time.
//!
//! ```
//! use tower_toolcall::registry::ToolRegistry;
//!
//! let registry = ToolRegistry::from_toml_str(r#"
//!     denied = ["agents.tools.shell::*"]
//!
//!     [[tools]]
//!     namespace = "agents.tools.web"
//!     name = "search"
//!     risk = "read-only"
//!     idempotent = true
//!     input_schema = { type = "object", required = ["query"], properties = { query = { type = "string" } } }
//!
//!     [tools.policy]
//!     loop_detect = "off"
//!     retry = { max_attempts = 3 }
//! "#)?;
//! let search = registry.get("agents.tools.web", "search").unwrap();
//! assert!(search.descriptor().policy.loop_detect.is_off());
//! assert!(registry.is_denied("agents.tools.shell", "exec"));
//! # Ok::<(), tower_toolcall::ConfigError>(())
//! ```

mod descriptor;
mod policy;
mod schema;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

pub use descriptor::{RiskLevel, ToolDescriptor};
pub use policy::OnStoreError;
pub(crate) use policy::ToolSettings;
pub use policy::{
    BreakerSettings, BulkheadSettings, ClassifyOverrides, IdempotencySettings, JitterKind,
    KeyScope, LayerSetting, LoopDetectSettings, LoopMode, OnLimit, ParamsMismatch, RateLimitKey,
    RateLimitSettings, RetrySettings, TimeoutSettings, ToolPolicy, UnclassifiedAs,
    ValidateSettings,
};

use crate::contract::control::ReliabilityControl;
use crate::contract::envelope::{next_registry_id, ToolCall};
use crate::contract::error::{ConfigError, ErrorCode, ToolError};
use crate::contract::serde_message::{missing_field, strip_position};
use schema::{list, violation_details, Schema};

/// The registered tools, the denied ones, and the policy of unregistered tools.
///
/// Cheap to clone: clones share one immutable registry, and the operator's
/// [`ReliabilityControl`] that every layer built from it obeys.
#[derive(Clone)]
pub struct ToolRegistry {
    inner: Arc<RegistryInner>,
    control: ReliabilityControl,
}

/// Tools by namespace, then by name. The maps are filled once when the registry is built and
/// only read afterwards, so a fast hasher is safe from collision attacks.
type ToolMap = HashMap<String, HashMap<String, Arc<RegisteredTool>, FastHash>, FastHash>;
type FastHash = foldhash::fast::RandomState;

struct RegistryInner {
    tools: ToolMap,
    /// The same tools, in the order of their full names; a tool's place is its index.
    in_order: Vec<Arc<RegisteredTool>>,
    /// This registry's own id, under which calls remember their tool's index.
    id: u32,
    open: bool,
    denied: Vec<DenyRule>,
    unregistered: ToolPolicy,
}

/// A tool in a built registry: its descriptor and its compiled schemas.
pub struct RegisteredTool {
    descriptor: ToolDescriptor,
    full_name: String,
    /// Its place among the registry's tools.
    index: u32,
    input: Option<Schema>,
    output: Option<Schema>,
}

#[derive(Clone, Debug, PartialEq)]
struct DenyRule {
    namespace: String,
    /// `None` denies the whole namespace.
    name: Option<String>,
}

impl DenyRule {
    fn parse(pattern: &str) -> Option<DenyRule> {
        let (namespace, name) = pattern.split_once("::")?;
        if namespace.is_empty() || name.is_empty() {
            return None;
        }
        Some(DenyRule {
            namespace: namespace.to_owned(),
            name: (name != "*").then(|| name.to_owned()),
        })
    }

    fn matches(&self, namespace: &str, name: &str) -> bool {
        self.namespace == namespace && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// The serde form of a registry file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    #[serde(default)]
    open: bool,
    #[serde(default)]
    denied: Vec<String>,
    #[serde(default)]
    unregistered: ToolPolicy,
    #[serde(default)]
    tools: Vec<ToolDescriptor>,
}

impl ToolRegistry {
    /// A builder for a registry.
    pub fn builder() -> ToolRegistryBuilder {
        ToolRegistryBuilder::default()
    }

    /// An open registry with no tools: every tool is let through with the default policy.
    pub fn open() -> ToolRegistry {
        ToolRegistry::builder()
            .open(true)
            .build()
            .expect("an empty registry is valid")
    }

    /// Loads a registry from TOML. Errors name the field, e.g. `tools[1].policy.retry`.
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml_str(text: &str) -> Result<ToolRegistry, ConfigError> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| ConfigError::new("", format!("is not valid TOML: {e}")))?;
        let file: RegistryFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            file_error(&path, e.into_inner().message())
        })?;
        ToolRegistry::from_file(file)
    }

    /// Loads a registry from a TOML table already read, such as a section of a larger file.
    /// It is read as [`from_toml_str`](ToolRegistry::from_toml_str) reads the table's text:
    /// the same problems, worded alike, naming the field within the table.
    ///
    /// ```
    /// use tower_toolcall::registry::ToolRegistry;
    ///
    /// let file: toml::Table = toml::from_str(r#"
    ///     [policy]
    ///     [[policy.tools]]
    ///     namespace = "agents.tools.web"
    ///     name = "search"
    ///     risk = "read-only"
    /// "#)?;
    /// let policy = file.get("policy").and_then(toml::Value::as_table).unwrap();
    /// let registry = ToolRegistry::from_toml_table(policy)?;
    /// assert!(registry.get("agents.tools.web", "search").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml_table(table: &toml::Table) -> Result<ToolRegistry, ConfigError> {
        // Through its text: serde reading the parsed values words some problems otherwise (a
        // number where a risk level goes) and reads a date-time in a schema as a string.
        let text = toml::to_string(table)
            .map_err(|e| ConfigError::new("", format!("cannot be read as a tool registry: {e}")))?;
        ToolRegistry::from_toml_str(&text)
    }

    /// Loads a registry from JSON. Errors name the field, e.g. `tools[1].policy.retry`.
    pub fn from_json_str(text: &str) -> Result<ToolRegistry, ConfigError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let file: RegistryFile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                ConfigError::new("", format!("is not valid JSON: {inner}"))
            } else {
                file_error(&path, strip_position(&inner.to_string()))
            }
        })?;
        de.end()
            .map_err(|e| ConfigError::new("", format!("is not valid JSON: {e}")))?;
        ToolRegistry::from_file(file)
    }

    /// Loads a registry from a `.toml` or `.json` file.
    pub fn from_path(path: impl AsRef<std::path::Path>) -> Result<ToolRegistry, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => ToolRegistry::from_json_str(&text),
            #[cfg(feature = "toml")]
            Some("toml") => ToolRegistry::from_toml_str(&text),
            _ => Err(ConfigError::new(
                "",
                format!(
                    "cannot tell the format of {}: name it .json or .toml",
                    path.display()
                ),
            )),
        }
    }

    fn from_file(file: RegistryFile) -> Result<ToolRegistry, ConfigError> {
        let mut builder = ToolRegistry::builder()
            .open(file.open)
            .unregistered_policy(file.unregistered);
        for pattern in file.denied {
            builder = builder.deny(pattern);
        }
        for tool in file.tools {
            builder = builder.tool(tool);
        }
        builder.build()
    }

    /// The registered tool `namespace::name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.inner.tools.get(namespace)?.get(name)
    }

    /// The registered tool a call is for.
    ///
    /// The call (and every clone of it) remembers where this registry found its tool, so that
    /// the next lookup, by any layer built from this registry, reads an index instead of
    /// looking the name up; changing the call's envelope makes it look again.
    pub fn tool_for(&self, call: &ToolCall) -> Option<&Arc<RegisteredTool>> {
        self.inner.in_order.get(self.index_for(call)? as usize)
    }

    /// The index of the call's tool among this registry's tools, `None` when it is not
    /// registered. The call remembers the answer, so that the other layers built from this
    /// registry find it without looking the tool up by name.
    pub(crate) fn index_for(&self, call: &ToolCall) -> Option<u32> {
        if self.is_empty() {
            return None;
        }
        let resolution = call.tool_resolution();
        if let Some(known) = resolution.get(self.inner.id) {
            return known;
        }
        let index = self
            .get(call.tool_namespace(), call.tool_name())
            .map(|tool| tool.index);
        resolution.set(self.inner.id, index);
        index
    }

    /// The policy for a call: its tool's, or the `unregistered` policy.
    pub fn policy_for(&self, call: &ToolCall) -> &ToolPolicy {
        self.tool_for(call)
            .map_or(&self.inner.unregistered, |tool| &tool.descriptor.policy)
    }

    /// `true` when calls of unknown tools are let through.
    pub fn is_open(&self) -> bool {
        self.inner.open
    }

    /// `true` when policy denies `namespace::name`.
    pub fn is_denied(&self, namespace: &str, name: &str) -> bool {
        self.inner
            .denied
            .iter()
            .any(|rule| rule.matches(namespace, name))
    }

    /// The policy of unregistered tools (in an open registry).
    pub fn unregistered_policy(&self) -> &ToolPolicy {
        &self.inner.unregistered
    }

    /// The switches every layer built from this registry obeys: the kill switch, breaker
    /// enforcement, key derivation and shadow mode ([`control`](crate::control)).
    pub fn control(&self) -> &ReliabilityControl {
        &self.control
    }

    /// The same tools under other switches; clones of `control` flip every layer built
    /// from the returned registry.
    ///
    /// ```
    /// use tower_toolcall::control::ReliabilityControl;
    /// use tower_toolcall::registry::ToolRegistry;
    ///
    /// let registry = ToolRegistry::open().with_control(ReliabilityControl::from_env()?);
    /// # let _ = registry;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn with_control(mut self, control: ReliabilityControl) -> Self {
        self.control = control;
        self
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.inner.in_order.len()
    }

    /// `true` when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.inner.in_order.is_empty()
    }

    /// Every registered tool, in the order of their full names.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<RegisteredTool>> {
        self.inner.in_order.iter()
    }
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.inner.in_order.len())
            .field("open", &self.inner.open)
            .field("denied", &self.inner.denied.len())
            .field("control", &self.control)
            .finish()
    }
}

impl Default for ToolRegistry {
    /// An open registry with no tools.
    fn default() -> Self {
        ToolRegistry::open()
    }
}

impl RegisteredTool {
    /// Its place among its registry's tools (see [`ToolRegistry::tools`]).
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The descriptor.
    pub fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor
    }

    /// `namespace::name`.
    pub fn full_name(&self) -> &str {
        &self.full_name
    }

    /// `true` when the tool has an input schema.
    pub fn has_input_schema(&self) -> bool {
        self.input.is_some()
    }

    /// `true` when the tool has an output schema.
    pub fn has_output_schema(&self) -> bool {
        self.output.is_some()
    }

    /// Checks params against the input schema: a `VALIDATION_ERROR` listing the failing
    /// paths (their values are never echoed).
    pub fn check_params(&self, params: &Value) -> Result<(), ToolError> {
        let Some(violations) = self
            .input
            .as_ref()
            .and_then(|schema| schema.violations(params, "payload.params"))
        else {
            return Ok(());
        };
        Err(ToolError::rejected(
            ErrorCode::ValidationError,
            format!(
                "invalid tool call: `payload.params` does not match the input schema of {}: {}; \
                 fix the params and call again",
                self.full_name,
                list(&violations)
            ),
        )
        .with_details(violation_details("payload.params", &violations)))
    }

    /// Checks output content against the output schema: an `INTERNAL_ERROR` (terminal)
    /// listing the failing paths.
    pub fn check_output(&self, content: &Value) -> Result<(), ToolError> {
        let Some(violations) = self
            .output
            .as_ref()
            .and_then(|schema| schema.violations(content, "output.content"))
        else {
            return Ok(());
        };
        Err(ToolError::new(
            ErrorCode::InternalError,
            format!(
                "the output of {} does not match its output schema: {}; the tool needs fixing",
                self.full_name,
                list(&violations)
            ),
        )
        .with_class(crate::contract::error::ErrorClass::Terminal)
        .with_details(violation_details("output.content", &violations)))
    }
}

impl fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("descriptor", &self.descriptor)
            .finish_non_exhaustive()
    }
}

/// Builds a [`ToolRegistry`]; made by [`ToolRegistry::builder`].
#[derive(Debug, Default)]
#[must_use]
pub struct ToolRegistryBuilder {
    tools: Vec<ToolDescriptor>,
    open: bool,
    denied: Vec<String>,
    unregistered: ToolPolicy,
    control: ReliabilityControl,
}

impl ToolRegistryBuilder {
    /// Registers a tool.
    pub fn tool(mut self, descriptor: ToolDescriptor) -> Self {
        self.tools.push(descriptor);
        self
    }

    /// Lets calls of unknown tools through (default: refused with `NOT_FOUND`).
    pub fn open(mut self, open: bool) -> Self {
        self.open = open;
        self
    }

    /// Denies `namespace::name`, or a whole namespace with `namespace::*`.
    pub fn deny(mut self, pattern: impl Into<String>) -> Self {
        self.denied.push(pattern.into());
        self
    }

    /// The policy of unregistered tools in an open registry.
    pub fn unregistered_policy(mut self, policy: ToolPolicy) -> Self {
        self.unregistered = policy;
        self
    }

    /// The switches every layer built from the registry obeys (default: everything on).
    pub fn control(mut self, control: ReliabilityControl) -> Self {
        self.control = control;
        self
    }

    /// Checks every descriptor, compiles every schema, and builds the registry.
    pub fn build(self) -> Result<ToolRegistry, ConfigError> {
        let mut denied = Vec::with_capacity(self.denied.len());
        for (i, pattern) in self.denied.iter().enumerate() {
            denied.push(DenyRule::parse(pattern).ok_or_else(|| {
                ConfigError::new(
                    format!("denied[{i}]"),
                    format!("must be `namespace::name` or `namespace::*`, got {pattern:?}"),
                )
            })?);
        }
        self.unregistered
            .check()
            .map_err(|e| e.within("unregistered"))?;

        let count = self.tools.len();
        if u32::try_from(count).is_err() {
            return Err(ConfigError::new(
                "tools",
                format!("holds {count} tools; a registry holds fewer than 2^32"),
            ));
        }
        let mut compiled = Vec::with_capacity(count);
        let mut registered = std::collections::HashSet::with_capacity(count);
        for (i, descriptor) in self.tools.into_iter().enumerate() {
            let at = format!("tools[{i}]");
            let tool = compile(descriptor).map_err(|e| e.within(&at))?;
            let names = (
                tool.descriptor.namespace.clone(),
                tool.descriptor.name.clone(),
            );
            if !registered.insert(names) {
                return Err(ConfigError::new(
                    at,
                    format!("registers {} a second time", tool.full_name),
                ));
            }
            compiled.push(tool);
        }
        compiled.sort_by(|a, b| a.full_name.cmp(&b.full_name));
        let mut tools = ToolMap::default();
        let mut in_order = Vec::with_capacity(count);
        for (index, mut tool) in (0..).zip(compiled) {
            tool.index = index;
            let tool = Arc::new(tool);
            tools
                .entry(tool.descriptor.namespace.clone())
                .or_default()
                .insert(tool.descriptor.name.clone(), tool.clone());
            in_order.push(tool);
        }
        Ok(ToolRegistry {
            inner: Arc::new(RegistryInner {
                tools,
                in_order,
                id: next_registry_id(),
                open: self.open,
                denied,
                unregistered: self.unregistered,
            }),
            control: self.control,
        })
    }
}

fn compile(descriptor: ToolDescriptor) -> Result<RegisteredTool, ConfigError> {
    for (field, value) in [
        ("namespace", &descriptor.namespace),
        ("name", &descriptor.name),
    ] {
        if value.trim().is_empty() {
            return Err(ConfigError::new(field, "must not be empty"));
        }
    }
    descriptor.policy.check().map_err(|e| e.within("policy"))?;
    let input = descriptor
        .input_schema
        .as_ref()
        .map(|schema| Schema::compile("input_schema", schema))
        .transpose()?;
    let output = descriptor
        .output_schema
        .as_ref()
        .map(|schema| Schema::compile("output_schema", schema))
        .transpose()?;
    Ok(RegisteredTool {
        full_name: descriptor.full_name(),
        index: 0,
        descriptor,
        input,
        output,
    })
}

fn file_error(path: &str, message: &str) -> ConfigError {
    let field = if path == "." { "" } else { path };
    if let Some(missing) = missing_field(message) {
        let field = if field.is_empty() {
            missing.to_owned()
        } else {
            format!("{field}.{missing}")
        };
        return ConfigError::new(field, "is required");
    }
    ConfigError::new(field, message.trim().to_owned())
}
