//! `/metrics` beside the tool router over real HTTP: the Prometheus exposition of the call and
//! breaker series, recorded by `metrics-exporter-prometheus` as `toolcall-gateway` does.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{ToolMetrics, DURATION_BUCKETS};
use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
use tower_toolcall_axum::{AdminRouter, ToolRouter};
use tower_toolcall_test::stacked;

const TOKEN: &str = "test-admin-token-0123456789";

/// A gateway with `/metrics` on 127.0.0.1, its series rendered by `prometheus`.
async fn gateway(prometheus: PrometheusHandle) -> SocketAddr {
    let registry = ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true},
            {"namespace": "vault", "name": "createFile", "risk": "writes"}
        ]}"#,
    )
    .unwrap();
    let metrics = ToolMetrics::new(&registry);
    metrics.describe();
    let stack = ToolStack::builder(registry)
        .on_event(metrics.clone())
        .build()
        .unwrap();
    let tools = stacked(
        &stack,
        tool_fn(
            |call: ToolCall| async move { Ok(ToolOutput::new(json!({"echo": call.params()}))) },
        ),
    );
    let store = stack.dedupe_store().unwrap().clone();
    let scrape = move || {
        let (store, metrics, prometheus) = (store.clone(), metrics.clone(), prometheus.clone());
        async move {
            metrics.record_dedupe_size(store.size().await.unwrap());
            prometheus.run_upkeep();
            prometheus.render()
        }
    };
    let app = ToolRouter::new(stack.registry().clone(), tools)
        .admin(AdminRouter::new(&stack, TOKEN).unwrap())
        .into_router()
        .merge(Router::new().route("/metrics", get(scrape)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn send(addr: SocketAddr, method: Method, path: &str, body: String) -> (StatusCode, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(axum::body::Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn search(query: &str) -> String {
    ToolCall::builder("web", "search")
        .session("s-metrics")
        .actor("user-1")
        .params(json!({"query": query}))
        .build()
        .unwrap()
        .to_json()
}

#[test]
fn metrics_expose_the_call_and_breaker_series() {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".into()),
            &DURATION_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let prometheus = recorder.handle();
    let exposition = metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let addr = gateway(prometheus).await;
                let (status, body) = send(addr, Method::POST, "/v1/tools/call", search("a")).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                let (status, body) = send(
                    addr,
                    Method::POST,
                    "/admin/breakers/tool:web::search/force-open",
                    String::new(),
                )
                .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                let (status, body) = send(addr, Method::POST, "/v1/tools/call", search("b")).await;
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
                let (status, body) = send(addr, Method::GET, "/metrics", String::new()).await;
                assert_eq!(status, StatusCode::OK);
                body
            })
    });
    let lines: Vec<&str> = exposition.lines().collect();
    for expected in [
        "# TYPE toolcall_tool_calls_total counter",
        r#"toolcall_tool_calls_total{tool="web::search",status="success"} 1"#,
        r#"toolcall_tool_calls_total{tool="web::search",status="circuit_open"} 1"#,
        "# TYPE toolcall_tool_call_duration_seconds histogram",
        r#"toolcall_tool_call_duration_seconds_bucket{tool="web::search",status="success",le="10"} 1"#,
        r#"toolcall_tool_call_duration_seconds_count{tool="web::search",status="circuit_open"} 1"#,
        "# TYPE toolcall_tool_circuit_breaker_state gauge",
        r#"toolcall_tool_circuit_breaker_state{tool="web::search",state="forced_open"} 1"#,
        r#"toolcall_tool_circuit_breaker_state{tool="web::search",state="closed"} 0"#,
        r#"toolcall_tool_circuit_breaker_transitions_total{tool="web::search",from_state="closed",to_state="forced_open"} 1"#,
        // the success and the refusal, kept as a failure
        "toolcall_tool_dedupe_cache_size 2",
        r#"toolcall_tool_dedupe_ttl_seconds{tool="web::search",state="completed",scope="session"} 86400"#,
    ] {
        assert!(
            lines.contains(&expected),
            "missing `{expected}` in:\n{exposition}"
        );
    }
}
