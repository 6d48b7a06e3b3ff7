//! The handler of a server made over a `Service<ToolCall>`: it lists the tools; their calls
//! go to the service.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

/// The tools of an [`McpServer::over`](crate::McpServer::over) a `Service<ToolCall>`, and the
/// server's info: answers `tools/list` (in the shape of the protocol version each client
/// negotiated) and `initialize`; the calls go through the server's stack to the service.
#[derive(Clone, Debug)]
pub struct ToolList {
    tools: Arc<[Tool]>,
    info: ServerConfig,
}

impl ToolList {
    /// `tools`, served with tools as the one capability.
    pub fn new(tools: impl Into<Arc<[Tool]>>) -> Self {
        ToolList {
            tools: tools.into(),
            info: ServerConfig::new(ServerCapabilities::builder().enable_tools().build()),
        }
    }

    /// Answers `initialize` (and discovery) with `info`: the server's name, version and
    /// instructions. Keep tools in its capabilities.
    pub fn with_info(mut self, info: ServerConfig) -> Self {
        self.info = info;
        self
    }

    /// The tools.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }
}

impl From<Vec<Tool>> for ToolList {
    fn from(tools: Vec<Tool>) -> Self {
        ToolList::new(tools)
    }
}

impl ServerHandler for ToolList {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // An McpServer sends every call to its service; only a ToolList served on its own
        // gets here.
        Err(ErrorData::internal_error(
            format!(
                "tool {} is served through an McpServer, not by its tool list",
                request.name
            ),
            None,
        ))
    }
}
