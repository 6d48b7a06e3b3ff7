//! The gateway as a child process, in front of `mcp-server-time` (Python) and
//! `server-everything` (TypeScript), driven by the official Python SDK client over stdio
//! and streamable HTTP. The SDKs come from the interop kit
//! (`examples/tests/interop/setup.sh`); a test that finds them missing fails with that
//! command.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tower_toolcall_test::cluster::RedisCluster;
use tower_toolcall_test::redis_server::RedisServer;

mod auth;
mod bulkhead;
mod hop;
mod host;
mod https;
mod operate;

const GATEWAY: &str = env!("CARGO_BIN_EXE_toolcall-gateway");

/// The interop kit's `path`, which must be installed.
fn kit(path: &str) -> PathBuf {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/tests/interop")
        .join(path);
    assert!(
        full.exists(),
        "{} is missing: install the MCP SDKs with `examples/tests/interop/setup.sh`",
        full.display()
    );
    full
}

/// The `[[upstreams]]` entry of `mcp-server-time`.
fn time_upstream() -> String {
    format!(
        "[[upstreams]]\nname = \"time\"\ncommand = \"{}\"\ntrust = \"trusted\"\n",
        kit(".venv/bin/mcp-server-time").display()
    )
}

/// The `[[upstreams]]` entry of `server-everything`.
fn everything_upstream() -> String {
    let everything = kit("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    format!(
        "[[upstreams]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\ntrust = \"trusted\"\n",
        everything.display()
    )
}

/// A configuration file of `text`, written to a directory of its own for `name`.
fn written(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A configuration file fronting both reference servers, and `extra`.
fn config_file(name: &str, extra: &str) -> PathBuf {
    written(
        name,
        &format!("{}\n{}\n{extra}", time_upstream(), everything_upstream()),
    )
}

/// Runs `plan` with the Python SDK's driver; its report.
async fn python(plan: Value) -> Value {
    let mut command = Command::new(kit(".venv/bin/python"));
    command.arg(kit("clients/client.py"));
    drive(command, plan).await
}

/// Runs `plan` with the TypeScript SDK's driver; its report.
async fn typescript(plan: Value) -> Value {
    kit("node_modules/@modelcontextprotocol/sdk/package.json");
    let mut command = Command::new("node");
    command.arg(kit("clients/client.mjs"));
    drive(command, plan).await
}

async fn drive(mut command: Command, plan: Value) -> Value {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(plan.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the driver finishes")
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not a report ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The gateway over HTTP on a free port; killed when dropped.
struct HttpGateway {
    child: Child,
    address: String,
}

/// A client of a gateway's HTTP fronts.
struct Probe {
    address: String,
}

impl HttpGateway {
    /// A client of the gateway at `address`, for another task.
    fn probe(address: String) -> Probe {
        Probe { address }
    }

    async fn start(config: &std::path::Path) -> HttpGateway {
        HttpGateway::start_with(&[config.as_os_str()]).await
    }

    /// The gateway with `--config` and `more` arguments after it.
    async fn start_with(config_and_more: &[&std::ffi::OsStr]) -> HttpGateway {
        HttpGateway::start_in(config_and_more, &[]).await
    }

    /// The gateway with `--config` and `more` arguments after it, and `env` in its
    /// environment.
    async fn start_in(config_and_more: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> HttpGateway {
        let (config, more) = config_and_more.split_first().expect("a configuration");
        let mut child = Command::new(GATEWAY)
            .arg("--config")
            .arg(config)
            .args(more)
            .args(["--listen", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the gateway starts its upstreams and listens")
            .unwrap()
            .expect("a line on stdout");
        let address = line.strip_prefix("listening on ").expect(&line).to_owned();
        HttpGateway { child, address }
    }

    async fn call(&self, envelope: &Value) -> (u16, String) {
        Self::probe(self.address.clone()).call(envelope).await
    }

    async fn get(&self, path: &str) -> (u16, String) {
        Self::probe(self.address.clone()).get(path).await
    }

    /// `POST path` with the tests' admin token: the status and the body.
    async fn admin(&self, path: &str) -> (u16, String) {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
             content-length: 0\r\nConnection: close\r\n\r\n",
            self.address
        );
        Self::probe(self.address.clone()).exchange(&request).await
    }
}

impl Probe {
    /// `POST /v1/tools/call` of `envelope`: the status and the body.
    async fn call(&self, envelope: &Value) -> (u16, String) {
        let body = envelope.to_string();
        let request = format!(
            "POST /v1/tools/call HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        );
        self.exchange(&request).await
    }

    /// `GET path`: the status and the body.
    async fn get(&self, path: &str) -> (u16, String) {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.address
        );
        self.exchange(&request).await
    }

    /// Sends `request` on a connection of its own: the status and the body.
    async fn exchange(&self, request: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(&self.address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (status, body)
    }
}

fn call(name: &str, arguments: Value, meta: Value) -> Value {
    json!({"op": "call", "name": name, "arguments": arguments, "meta": meta})
}

fn error_code(step: &Value) -> Option<&str> {
    step["ok"]["_meta"]["rs.tower-toolcall/error"]["code"].as_str()
}

/// What the steps of `plan_steps` give, checked: the tools of both upstreams under one
/// list, a duplicate key answered once, the 4th identical call stopped, an `isError`
/// answer passed on.
fn check_the_stack_at_work(report: &Value) {
    let steps = report["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps[0]["ok"]["tools"]
        .as_array()
        .expect("a tool list")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"time__get_current_time"), "{names:?}");
    assert!(names.contains(&"everything__echo"), "{names:?}");
    // A duplicate key: answered from the record.
    assert_eq!(steps[1]["ok"]["isError"], false, "{}", steps[1]);
    assert_eq!(
        steps[2]["ok"]["_meta"]["rs.tower-toolcall/fromCache"], true,
        "{}",
        steps[2]
    );
    // The 4th identical call is a loop.
    for step in &steps[3..6] {
        assert_eq!(step["ok"]["isError"], false, "{step}");
    }
    assert_eq!(error_code(&steps[6]), Some("LOOP_DETECTED"), "{}", steps[6]);
    // The tool's isError answer reaches the model as it is.
    let mars = &steps[7]["ok"];
    assert_eq!(mars["isError"], true, "{mars}");
    assert_eq!(error_code(&steps[7]), Some("UPSTREAM_ERROR"), "{mars}");
    assert!(
        mars["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Mars/Olympus"),
        "{mars}"
    );
}

fn plan_steps(client: &str) -> Vec<Value> {
    let paris = json!({"timezone": "Europe/Paris"});
    let echo = call(
        "everything__echo",
        json!({"message": format!("hi {client}")}),
        json!({}),
    );
    vec![
        json!({"op": "listTools"}),
        call(
            "time__get_current_time",
            paris.clone(),
            json!({"idempotencyKey": format!("k-{client}")}),
        ),
        call(
            "time__get_current_time",
            paris,
            json!({"idempotencyKey": format!("k-{client}")}),
        ),
        echo.clone(),
        echo.clone(),
        echo.clone(),
        echo,
        call(
            "time__get_current_time",
            json!({"timezone": "Mars/Olympus"}),
            json!({}),
        ),
    ]
}

#[tokio::test]
async fn over_http_in_both_protocol_versions() {
    let config = config_file("http", "");
    let gateway = HttpGateway::start(&config).await;
    assert_eq!(gateway.get("/healthz").await.0, 200);
    let (status, body) = gateway.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    for version in ["2025-11-25", "2026-07-28"] {
        let client = format!("gateway-http-{version}");
        let report = python(json!({
            "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
            "protocolVersion": version,
            "clientName": client,
            "steps": plan_steps(&client),
        }))
        .await;
        check_the_stack_at_work(&report);
    }
    // The TypeScript SDK speaks the 2025-11-25 handshake only.
    let client = "gateway-http-typescript";
    let report = typescript(json!({
        "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
        "protocolVersion": "2025-11-25",
        "clientName": client,
        "steps": plan_steps(client),
    }))
    .await;
    check_the_stack_at_work(&report);
    let (status, metrics) = gateway.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("toolcall_tool_calls_total"), "{metrics}");
    // The isError answers (three clients asked about Mars) were never retried.
    let retried: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("toolcall_tool_retry_attempts_total") && l.contains("get_current_time")
        })
        .collect();
    assert!(retried.is_empty(), "{retried:?}");
    drop(gateway);
}

#[tokio::test]
async fn over_stdio_as_a_host_launches_it() {
    let config = config_file("stdio", "");
    let report = python(json!({
        "transport": {
            "kind": "stdio", "command": GATEWAY, "args": ["--stdio", "--config", config],
            "env": {"RUST_LOG": "warn"}
        },
        "protocolVersion": "2025-11-25",
        "clientName": "gateway-stdio",
        "steps": plan_steps("gateway-stdio"),
    }))
    .await;
    check_the_stack_at_work(&report);
}

#[tokio::test]
async fn a_bad_configuration_is_refused_with_every_field_named() {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        r#"
listen = "not an address"
[[upstreams]]
name = "Time!"
comand = "mcp-server-time"
"#,
    )
    .unwrap();
    let output = Command::new(GATEWAY)
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    for field in ["listen", "upstreams[0].name", "upstreams[0].comand"] {
        assert!(said.contains(field), "{field} not named in: {said}");
    }
}

#[tokio::test]
async fn sigterm_lets_the_call_in_flight_finish() {
    let config = config_file("sigterm", "");
    let mut gateway = HttpGateway::start(&config).await;
    // A call that takes 3 s (server-everything's long-running operation), as an envelope.
    let envelope = json!({
        "contractVersion": "1.1", "requestId": "r-long", "toolNamespace": "everything",
        "toolName": "trigger-long-running-operation",
        "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"duration": 3, "steps": 3}}
    })
    .to_string();
    let mut stream = tokio::net::TcpStream::connect(&gateway.address)
        .await
        .unwrap();
    let request = format!(
        "POST /v1/tools/call HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nConnection: close\r\n\r\n{envelope}",
        gateway.address,
        envelope.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = gateway.child.id().unwrap();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"status\":\"success\""), "{response}");
    let status = tokio::time::timeout(Duration::from_secs(20), gateway.child.wait())
        .await
        .expect("the gateway exits once the call is done")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_killed_upstream_is_started_again_behind_the_gateway() {
    let config = config_file("respawn", "");
    let gateway = HttpGateway::start(&config).await;
    let now = json!({
        "contractVersion": "1.1", "requestId": "r-now", "toolNamespace": "time",
        "toolName": "get_current_time", "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"timezone": "Europe/Paris"}}
    });
    assert_eq!(gateway.call(&now).await.0, 200);
    // The gateway's own mcp-server-time process.
    let pid = gateway.child.id().unwrap().to_string();
    let found = std::process::Command::new("pgrep")
        .args(["-P", &pid, "-f", "mcp-server-time"])
        .output()
        .unwrap();
    let child = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    assert!(!child.is_empty(), "the gateway runs mcp-server-time");
    let killed = std::process::Command::new("kill")
        .args(["-9", &child])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = std::time::Instant::now();
    for attempt in 0.. {
        // Each poll in a session of its own: identical failing calls in one session are a
        // loop, which the gateway would stop.
        let mut now = now.clone();
        now["target"]["sessionKey"] = json!(format!("s-{attempt}"));
        let (status, body) = gateway.call(&now).await;
        if status == 200 {
            break;
        }
        assert!(body.contains("UPSTREAM_UNAVAILABLE"), "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never came back: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "mcp-server-time answered through the gateway {} ms after kill -9",
        started.elapsed().as_millis()
    );
}

#[tokio::test]
async fn a_hosts_servers_file_is_fronted_untrusted_and_every_call_audited() {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-host-{}", std::process::id()));
    let audit = dir.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    // Claude Desktop's shape.
    let host = dir.join("claude_desktop_config.json");
    std::fs::write(
        &host,
        json!({"mcpServers": {"Time": {"command": kit(".venv/bin/mcp-server-time")}}}).to_string(),
    )
    .unwrap();
    let config = written(
        "host",
        &format!("[audit]\npath = \"{}\"\n", audit.display()),
    );
    let gateway =
        HttpGateway::start_with(&[config.as_os_str(), "--mcp-json".as_ref(), host.as_os_str()])
            .await;
    let now = |confirmation: Option<&str>| {
        let mut envelope = json!({
            "contractVersion": "1.1", "requestId": "r-host", "toolNamespace": "time",
            "toolName": "get_current_time", "target": {"sessionKey": "s", "actorId": "a"},
            "payload": {"version": "1.0", "params": {"timezone": "Europe/Paris"}}
        });
        if let Some(id) = confirmation {
            envelope["control"] = json!({"confirmationId": id});
        }
        envelope
    };
    // Untrusted, marked read-only: it runs without a confirmation, and a made-up one is
    // refused.
    let (status, body) = gateway.call(&now(None)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gateway.call(&now(Some("approved-1"))).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("POLICY_DENIED"), "{body}");

    // SIGTERM writes the audit out.
    let audited = audited(gateway, &audit).await;
    assert!(
        audited.contains("r-host"),
        "the calls are in the audit: {audited}"
    );
}

/// SIGTERM, and the audit log's lines once the gateway wrote them out to `dir`.
async fn audited(mut gateway: HttpGateway, dir: &std::path::Path) -> String {
    let pid = gateway.child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), gateway.child.wait())
        .await
        .unwrap()
        .unwrap();
    let mut lines = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        lines += &std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
    }
    lines
}

/// Sends SIGHUP to the gateway.
fn hang_up(gateway: &HttpGateway) {
    let pid = gateway.child.id().unwrap();
    let signalled = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
}

#[tokio::test]
async fn sighup_reloads_the_upstreams_and_refuses_a_bad_file() {
    let config = written("reload", &time_upstream());
    let gateway = HttpGateway::start(&config).await;
    let listed = |body: &str, tool: &str| body.contains(&format!("\"{tool}\""));
    let (_, tools) = gateway.get("/v1/tools").await;
    assert!(
        listed(&tools, "get_current_time") && !listed(&tools, "echo"),
        "{tools}"
    );
    // An MCP session open across the reloads.
    let events = tower_toolcall_mcp::ClientEvents::default();
    let session = rmcp::ServiceExt::serve(
        events.clone(),
        rmcp::transport::StreamableHttpClientTransport::from_uri(format!(
            "http://{}/mcp",
            gateway.address
        )),
    )
    .await
    .unwrap();
    let mut changes = tower_toolcall_mcp::McpClient::new(session.peer().clone())
        .with_events(&events)
        .tool_list_changes();

    // An upstream added.
    std::fs::write(
        &config,
        format!("{}\n{}", time_upstream(), everything_upstream()),
    )
    .unwrap();
    hang_up(&gateway);
    let started = std::time::Instant::now();
    loop {
        let (_, tools) = gateway.get("/v1/tools").await;
        if listed(&tools, "echo") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never reloaded: {tools}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The session goes on, told that the tools changed.
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("the session is told of the new tools")
        .unwrap();
    let seen = session.peer().list_all_tools().await.unwrap();
    assert!(
        seen.iter().any(|t| t.name == "everything__echo"),
        "the session lists the new upstream's tools"
    );

    // A call in flight while an upstream is removed finishes on the gateway it started on.
    let envelope = json!({
        "contractVersion": "1.1", "requestId": "r-long", "toolNamespace": "everything",
        "toolName": "trigger-long-running-operation",
        "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"duration": 2, "steps": 2}}
    });
    let address = gateway.address.clone();
    let in_flight = tokio::spawn(async move {
        let probe = HttpGateway::probe(address);
        probe.call(&envelope).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&config, time_upstream()).unwrap();
    hang_up(&gateway);
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"status\":\"success\""), "{body}");
    let started = std::time::Instant::now();
    loop {
        let (_, tools) = gateway.get("/v1/tools").await;
        if !listed(&tools, "echo") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never reloaded: {tools}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A bad file is refused; the gateway in service goes on.
    std::fs::write(&config, "[[upstreams]]\nname = \"time\"\ncomand = \"x\"\n").unwrap();
    hang_up(&gateway);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, tools) = gateway.get("/v1/tools").await;
    assert_eq!(status, 200);
    assert!(listed(&tools, "get_current_time"), "{tools}");
}

/// Two gateways on one redis-server behave as one: a quota and a loop session shared.
#[tokio::test]
async fn two_gateways_on_one_redis_share_a_quota_and_a_loop() {
    let redis = RedisServer::start();
    two_gateways_as_one("fleet", &format!("redis = \"{}\"", redis.url())).await;
}

/// Two gateways on a 3-master Redis Cluster behave as one, as on one node.
#[tokio::test]
async fn two_gateways_on_a_redis_cluster_share_a_quota_and_a_loop() {
    let cluster = RedisCluster::start();
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("\"{s}\"")).collect();
    two_gateways_as_one(
        "fleet-cluster",
        &format!("cluster = [{}]", seeds.join(", ")),
    )
    .await;
}

/// Two gateways with `store` in their `[store]` share a quota and a loop session.
async fn two_gateways_as_one(name: &str, store: &str) {
    let extra = format!(
        r#"
[store]
{store}

[policy]
[[policy.tools]]
namespace = "time"
name = "get_current_time"
risk = "read-only"
idempotent = true
[policy.tools.policy]
rate_limit = {{ per_second = 1, burst = 2, key = "tool" }}
"#
    );
    let config = config_file(name, &extra);
    let admin = [("TOOLCALL_ADMIN_TOKEN", ADMIN_TOKEN)];
    let (one, two) = (
        HttpGateway::start_in(&[config.as_os_str()], &admin).await,
        HttpGateway::start_in(&[config.as_os_str()], &admin).await,
    );
    let plan = |gateway: &HttpGateway, steps: Vec<Value>| {
        json!({
            "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
            "protocolVersion": "2026-07-28",
            "clientName": "fleet-agent",
            "steps": steps,
        })
    };
    // The quota: 2 calls at once, then 1 a second, over both gateways (as envelopes: three
    // calls within milliseconds).
    let now = |zone: &str| {
        json!({
            "contractVersion": "1.1", "requestId": format!("r-{zone}"), "toolNamespace": "time",
            "toolName": "get_current_time", "target": {"sessionKey": zone, "actorId": "a"},
            "payload": {"version": "1.0", "params": {"timezone": zone}}
        })
    };
    assert_eq!(one.call(&now("Europe/Paris")).await.0, 200);
    assert_eq!(two.call(&now("Europe/Rome")).await.0, 200);
    let (status, body) = one.call(&now("Europe/Berlin")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("RATE_LIMITED"), "{body}");

    // The loop: two identical calls through each gateway, in one session.
    let echo = call("everything__echo", json!({"message": "again"}), json!({}));
    let through_one = python(plan(&one, vec![echo.clone(), echo.clone()])).await;
    let through_two = python(plan(&two, vec![echo.clone(), echo])).await;
    for step in through_one["steps"].as_array().unwrap() {
        assert_eq!(step["ok"]["isError"], false, "{step}");
    }
    assert_eq!(
        through_two["steps"][0]["ok"]["isError"], false,
        "{through_two}"
    );
    assert_eq!(
        error_code(&through_two["steps"][1]),
        Some("LOOP_DETECTED"),
        "{through_two}"
    );

    // An operator's force-open of a server's breaker on one gateway stops that server's
    // calls on both, and no other server's; a reset on the other lets them through again.
    let convert = || {
        json!({
            "contractVersion": "1.1", "requestId": "r-convert", "toolNamespace": "time",
            "toolName": "convert_time", "target": {"sessionKey": "ops", "actorId": "a"},
            "payload": {"version": "1.0", "params": {
                "source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"
            }}
        })
    };
    assert_eq!(two.call(&convert()).await.0, 200);
    let breaker = "/admin/breakers/dependency:time";
    let (status, body) = one.admin(&format!("{breaker}/force-open")).await;
    assert_eq!(status, 200, "{body}");
    let refused = wait_for(|| async {
        let (status, body) = two.call(&convert()).await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(refused.contains("CIRCUIT_OPEN"), "{refused}");
    let echo = json!({
        "contractVersion": "1.1", "requestId": "r-echo", "toolNamespace": "everything",
        "toolName": "echo", "target": {"sessionKey": "ops", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"message": "still here"}}
    });
    let (status, body) = one.call(&echo).await;
    assert_eq!(status, 200, "another server runs: {body}");
    let (_, metrics) = one.get("/metrics").await;
    assert!(
        metrics.contains("tool=\"dependency:time\""),
        "the server's breaker by its name: {metrics}"
    );
    let (status, body) = two.admin(&format!("{breaker}/reset")).await;
    assert_eq!(status, 200, "{body}");
    wait_for(|| async { (one.call(&convert()).await.0 == 200).then_some(()) }).await;
}

/// The admin token of the gateways the tests start with one.
const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// Polls `check` until it gives a value, for at most 10 s.
async fn wait_for<T, F, Fut>(check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[path = "../support/flaky.rs"]
mod flaky;

/// In front of a flaky server of the tests' own: a payment whose answer was lost is not made
/// twice when the agent sends it again, and a read that failed is retried by the gateway.
#[tokio::test]
async fn in_front_of_a_flaky_server_a_lost_answer_is_not_a_second_payment() {
    use rmcp::ServiceExt as _;

    let (upstream, url) = flaky::upstream().await;
    let config = written(
        "flaky",
        &format!("[[upstreams]]\nname = \"bank\"\nurl = \"{url}\"\ntrust = \"trusted\"\ntimeout_ms = 5000\n"),
    );
    let gateway = HttpGateway::start(&config).await;
    let agent = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            format!("http://{}/mcp", gateway.address),
        ))
        .await
        .unwrap();
    let call = |name: &str, args: Value, key: Option<&str>| {
        let mut params = rmcp::model::CallToolRequestParams::new(name.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        if let Some(key) = key {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.insert("idempotencyKey".to_owned(), Value::from(key));
            params.meta = Some(meta);
        }
        params
    };
    // The first payment's answer is lost: the agent gives up after 600 ms and sends it again.
    let pay = || call("bank__pay", json!({"id": "p-1"}), Some("pay-p-1"));
    let first = tokio::time::timeout(Duration::from_millis(600), agent.call_tool(pay())).await;
    assert!(first.is_err(), "the answer is lost");
    let mut answer = None;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let again = agent.call_tool(pay()).await.unwrap();
        if again.is_error != Some(true) {
            answer = Some(again);
            break;
        }
        // Still in flight: the re-send joins it, or is told to come back.
        let text = again.content[0].as_text().unwrap().text.clone();
        assert!(text.starts_with("IDEMPOTENCY_IN_FLIGHT"), "{text}");
    }
    let answer = answer.expect("the payment's own result, once it ended");
    assert_eq!(answer.structured_content, Some(json!({"paid": true})));
    assert_eq!(upstream.payments.lock().unwrap()["p-1"], 1, "paid once");

    // The first two reads fail at the upstream (its draws 0 and 1 are unlucky); the gateway
    // retries, the agent sees one answer.
    let calls_before = upstream.calls.load(std::sync::atomic::Ordering::SeqCst);
    let read = agent
        .call_tool(call("bank__balance", json!({"account": "a-1"}), None))
        .await
        .unwrap();
    assert_ne!(read.is_error, Some(true), "{read:?}");
    assert_eq!(
        upstream.calls.load(std::sync::atomic::Ordering::SeqCst) - calls_before,
        3,
        "two failures, then the retry that is answered"
    );
    agent.cancel().await.unwrap();
}

#[path = "../support/http.rs"]
mod http;
#[path = "../support/lively.rs"]
mod lively;
#[path = "../support/tls.rs"]
mod tls;

/// A gateway in front of a [`lively::Lively`] upstream; the upstream's state.
async fn lively_gateway(name: &str) -> (lively::Lively, HttpGateway) {
    lively_gateway_with(name, "").await
}

/// [`lively_gateway`] with `extra` in its configuration.
async fn lively_gateway_with(name: &str, extra: &str) -> (lively::Lively, HttpGateway) {
    let upstream = lively::Lively::default();
    let url = http::serve(upstream.clone()).await;
    let config = written(
        name,
        &format!("{extra}\n[[upstreams]]\nname = \"lively\"\nurl = \"{url}\"\ntrust = \"trusted\"\ntimeout_ms = 30000\n"),
    );
    (upstream, HttpGateway::start(&config).await)
}

/// Waits up to 5 s for `ends` to count `(started, finished, stopped)`.
async fn ends_at(ends: &lively::Ends, wanted: (u64, u64, u64), what: &str) {
    for _ in 0..100 {
        if ends.counts() == wanted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ends.counts(),
        wanted,
        "{what}: (started, finished, stopped)"
    );
}

/// The progress a driver reported for a call: `(progress, total, message)` in order.
fn progress_of(step: &Value) -> Vec<(f64, f64, String)> {
    step["progress"]
        .as_array()
        .unwrap_or_else(|| panic!("no progress in {step}"))
        .iter()
        .map(|p| {
            (
                p["progress"].as_f64().unwrap(),
                p["total"].as_f64().unwrap(),
                p["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The progress `scan` reports, as a client sees it.
fn scan_progress() -> Vec<(f64, f64, String)> {
    (1..=lively::SCAN_STEPS)
        .map(|step| {
            (
                step as f64,
                lively::SCAN_STEPS as f64,
                format!("scanned {step} of {}", lively::SCAN_STEPS),
            )
        })
        .collect()
}

/// The upstream's progress reaches the client that asked for it, through the whole stack;
/// a client's cancellation stops a read at the upstream, and leaves a write to run to its
/// end (its outcome recorded for a re-send).
#[tokio::test]
async fn progress_reaches_the_client_and_a_cancelled_read_stops_upstream() {
    let (upstream, gateway) = lively_gateway("lively-progress").await;
    let mcp = json!({"kind": "http", "url": format!("http://{}/mcp", gateway.address)});
    let report = typescript(json!({
        "transport": mcp, "protocolVersion": "2025-11-25", "clientName": "progress-ts",
        "steps": [
            {"op": "call", "name": "lively__scan", "arguments": {}, "progress": true},
            {"op": "call", "name": "lively__scan", "arguments": {"holdMs": 20000}, "cancelAfterMs": 300},
            {"op": "call", "name": "lively__send", "arguments": {"holdMs": 1500}, "cancelAfterMs": 300},
        ],
    }))
    .await;
    let steps = &report["steps"];
    assert_eq!(progress_of(&steps[0]), scan_progress(), "{report}");
    assert_eq!(
        steps[0]["ok"]["structuredContent"],
        json!({"scanned": true}),
        "{report}"
    );
    assert!(
        steps[1].get("error").is_some(),
        "the client gave up: {report}"
    );
    assert!(
        steps[2].get("error").is_some(),
        "the client gave up: {report}"
    );
    ends_at(
        &upstream.scan,
        (2, 1, 1),
        "the cancelled scan stopped upstream",
    )
    .await;
    ends_at(
        &upstream.send,
        (1, 1, 0),
        "the cancelled send ran to its end",
    )
    .await;

    // The Python SDK's progress, in both protocol versions.
    for version in ["2025-11-25", "2026-07-28"] {
        let report = python(json!({
            "transport": mcp, "protocolVersion": version, "clientName": "progress-py",
            "steps": [{"op": "call", "name": "lively__scan", "arguments": {}, "progress": true}],
        }))
        .await;
        assert_eq!(
            progress_of(&report["steps"][0]),
            scan_progress(),
            "{version}: {report}"
        );
    }
}

/// An upstream that changes its tools: the gateway lists them again, puts them behind the
/// stack, and tells its clients (a 2025-11-25 session, a 2026-07-28 listen stream).
#[tokio::test]
async fn an_upstream_tool_list_change_reaches_every_client() {
    let (_upstream, gateway) = lively_gateway("lively-list").await;
    let mcp = json!({"kind": "http", "url": format!("http://{}/mcp", gateway.address)});
    let names = |step: &Value| -> Vec<String> {
        step["ok"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("no tools in {step}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    for (driver, version, grown) in [
        ("typescript", "2025-11-25", "lively__extra_1"),
        ("python", "2026-07-28", "lively__extra_2"),
    ] {
        let plan = json!({
            "transport": mcp, "protocolVersion": version, "clientName": "list-changed",
            "steps": [
                {"op": "listTools"},
                {"op": "listenToolListChanged"},
                {"op": "call", "name": "lively__grow", "arguments": {}},
                {"op": "awaitToolListChanged", "timeoutMs": 10000},
                {"op": "listTools"},
                {"op": "call", "name": grown, "arguments": {}},
            ],
        });
        let report = match driver {
            "typescript" => typescript(plan).await,
            _ => python(plan).await,
        };
        let steps = &report["steps"];
        assert!(!names(&steps[0]).contains(&grown.to_owned()), "{report}");
        assert!(steps[1].get("ok").is_some(), "{driver}: {report}");
        assert!(
            steps[3].get("ok").is_some(),
            "{driver}: told of the change: {report}"
        );
        assert!(names(&steps[4]).contains(&grown.to_owned()), "{report}");
        let grown_name = grown.trim_start_matches("lively__");
        assert_eq!(
            steps[5]["ok"]["structuredContent"],
            json!({"ran": grown_name}),
            "{driver}: the new tool is called through the stack: {report}"
        );
    }
}
