//! What the benchmarks share: the gateway and `mcp-proxy` 0.6 as child processes in front of
//! an upstream, an echo MCP server over streamable HTTP, an MCP session to any of them, and
//! the memory of a process read from `/proc`.
//!
//! Every bench binary uses a part of this module only.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The version of `mcp-proxy` the figures are taken with.
pub(crate) const MCP_PROXY_VERSION: &str = "0.6.0";

/// What installs it where [`mcp_proxy_binary`] looks first (from the workspace's root).
pub(crate) const MCP_PROXY_INSTALL: &str = "crates/toolcall-gateway/benches/mcp-proxy.sh \
     (cargo install mcp-proxy --version 0.6.0 --locked --root .tools)";

/// `mcp-proxy`'s backend entry (`{name}`, `{url}`) with the resilience of the loaded
/// configuration of its own `examples/overhead.rs`.
pub(crate) const MCP_PROXY_LOADED: &str = "[[backends]]
name = \"{name}\"
transport = \"http\"
url = \"{url}\"

[backends.timeout]
seconds = 5

[backends.retry]
max_retries = 2
initial_backoff_ms = 10
max_backoff_ms = 100

[backends.circuit_breaker]
failure_rate_threshold = 0.5
minimum_calls = 100
wait_duration_seconds = 5

[backends.cache]
tool_ttl_seconds = 60
max_entries = 10000
";

/// A process the benchmark started, with the URL of its MCP endpoint; killed when dropped.
#[derive(Debug)]
pub(crate) struct Front {
    pub(crate) child: Child,
    pub(crate) url: String,
    /// The directory of its configuration file.
    dir: PathBuf,
}

impl Front {
    /// The address it listens on (`host:port`).
    pub(crate) fn address(&self) -> String {
        let rest = self.url.trim_start_matches("http://");
        rest.split('/').next().unwrap_or(rest).to_owned()
    }

    /// The process id, for [`Memory::of`].
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("the process still runs")
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The number in the environment variable `name`, else `default`.
pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh directory for a child's configuration.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "toolcall-bench-{}-{name}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("the temporary directory is writable");
    dir
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The gateway (the binary this package builds, in the bench profile) with `config` as its
/// `gateway.toml`, listening on a free loopback port.
pub(crate) async fn gateway(config: &str) -> Front {
    gateway_at(env!("CARGO_BIN_EXE_toolcall-gateway"), config).await
}

/// The gateway binary at `binary` (another build of it, for before and after) with `config`
/// as its `gateway.toml`, listening on a free loopback port.
pub(crate) async fn gateway_at(binary: &str, config: &str) -> Front {
    gateway_under(&[], binary.as_ref(), config).await
}

/// The gateway binary at `binary`, run under `wrapper` (a program and its arguments, such as
/// valgrind's; none when empty), with `config` as its `gateway.toml`, listening on a free
/// loopback port.
pub(crate) async fn gateway_under(wrapper: &[String], binary: &Path, config: &str) -> Front {
    let dir = scratch("gateway");
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = command(wrapper, binary)
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .next_line()
        .await
        .unwrap()
        .expect("the gateway prints the address it listens on");
    let address = line.trim_start_matches("listening on ").to_owned();
    Front {
        child,
        url: format!("http://{address}/mcp"),
        dir,
    }
}

/// The `mcp-proxy` binary: `MCP_PROXY` if set, else `.tools/bin/mcp-proxy` at the
/// workspace's root (where `benches/mcp-proxy.sh` installs it), else `mcp-proxy` on the
/// `PATH`. Panics with the command that installs it when there is none: the comparison
/// is the point of the benchmark, so it never runs without its peer.
pub(crate) fn mcp_proxy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("MCP_PROXY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "MCP_PROXY={} is not a file; install mcp-proxy {MCP_PROXY_VERSION} with {MCP_PROXY_INSTALL}",
            path.display()
        );
        return path;
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/mcp-proxy");
    if local.is_file() {
        return local;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("mcp-proxy"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "mcp-proxy {MCP_PROXY_VERSION} is missing (neither MCP_PROXY, nor .tools/bin/mcp-proxy, \
             nor on the PATH); install it with {MCP_PROXY_INSTALL}"
        )
    })
}

/// A free loopback port (bound, then released for the child to bind).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `mcp-proxy` with `backends` (its `[[backends]]` tables and their middleware, as TOML)
/// after a `[proxy]` table of its own, ready once its `/readyz` answers 200. Its MCP
/// endpoint is `/`, its tools are named `backend/tool`.
pub(crate) async fn mcp_proxy(backends: &str, performance: &str) -> Front {
    mcp_proxy_under(&[], backends, performance).await
}

/// [`mcp_proxy`] run under `wrapper` (a program and its arguments; none when empty).
pub(crate) async fn mcp_proxy_under(
    wrapper: &[String],
    backends: &str,
    performance: &str,
) -> Front {
    let binary = mcp_proxy_binary();
    let dir = scratch("mcp-proxy");
    let path = dir.join("proxy.toml");
    let port = free_port();
    std::fs::write(
        &path,
        format!(
            "[proxy]\nname = \"bench\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\
             [observability]\naudit = false\nlog_level = \"error\"\n{performance}\n{backends}"
        ),
    )
    .unwrap();
    let child = command(wrapper, &binary)
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| {
            panic!(
                "{} does not start ({err}); install mcp-proxy {MCP_PROXY_VERSION} with {MCP_PROXY_INSTALL}",
                binary.display()
            )
        });
    let mut front = Front {
        child,
        url: format!("http://127.0.0.1:{port}/"),
        dir,
    };
    for _ in 0..1200 {
        if get_status(port, "/readyz").await == Some(200) {
            return front;
        }
        if let Ok(Some(status)) = front.child.try_wait() {
            panic!(
                "mcp-proxy exited at start-up ({status}); its configuration:\n{}",
                std::fs::read_to_string(&path).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("mcp-proxy did not become ready on port {port} within 60 s");
}

/// `binary` as a command, run under `wrapper` when there is one.
fn command(wrapper: &[String], binary: &Path) -> Command {
    match wrapper.split_first() {
        None => Command::new(binary),
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
    }
}

/// The status of `GET path` on the loopback `port`, `None` when nothing answers.
async fn get_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// An MCP session over streamable HTTP to `url`, as the client `name`.
pub(crate) async fn session(
    url: &str,
    name: &str,
) -> RunningService<RoleClient, rmcp::model::ClientConfig> {
    let mut info = rmcp::model::ClientConfig::default();
    info.client_info = rmcp::model::Implementation::new(name.to_owned(), "1.0");
    info.serve(StreamableHttpClientTransport::from_uri(url.to_owned()))
        .await
        .unwrap_or_else(|err| panic!("an MCP session to {url} opens: {err}"))
}

/// Calls `tool` with `args`; the error text when the call did not end in a result that
/// is not an error.
pub(crate) async fn call(
    peer: &rmcp::service::Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, String> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    match peer.call_tool(params).await {
        Ok(result) if result.is_error == Some(true) => {
            Err(format!("isError: {:?}", result.content))
        }
        Ok(result) => Ok(result),
        Err(err) => Err(err.to_string()),
    }
}

/// An MCP server with one tool, `echo` (`readOnlyHint: true`), which answers its arguments
/// as text.
#[derive(Clone, Debug, Default)]
pub(crate) struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        let echo = Tool::new(
            "echo",
            "Answers its arguments",
            Arc::new(schema.as_object().cloned().unwrap_or_default()),
        )
        .annotate(ToolAnnotations::new().read_only(true));
        Ok(ListToolsResult::with_all_items(vec![echo]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        Ok(CallToolResult::success(vec![ContentBlock::text(args.to_string())]).into())
    }
}

/// Serves [`Echo`] over streamable HTTP on a free loopback port; its URL (`/mcp`).
pub(crate) async fn echo_server() -> String {
    crate::http::serve(Echo).await
}

/// A process's memory, from `/proc/<pid>/status`, in kB.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Memory {
    /// Peak resident set size (`VmHWM`).
    pub(crate) peak_kb: u64,
    /// Resident set size now (`VmRSS`).
    pub(crate) now_kb: u64,
}

impl Memory {
    /// The memory of the process `pid`.
    pub(crate) fn of(pid: u32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|err| panic!("/proc/{pid}/status cannot be read: {err}"));
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("/proc/{pid}/status has no {name}"))
        };
        Memory {
            peak_kb: field("VmHWM:"),
            now_kb: field("VmRSS:"),
        }
    }
}

/// The CPU time a process has used so far, user and system (`/proc/<pid>/stat`).
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|err| panic!("/proc/{pid}/stat cannot be read: {err}"));
    // The fields after the command's name, which ends at the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime: fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel's clock ticks are 100 a second on Linux (USER_HZ).
    Duration::from_millis(ticks * 10)
}
