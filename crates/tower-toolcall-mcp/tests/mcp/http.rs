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

/// Over streamable HTTP with sessions (the 2025-11-25 handshake): the session is the
/// transport's `Mcp-Session-Id`, the actor and tenant the authenticated principal's.
#[tokio::test]
async fn over_http_the_session_is_the_transports_and_the_actor_the_principals() {
    use tower_toolcall_mcp::Principal;

    let (server, seen) = super::edge::recorded(|server| server);
    let service = StreamableHttpService::new(
        move || Ok(server.connection()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let authenticated = axum::middleware::from_fn(
        |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
            request
                .extensions_mut()
                .insert(Principal::new("user-7").with_tenant("acme"));
            next.run(request).await
        },
    );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(authenticated);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });

    for _ in 0..2 {
        let running =
            ().serve(StreamableHttpClientTransport::from_uri(address.clone()))
                .await
                .unwrap();
        for _ in 0..2 {
            running
                .call_tool(super::params("search", serde_json::json!({"query": "x"})))
                .await
                .unwrap();
        }
        running.cancel().await.unwrap();
    }
    let seen = seen.lock().unwrap();
    let who: Vec<_> = seen
        .iter()
        .map(|c| (c.session_key().to_owned(), c.actor_id(), c.tenant_id()))
        .collect();
    assert_eq!(who.len(), 4);
    for (session, actor, tenant) in &who {
        assert_eq!((*actor, *tenant), ("user-7", Some("acme")));
        assert!(!session.is_empty() && session != "user-7", "{session}");
    }
    assert_eq!(who[0].0, who[1].0, "one connection, one session");
    assert_ne!(who[1].0, who[2].0, "a new connection, a new session");
}
