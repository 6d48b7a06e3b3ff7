//! The gateway's memory under the clients and upstreams that used to exhaust it: its peak
//! resident set (`VmHWM`) while one client opens MCP sessions up to the cap and closes them,
//! while a chatty upstream floods progress to a client that does not read, and while
//! clients leave the `tools/list` of a 10 000-tool upstream unread.
//!
//! ```text
//! cargo bench -p toolcall-gateway --bench bounds
//! GATEWAY_BEFORE=/path/to/an/older/toolcall-gateway cargo bench -p toolcall-gateway --bench bounds
//! ```
//!
//! `GATEWAY_BEFORE` measures another build of the gateway in the same run, before this
//! one (an older commit's release binary, for before and after). Each step runs against a
//! gateway of its own, started for it, in front of upstreams in this process over streamable
//! HTTP:
//!
//! - **sessions**: `SESSIONS` (10 000, the default cap) `initialize` requests, 50 at a time,
//!   each session kept open; then as many again, which the cap refuses; then every session
//!   ended (`DELETE`). Per session: the growth over the started gateway, divided by the
//!   sessions open.
//! - **progress flood**: a session calls `flood`, which sends `PROGRESS` notifications of
//!   8 KiB each (400 000, about 3.1 GiB, by default) on a request whose answer its client
//!   never reads, then answers.
//! - **unread tool lists**: `LISTS` (100) sessions each ask for the list of an upstream of
//!   10 000 tools (about 7 MiB encoded) and never read the answer.

#[path = "../tests/support/http.rs"]
mod http;
mod peers;

use std::sync::Arc;
use std::time::Duration;

use peers::Memory;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sessions opened at once.
const BATCH: usize = 50;

/// An upstream of many tools (`tool0`…), and `flood`, which sends `count` progress
/// notifications of `bytes` each before it answers.
#[derive(Clone)]
struct Upstream {
    tools: Arc<Vec<Tool>>,
}

impl Upstream {
    fn with(count: usize) -> Upstream {
        let schema = json!({"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for, in a few words"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            "region": {"type": "string", "enum": ["eu", "us", "ap"]}
        }});
        let schema = Arc::new(schema.as_object().cloned().unwrap_or_default());
        let mut tools: Vec<Tool> = (0..count)
            .map(|n| {
                Tool::new(
                    format!("tool{n}"),
                    format!(
                        "Tool number {n}: {}",
                        "looks a thing up and answers it; ".repeat(12)
                    ),
                    schema.clone(),
                )
                .annotate(ToolAnnotations::new().read_only(true))
            })
            .collect();
        tools.push(
            Tool::new("flood", "Reports progress", schema)
                .annotate(ToolAnnotations::new().read_only(true)),
        );
        Upstream {
            tools: Arc::new(tools),
        }
    }
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let number = |name: &str| args.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
        let (count, bytes) = (number("count"), number("bytes") as usize);
        if let Some(token) = context.meta.get_progress_token() {
            let message = "p".repeat(bytes);
            for step in 1..=count {
                let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                    .with_total(count as f64)
                    .with_message(message.clone());
                if context.peer.notify_progress(progress).await.is_err() {
                    break;
                }
            }
        }
        Ok(CallToolResult::structured(json!({"sent": count})).into())
    }
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Sends `request` on a new connection, and reads the answer's head (or all of it within
/// `read` when asked); the connection, kept open unread, and what was read.
async fn send(address: &str, request: &str, read_all: Option<Duration>) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(address)
        .await
        .expect("the gateway accepts");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + read_all.unwrap_or(Duration::from_secs(30));
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if read_all.is_none() && answer.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    (stream, String::from_utf8_lossy(&answer).into_owned())
}

fn post(address: &str, session: Option<&str>, body: &serde_json::Value) -> String {
    let body = body.to_string();
    let session = session.map_or(String::new(), |id| {
        format!("mcp-session-id: {id}\r\nmcp-protocol-version: 2025-11-25\r\n")
    });
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\n{session}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Opens a session: its id, or `None` when it was refused.
async fn open(address: &str, n: usize) -> Option<String> {
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": format!("client-{n}"), "version": "1"}}
    });
    let (stream, head) = send(address, &post(address, None, &initialize), None).await;
    drop(stream);
    let id = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_owned())
    })?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    drop(send(address, &post(address, Some(&id), &initialized), None).await);
    Some(id)
}

/// The sessions step: the memory started, with the sessions open and the cap reached, and
/// after they ended; the sessions opened and refused.
async fn sessions(binary: &str, upstream: &str, count: usize) -> ([Memory; 3], usize, usize) {
    let gateway = peers::gateway_at(binary, &config(upstream)).await;
    let address = gateway.address();
    let started = Memory::of(gateway.pid());
    let mut ids = Vec::with_capacity(count);
    let mut refused = 0;
    for batch in 0..(2 * count).div_ceil(BATCH) {
        let mut opening = tokio::task::JoinSet::new();
        for n in batch * BATCH..((batch + 1) * BATCH).min(2 * count) {
            let address = address.clone();
            opening.spawn(async move { open(&address, n).await });
        }
        while let Some(opened) = opening.join_next().await {
            match opened.expect("an attempt ends") {
                Some(id) => ids.push(id),
                None => refused += 1,
            }
        }
    }
    let open_now = Memory::of(gateway.pid());
    let opened = ids.len();
    for batch in ids.chunks(BATCH) {
        let mut ending = tokio::task::JoinSet::new();
        for id in batch {
            let (address, id) = (address.clone(), id.clone());
            ending.spawn(async move {
                let request = format!(
                    "DELETE /mcp HTTP/1.1\r\nHost: {address}\r\nmcp-session-id: {id}\r\n\
                     mcp-protocol-version: 2025-11-25\r\n\r\n"
                );
                drop(send(&address, &request, None).await);
            });
        }
        while ending.join_next().await.is_some() {}
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ended = Memory::of(gateway.pid());
    ([started, open_now, ended], opened, refused)
}

/// The progress step: the memory started, and at the flood's end.
async fn flood(binary: &str, upstream: &str, count: u64) -> [Memory; 2] {
    let gateway = peers::gateway_at(binary, &config(upstream)).await;
    let address = gateway.address();
    let started = Memory::of(gateway.pid());
    let id = open(&address, 0).await.expect("a session");
    let call = json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "up__flood", "arguments": {"count": count, "bytes": 8192},
                   "_meta": {"progressToken": "flood"}}
    });
    // The client reads the answer's head, then nothing.
    let (unread, _) = send(&address, &post(&address, Some(&id), &call), None).await;
    // The flood is over when the upstream has sent it all: watch the gateway's CPU go idle.
    let mut last = cpu_ticks(gateway.pid());
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = cpu_ticks(gateway.pid());
        if now - last < 10 {
            break;
        }
        last = now;
    }
    let flooded = Memory::of(gateway.pid());
    drop(unread);
    [started, flooded]
}

/// The unread lists step: the memory started, and with `count` lists unread.
async fn lists(binary: &str, upstream: &str, count: usize) -> [Memory; 2] {
    let gateway = peers::gateway_at(binary, &config(upstream)).await;
    let address = gateway.address();
    let started = Memory::of(gateway.pid());
    let mut unread = Vec::with_capacity(count);
    for n in 0..count {
        let id = open(&address, n).await.expect("a session");
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        unread.push(
            send(&address, &post(&address, Some(&id), &list), None)
                .await
                .0,
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = Memory::of(gateway.pid());
    drop(unread);
    [started, held]
}

/// The CPU time of `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn config(upstream: &str) -> String {
    format!("[[upstreams]]\nname = \"up\"\nurl = \"{upstream}\"\ntrust = \"trusted\"\n")
}

#[tokio::main]
async fn main() {
    let env = peers::env_or::<u64>;
    let (session_count, progress, list_count) = (
        env("SESSIONS", 10_000) as usize,
        env("PROGRESS", 400_000),
        env("LISTS", 100) as usize,
    );
    let small = http::serve(Upstream::with(1)).await;
    let wide = http::serve(Upstream::with(10_000)).await;
    let mut builds = vec![("after", env!("CARGO_BIN_EXE_toolcall-gateway").to_owned())];
    if let Ok(before) = std::env::var("GATEWAY_BEFORE") {
        builds.insert(0, ("before", before));
    }
    let mut rows = Vec::new();
    for (build, binary) in &builds {
        let ([started, open, ended], opened, refused) =
            sessions(binary, &small, session_count).await;
        let per_session =
            (open.now_kb.saturating_sub(started.now_kb)) as f64 * 1024.0 / opened.max(1) as f64;
        println!(
            "{build}: {opened} sessions open ({refused} refused): peak {:.1} MiB, {:.1} KiB \
             per session; ended: {:.1} MiB now",
            mib(open.peak_kb),
            per_session / 1024.0,
            mib(ended.now_kb)
        );
        let [quiet, flooded] = flood(binary, &small, progress).await;
        println!(
            "{build}: progress flood ({progress} x 8 KiB, unread): peak {:.1} MiB (from {:.1})",
            mib(flooded.peak_kb),
            mib(quiet.peak_kb)
        );
        let [listed, held] = lists(binary, &wide, list_count).await;
        println!(
            "{build}: {list_count} unread lists of 10 000 tools: peak {:.1} MiB (from {:.1})",
            mib(held.peak_kb),
            mib(listed.peak_kb)
        );
        rows.push((
            build,
            [
                format!("{:.1} MiB", mib(open.peak_kb)),
                format!("{:.1} KiB", per_session / 1024.0),
                format!("{:.1} MiB", mib(ended.now_kb)),
                format!("{:.1} MiB", mib(flooded.peak_kb)),
                format!("{:.1} MiB", mib(held.peak_kb)),
            ],
        ));
    }
    println!();
    println!(
        "| build | peak, {session_count} sessions open | per session | after they ended | \
         peak, progress flood | peak, {list_count} unread 10 000-tool lists |"
    );
    println!("|---|---|---|---|---|---|");
    for (build, cells) in rows {
        println!("| {build} | {} |", cells.join(" | "));
    }
}
