//! The client over streamable HTTP: an rmcp streamable-HTTP server on a loopback port, the
//! stack on the client's side.

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::ServiceExt as _;
use tower_toolcall_mcp::McpClient;

use super::example::Notes;
use super::the_stack_on_the_client_side;

/// Serves `notes` over streamable HTTP at `http://127.0.0.1:<port>/mcp`, one handler per
/// session; gives the address.
async fn serve_over_http(notes: Notes) -> String {
    let service = StreamableHttpService::new(
        move || Ok(notes.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{address}/mcp")
}

// Real time: the client's HTTP connection waits on a socket, which paused time would skip
// past into the stack's timeouts.
#[tokio::test]
async fn the_stack_on_a_client_over_streamable_http() {
    let notes = Notes::default();
    let address = serve_over_http(notes.clone()).await;
    let running =
        ().serve(StreamableHttpClientTransport::from_uri(address))
            .await
            .expect("the MCP handshake over streamable HTTP");
    the_stack_on_the_client_side(&notes, McpClient::new(running.peer().clone())).await;
    running.cancel().await.unwrap();
}
