//! `McpClient` behind the whole stack, in front of the SDKs' reference servers: an `isError`
//! answer neither retried nor counted, one breaker for the whole server, and a killed server
//! started again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ServiceExt as _;
use serde_json::{json, Value};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_toolcall::breaker::BreakerKey;
use tower_toolcall::{ErrorClass, ErrorCode, ToolCall, ToolStack};
use tower_toolcall_mcp::{McpClient, Trust, UpstreamState};

use super::kit::{everything_server, time_server};

fn call(namespace: &str, name: &str, args: Value) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("agent-session")
        .actor("agent")
        .params(args)
        .build()
        .unwrap()
}

/// A client of the server `command` makes, kept running, with the process id of each of its
/// runs.
async fn kept(
    name: &str,
    command: fn() -> tokio::process::Command,
) -> (McpClient, Arc<Mutex<Option<u32>>>) {
    let pid = Arc::new(Mutex::new(None));
    let seen = pid.clone();
    let client = McpClient::connect(name, move || {
        let seen = seen.clone();
        async move {
            let transport = rmcp::transport::TokioChildProcess::new(command())?;
            *seen.lock().unwrap() = transport.id();
            ().serve(transport)
                .await
                .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    (client, pid)
}

fn kill(pid: &Mutex<Option<u32>>) {
    let pid = pid.lock().unwrap().take().expect("a running server");
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {pid}");
}

#[tokio::test]
async fn an_is_error_answer_of_mcp_server_time_is_neither_retried_nor_counted() {
    let (client, _) = kept("time", time_server).await;
    let registry = client.registry("time", Trust::Trusted, None).await.unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let breakers = stack.breakers().unwrap();
    let tools = stack.layer(client);

    let now = tools
        .clone()
        .oneshot(call(
            "time",
            "get_current_time",
            json!({"timezone": "Europe/Paris"}),
        ))
        .await
        .unwrap();
    assert_eq!(now.content["timezone"], "Europe/Paris");

    let err = tools
        .clone()
        .oneshot(call(
            "time",
            "get_current_time",
            json!({"timezone": "Mars/Olympus"}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::UpstreamError);
    assert_eq!(err.class(), ErrorClass::Terminal);
    assert!(err.message().contains("Mars/Olympus"), "{}", err.message());
    assert!(
        err.record().retried_by.is_empty(),
        "not retried: {:?}",
        err.record()
    );
    let stats = breakers
        .status(&BreakerKey::tool("time", "get_current_time"))
        .unwrap()
        .stats;
    assert_eq!((stats.successes, stats.failures), (1, 0), "{stats:?}");
}

/// Kills the server under `client` and measures how long until a call of `tool` through
/// `tools` succeeds again; the calls meanwhile fail fast.
async fn recovery<S>(
    client: &McpClient,
    pid: &Mutex<Option<u32>>,
    tools: &S,
    tool: (&str, &str, Value),
) -> Duration
where
    S: tower::Service<
            ToolCall,
            Response = tower_toolcall::ToolOutput,
            Error = tower_toolcall::ToolError,
        > + Clone,
{
    kill(pid);
    let killed = Instant::now();
    loop {
        let started = Instant::now();
        let outcome = client
            .clone()
            .oneshot(call(tool.0, tool.1, tool.2.clone()))
            .await;
        match outcome {
            Ok(_) => break,
            Err(err) => {
                assert_eq!(err.code(), ErrorCode::UpstreamUnavailable, "{err:?}");
                assert!(started.elapsed() < Duration::from_secs(1), "fails fast");
                assert!(
                    killed.elapsed() < Duration::from_secs(30),
                    "never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let recovered = killed.elapsed();
    tools
        .clone()
        .oneshot(call(tool.0, tool.1, tool.2))
        .await
        .expect("the stack calls the new server");
    recovered
}

#[tokio::test]
async fn a_killed_mcp_server_time_is_started_again() {
    let (client, pid) = kept("time", time_server).await;
    let registry = client.registry("time", Trust::Trusted, None).await.unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let breakers = stack.breakers().unwrap();
    let tools = stack.layer(client.clone());
    let paris = (
        "time",
        "get_current_time",
        json!({"timezone": "Europe/Paris"}),
    );
    let mut times = Vec::new();
    for _ in 0..5 {
        times.push(recovery(&client, &pid, &tools, paris.clone()).await);
    }
    let millis: Vec<u128> = times.iter().map(Duration::as_millis).collect();
    eprintln!("recovery after kill -9 of mcp-server-time, ms: {millis:?}");
    assert_eq!(client.state(), UpstreamState::Connected);
    assert_eq!(client.stats().disconnects, 5);
    assert_eq!(client.stats().reconnects, 5);
    // A recovery is the reconnection (at once) plus the start of a Python interpreter and
    // its imports: about 1 s on an idle machine, several under a loaded test run.
    assert!(
        times.iter().all(|t| *t < Duration::from_secs(15)),
        "recoveries {millis:?} ms"
    );
    // The tool's own breaker saw the outage as nothing: the server's breaker took it.
    let stats = breakers
        .status(&BreakerKey::tool("time", "get_current_time"))
        .unwrap()
        .stats;
    assert_eq!(stats.failures, 0, "{stats:?}");
}

#[tokio::test]
async fn server_everything_behind_the_stack_and_one_breaker_for_all_its_tools() {
    let (client, pid) = kept("everything", everything_server).await;
    let tools_listed = client.tools().await.unwrap();
    assert!(tools_listed.len() >= 13, "{} tools", tools_listed.len());
    let registry = client
        .registry("everything", Trust::Trusted, None)
        .await
        .unwrap();
    let tools = ToolStack::builder(registry)
        .build()
        .unwrap()
        .layer(client.clone());

    let echoed = tools
        .clone()
        .oneshot(call("everything", "echo", json!({"message": "hi"})))
        .await
        .unwrap();
    assert!(
        echoed.content.to_string().contains("hi"),
        "{}",
        echoed.content
    );
    let weather = tools
        .clone()
        .oneshot(call(
            "everything",
            "get-structured-content",
            json!({"location": "New York"}),
        ))
        .await
        .unwrap();
    assert!(
        weather.content["temperature"].is_number(),
        "{}",
        weather.content
    );
    // Arguments the tool's own input schema refuses never reach it.
    let refused = tools
        .clone()
        .oneshot(call("everything", "get-sum", json!({"a": "one", "b": 2})))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::ValidationError);
    assert!(
        refused.message().contains("payload.params.a"),
        "{}",
        refused.message()
    );

    // The server dies: every one of its tools fails at once, until it is back.
    kill(&pid);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for name in ["echo", "get-sum", "get-tiny-image"] {
        let started = Instant::now();
        match client
            .clone()
            .oneshot(call("everything", name, json!({})))
            .await
        {
            Err(err) => {
                assert_eq!(
                    err.code(),
                    ErrorCode::UpstreamUnavailable,
                    "{name}: {err:?}"
                );
                assert!(started.elapsed() < Duration::from_millis(500));
            }
            // Already started again.
            Ok(_) => assert_eq!(client.stats().reconnects, 1),
        }
    }
    let back = recovery_wait(&client).await;
    eprintln!("server-everything back after {} ms", back.as_millis());
    tools
        .oneshot(call("everything", "echo", json!({"message": "again"})))
        .await
        .unwrap();
}

/// Waits until the client is connected again.
async fn recovery_wait(client: &McpClient) -> Duration {
    let started = Instant::now();
    while client.state() != UpstreamState::Connected || client.stats().reconnects == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// A proxy, `McpServer::over` a stack around `McpClient`, serves a server that speaks only
/// the handshake protocol (server-everything) to a client of the stateless 2026-07-28
/// protocol: the tool list is re-issued in the client's shape.
#[tokio::test]
async fn a_proxy_serves_a_legacy_upstream_to_a_stateless_client() {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    use tower_toolcall_mcp::McpServer;

    use super::kit::Sdk;

    let upstream = McpClient::spawn("everything", everything_server)
        .await
        .unwrap();
    let listed = upstream.tools().await.unwrap();
    let registry = upstream
        .registry("everything", Trust::Trusted, None)
        .await
        .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let proxy = McpServer::over("everything", stack.layer(upstream), listed.clone());
    let service = StreamableHttpService::new(
        move || Ok(proxy.connection()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await
    });

    for version in ["2025-11-25", "2026-07-28"] {
        let report = Sdk::Python
            .run(&json!({
                "transport": {"kind": "http", "url": url},
                "protocolVersion": version,
                "clientName": format!("proxy-{version}"),
                "steps": [
                    {"op": "listTools"},
                    {"op": "call", "name": "echo", "arguments": {"message": "through"}},
                ]
            }))
            .await;
        assert_eq!(report["negotiatedProtocolVersion"], version, "{report}");
        let tools = &report["steps"][0]["ok"]["tools"];
        assert_eq!(
            tools.as_array().map(Vec::len),
            Some(listed.len()),
            "{report}"
        );
        let echoed = &report["steps"][1]["ok"];
        assert!(
            echoed["content"].to_string().contains("through"),
            "{report}"
        );
    }
}

/// An HTTP upstream that restarts (its sessions lost with it) is connected to again, its
/// session initialized anew, without rebuilding the stack.
#[cfg(feature = "mcp-http")]
#[tokio::test]
async fn an_http_upstream_that_restarts_is_connected_to_again() {
    use super::kit::HttpServer;

    let server = HttpServer::start().await;
    let url = server.url.clone();
    let address = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let client = McpClient::http("notes", url).await.unwrap();
    let registry = client
        .registry("notes", Trust::Trusted, None)
        .await
        .unwrap();
    let tools = ToolStack::builder(registry)
        .build()
        .unwrap()
        .layer(client.clone());
    let search = || call("notes", "search", json!({"query": "x"}));
    tools.clone().oneshot(search()).await.unwrap();

    server.kill().await;
    let killed = Instant::now();
    let failed = client.clone().oneshot(search()).await.unwrap_err();
    assert_eq!(failed.code(), ErrorCode::UpstreamUnavailable, "{failed:?}");
    assert!(killed.elapsed() < Duration::from_secs(2), "fails fast");

    let _restarted = HttpServer::start_on(&address).await;
    let started = Instant::now();
    loop {
        match tools.clone().oneshot(search()).await {
            Ok(_) => break,
            Err(err) => {
                assert_eq!(err.code(), ErrorCode::UpstreamUnavailable, "{err:?}");
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!(
        "the HTTP upstream answered again {} ms after its restart",
        started.elapsed().as_millis()
    );
    assert!(client.stats().reconnects >= 1, "{:?}", client.stats());
}
