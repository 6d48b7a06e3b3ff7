//! Run with: `cargo run -p tower-toolcall-examples --bin gateway`
//!
//! A tool gateway: three demo tools behind the whole stack, served over HTTP on
//! 127.0.0.1:8080 (`PORT` changes the port).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/tools/call` | a `ToolCall` envelope in, a `ToolResult` envelope out |
//! | `GET /v1/tools` | the tools, their schemas and capabilities |
//! | `GET /metrics` | Prometheus exposition of the call, retry, breaker and dedupe series |
//! | `/admin/…` | breakers, loop sessions, dedupe records, switches; only when `TOOLCALL_ADMIN_TOKEN` is set |
//!
//! The tools:
//! - `web::search`: read-only; its upstream fails on every 5th request (the retry hides it);
//! - `vault::createFile`: mutating; needs `control.confirmationId` (over HTTP, a confirmation
//!   id is only as trustworthy as the caller that sends it: authenticate callers in front of
//!   the gateway);
//! - `reports::report`: slow; takes 2 seconds.
//!
//! Dedupe records live in memory, or in Redis when `TOOLCALL_REDIS_URL` is set (run with
//! `--features redis`). The switches come from the environment
//! (`TOOL_RELIABILITY_ENABLED`, …). Ctrl-C stops taking new connections, lets the calls in
//! flight finish, then exits.
//!
//! Calls must be sent as `Content-Type: application/json`. Connections that send their
//! headers slowly or sit idle are closed after 10 s, bodies must arrive within 15 s, at most
//! 256 connections and 64 calls are served at once (a call over that gets 503 with
//! `Retry-After`); a client that disconnects does not cancel its call, so a re-send with the
//! same `Idempotency-Key` gets its result.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tower::Layer;
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::idempotency::DedupeStore;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::trace::{ToolMetrics, DURATION_BUCKETS};
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolError, ToolOutput, ToolStack};
use tower_toolcall_axum::{self as http, AdminRouter, ServeConfig, ToolRouter};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The tools the gateway serves, with their schemas and policies.
fn registry(control: ReliabilityControl) -> Result<ToolRegistry, tower_toolcall::ConfigError> {
    ToolRegistry::builder()
        .control(control)
        .tool(
            ToolDescriptor::new("web", "search", RiskLevel::ReadOnly)
                .with_description("Searches the web.")
                .with_idempotent(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string", "minLength": 1}}
                })),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                .with_description("Creates a file in the vault.")
                .with_confirmation_required(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["path", "content"],
                    "properties": {
                        "path": {"type": "string"},
                        "content": {"type": "string"}
                    },
                    "additionalProperties": false
                })),
        )
        .tool(
            ToolDescriptor::new("reports", "report", RiskLevel::ReadOnly)
                .with_description("Builds a report; takes 2 seconds.")
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .build()
}

/// The search: read-only; its upstream fails on every 5th request.
fn search(call: &ToolCall, searches: &AtomicUsize) -> Result<ToolOutput, ToolError> {
    if searches.fetch_add(1, Ordering::SeqCst) % 5 == 4 {
        return Err(ToolError::from_http_status(
            503,
            "search upstream is overloaded",
        ));
    }
    let query = call
        .params()
        .as_map()
        .get("query")
        .and_then(|q| q.as_str())
        .unwrap_or_default();
    Ok(ToolOutput::new(json!({
        "query": query,
        "hits": [format!("{query}: the first hit"), format!("{query}: the second hit")],
    })))
}

/// The file write: mutating; pretends to write and says when, so that a cached answer shows.
fn create_file(call: &ToolCall) -> Result<ToolOutput, ToolError> {
    let params = call.params().as_map();
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    Ok(ToolOutput::new(json!({
        "path": params["path"],
        "bytes": params["content"].as_str().unwrap_or_default().len(),
        "createdAt": created_at,
    })))
}

/// The report: slow.
async fn report() -> Result<ToolOutput, ToolError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(ToolOutput::new(json!({"report": "all systems nominal"})))
}

/// One service for every tool: it dispatches on the tool's name.
async fn run_tool(call: ToolCall, searches: Arc<AtomicUsize>) -> Result<ToolOutput, ToolError> {
    match (call.tool_namespace(), call.tool_name()) {
        ("web", "search") => search(&call, &searches),
        ("vault", "createFile") => create_file(&call),
        ("reports", "report") => report().await,
        (ns, name) => Err(ToolError::new(
            ErrorCode::NotFound,
            format!("no implementation for {ns}::{name}"),
        )),
    }
}

/// The Prometheus recorder, with histogram buckets for the durations.
fn prometheus() -> Result<PrometheusHandle, BoxError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".into()),
            &DURATION_BUCKETS,
        )?
        .install_recorder()?)
}

/// `GET /metrics`: the dedupe store's size, then every series in the Prometheus text format.
async fn scrape<St: DedupeStore>(
    State((stack, metrics, prometheus)): State<(ToolStack<St>, ToolMetrics, PrometheusHandle)>,
) -> String {
    if let Some(store) = stack.dedupe_store() {
        if let Ok(records) = store.size().await {
            metrics.record_dedupe_size(records);
        }
    }
    prometheus.run_upkeep();
    prometheus.render()
}

/// The gateway's routes around `stack`.
fn app<St: DedupeStore>(
    stack: ToolStack<St>,
    metrics: ToolMetrics,
    prometheus: PrometheusHandle,
) -> Result<Router, BoxError> {
    let searches = Arc::new(AtomicUsize::new(0));
    let tools = tool_fn(move |call: ToolCall| run_tool(call, searches.clone()));
    let mut router = ToolRouter::new(stack.registry().clone(), stack.layer(tools))
        .body_timeout(Duration::from_secs(15))
        .max_calls_in_flight(64);
    match std::env::var("TOOLCALL_ADMIN_TOKEN") {
        Ok(token) => router = router.admin(AdminRouter::new(&stack, token)?),
        Err(_) => tracing::info!("TOOLCALL_ADMIN_TOKEN is not set: no admin API"),
    }
    let metrics_route = Router::new()
        .route("/metrics", get(scrape::<St>))
        .with_state((stack, metrics, prometheus));
    Ok(router.into_router().merge(metrics_route))
}

/// Serves `app` until Ctrl-C, then lets the calls in flight finish.
///
/// The limits a gateway reachable by untrusted clients needs: a connection must send a
/// request's headers within 10 s (which also closes connections left idle that long), at
/// most 256 connections are open at once (well under a `ulimit -n` of 1024), and the router
/// reads a body for at most 15 s and runs at most 64 calls at once (see `app`).
async fn serve(app: Router) -> Result<(), BoxError> {
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    tracing::info!("serving on http://{}", listener.local_addr()?);
    let limits = ServeConfig::default()
        .header_read_timeout(Duration::from_secs(10))
        .max_connections(256);
    http::serve(listener, app, limits, async {
        tokio::signal::ctrl_c().await.ok();
        tracing::info!("shutting down: finishing the calls in flight");
    })
    .await?;
    tracing::info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The error's message, naming what to fix; never a debug dump.
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let prometheus = prometheus()?;

    let registry = registry(ReliabilityControl::from_env()?)?;
    let metrics = ToolMetrics::new(&registry);
    metrics.describe();
    let stack = ToolStack::builder(registry).metrics(metrics.clone());

    let redis_url = std::env::var("TOOLCALL_REDIS_URL").ok();
    #[cfg(feature = "redis")]
    if let Some(url) = redis_url {
        let store = tower_toolcall_redis::RedisDedupeStore::open(&url)?;
        store.ping().await?;
        // The URL's password never reaches a log line.
        let shown = tower_toolcall::trace::Redactor::default()
            .redact_str(&url)
            .into_owned();
        tracing::info!("dedupe records in Redis at {shown}");
        let stack = stack.store(store).build()?;
        return serve(app(stack, metrics, prometheus)?).await;
    }
    #[cfg(not(feature = "redis"))]
    if redis_url.is_some() {
        return Err(
            "TOOLCALL_REDIS_URL is set, but the Redis store needs the `redis` feature: \
                    cargo run -p tower-toolcall-examples --features redis --bin gateway"
                .into(),
        );
    }

    tracing::info!("dedupe records in memory");
    serve(app(stack.build()?, metrics, prometheus)?).await
}
