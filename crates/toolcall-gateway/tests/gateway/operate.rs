//! What an operator runs: one timeout per call (the upstream's), and the HTTP side beside a
//! stdio front.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{call, error_code, everything_upstream, python, written, HttpGateway, Probe, GATEWAY};

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
    let (status, metrics) = Probe::get(&probe, "/metrics").await;
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
