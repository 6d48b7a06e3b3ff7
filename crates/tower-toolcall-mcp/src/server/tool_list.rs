//! The handler of a server made over a `Service<ToolCall>`: it lists the tools; their calls
//! go to the service.

use std::collections::HashMap;
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
    routes: Arc<HashMap<String, Route>>,
}

/// Where a listed tool is called: its namespace and its name there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) namespace: Arc<str>,
    pub(crate) name: String,
}

impl ToolList {
    /// `tools`, served with tools as the one capability, each called by its name in the
    /// server's namespace.
    pub fn new(tools: impl Into<Arc<[Tool]>>) -> Self {
        ToolList {
            tools: tools.into(),
            info: ServerConfig::new(ServerCapabilities::builder().enable_tools().build()),
            routes: Arc::default(),
        }
    }

    /// The tools of several servers under one list: each `(tool, namespace, name)` is listed
    /// as `tool` (whose name is the one clients see) and called as the tool `name` of
    /// `namespace`, so that a gateway can give the tools of many servers names that do not
    /// collide. `Err` names a listed name given twice.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rmcp::model::Tool;
    /// use tower_toolcall_mcp::ToolList;
    ///
    /// let now = Tool::new("get_current_time", "The time", Arc::new(serde_json::Map::new()));
    /// let mut listed = now.clone();
    /// listed.name = "time__get_current_time".into();
    /// let list = ToolList::routed([(listed, "time", "get_current_time")]).unwrap();
    /// assert_eq!(list.tools()[0].name, "time__get_current_time");
    /// ```
    pub fn routed<I, N>(tools: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = (Tool, N, N)>,
        N: AsRef<str>,
    {
        let mut listed = Vec::new();
        let mut routes = HashMap::new();
        for (tool, namespace, name) in tools {
            let route = Route {
                namespace: Arc::from(namespace.as_ref()),
                name: name.as_ref().to_owned(),
            };
            if routes.insert(tool.name.to_string(), route).is_some() {
                return Err(format!("the tool name {} is listed twice", tool.name));
            }
            listed.push(tool);
        }
        Ok(ToolList {
            routes: Arc::new(routes),
            ..ToolList::new(listed)
        })
    }

    /// Where the listed tool `name` is called, when the list was made [routed](ToolList::routed).
    pub(crate) fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
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
