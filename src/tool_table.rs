//! Per-tool values that a layer resolves once, when it is built, from the registry: the
//! layer's defaults merged with each tool's overrides. Looking one up for a call costs a hash
//! of the tool's name and a comparison of its namespace; nothing is merged per call.
//!
//! The table also keeps the registry's [`ReliabilityControl`], so that a layer reads the
//! operator's switches from where it reads its tools.

use std::collections::HashMap;
use std::fmt;

use crate::control::ReliabilityControl;
use crate::envelope::ToolCall;
use crate::error::ConfigError;
use crate::registry::{ToolDescriptor, ToolPolicy, ToolRegistry};

/// One resolved value per registered tool, and one for every unregistered tool.
pub(crate) struct ToolTable<T> {
    /// Tool name → (namespace, value). Most names live in one namespace only.
    by_name: ByName<T>,
    unregistered: T,
    control: ReliabilityControl,
}

/// Tool name → the (namespace, value) of each tool with that name.
type ByName<T> = HashMap<Box<str>, Vec<(Box<str>, T)>, FastHash>;

/// The table is filled once when a layer is built and only read afterwards, so a fast hasher
/// is safe from collision attacks.
type FastHash = foldhash::fast::RandomState;

impl<T> ToolTable<T> {
    /// Resolves a value for every tool of `registry` and for unregistered tools.
    ///
    /// `resolve` gets the tool's descriptor (`None` for unregistered tools) and its policy.
    /// Its errors are put under `tools[namespace::name]` or `unregistered`.
    pub(crate) fn resolve(
        registry: &ToolRegistry,
        mut resolve: impl FnMut(Option<&ToolDescriptor>, &ToolPolicy) -> Result<T, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let unregistered =
            resolve(None, registry.unregistered_policy()).map_err(|e| e.within("unregistered"))?;
        let mut tools: Vec<_> = registry.tools().collect();
        tools.sort_by(|a, b| a.full_name().cmp(b.full_name()));
        let mut by_name: ByName<T> = HashMap::default();
        for tool in tools {
            let descriptor = tool.descriptor();
            let value = resolve(Some(descriptor), &descriptor.policy)
                .map_err(|e| e.within(&format!("tools[{}]", tool.full_name())))?;
            by_name
                .entry(descriptor.name.as_str().into())
                .or_default()
                .push((descriptor.namespace.as_str().into(), value));
        }
        Ok(ToolTable {
            by_name,
            unregistered,
            control: registry.control().clone(),
        })
    }

    /// The switches of the registry the table was resolved from.
    pub(crate) fn control(&self) -> &ReliabilityControl {
        &self.control
    }

    /// The value of the registered tool `namespace::name`.
    pub(crate) fn registered(&self, namespace: &str, name: &str) -> Option<&T> {
        self.by_name
            .get(name)?
            .iter()
            .find(|(ns, _)| &**ns == namespace)
            .map(|(_, value)| value)
    }

    /// The value for `namespace::name`: its own when it is registered, the unregistered one
    /// otherwise.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> &T {
        self.registered(namespace, name)
            .unwrap_or(&self.unregistered)
    }

    /// The value for the tool of `call`.
    pub(crate) fn for_call(&self, call: &ToolCall) -> &T {
        self.get(call.tool_namespace(), call.tool_name())
    }

    /// Every value: the registered tools' and the unregistered one.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.iter()
            .map(|(_, _, value)| value)
            .chain(std::iter::once(&self.unregistered))
    }

    /// Every registered tool's namespace, name and value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str, &T)> {
        self.by_name.iter().flat_map(|(name, entries)| {
            entries
                .iter()
                .map(move |(ns, value)| (&**ns, &**name, value))
        })
    }
}

impl<T> fmt::Debug for ToolTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolTable")
            .field("tools", &self.by_name.values().map(Vec::len).sum::<usize>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{RiskLevel, ToolDescriptor};

    #[test]
    fn resolves_each_tool_once_and_names_the_failing_one() {
        let registry = ToolRegistry::builder()
            .tool(ToolDescriptor::new("a", "read", RiskLevel::ReadOnly))
            .tool(ToolDescriptor::new("b", "read", RiskLevel::Writes))
            .build()
            .unwrap();
        let table = ToolTable::resolve(&registry, |d, _| Ok(d.map(|d| d.risk))).unwrap();
        assert_eq!(table.get("a", "read"), &Some(RiskLevel::ReadOnly));
        assert_eq!(table.get("b", "read"), &Some(RiskLevel::Writes));
        assert_eq!(table.get("c", "read"), &None);
        assert_eq!(table.registered("c", "read"), None);
        assert_eq!(table.iter().count(), 2);

        let err = ToolTable::resolve(&registry, |d, _| match d {
            Some(d) if d.namespace == "b" => Err(ConfigError::new("policy.retry.x", "is bad")),
            _ => Ok(()),
        })
        .unwrap_err();
        assert_eq!(err.field(), "tools[b::read].policy.retry.x");
    }
}
