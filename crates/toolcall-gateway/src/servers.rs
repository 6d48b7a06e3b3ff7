//! `[servers.NAME]`: the operator's word on one upstream, configured or imported from a
//! host's file, by its name: whether it is trusted, how its tools' calls are confirmed, how
//! many of its calls run at once, and a policy for all its tools with per-tool overrides.
//!
//! ```toml
//! [servers.filesystem]
//! trust = "trusted"                 # its annotations become the policy (or --trust filesystem)
//! confirm = "elicit"                # elicit (default) | host | never
//! max_concurrent = 8                # calls of all its tools at once (unset: no limit)
//! max_queued = 16                   # more waiting for a place (default max_concurrent; 0: none)
//! policy = { rate_limit = { per_second = 5, burst = 10 }, retry = { max_attempts = 2 } }
//!
//! [servers.filesystem.tools.write_file]
//! risk = "writes"
//! idempotent = true
//! confirm = "host"
//! ```
//!
//! The policy table is the tool registry's (`validate`, `loop_detect`, `rate_limit`,
//! `idempotency`, `bulkhead`, `retry`, `breaker`, `timeout`, `classify`): each layer it sets replaces
//! that layer's policy from the annotations. A `[[policy.tools]]` entry for a tool still
//! replaces everything about it.
//!
//! `max_concurrent` and `max_queued` limit the server as a whole, beside each tool's
//! `policy.bulkhead`: they are the bulkhead layer's limit of the server's namespace
//! ([`BulkheadLayerBuilder::namespace`](tower_toolcall::bulkhead::BulkheadLayerBuilder::namespace)),
//! so that one upstream's calls cannot take every place of the gateway. A call that finds
//! them all taken and the queue full is refused at once with `RATE_LIMITED` and a
//! `retryAfterMs`.

use std::collections::BTreeMap;

use toml::{Table, Value};
use tower_toolcall::registry::{
    BulkheadSettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall_mcp::{Confirm, Trust};

use crate::config::{key_path, kind, Checker};

const SERVER_KEYS: &[&str] = &[
    "trust",
    "confirm",
    "risk",
    "idempotent",
    "max_concurrent",
    "max_queued",
    "policy",
    "tools",
];
const TOOL_KEYS: &[&str] = &["confirm", "risk", "idempotent", "policy"];

/// How the calls of a server's tools that need the user's confirmation get it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ConfirmMode {
    /// The gateway asks the user through MCP elicitation.
    #[default]
    Elicit,
    /// The host asks its user before each call.
    Host,
    /// The operator waives it: the tools need no confirmation.
    Never,
}

impl ConfirmMode {
    /// The edge's mode, for a tool that needs confirmation.
    pub(crate) fn edge(self) -> Confirm {
        match self {
            ConfirmMode::Host => Confirm::Host,
            ConfirmMode::Elicit | ConfirmMode::Never => Confirm::Elicit,
        }
    }
}

/// `[servers.NAME]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ServerPolicy {
    /// Whether its annotations may relax the policy, when the table says.
    pub(crate) trust: Option<Trust>,
    /// What applies to all its tools.
    pub(crate) all: Overlay,
    /// What applies to one tool, by its name on the server.
    pub(crate) tools: BTreeMap<String, Overlay>,
    /// The places of all its tools together (`max_concurrent`, `max_queued`), when it is
    /// limited.
    pub(crate) limit: Option<BulkheadSettings>,
}

/// What the operator sets for a server's tools, or for one of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Overlay {
    pub(crate) confirm: Option<ConfirmMode>,
    pub(crate) risk: Option<RiskLevel>,
    pub(crate) idempotent: Option<bool>,
    pub(crate) policy: Option<ToolPolicy>,
}

impl ServerPolicy {
    /// The descriptor of the server's tool `descriptor` (from its annotations) under this
    /// table: the server's settings, then the tool's.
    pub(crate) fn apply(&self, mut descriptor: ToolDescriptor) -> ToolDescriptor {
        let tool = self.tools.get(&descriptor.name);
        for overlay in std::iter::once(&self.all).chain(tool) {
            if let Some(risk) = overlay.risk {
                descriptor.risk = risk;
            }
            if let Some(idempotent) = overlay.idempotent {
                descriptor.idempotent = idempotent;
            }
            if let Some(policy) = &overlay.policy {
                merge(&mut descriptor.policy, policy);
            }
        }
        // A tool's own confirm says whether it needs confirmation; the server's only how.
        match tool.and_then(|tool| tool.confirm).or(self.all.confirm) {
            Some(ConfirmMode::Never) => descriptor.confirmation_required = false,
            Some(_) if tool.is_some_and(|tool| tool.confirm.is_some()) => {
                descriptor.confirmation_required = true;
            }
            _ => {}
        }
        descriptor
    }

    /// How the tool `name`'s calls are confirmed when it needs confirmation.
    pub(crate) fn confirm(&self, name: &str) -> ConfirmMode {
        self.tools
            .get(name)
            .and_then(|tool| tool.confirm)
            .or(self.all.confirm)
            .unwrap_or_default()
    }
}

/// Each layer `overlay` sets replaces `policy`'s.
fn merge(policy: &mut ToolPolicy, overlay: &ToolPolicy) {
    use tower_toolcall::registry::LayerSetting::Default as Unset;
    macro_rules! take {
        ($($layer:ident),*) => {
            $(if overlay.$layer != Unset {
                policy.$layer = overlay.$layer.clone();
            })*
        };
    }
    take!(
        validate,
        loop_detect,
        rate_limit,
        idempotency,
        bulkhead,
        retry,
        breaker,
        timeout
    );
    if overlay.classify != Default::default() {
        policy.classify = overlay.classify.clone();
    }
}

impl Checker {
    /// `[servers]`: each server's table by its name.
    pub(crate) fn servers(&mut self, root: &Table) -> BTreeMap<String, ServerPolicy> {
        let mut servers = BTreeMap::new();
        let Some(table) = self.table(root, "", "servers") else {
            return servers;
        };
        for (name, value) in table {
            let field = key_path("servers", name);
            let Value::Table(server) = value else {
                self.add(
                    field,
                    format!(
                        "must be a table (write it as [servers.{name}]), got {}",
                        kind(value)
                    ),
                );
                continue;
            };
            servers.insert(name.clone(), self.server(server, &field));
        }
        servers
    }

    fn server(&mut self, table: &Table, field: &str) -> ServerPolicy {
        self.known_keys(table, field, SERVER_KEYS);
        let trust = match table.get("trust") {
            None => None,
            Some(Value::Boolean(true)) => Some(Trust::Trusted),
            Some(Value::Boolean(false)) => Some(Trust::Untrusted),
            Some(Value::String(s)) if s == "trusted" => Some(Trust::Trusted),
            Some(Value::String(s)) if s == "untrusted" => Some(Trust::Untrusted),
            Some(other) => {
                self.add(
                    key_path(field, "trust"),
                    format!(
                        "must be \"trusted\" or \"untrusted\" (or true or false), got {}",
                        shown(other)
                    ),
                );
                None
            }
        };
        let limit = self.server_limit(table, field);
        let all = self.overlay(table, field);
        let mut tools = BTreeMap::new();
        if let Some(by_name) = self.table(table, field, "tools") {
            let tools_field = key_path(field, "tools");
            for (name, value) in by_name {
                let tool_field = key_path(&tools_field, name);
                if name.contains('*') {
                    self.add(
                        tool_field,
                        format!(
                            "names no tool: a tool's name is matched as it is; what applies to \
                             every tool of the server goes in [{field}] itself"
                        ),
                    );
                    continue;
                }
                match value {
                    Value::Table(tool) => {
                        self.known_keys(tool, &tool_field, TOOL_KEYS);
                        tools.insert(name.clone(), self.overlay(tool, &tool_field));
                    }
                    other => self.add(tool_field, format!("must be a table, got {}", kind(other))),
                }
            }
        }
        ServerPolicy {
            trust,
            all,
            tools,
            limit,
        }
    }

    /// `max_concurrent` and `max_queued` of a server: a queue needs places to wait for.
    fn server_limit(&mut self, table: &Table, field: &str) -> Option<BulkheadSettings> {
        let max_concurrent = self.count(table, field, "max_concurrent");
        let max_queued = match table.get("max_queued") {
            None => None,
            Some(Value::Integer(n)) if (0..=1_000_000).contains(n) => u32::try_from(*n).ok(),
            Some(other) => {
                let got = match other {
                    Value::Integer(n) => n.to_string(),
                    other => kind(other).to_owned(),
                };
                self.add(
                    key_path(field, "max_queued"),
                    format!("must be a whole number from 0 to 1000000, got {got}"),
                );
                None
            }
        };
        if max_queued.is_some() && !table.contains_key("max_concurrent") {
            self.add(
                key_path(field, "max_concurrent"),
                "is required with max_queued: the calls of the server's tools at once, which \
                 the queued calls wait for",
            );
        }
        let max_concurrent = u32::try_from(max_concurrent?).ok()?;
        let mut limit = BulkheadSettings::default().with_max_concurrent(max_concurrent);
        if let Some(max_queued) = max_queued {
            limit = limit.with_max_queued(max_queued);
        }
        Some(limit)
    }

    fn overlay(&mut self, table: &Table, field: &str) -> Overlay {
        let confirm = match self.string(table, field, "confirm") {
            None => None,
            Some("elicit") => Some(ConfirmMode::Elicit),
            Some("host") => Some(ConfirmMode::Host),
            Some("never") => Some(ConfirmMode::Never),
            Some(other) => {
                self.add(
                    key_path(field, "confirm"),
                    format!(
                        "must be \"elicit\" (the gateway asks the user through MCP \
                         elicitation), \"host\" (the host asks its user) or \"never\", got \
                         {other:?}"
                    ),
                );
                None
            }
        };
        let idempotent = self.boolean(table, field, "idempotent");
        // The risk and the policy are read by the tool registry's own loader.
        let mut entry = Table::new();
        entry.insert("namespace".into(), Value::String("server".into()));
        entry.insert("name".into(), Value::String("tool".into()));
        let risk_given = table.get("risk").cloned();
        entry.insert(
            "risk".into(),
            risk_given
                .clone()
                .unwrap_or_else(|| Value::String("commands".into())),
        );
        match table.get("policy") {
            None => {}
            Some(policy @ Value::Table(_)) => {
                entry.insert("policy".into(), policy.clone());
            }
            Some(other) => {
                self.add(
                    key_path(field, "policy"),
                    format!(
                        "must be a table of the layers' policies, as in [policy], got {}",
                        kind(other)
                    ),
                );
                return Overlay {
                    confirm,
                    idempotent,
                    ..Overlay::default()
                };
            }
        }
        let mut registry = Table::new();
        registry.insert("tools".into(), Value::Array(vec![Value::Table(entry)]));
        let registry = match ToolRegistry::from_toml_table(&registry) {
            Ok(registry) => registry,
            Err(problem) => {
                let inner = problem.field().trim_start_matches("tools[0]");
                let inner = inner.trim_start_matches('.');
                let at = match inner {
                    "" => field.to_owned(),
                    inner => format!("{field}.{inner}"),
                };
                self.add(at, problem.problem());
                return Overlay {
                    confirm,
                    idempotent,
                    ..Overlay::default()
                };
            }
        };
        let descriptor = registry
            .get("server", "tool")
            .map(|tool| tool.descriptor().clone());
        Overlay {
            confirm,
            risk: risk_given.and(descriptor.as_ref().map(|d| d.risk)),
            idempotent,
            policy: table
                .contains_key("policy")
                .then(|| descriptor.map(|d| d.policy))
                .flatten(),
        }
    }
}

/// A TOML value as a problem may quote it: strings quoted, other kinds named.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => kind(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    fn servers(text: &str) -> BTreeMap<String, ServerPolicy> {
        GatewayConfig::from_toml_str(text).unwrap().servers
    }

    use crate::config::problem_lines as problems;

    #[test]
    fn a_server_table_applies_to_every_tool_and_a_tool_table_to_one() {
        let servers = servers(
            r#"
            [servers.fs]
            trust = true
            confirm = "host"
            policy = { retry = { max_attempts = 2 }, rate_limit = { per_second = 5, burst = 10 }, bulkhead = { max_concurrent = 4 } }

            [servers.fs.tools.write_file]
            risk = "writes"
            idempotent = true
            policy = { retry = "off" }

            [servers.fs.tools.read_file]
            confirm = "never"
            "#,
        );
        let fs = &servers["fs"];
        assert_eq!(fs.trust, Some(Trust::Trusted));
        assert_eq!(fs.confirm("write_file"), ConfirmMode::Host);
        assert_eq!(fs.confirm("read_file"), ConfirmMode::Never);
        assert_eq!(fs.confirm("other"), ConfirmMode::Host);

        let base = ToolDescriptor::new("fs", "write_file", RiskLevel::Commands)
            .with_confirmation_required(true);
        let write = fs.apply(base);
        assert_eq!(write.risk, RiskLevel::Writes);
        assert!(write.idempotent && write.confirmation_required);
        assert!(write.policy.retry.is_off());
        assert!(!write.policy.rate_limit.is_off());
        assert_ne!(write.policy.rate_limit, Default::default());
        let bulkhead = write
            .policy
            .bulkhead
            .overrides()
            .expect("the server's bulkhead");
        assert_eq!(bulkhead.max_concurrent, Some(4));

        let read = fs.apply(
            ToolDescriptor::new("fs", "read_file", RiskLevel::Commands)
                .with_confirmation_required(true),
        );
        assert_eq!(read.risk, RiskLevel::Commands);
        assert!(!read.confirmation_required);
        assert_ne!(read.policy.retry, Default::default());
    }

    #[test]
    fn a_server_may_limit_the_calls_of_all_its_tools() {
        let servers = servers(
            "[servers.fs]\nmax_concurrent = 4\nmax_queued = 0\n[servers.git]\nmax_concurrent = 2\n[servers.web]\n",
        );
        let limit = |name: &str| {
            servers[name]
                .limit
                .as_ref()
                .map(|l| (l.max_concurrent, l.max_queued))
        };
        assert_eq!(limit("fs"), Some((Some(4), Some(0))));
        assert_eq!(limit("git"), Some((Some(2), None)), "the queue by default");
        assert_eq!(limit("web"), None);
    }

    #[test]
    fn a_bad_server_limit_is_named_by_field() {
        assert_eq!(
            problems(
                r#"
                [servers.fs]
                max_concurrent = 0
                max_queued = -1
                [servers.git]
                max_queued = 4
                [servers.web]
                max_concurrent = "many"
                "#
            ),
            [
                "servers.fs.max_concurrent: must be from 1 to 1000000, got 0",
                "servers.fs.max_queued: must be a whole number from 0 to 1000000, got -1",
                "servers.git.max_concurrent: is required with max_queued: the calls of the \
                 server's tools at once, which the queued calls wait for",
                "servers.web.max_concurrent: must be a whole number, got a string",
            ]
        );
    }

    #[test]
    fn a_tool_that_sets_how_it_is_confirmed_needs_confirmation() {
        let servers = servers("[servers.mail.tools.send]\nconfirm = \"elicit\"\n");
        let send = servers["mail"].apply(ToolDescriptor::new("mail", "send", RiskLevel::Writes));
        assert!(send.confirmation_required);
    }

    #[test]
    fn bad_server_tables_are_named_by_field() {
        assert_eq!(
            problems(
                r#"
                [servers.fs]
                trust = "yes"
                confirm = "always"
                colour = 1
                risk = "dangerous"
                [servers.fs.tools."*"]
                risk = "read-only"
                [servers.fs.tools.write]
                policy = { retry = { max_attempts = 0 } }
                [servers.git]
                policy = 3
                "#
            ),
            [
                "servers.fs.colour: unknown field; expected one of trust, confirm, risk, \
                 idempotent, max_concurrent, max_queued, policy, tools",
                "servers.fs.confirm: must be \"elicit\" (the gateway asks the user through MCP \
                 elicitation), \"host\" (the host asks its user) or \"never\", got \"always\"",
                "servers.fs.risk: unknown variant `dangerous`, expected one of `read-only`, \
                 `writes`, `commands`",
                "servers.fs.tools.\"*\": names no tool: a tool's name is matched as it is; what \
                 applies to every tool of the server goes in [servers.fs] itself",
                "servers.fs.tools.write.policy.retry.max_attempts: must be at least 1, got 0",
                "servers.fs.trust: must be \"trusted\" or \"untrusted\" (or true or false), got \
                 \"yes\"",
                "servers.git.policy: must be a table of the layers' policies, as in [policy], \
                 got an integer",
            ]
        );
    }
}
