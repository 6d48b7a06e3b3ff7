//! What an operator runs: one timeout per call (the upstream's), and the HTTP side beside a
//! stdio front.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{
    call, error_code, everything_upstream, hang_up, kit, lively_gateway_with, python, written,
    HttpGateway, Probe, GATEWAY,
};

/// The attempt timeout `GET /v1/tools` lists for the tool `name`.
fn attempt_timeout(tools: &str, name: &str) -> Value {
    let tools: Value = serde_json::from_str(tools).unwrap();
    let tool = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == name)
        .unwrap_or_else(|| panic!("{name} is listed: {tools}"));
    tool["capabilities"]["timeout"]["attemptTimeoutMs"].clone()
}

#[tokio::test]
async fn an_upstreams_timeout_is_the_one_timeout_of_its_calls() {
    // Above the stack's default of 30 s, and below it.
    let long = everything_upstream().replace("name = \"everything\"", "name = \"slow\"")
        + "timeout_ms = 45000\n";
    let short = everything_upstream() + "timeout_ms = 500\n";
    // Not retried, so that one attempt's time is the call's.
    let config = written(
        "one-timeout",
        &format!("{long}\n{short}\n[servers.everything]\npolicy = {{ retry = \"off\" }}\n"),
    );
    let gateway = HttpGateway::start(&config).await;
    let (_, tools) = gateway.get("/v1/tools").await;
    assert_eq!(attempt_timeout(&tools, "echo"), json!(500), "{tools}");
    let tools: Value = serde_json::from_str(&tools).unwrap();
    let slow = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["namespace"] == "slow" && t["name"] == "echo")
        .unwrap();
    assert_eq!(slow["capabilities"]["timeout"]["attemptTimeoutMs"], 45000);

    // A call longer than 500 ms is cut by the stack at 500 ms: TIMEOUT.
    let started = Instant::now();
    let (status, body) = gateway
        .call(&json!({
            "contractVersion": "1.1", "requestId": "r-long", "toolNamespace": "everything",
            "toolName": "trigger-long-running-operation",
            "target": {"sessionKey": "s", "actorId": "a"},
            "payload": {"version": "1.0", "params": {"duration": 3, "steps": 3}}
        }))
        .await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("\"TIMEOUT\""), "{body}");
    assert!(started.elapsed() < Duration::from_millis(2500), "{body}");
}

#[tokio::test]
async fn with_stdio_and_listen_the_http_side_serves_beside_the_host() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = written("stdio-listen", &everything_upstream());
    let address = format!("127.0.0.1:{port}");
    let plan = json!({
        "transport": {
            "kind": "stdio", "command": GATEWAY,
            "args": ["--stdio", "--config", config, "--listen", address],
            "env": {"RUST_LOG": "warn"}
        },
        "protocolVersion": "2025-11-25",
        "steps": [
            call("everything__echo", json!({"message": "before"}), json!({})),
            {"op": "sleepMs", "ms": 4000},
            call("everything__echo", json!({"message": "after"}), json!({})),
        ],
    });
    let host = tokio::spawn(python(plan));
    // The probes answer on the port while the host's session runs.
    let probe = HttpGateway::probe(address.clone());
    let started = Instant::now();
    let health = loop {
        if tokio::net::TcpStream::connect(&address).await.is_ok() {
            break probe.get("/healthz").await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(health.0, 200);
    // The host's first call counted (it may still be on its way when the port opens).
    let started = Instant::now();
    let (status, metrics) = loop {
        let (status, metrics) = Probe::get(&probe, "/metrics").await;
        if metrics.contains("toolcall_tool_calls_total")
            || started.elapsed() > Duration::from_secs(20)
        {
            break (status, metrics);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 200);
    assert!(metrics.contains("toolcall_tool_calls_total"), "{metrics}");
    // The host's session was not disturbed: stdout is only MCP.
    let report = host.await.unwrap();
    for step in [&report["steps"][0], &report["steps"][2]] {
        assert!(error_code(step).is_none(), "{report}");
        assert_eq!(step["ok"]["isError"], false, "{report}");
    }
}

#[tokio::test]
async fn a_bare_name_never_reaches_an_upstream_named_like_the_gateway() {
    let upstream = everything_upstream().replace("name = \"everything\"", "name = \"gateway\"");
    let config = written("bare-names", &upstream);
    let gateway = HttpGateway::start(&config).await;
    let report = python(json!({
        "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
        "protocolVersion": "2025-11-25",
        "steps": [
            call("gateway__echo", json!({"message": "listed"}), json!({})),
            call("echo", json!({"message": "bare"}), json!({})),
        ],
    }))
    .await;
    assert!(error_code(&report["steps"][0]).is_none(), "{report}");
    assert_eq!(
        error_code(&report["steps"][1]),
        Some("POLICY_DENIED"),
        "{report}"
    );
}

/// The gateway over HTTP on a free port with `config` and `more` arguments, logging at
/// `level`, its stdout and stderr piped.
pub(super) fn logging_gateway(
    config: &std::path::Path,
    more: &[&str],
    level: &str,
) -> tokio::process::Child {
    tokio::process::Command::new(GATEWAY)
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .args(more)
        .env("RUST_LOG", level)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn json_logs_are_only_json_and_an_upstreams_stderr_is_its_events() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

    let config = written("json-logs", &everything_upstream());
    let mut child = logging_gateway(&config, &["--log-format", "json"], "info");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(listening.starts_with("listening on "), "{listening}");
    // The server has written its banner by the time it answered initialize.
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.start_kill().unwrap();
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .await
        .unwrap();
    let _ = child.wait().await;
    assert!(
        !logs.contains('\u{1b}'),
        "no colour codes off a terminal: {logs}"
    );
    let mut from_upstream = 0;
    for line in logs.lines().filter(|line| !line.trim().is_empty()) {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line:?}"));
        if event["fields"]["event"] == "upstream_stderr" {
            assert_eq!(event["fields"]["upstream"], "everything", "{line}");
            from_upstream += 1;
        }
    }
    assert!(
        from_upstream >= 1,
        "the upstream's banner is an event: {logs}"
    );
}

#[tokio::test]
async fn a_restart_that_never_answers_is_timed_out_and_tried_again() {
    let dir = std::env::temp_dir().join(format!("toolcall-hung-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The first start serves; the next ones hang without a word until `recovered` exists.
    let script = dir.join("time.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(cat \"$DIR/starts\" 2>/dev/null || echo 0)\nn=$((n+1))\n\
             echo $n > \"$DIR/starts\"\necho $$ > \"$DIR/pid\"\n\
             if [ \"$n\" -gt 1 ] && [ ! -f \"$DIR/recovered\" ]; then exec sleep 600; fi\n\
             exec {} \"$@\"\n",
            kit(".venv/bin/mcp-server-time").display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let config = written(
        "hung-respawn",
        &format!(
            "[[upstreams]]\nname = \"time\"\ncommand = \"{}\"\nstartup_timeout_ms = 3000\n\
             env = {{ DIR = \"{}\" }}\n",
            script.display(),
            dir.display()
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    assert_eq!(gateway.get("/readyz").await.0, 200);
    // The server dies; its restart hangs.
    let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    let started = Instant::now();
    loop {
        // The script rewrites the count in place: a read between its truncation and its
        // write finds nothing, which counts as no new start yet.
        let starts: u32 = std::fs::read_to_string(dir.join("starts"))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0);
        // Timed out and started again: a third start.
        if starts >= 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the hung restart was never given up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gateway.get("/readyz").await.0, 503);
    // It recovers: ready again.
    std::fs::write(dir.join("recovered"), "").unwrap();
    let started = Instant::now();
    while gateway.get("/readyz").await.0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never ready again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_reload_refills_no_quota() {
    let quota = "[policy]\n[[policy.tools]]\nnamespace = \"everything\"\nname = \"echo\"\n\
                 risk = \"read-only\"\n[policy.tools.policy]\n\
                 rate_limit = { per_second = 1, burst = 2, key = \"tool\" }\n";
    let config = written(
        "quota-reload",
        &format!("{}\n{quota}", everything_upstream()),
    );
    let gateway = HttpGateway::start(&config).await;
    let echo = |n: u32| {
        json!({
            "contractVersion": "1.1", "requestId": format!("r-{n}"), "toolNamespace": "everything",
            "toolName": "echo", "target": {"sessionKey": format!("s-{n}"), "actorId": "a"},
            "payload": {"version": "1.0", "params": {"message": format!("m{n}")}}
        })
    };
    // get-sum says it is idempotent; the reload says it is not.
    let reloaded = |tools: &str| {
        let tools: Value = serde_json::from_str(tools).unwrap();
        tools["tools"].as_array().unwrap().iter().any(|t| {
            t["name"] == "get-sum" && t["capabilities"]["idempotency"]["idempotent"] == false
        })
    };
    assert_eq!(gateway.call(&echo(1)).await.0, 200);
    assert_eq!(gateway.call(&echo(2)).await.0, 200);
    assert_eq!(gateway.call(&echo(3)).await.0, 429);
    let spent = Instant::now();
    // A reload (another tool's policy changes: get-sum, idempotent by its annotations, is
    // not): the quota is not refilled.
    std::fs::write(
        &config,
        format!(
            "{}\n[servers.everything.tools.get-sum]\nidempotent = false\n{quota}",
            everything_upstream()
        ),
    )
    .unwrap();
    hang_up(&gateway);
    loop {
        let (_, tools) = gateway.get("/v1/tools").await;
        if reloaded(&tools) {
            break;
        }
        assert!(spent.elapsed() < Duration::from_secs(10), "never reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = gateway.call(&echo(4)).await;
    if spent.elapsed() < Duration::from_millis(900) {
        assert_eq!(status, 429, "the reload refilled the quota: {body}");
    }
    // It refills at its rate.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(gateway.call(&echo(5)).await.0, 200);
}

#[tokio::test]
async fn calls_whose_clients_left_still_count_against_the_mcp_front() {
    let (upstream, gateway) =
        lively_gateway_with("mcp-in-flight", "[http]\nmax_calls_in_flight = 2\n").await;
    let send = |id: u32| {
        json!({"op": "call", "name": "lively__send", "arguments": {"holdMs": 3000, "n": id},
               "cancelAfterMs": 200})
    };
    let report = python(json!({
        "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
        "protocolVersion": "2025-11-25",
        "steps": [
            // Two writes the client gives up on: they run on, and hold their places.
            send(1),
            send(2),
            call("lively__scan", json!({}), json!({})),
        ],
    }))
    .await;
    let busy = &report["steps"][2];
    assert_eq!(error_code(busy), Some("UPSTREAM_UNAVAILABLE"), "{report}");
    assert_eq!(
        busy["ok"]["_meta"]["rs.tower-toolcall/error"]["retriable"], true,
        "{report}"
    );
    assert_eq!(upstream.send.counts().0, 2, "both writes ran");
    // Their places come back when they end.
    let started = Instant::now();
    loop {
        let report = python(json!({
            "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
            "protocolVersion": "2025-11-25",
            "steps": [call("lively__scan", json!({}), json!({}))],
        }))
        .await;
        if error_code(&report["steps"][0]).is_none() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "{report}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_slow_body_on_mcp_is_cut_at_the_body_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let config = written(
        "mcp-slow-body",
        &format!("[http]\nbody_timeout_ms = 500\n{}", everything_upstream()),
    );
    let gateway = HttpGateway::start(&config).await;
    let mut stream = tokio::net::TcpStream::connect(&gateway.address)
        .await
        .unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: 100\r\n\r\n{{\"jsonrpc\"",
        gateway.address
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .expect("the gateway answers and closes within the body timeout")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_reload_adds_no_room_for_calls_on_v1() {
    let (upstream, gateway) =
        lively_gateway_with("v1-in-flight", "[http]\nmax_calls_in_flight = 1\n").await;
    let send = |n: u32, hold: u64| {
        json!({
            "contractVersion": "1.1", "requestId": format!("r-send-{n}"), "toolNamespace": "lively",
            "toolName": "send", "target": {"sessionKey": format!("s-{n}"), "actorId": "a"},
            "payload": {"version": "1.0", "params": {"holdMs": hold, "n": n}}
        })
    };
    // One call holds the only place, across a reload.
    let probe = HttpGateway::probe(gateway.address.clone());
    let holding = tokio::spawn(async move { probe.call(&send(1, 3000)).await });
    let started = Instant::now();
    while upstream.send.counts().0 == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hang_up(&gateway);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = gateway.call(&send(2, 0)).await;
    assert_eq!(status, 503, "the reload made room: {body}");
    assert!(body.contains("UPSTREAM_UNAVAILABLE"), "{body}");
    assert_eq!(holding.await.unwrap().0, 200);
    assert_eq!(gateway.call(&send(3, 0)).await.0, 200);
}

/// Opens a 2025-11-25 session on the gateway's `/mcp` with a raw `initialize`: its id, or
/// the whole answer when there is none.
pub(super) async fn open_session(address: &str) -> Result<String, String> {
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}
    })
    .to_string();
    let answer = raw(
        address,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: {address}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ncontent-length: {}\r\n\
             Connection: close\r\n\r\n{initialize}",
            initialize.len()
        ),
    )
    .await;
    answer
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .ok_or(answer)
}

/// POSTs `message` to `/mcp` in the session `id`: the whole answer.
pub(super) async fn in_session(address: &str, id: &str, message: &Value) -> String {
    let message = message.to_string();
    raw(
        address,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: {address}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-session-id: {id}\r\n\
             mcp-protocol-version: 2025-11-25\r\ncontent-length: {}\r\n\
             Connection: close\r\n\r\n{message}",
            message.len()
        ),
    )
    .await
}

/// Sends `request` on a connection of its own: the whole answer (what came within 5 s).
pub(super) async fn raw(address: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn mcp_sessions_are_capped_and_an_idle_one_expires() {
    let config = written(
        "mcp-sessions",
        &format!(
            "[http]\nmax_sessions = 2\nsession_idle_ms = 1500\n{}",
            everything_upstream()
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    let address = gateway.address.clone();
    let first = open_session(&address).await.unwrap();
    open_session(&address).await.unwrap();
    // The third finds no room: 503, with a time to come back.
    let refused = open_session(&address).await.unwrap_err();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 5"),
        "{refused}"
    );
    // Ending one makes room.
    raw(
        &address,
        &format!(
            "DELETE /mcp HTTP/1.1\r\nHost: {address}\r\nmcp-session-id: {first}\r\n\
             mcp-protocol-version: 2025-11-25\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    let third = open_session(&address).await.unwrap();
    // Unused, the sessions expire: room again, and the old id is gone.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    open_session(&address).await.unwrap();
    open_session(&address).await.unwrap();
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let gone = in_session(&address, &third, &ping).await;
    assert!(gone.starts_with("HTTP/1.1 404"), "{gone}");
}

/// A `tools/call` in session `session` of `address`, with `id` and the `_meta` `meta`:
/// the answer's head (lower case) and body.
async fn call_in_session(
    address: &str,
    session: &str,
    id: u32,
    name: &str,
    meta: Value,
) -> (String, String) {
    let call = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": {"n": id}, "_meta": meta}
    });
    let answer = in_session(address, session, &call).await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.to_ascii_lowercase(), body.to_owned())
}

#[tokio::test]
async fn a_call_in_a_session_is_answered_in_plain_json_unless_its_progress_comes_first() {
    let (upstream, gateway) = lively_gateway_with("session-answers", "").await;
    let address = gateway.address.clone();
    let session = open_session(&address).await.unwrap();
    // No progress comes: one JSON response, though the client asked for progress.
    let (head, body) = call_in_session(
        &address,
        &session,
        7,
        "lively__send",
        json!({"progressToken": "p-7"}),
    )
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"],
        json!({"sent": true}),
        "{answer}"
    );
    assert_eq!(upstream.send.counts(), (1, 1, 0));
    // The upstream reports progress: the progress first, under the client's token, then the
    // response, as events.
    let (head, body) = call_in_session(
        &address,
        &session,
        8,
        "lively__scan",
        json!({"progressToken": "p-8"}),
    )
    .await;
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let progress = body
        .find("\"method\":\"notifications/progress\"")
        .unwrap_or_else(|| panic!("no progress: {body}"));
    assert!(body.contains("\"progressToken\":\"p-8\""), "{body}");
    let response = body
        .find("\"id\":8,\"result\"")
        .unwrap_or_else(|| panic!("no response: {body}"));
    assert!(progress < response, "{body}");
    assert!(body.contains("\"scanned\":true"), "{body}");
    // Without a token, the same scan is one JSON response.
    let (head, body) = call_in_session(&address, &session, 9, "lively__scan", json!({})).await;
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(!body.contains("notifications/progress"), "{body}");
}

#[tokio::test]
async fn a_session_in_use_stays_open_and_an_idle_one_closes() {
    let (_upstream, gateway) =
        lively_gateway_with("session-in-use", "[http]\nsession_idle_ms = 1000\n").await;
    let address = gateway.address.clone();
    let busy = open_session(&address).await.unwrap();
    let idle = open_session(&address).await.unwrap();
    // Calls the gateway answers itself, for well over the idle time.
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_millis(2500) {
        n += 1;
        let (head, body) = call_in_session(&address, &busy, n, "lively__send", json!({})).await;
        assert!(head.starts_with("http/1.1 200"), "call {n}: {head}\n{body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ping = json!({"jsonrpc": "2.0", "id": 99, "method": "ping"});
    let gone = in_session(&address, &idle, &ping).await;
    assert!(gone.starts_with("HTTP/1.1 404"), "{gone}");
    let (head, _) = call_in_session(&address, &busy, 100, "lively__send", json!({})).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn the_admin_api_lists_each_upstreams_connection_state() {
    let config = written(
        "admin-upstreams",
        &format!(
            "{}\n[[upstreams]]\nname = \"gone\"\ncommand = \"/nonexistent/mcp-server\"\nrequired = false\n",
            everything_upstream()
        ),
    );
    let gateway = HttpGateway::start_in(
        &[config.as_os_str()],
        &[("TOOLCALL_ADMIN_TOKEN", super::ADMIN_TOKEN)],
    )
    .await;
    let get = |token: &str| {
        format!(
            "GET /admin/upstreams HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
             Connection: close\r\n\r\n",
            gateway.address
        )
    };
    let probe = HttpGateway::probe(gateway.address.clone());
    let (status, _) = probe.exchange(&get("wrong-token-0123456789abcdef")).await;
    assert_eq!(status, 401);
    let (status, body) = probe.exchange(&get(super::ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    let states: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(states[0]["name"], "everything", "{states}");
    assert_eq!(states[0]["state"], "connected", "{states}");
    assert_eq!(states[0]["transport"], "stdio", "{states}");
    assert_eq!(states[1]["name"], "gone", "{states}");
    assert_eq!(states[1]["state"], "down", "{states}");
    assert_eq!(states[1]["required"], false, "{states}");
    // Optional and down: the gateway is ready.
    assert_eq!(gateway.get("/readyz").await.0, 200);
}

/// Opens one `subscriptions/listen` stream with the Python SDK, then a second from another
/// client, and says what became of the second.
const TWO_LISTENERS: &str = r#"
import anyio, sys
from mcp import Client

async def main(url):
    async with Client(url, mode="2026-07-28") as one, Client(url, mode="2026-07-28") as two:
        async with one.listen(tools_list_changed=True):
            try:
                with anyio.fail_after(3):
                    async with two.listen(tools_list_changed=True) as second:
                        async for _event in second:
                            pass
                print("ended")
            except TimeoutError:
                print("open")
            except Exception as e:
                print("refused", type(e).__name__)

anyio.run(main, sys.argv[1])
"#;

#[tokio::test]
async fn listen_streams_are_bounded_per_caller() {
    let config = written(
        "listen-streams",
        &format!(
            "[http]\nmax_listen_streams_per_caller = 1\n{}",
            everything_upstream()
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    let script = config.with_file_name("two_listeners.py");
    std::fs::write(&script, TWO_LISTENERS).unwrap();
    let output = tokio::process::Command::new(kit(".venv/bin/python"))
        .arg(&script)
        .arg(format!("http://{}/mcp", gateway.address))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.trim().starts_with("refused"),
        "the second stream of one caller is refused: {said} {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn a_storm_of_tool_list_changes_refills_no_quota() {
    // Another upstream's tool, limited to five calls at once and one a second.
    let quota = format!(
        "{}\n[policy]\n[[policy.tools]]\nnamespace = \"everything\"\nname = \"echo\"\n\
         risk = \"read-only\"\n[policy.tools.policy]\n\
         rate_limit = {{ per_second = 1, burst = 5, key = \"tool\" }}\n",
        everything_upstream()
    );
    let (_upstream, gateway) = lively_gateway_with("list-storm", &quota).await;
    let envelope = |namespace: &str, name: &str, n: u32, params: Value| {
        json!({
            "contractVersion": "1.1", "requestId": format!("r-{name}-{n}"),
            "toolNamespace": namespace, "toolName": name,
            "target": {"sessionKey": format!("s-{n}"), "actorId": "a"},
            "payload": {"version": "1.0", "params": params}
        })
    };
    // The lively upstream changes its list every 20 ms for 3 s.
    let probe = HttpGateway::probe(gateway.address.clone());
    let storm = envelope("lively", "storm", 0, json!({"count": 150, "everyMs": 20}));
    let storming = tokio::spawn(async move { probe.call(&storm).await });
    let started = Instant::now();
    let mut allowed = 0;
    let mut n = 0;
    while started.elapsed() < Duration::from_millis(3000) {
        n += 1;
        let echo = envelope("everything", "echo", n, json!({"message": format!("m{n}")}));
        if gateway.call(&echo).await.0 == 200 {
            allowed += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed().as_secs();
    // Five at once, then one a second: the rebuilds (one a second at most) never refill
    // the quota, each of which would give five more.
    assert!(
        allowed <= 6 + elapsed,
        "{allowed} calls allowed in {elapsed} s of {n}"
    );
    assert_eq!(storming.await.unwrap().0, 200);
}

#[tokio::test]
async fn breakers_outlive_a_reload_where_their_tools_still_are() {
    let config = written("breakers-reload", &everything_upstream());
    let gateway = HttpGateway::start_in(
        &[config.as_os_str()],
        &[("TOOLCALL_ADMIN_TOKEN", super::ADMIN_TOKEN)],
    )
    .await;
    let call = |name: &str, params: Value| {
        json!({
            "contractVersion": "1.1", "requestId": format!("r-{name}"), "toolNamespace": "everything",
            "toolName": name, "target": {"sessionKey": "ops", "actorId": "a"},
            "payload": {"version": "1.0", "params": params}
        })
    };
    let echo = || call("echo", json!({"message": "hi"}));
    let sum = || call("get-sum", json!({"a": 1, "b": 2}));
    let (status, body) = gateway
        .admin("/admin/breakers/tool:everything::echo/force-open")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(gateway.call(&echo()).await.0, 503);
    // A reload (another tool's policy changes: get-sum, idempotent by its annotations, is
    // not): the breaker held open stays open.
    std::fs::write(
        &config,
        format!(
            "{}\n[servers.everything.tools.get-sum]\nidempotent = false\n",
            everything_upstream()
        ),
    )
    .unwrap();
    hang_up(&gateway);
    let started = Instant::now();
    loop {
        let (_, tools) = gateway.get("/v1/tools").await;
        let tools: Value = serde_json::from_str(&tools).unwrap();
        let reloaded = tools["tools"].as_array().unwrap().iter().any(|t| {
            t["name"] == "get-sum" && t["capabilities"]["idempotency"]["idempotent"] == false
        });
        if reloaded {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = gateway.call(&echo()).await;
    assert_eq!(status, 503, "the reload closed the breaker: {body}");
    assert_eq!(gateway.call(&sum()).await.0, 200);
    let (status, _) = gateway
        .admin("/admin/breakers/tool:everything::echo/reset")
        .await;
    assert_eq!(status, 200);
    assert_eq!(gateway.call(&echo()).await.0, 200);
}

/// A stdio MCP server, in plain JSON-RPC, whose `tools/list` answer is about 250 KB.
const BIG_LIST_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    method = msg.get("method")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "big", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": f"tool{i}", "description": "x" * 200,
                             "inputSchema": {"type": "object"}} for i in range(1000)]}
    elif "id" in msg:
        result = {}
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test]
async fn a_tool_list_over_the_bound_is_refused_at_once_naming_the_upstream_and_the_bound() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let script = written("big-list", "").with_file_name("big.py");
    std::fs::write(&script, BIG_LIST_SERVER).unwrap();
    let config = written(
        "big-list",
        &format!(
            "{}[[upstreams]]\nname = \"big\"\ncommand = \"{}\"\nargs = [\"{}\"]\n\
             max_message_bytes = 65536\nstartup_timeout_ms = 30000\nrequired = false\n",
            everything_upstream(),
            kit(".venv/bin/python").display(),
            script.display()
        ),
    );
    let started = Instant::now();
    let mut child = logging_gateway(&config, &[], "warn");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(25), stdout.next_line())
        .await
        .expect("the gateway starts without waiting out big's start-up time")
        .unwrap()
        .unwrap();
    // Not the 30 s of big's start-up time: its list failed at once.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(Duration::from_secs(10), async {
        let mut said = Vec::new();
        while let Some(line) = stderr.next_line().await.unwrap() {
            let done = line.contains("upstream big") && line.contains("longer than 65536 bytes");
            said.push(line);
            if done {
                return said;
            }
        }
        said
    })
    .await
    .expect("the gateway says why big is down");
    assert!(
        said.iter()
            .any(|line| line.contains("upstream_message_too_large")),
        "{said:#?}"
    );
    // The other upstream serves; big is down, and said to be.
    let address = listening.strip_prefix("listening on ").unwrap().to_owned();
    let probe = HttpGateway::probe(address);
    let (status, body) = probe.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["down"], json!(["big"]), "{body}");
}

#[tokio::test]
async fn a_sessions_tool_list_is_the_lists_one_encoding() {
    let config = written("shared-list", &everything_upstream());
    let gateway = HttpGateway::start(&config).await;
    let address = gateway.address.clone();
    let session = open_session(&address).await.unwrap();
    let list = |id: Value, params: Value| {
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        if !params.is_null() {
            request["params"] = params;
        }
        let (address, session) = (address.clone(), session.clone());
        async move {
            let answer = in_session(&address, &session, &request).await;
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            (head.to_ascii_lowercase(), body.to_owned())
        }
    };
    let (head, body) = list(json!("list-1"), Value::Null).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    // Chunked: the body is the list's bytes between a head and a tail.
    let body: String = body
        .split("\r\n")
        .collect::<Vec<_>>()
        .chunks(2)
        .filter_map(|pair| pair.get(1).copied())
        .collect();
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["jsonrpc"], "2.0");
    assert_eq!(answer["id"], "list-1");
    let tools = answer["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|tool| tool["name"] == "everything__echo"));
    // rmcp still answers a page asked for by cursor, and whatever else the session sends.
    let (head, body) = list(json!(2), json!({"cursor": "next"})).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    assert!(body.contains("\"id\":2"), "{body}");
    // Without an open session: no list, rmcp's 404.
    let request = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    let stale = in_session(&address, "no-such-session", &request).await;
    assert!(stale.starts_with("HTTP/1.1 404"), "{stale}");
}
