//! The handler of a server made over a `Service<ToolCall>`: it lists the tools, and tells
//! its clients when the list changes; their calls go to the service.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::Principal;

use super::encoded::Encodings;
use super::Confirm;

/// How long a client may take to take the notice that the tools changed.
const NOTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The tools of an [`McpServer::over`](crate::McpServer::over) a `Service<ToolCall>`, and the
/// server's info: answers `tools/list` (in the shape of the protocol version each client
/// negotiated) and `initialize`; the calls go through the server's stack to the service.
///
/// **A list that changes.** Clones share the list: [`replace`](ToolList::replace) puts other
/// tools in every clone's place, for every connection of the server, and tells every
/// connected client, as MCP does (the server announces `tools.listChanged`): a
/// `notifications/tools/list_changed` on each 2025-11-25 session, and on each 2026-07-28
/// `subscriptions/listen` stream that asked for tool list changes.
#[derive(Clone, Debug)]
pub struct ToolList {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: RwLock<Listed>,
    /// Bumped on each replacement, for the subscription streams.
    changes: tokio::sync::watch::Sender<u64>,
    /// The sessions of the clients that initialized under 2025-11-25.
    sessions: Mutex<Vec<Peer<RoleServer>>>,
    /// The list's `tools/list` results, encoded.
    encodings: Encodings,
}

/// What the list holds at one time.
#[derive(Clone, Debug)]
struct Listed {
    tools: Arc<[Tool]>,
    info: ServerConfig,
    routes: Arc<HashMap<String, Route>>,
    /// Made [routed](ToolList::routed): its calls go only to the tools it lists.
    routed: bool,
    visible: Visibility,
}

/// Which listed tools a caller sees and may call, and who is told of a call refused.
#[derive(Clone, Default)]
struct Visibility(Option<Arc<VisibleFn>>, Option<Arc<DeniedFn>>);

/// Told of each call refused because its caller may not see the tool.
type DeniedFn = dyn Fn(Option<&Principal>, &str) + Send + Sync;

/// Whether the caller (its principal, if any) sees the listed tool of this name.
type VisibleFn = dyn Fn(Option<&Principal>, &str) -> bool + Send + Sync;

impl Visibility {
    fn shows(&self, principal: Option<&Principal>, name: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|visible| visible(principal, name))
    }
}

impl fmt::Debug for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Visibility(filtered)"
        } else {
            "Visibility(all)"
        })
    }
}

/// Where a listed tool is called: its namespace and its name there, and whether a client's
/// cancellation stops its call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) namespace: Arc<str>,
    pub(crate) name: String,
    pub(crate) stops_when_cancelled: bool,
    /// How a call gets the user's confirmation, for a tool that needs one.
    pub(crate) confirm: Option<Confirm>,
}

impl ToolList {
    /// `tools`, served with tools as the one capability, each called by its name in the
    /// server's namespace.
    pub fn new(tools: impl Into<Arc<[Tool]>>) -> Self {
        ToolList::of(Listed {
            tools: tools.into(),
            info: ServerConfig::new(
                ServerCapabilities::builder()
                    .enable_tools()
                    .enable_tool_list_changed()
                    .build(),
            ),
            routes: Arc::default(),
            routed: false,
            visible: Visibility::default(),
        })
    }

    fn of(listed: Listed) -> Self {
        ToolList {
            shared: Arc::new(Shared {
                current: RwLock::new(listed),
                changes: tokio::sync::watch::Sender::new(0),
                sessions: Mutex::default(),
                encodings: Encodings::default(),
            }),
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
                stops_when_cancelled: false,
                confirm: None,
            };
            if routes.insert(tool.name.to_string(), route).is_some() {
                return Err(format!("the tool name {} is listed twice", tool.name));
            }
            listed.push(tool);
        }
        let list = ToolList::new(listed);
        {
            let mut listed = list.write();
            listed.routes = Arc::new(routes);
            listed.routed = true;
        }
        Ok(list)
    }

    /// Stops the call of a [routed](ToolList::routed) tool that `registry` holds safe to
    /// repeat (read-only or idempotent, as its policy says after trust) when the client
    /// cancels its request (`notifications/cancelled`): the call is dropped, its idempotency
    /// key freed, and an [`McpClient`](crate::McpClient) beneath cancels its request on the
    /// server behind. A call of any other tool runs to its end whatever the client does, so
    /// that a re-send gets its result rather than a second run (see
    /// [`McpServer`](crate::McpServer#cancellation)).
    pub fn stop_repeatable_when_cancelled(self, registry: &ToolRegistry) -> Self {
        {
            let mut listed = self.write();
            let mut routes = (*listed.routes).clone();
            for route in routes.values_mut() {
                route.stops_when_cancelled = registry
                    .get(&route.namespace, &route.name)
                    .is_some_and(|tool| tool.descriptor().repeat_is_safe());
            }
            listed.routes = Arc::new(routes);
        }
        self
    }

    /// Confirms each call of a [routed](ToolList::routed) tool that `registry` says needs the
    /// user's confirmation (a mutating tool with `confirmation_required`) as `confirm` says
    /// for its namespace and name (see [`Confirm`]); without it, such a call needs a
    /// `_meta.confirmationId`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rmcp::model::Tool;
    /// use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
    /// use tower_toolcall_mcp::{Confirm, ToolList};
    ///
    /// let send = Tool::new("send", "Sends a mail", Arc::new(serde_json::Map::new()));
    /// let registry = ToolRegistry::builder()
    ///     .tool(ToolDescriptor::new("mail", "send", RiskLevel::Writes).with_confirmation_required(true))
    ///     .build()?;
    /// let list = ToolList::routed([(send, "mail", "send")])
    ///     .unwrap()
    ///     .confirm_by(&registry, |_namespace, _name| Confirm::Elicit);
    /// # let _ = list;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn confirm_by<F>(self, registry: &ToolRegistry, confirm: F) -> Self
    where
        F: Fn(&str, &str) -> Confirm,
    {
        {
            let mut listed = self.write();
            let mut routes = (*listed.routes).clone();
            for route in routes.values_mut() {
                let needed = registry
                    .get(&route.namespace, &route.name)
                    .is_some_and(|tool| {
                        let descriptor = tool.descriptor();
                        descriptor.confirmation_required && descriptor.risk.is_mutating()
                    });
                route.confirm = needed.then(|| confirm(&route.namespace, &route.name));
            }
            listed.routes = Arc::new(routes);
        }
        self
    }

    /// Shows each caller only the tools `visible` says it may call: `tools/list` lists the
    /// others to no one, and an [`McpServer`](crate::McpServer) refuses their calls as
    /// `POLICY_DENIED`, in the same words as a call of a tool that does not exist, so that
    /// a refusal never tells a caller that the tool is there. `visible` gets the caller's
    /// principal (none for a server without authentication) and the listed name. Replacing
    /// the list replaces the rule with the new list's.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rmcp::model::Tool;
    /// use tower_toolcall_mcp::{Principal, ToolList};
    ///
    /// let tool = |name: &'static str| Tool::new(name, "a tool", Arc::new(serde_json::Map::new()));
    /// let list = ToolList::new(vec![tool("search"), tool("delete")]).visible_to(
    ///     |principal: Option<&Principal>, name: &str| {
    ///         name == "search" || principal.is_some_and(|p| p.has_role("admin"))
    ///     },
    /// );
    /// let reader = Principal::new("bob").with_roles(["reader"]);
    /// assert_eq!(list.tools_for(Some(&reader)).len(), 1);
    /// ```
    pub fn visible_to<F>(self, visible: F) -> Self
    where
        F: Fn(Option<&Principal>, &str) -> bool + Send + Sync + 'static,
    {
        self.write().visible.0 = Some(Arc::new(visible));
        self
    }

    /// Calls `denied` with the caller and the listed name of each call refused because the
    /// caller may not see the tool (see [`visible_to`](ToolList::visible_to)): for an audit
    /// of refusals.
    pub fn on_denied<F>(self, denied: F) -> Self
    where
        F: Fn(Option<&Principal>, &str) + Send + Sync + 'static,
    {
        self.write().visible.1 = Some(Arc::new(denied));
        self
    }

    /// The tools `principal` sees (see [`visible_to`](ToolList::visible_to)).
    pub fn tools_for(&self, principal: Option<&Principal>) -> Vec<Tool> {
        let listed = self.read();
        listed
            .tools
            .iter()
            .filter(|tool| listed.visible.shows(principal, &tool.name))
            .cloned()
            .collect()
    }

    /// The `tools/list` result `principal` is shown, as JSON (`{"tools": [...]}`): encoded
    /// once per list and per set of tools a caller sees, and shared, so that a front that
    /// answers `tools/list` with these bytes holds one copy of a large list however many
    /// answers are being sent, or left unread, at once.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rmcp::model::Tool;
    /// use tower_toolcall_mcp::ToolList;
    ///
    /// let list = ToolList::new(vec![Tool::new("search", "Search", Arc::new(serde_json::Map::new()))]);
    /// let result: serde_json::Value = serde_json::from_slice(&list.encoded_for(None)).unwrap();
    /// assert_eq!(result["tools"][0]["name"], "search");
    /// // The same bytes for the next caller who sees the same tools.
    /// assert_eq!(list.encoded_for(None).as_ptr(), list.encoded_for(None).as_ptr());
    /// ```
    pub fn encoded_for(&self, principal: Option<&Principal>) -> bytes::Bytes {
        let (tools, visible) = {
            let listed = self.read();
            (listed.tools.clone(), listed.visible.clone())
        };
        self.shared
            .encodings
            .of(&tools, |tool| visible.shows(principal, &tool.name))
    }

    /// Whether `principal` may call the listed tool `name`; the refusal is reported.
    pub(crate) fn admits(&self, principal: Option<&Principal>, name: &str) -> bool {
        let visible = self.read().visible.clone();
        let shown = visible.shows(principal, name);
        if !shown {
            if let Some(denied) = &visible.1 {
                denied(principal, name);
            }
        }
        shown
    }

    /// Where the listed tool `name` is called, when the list was made [routed](ToolList::routed):
    /// `Err` for a name a routed list does not list, `Ok(None)` for any name of another list.
    pub(crate) fn route(&self, name: &str) -> Result<Option<Route>, ()> {
        let listed = self.read();
        match listed.routes.get(name) {
            Some(route) => Ok(Some(route.clone())),
            None if listed.routed => Err(()),
            None => Ok(None),
        }
    }

    /// Answers `initialize` (and discovery) with `info`: the server's name, version and
    /// instructions. Keep tools in its capabilities (with `listChanged` if the list is to
    /// be [replaced](ToolList::replace)).
    pub fn with_info(self, info: ServerConfig) -> Self {
        self.write().info = info;
        self
    }

    /// The tools listed now.
    pub fn tools(&self) -> Arc<[Tool]> {
        self.read().tools.clone()
    }

    /// Lists `next`'s tools (and calls them where `next` routes them) from now on, in every
    /// clone of this list, and tells every connected client that the list changed, without
    /// waiting for them: each is told on a task of the change, within a bound of its own, so
    /// that a client that stopped reading holds up neither the change nor the others. The
    /// server's info stays this list's. Calls already under way finish where they were sent.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rmcp::model::Tool;
    /// use tower_toolcall_mcp::ToolList;
    ///
    /// # tokio_test::block_on(async {
    /// let tool = |name: &'static str| Tool::new(name, "a tool", Arc::new(serde_json::Map::new()));
    /// let served = ToolList::new(vec![tool("search")]);
    /// let shared = served.clone();
    /// served.replace(ToolList::new(vec![tool("search"), tool("fetch")])).await;
    /// assert_eq!(shared.tools().len(), 2);
    /// # });
    /// ```
    pub async fn replace(&self, next: ToolList) {
        let next = next.read().clone();
        {
            let mut listed = self.write();
            listed.tools = next.tools;
            listed.routes = next.routes;
            listed.routed = next.routed;
            listed.visible = next.visible;
        }
        self.shared.changes.send_modify(|changes| *changes += 1);
        // Told on a task of their own, all at once, each within a bound: a client that
        // stopped reading never holds up the change, nor the others.
        let sessions = self.open_sessions().clone();
        if sessions.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let told = sessions.iter().map(|session| async move {
                let telling = session.notify_tool_list_changed();
                match tokio::time::timeout(NOTIFY_TIMEOUT, telling).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "a client could not be told that the tools changed");
                    }
                    Err(_) => tracing::debug!(
                        "a client did not take the notice that the tools changed in time"
                    ),
                }
            });
            futures_util::future::join_all(told).await;
        });
    }

    /// The 2025-11-25 sessions still open, locked; the others leave the list.
    fn open_sessions(&self) -> std::sync::MutexGuard<'_, Vec<Peer<RoleServer>>> {
        let mut sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|session| !session.is_transport_closed());
        sessions
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Listed> {
        self.shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Listed> {
        self.shared
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl From<Vec<Tool>> for ToolList {
    fn from(tools: Vec<Tool>) -> Self {
        ToolList::new(tools)
    }
}

impl ServerHandler for ToolList {
    fn get_info(&self) -> ServerConfig {
        self.read().info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // The caller as its McpServer found it.
        let principal = context.extensions.get::<Principal>();
        Ok(ListToolsResult::with_all_items(self.tools_for(principal)))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().iter().find(|tool| tool.name == name).cloned()
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // A 2025-11-25 session: told of list changes on the session itself.
        self.open_sessions().push(context.peer);
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let _ = requested;
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        // A 2026-07-28 stream: told of each replacement until the client ends it.
        let mut changes = self.shared.changes.subscribe();
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    if subscription.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
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
