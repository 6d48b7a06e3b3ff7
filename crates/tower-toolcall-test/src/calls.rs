//! Calls, registries and stacks as the suites build them.

use tower::{Layer, Service, ServiceExt};
use tower_toolcall::registry::{ToolDescriptor, ToolRegistry};
use tower_toolcall::{ToolCall, ToolError, ToolOutput, ToolStack, ToolStackService};

/// A call of `namespace::name` in session `sess-42`.
pub fn call_of(namespace: &str, name: &str) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-42")
        .actor("user-7")
        .build()
        .expect("a valid call")
}

/// A registry of `tools`.
pub fn registry_of(tools: impl IntoIterator<Item = ToolDescriptor>) -> ToolRegistry {
    tools
        .into_iter()
        .fold(ToolRegistry::builder(), |builder, tool| builder.tool(tool))
        .build()
        .expect("a valid registry")
}

/// Calls `svc` once it is ready.
pub async fn call_once<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready().await?.call(call).await
}

/// `tool` behind the whole stack as the core's builder assembles it: the stack the test
/// suites exercise, answering with the core's `ToolOutput` / `ToolError`.
pub fn stacked<S>(stack: &ToolStack, tool: S) -> ToolStackService<S> {
    stack.layer(tool)
}
