//! Per-tool values that a layer resolves once, when it is built, from the registry: the
//! layer's defaults merged with each tool's overrides. A value is found for a call by the
//! index its registry gives the call's tool, which the call remembers (see
//! [`ToolRegistry::index_for`]): the first layer of a stack looks the tool up by name, the
//! others read one number. Nothing is merged per call.
//!
//! The table also keeps the registry's [`ReliabilityControl`], so that a layer reads the
//! operator's switches from where it reads its tools, and answers the questions every
//! layer's `call` opens with ([`ToolTable::gate`]).

use std::fmt;

use crate::control::{ReliabilityControl, ShadowLayer};
use crate::envelope::ToolCall;
use crate::error::ConfigError;
use crate::registry::{ToolDescriptor, ToolPolicy, ToolRegistry};

/// A layer acting on a call: the tool's settings, and whether the layer is in shadow mode for
/// the call (it decides as it would, notes what it would have done, and lets the call
/// through). Made by [`ToolTable::gate`].
#[derive(Debug)]
pub(crate) struct Acting<'a, T> {
    pub(crate) tool: &'a T,
    pub(crate) shadow: bool,
}

/// One resolved value per registered tool, and one for every unregistered tool.
pub(crate) struct ToolTable<T> {
    /// The registry the values were resolved from: it finds a call's tool.
    registry: ToolRegistry,
    /// The value of each registered tool, at the tool's index in the registry.
    by_index: Vec<T>,
    unregistered: T,
}

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
        // The registry lists its tools by index.
        let by_index = registry
            .tools()
            .map(|tool| {
                let descriptor = tool.descriptor();
                resolve(Some(descriptor), &descriptor.policy)
                    .map_err(|e| e.within(&format!("tools[{}]", tool.full_name())))
            })
            .collect::<Result<_, _>>()?;
        Ok(ToolTable {
            registry: registry.clone(),
            by_index,
            unregistered,
        })
    }

    /// The switches of the registry the table was resolved from.
    pub(crate) fn control(&self) -> &ReliabilityControl {
        self.registry.control()
    }

    /// The value of the registered tool `namespace::name`.
    pub(crate) fn registered(&self, namespace: &str, name: &str) -> Option<&T> {
        let tool = self.registry.get(namespace, name)?;
        self.by_index.get(tool.index() as usize)
    }

    /// The value for `namespace::name`: its own when it is registered, the unregistered one
    /// otherwise.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> &T {
        self.registered(namespace, name)
            .unwrap_or(&self.unregistered)
    }

    /// The value for the tool of `call`.
    pub(crate) fn for_call(&self, call: &ToolCall) -> &T {
        if self.by_index.is_empty() {
            // An empty registry: every tool is unregistered.
            return &self.unregistered;
        }
        self.registry
            .index_for(call)
            .and_then(|index| self.by_index.get(index as usize))
            .unwrap_or(&self.unregistered)
    }

    /// Every value: the registered tools' and the unregistered one.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.by_index
            .iter()
            .chain(std::iter::once(&self.unregistered))
    }

    /// The value of every unregistered tool.
    pub(crate) fn get_unregistered(&self) -> &T {
        &self.unregistered
    }

    /// Every registered tool's namespace, name and value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str, &T)> {
        self.registry
            .tools()
            .zip(&self.by_index)
            .map(|(tool, value)| {
                let descriptor = tool.descriptor();
                (
                    descriptor.namespace.as_str(),
                    descriptor.name.as_str(),
                    value,
                )
            })
    }
}

impl<T> ToolTable<Option<T>> {
    /// The questions every layer's `call` opens with, for a table whose value is `None` for
    /// the tools whose policy switches the layer off: `None` (the call goes to the inner
    /// service untouched) while the operator's kill switch is off or for such a tool; else
    /// the tool's settings, in shadow mode when `layer` (the layer's shadow switch, `None`
    /// for a layer that always enforces) does not enforce on `call`
    /// ([`ReliabilityControl::enforces_layer`]).
    pub(crate) fn gate(
        &self,
        call: &ToolCall,
        layer: Option<ShadowLayer>,
    ) -> Option<Acting<'_, T>> {
        if !self.control().is_enabled() {
            return None;
        }
        let tool = self.for_call(call).as_ref()?;
        let shadow = layer.is_some_and(|layer| !self.control().enforces_layer(layer, call));
        Some(Acting { tool, shadow })
    }
}

impl<T> fmt::Debug for ToolTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolTable")
            .field("tools", &self.by_index.len())
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
