//! Run with: `cargo run -p tower-toolcall-examples --features grpc --bin grpc`
//!
//! A small gRPC tool service (`proto/tools.proto`) whose calls run through the whole stack.
//! Its `forecast` tool asks an upstream gRPC service that is unavailable on its first
//! answer: the upstream's `Status` becomes a retriable `ToolError`, the stack retries, and
//! the caller sees the forecast. A `ToolError` that ends a call goes back to the gRPC caller
//! as a `Status` with the matching code. The example starts the service on a loopback port
//! and calls it with the generated client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tonic::{Request, Response, Status};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;
use tower_toolcall::registry::{RetrySettings, RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};

/// The code generated from `proto/tools.proto`.
#[allow(missing_docs)]
pub mod proto {
    tonic::include_proto!("tools.v1");
}

use proto::tools_server::{Tools, ToolsServer};
use proto::{CallReply, CallRequest};

/// The gRPC service: each request becomes a `ToolCall` through the stack.
#[derive(Debug)]
pub struct StackedTools {
    tools: BoxCloneSyncService<ToolCall, ToolOutput, ToolError>,
}

#[tonic::async_trait]
impl Tools for StackedTools {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let request = request.into_inner();
        let params: Value = serde_json::from_str(&request.params_json)
            .map_err(|err| ToolError::invalid_field("params_json", err))?;
        let mut call = ToolCall::builder(request.namespace, request.name)
            .session(request.session_key)
            .actor("grpc-client")
            .params(params);
        if !request.idempotency_key.is_empty() {
            call = call.idempotency_key(request.idempotency_key);
        }
        let output = self.tools.clone().oneshot(call.build()?).await?;
        Ok(Response::new(CallReply {
            content_json: output.content.to_string(),
            from_cache: output.record().from_cache,
        }))
    }
}

/// How many times the upstream of `forecast` was asked.
#[derive(Clone, Debug, Default)]
pub struct UpstreamCalls(pub Arc<AtomicUsize>);

/// The service, with a `weather::forecast` tool (read-only, its upstream unavailable on the
/// first ask) and a `notes::append` tool (writes, with a schema).
pub fn service(
    upstream: UpstreamCalls,
) -> Result<ToolsServer<StackedTools>, tower_toolcall::ConfigError> {
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new(
            "weather",
            "forecast",
            RiskLevel::ReadOnly,
        ))
        .tool(
            ToolDescriptor::new("notes", "append", RiskLevel::Writes).with_input_schema(json!({
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string", "minLength": 1}}
            })),
        )
        .build()?;
    let stack = ToolStack::builder(registry)
        .retry(|retry| {
            retry.settings(
                RetrySettings::default()
                    .with_base_delay_ms(1)
                    .with_max_delay_ms(5),
            )
        })
        .build()?;
    let tool = tool_fn(move |call: ToolCall| {
        let upstream = upstream.clone();
        async move {
            match call.tool_name() {
                "forecast" => {
                    // The answer of an upstream gRPC service, turned into a classified error.
                    if upstream.0.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err(ToolError::from(Status::unavailable(
                            "weather backend restarting",
                        )));
                    }
                    Ok(ToolOutput::new(
                        json!({"city": call.params().as_map()["city"], "sky": "clear"}),
                    ))
                }
                _ => Ok(ToolOutput::new(
                    json!({"appended": call.params().as_map()["text"]}),
                )),
            }
        }
    });
    let tools = BoxCloneSyncService::new(tower::Layer::layer(&stack, tool));
    Ok(ToolsServer::new(StackedTools { tools }))
}

/// Serves the tools on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    upstream: UpstreamCalls,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tonic::transport::Server::builder()
        .add_service(service(upstream)?)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await?;
    Ok(())
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let address = listener.local_addr()?;
    let upstream = UpstreamCalls::default();
    tokio::spawn(serve(listener, upstream.clone()));

    let mut client = proto::tools_client::ToolsClient::connect(format!("http://{address}")).await?;
    let reply = client
        .call(CallRequest {
            namespace: "weather".into(),
            name: "forecast".into(),
            params_json: r#"{"city": "Lyon"}"#.into(),
            session_key: "s-1".into(),
            idempotency_key: String::new(),
        })
        .await?
        .into_inner();
    println!(
        "forecast: {} (the upstream was asked {} times)",
        reply.content_json,
        upstream.0.load(Ordering::SeqCst)
    );

    let refused = client
        .call(CallRequest {
            namespace: "notes".into(),
            name: "append".into(),
            params_json: r#"{"text": ""}"#.into(),
            session_key: "s-1".into(),
            idempotency_key: "append-1".into(),
        })
        .await
        .unwrap_err();
    println!(
        "append with empty text: {:?} {}",
        refused.code(),
        refused.message()
    );
    Ok(())
}
