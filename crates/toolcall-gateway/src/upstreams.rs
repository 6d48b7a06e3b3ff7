//! The MCP servers behind the gateway: started (or connected to), kept up, and called by
//! the namespace of each call.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::Tool;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt as _};
use tower_toolcall::registry::JitterKind;
use tower_toolcall::retry::Backoff;
use tower_toolcall::{ErrorCode, ToolCall, ToolError, ToolOutput};
use tower_toolcall_mcp::{
    pooled_http_client_builder, registry_for, McpClient, ProgressRelay, UpstreamState,
};

use crate::config::{redact_url, GatewayConfig, UpstreamConfig, UpstreamTransport};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A running upstream: its client (kept connected) and the tools it listed. Clones share
/// the connection.
#[derive(Clone)]
pub(crate) struct Upstream {
    pub(crate) config: UpstreamConfig,
    pub(crate) client: McpClient,
    pub(crate) tools: Vec<Tool>,
}

impl Upstream {
    /// Starts (or connects to) the upstream, and lists its tools, within its start-up
    /// timeout. The progress it reports on calls goes through `relay`; its name is sent on
    /// `changes` each time its tools may have changed (it said so, or it was connected to
    /// again), for as long as it runs.
    pub(crate) async fn start(
        config: UpstreamConfig,
        relay: ProgressRelay,
        changes: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Upstream, BoxError> {
        let name = config.name.clone();
        let started = async {
            // A restart that never answers is given up after the start-up time too.
            let client = connect(&config)
                .await?
                .relay_progress(&relay)
                .reconnect_within(config.startup_timeout);
            let tools = client.tools().await?;
            Ok::<_, BoxError>((client, tools))
        };
        let (client, tools) = tokio::time::timeout(config.startup_timeout, started)
            .await
            .map_err(|_| {
                format!(
                    "upstream {name} did not list its tools within {} ms (upstreams[].startup_timeout_ms)",
                    config.startup_timeout.as_millis()
                )
            })?
            .map_err(|err| format!("upstream {name}: {}", scrubbed(&config, &err.to_string())))?;
        // A list the gateway cannot serve (empty or duplicate names, a schema that does not
        // compile) keeps this upstream out, not the others.
        registry_for(&name, &tools, config.trust, None).map_err(|err| {
            format!("upstream {name} listed tools the gateway cannot serve: {err}")
        })?;
        tracing::info!(event = "upstream_started", upstream = %name, tools = tools.len());
        // The watch holds no client: it ends with the upstream's last clone.
        let mut changed = client.tool_list_changes();
        tokio::spawn(async move {
            while changed.changed().await.is_ok() {
                if changes.send(name.clone()).is_err() {
                    return;
                }
            }
        });
        Ok(Upstream {
            config,
            client,
            tools,
        })
    }

    /// The upstream with the tools it lists now, within its start-up timeout.
    pub(crate) async fn relisted(&self) -> Result<Upstream, BoxError> {
        let name = &self.config.name;
        let tools = tokio::time::timeout(self.config.startup_timeout, self.client.tools())
            .await
            .map_err(|_| format!("upstream {name} did not list its tools in time"))?
            .map_err(|err| format!("upstream {name}: {err}"))?;
        Ok(Upstream {
            tools,
            ..self.clone()
        })
    }

    /// Whether the upstream is connected now.
    pub(crate) fn is_up(&self) -> bool {
        self.client.state() == UpstreamState::Connected
    }
}

/// How often an upstream that failed to start is started again: after about 1 s, doubling
/// up to a minute.
const DOWN_BACKOFF: Backoff = Backoff::new(
    Duration::from_secs(1),
    Duration::from_secs(60),
    JitterKind::Equal,
    0,
);

/// An upstream that failed to start, and its starts again in the background, which end with
/// its last clone (the gateways that still want it). Clones share them.
#[derive(Clone)]
pub(crate) struct Down {
    pub(crate) config: UpstreamConfig,
    _retrying: Arc<AbortOnDrop>,
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Down {
    /// `config`'s upstream, which failed to start for `reason`: logged, and started again in
    /// the background until it comes up, then sent on `came_up`.
    pub(crate) fn retrying(
        config: UpstreamConfig,
        reason: String,
        relay: ProgressRelay,
        changes: tokio::sync::mpsc::UnboundedSender<String>,
        came_up: tokio::sync::mpsc::UnboundedSender<Upstream>,
    ) -> Down {
        tracing::error!(
            event = "upstream_down",
            upstream = %config.name,
            required = config.required,
            "{reason}; the other upstreams serve, and this one is started again in the background"
        );
        let retried = config.clone();
        let task = tokio::spawn(async move {
            let mut retry = 0;
            loop {
                retry += 1;
                tokio::time::sleep(DOWN_BACKOFF.random_delay(retry, None)).await;
                match Upstream::start(retried.clone(), relay.clone(), changes.clone()).await {
                    Ok(upstream) => {
                        tracing::info!(event = "upstream_up", upstream = %retried.name, retry);
                        let _ = came_up.send(upstream);
                        return;
                    }
                    Err(err) => tracing::warn!(
                        event = "upstream_still_down",
                        upstream = %retried.name,
                        retry,
                        "{err}"
                    ),
                }
            }
        });
        Down {
            config,
            _retrying: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }
}

/// What `GET /admin/upstreams` answers: each upstream by its name, how it is reached,
/// whether `/readyz` waits for it, and its connection's state: `connected`, `reconnecting`
/// (with the failed attempts so far and the time to the next), or `down` (it failed to
/// start, and is started again in the background), with its counts.
pub(crate) fn states(up: &[Upstream], down: &[Down]) -> serde_json::Value {
    use serde_json::json;
    let transport = |config: &UpstreamConfig| match config.transport {
        UpstreamTransport::Stdio { .. } => "stdio",
        UpstreamTransport::Http { .. } => "http",
    };
    let trust = |config: &UpstreamConfig| match config.trust {
        tower_toolcall_mcp::Trust::Trusted => "trusted",
        _ => "untrusted",
    };
    let mut states: Vec<serde_json::Value> = up
        .iter()
        .map(|u| {
            let stats = u.client.stats();
            let mut state = json!({
                "name": u.config.name,
                "transport": transport(&u.config),
                "trust": trust(&u.config),
                "required": u.config.required,
                "tools": u.tools.len(),
                "disconnects": stats.disconnects,
                "reconnects": stats.reconnects,
                "failedAttempts": stats.failed_attempts,
            });
            match u.client.state() {
                UpstreamState::Connected => state["state"] = json!("connected"),
                UpstreamState::Reconnecting {
                    failed_attempts,
                    next_attempt_in,
                } => {
                    state["state"] = json!("reconnecting");
                    state["failedAttemptsSinceDown"] = json!(failed_attempts);
                    state["nextAttemptInMs"] =
                        json!(u64::try_from(next_attempt_in.as_millis()).unwrap_or(u64::MAX));
                }
                _ => state["state"] = json!("unknown"),
            }
            state
        })
        .collect();
    states.extend(down.iter().map(|d| {
        json!({
            "name": d.config.name,
            "transport": transport(&d.config),
            "trust": trust(&d.config),
            "required": d.config.required,
            "state": "down",
        })
    }));
    states.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    serde_json::Value::Array(states)
}

/// `text` (an error of the upstream's client, which may quote its URL) with the URL's
/// secrets redacted.
fn scrubbed(config: &UpstreamConfig, text: &str) -> String {
    match &config.transport {
        UpstreamTransport::Http { url, .. } => {
            let mut text = text.replace(url.as_str(), &redact_url(url));
            // The client may quote the URL as it parsed it (a `/` added after the host).
            if let Some((base, _)) = url.split_once('?') {
                if let Some(at) = text.find(base) {
                    let end = text[at..]
                        .find(|c: char| c.is_whitespace() || c == ')' || c == '"')
                        .map_or(text.len(), |e| at + e);
                    let quoted = text[at..end].to_owned();
                    text = text.replace(&quoted, &redact_url(&quoted));
                }
            }
            text
        }
        UpstreamTransport::Stdio { .. } => text.to_owned(),
    }
}

/// A client of the upstream, kept connected: its process started again when it exits, its
/// HTTP session made again when it is lost.
async fn connect(config: &UpstreamConfig) -> Result<McpClient, BoxError> {
    let name = config.name.clone();
    match &config.transport {
        UpstreamTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let (command, args, env, cwd) =
                (command.clone(), args.clone(), env.clone(), cwd.clone());
            let client = McpClient::spawn_bounded(name, config.max_message_bytes, move || {
                let mut process = tokio::process::Command::new(&command);
                // Only the allow-listed variables of the gateway's environment, and the
                // entry's own: never the gateway's secrets.
                process
                    .args(&args)
                    .env_clear()
                    .envs(inherited_env())
                    .envs(&env);
                if let Some(cwd) = &cwd {
                    process.current_dir(cwd);
                }
                process
            })
            .await?;
            Ok(client)
        }
        UpstreamTransport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (header, value) in headers {
                let invalid =
                    |what: &str| format!("upstream {name}: {what} of header {header} is not valid");
                let header =
                    http::HeaderName::try_from(header.as_str()).map_err(|_| invalid("the name"))?;
                let mut value = http::HeaderValue::try_from(value.expose())
                    .map_err(|_| invalid("the value"))?;
                value.set_sensitive(true);
                custom.insert(header, value);
            }
            let transport = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(custom)
                .max_concurrent_requests(config.max_in_flight);
            // One pool of kept-alive connections, unless the server answers them late.
            let mut client = pooled_http_client_builder();
            if !config.keep_alive {
                client = client.pool_max_idle_per_host(0);
            }
            let client = config
                .tls
                .apply(client)
                .and_then(|client| client.build())
                .map_err(|err| format!("upstream {name}: the HTTP client cannot be made: {err}"))?;
            Ok(McpClient::http_with_client(name, client, transport).await?)
        }
    }
}

/// The variables of the gateway's environment a stdio upstream inherits, as the official
/// MCP SDKs' clients pass them: what a program needs to run (its `PATH`, the user, the
/// home directory, the terminal), never a credential or a `TOOLCALL_*` setting. Anything
/// else an upstream needs goes in its entry's `env`.
const INHERITED_ENV: &[&str] = if cfg!(windows) {
    &[
        "APPDATA",
        "HOMEDRIVE",
        "HOMEPATH",
        "LOCALAPPDATA",
        "PATH",
        "PROCESSOR_ARCHITECTURE",
        "SYSTEMDRIVE",
        "SYSTEMROOT",
        "TEMP",
        "USERNAME",
        "USERPROFILE",
        "PROGRAMFILES",
    ]
} else {
    &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"]
};

/// The allow-listed variables that are set (a value that is a shell function, `()…`, is
/// left out, as the SDKs do).
fn inherited_env() -> impl Iterator<Item = (&'static str, String)> {
    INHERITED_ENV.iter().filter_map(|name| {
        let value = std::env::var(name).ok()?;
        (!value.starts_with("()")).then_some((*name, value))
    })
}

/// Each stdio upstream of `config` whose command cannot be found: a path that is no file,
/// or a name on none of the directories of its `PATH` (its entry's `PATH`, else the
/// gateway's), as a line naming the upstream and what to do.
pub(crate) fn missing_commands(config: &GatewayConfig) -> Vec<String> {
    config
        .upstreams
        .iter()
        .filter_map(|upstream| {
            let UpstreamTransport::Stdio {
                command, env, cwd, ..
            } = &upstream.transport
            else {
                return None;
            };
            let found = if command.contains(std::path::MAIN_SEPARATOR) || command.contains('/') {
                let path = std::path::Path::new(command);
                let path = match cwd {
                    Some(cwd) if path.is_relative() => cwd.join(path),
                    _ => path.to_path_buf(),
                };
                path.is_file()
            } else {
                let path = env
                    .get("PATH")
                    .cloned()
                    .or_else(|| std::env::var("PATH").ok())
                    .unwrap_or_default();
                std::env::split_paths(&path).any(|dir| dir.join(command).is_file())
            };
            (!found).then(|| {
                format!(
                    "upstream {}: the command {command:?} is not found{}; install it, or give \
                     its full path",
                    upstream.name,
                    if command.contains('/') {
                        ""
                    } else {
                        " on PATH"
                    }
                )
            })
        })
        .collect()
}

/// A service of tools.
pub(crate) type Route = BoxCloneSyncService<ToolCall, ToolOutput, ToolError>;

/// The calls of every upstream's tools, each to the service of its namespace. The stack
/// around it bounds each attempt (an upstream's `timeout_ms` is its tools' attempt timeout).
#[derive(Clone)]
pub(crate) struct Router {
    routes: Arc<HashMap<String, Route>>,
}

impl Router {
    pub(crate) fn new(routes: HashMap<String, Route>) -> Self {
        Router {
            routes: Arc::new(routes),
        }
    }

    /// The routes of `upstreams`: each its namespace to its client.
    pub(crate) fn of(upstreams: &[Upstream]) -> Self {
        Router::new(
            upstreams
                .iter()
                .map(|u| {
                    let client = BoxCloneSyncService::new(u.client.clone());
                    (u.config.name.clone(), client)
                })
                .collect(),
        )
    }
}

impl Service<ToolCall> for Router {
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = tower_toolcall::BoxToolFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let Some(service) = self.routes.get(call.tool_namespace()).cloned() else {
            let message = format!("no upstream serves the tool {}", call.tool_name());
            return Box::pin(async move { Err(ToolError::new(ErrorCode::NotFound, message)) });
        };
        Box::pin(service.oneshot(call))
    }
}
