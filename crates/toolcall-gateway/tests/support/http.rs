//! An MCP server of the tests' own over streamable HTTP, on a free loopback port.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::serve::ListenerExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;

/// Serves `handler` (a clone of it for each session) at `/mcp` of a free loopback port, for
/// as long as the runtime runs; its URL.
pub(crate) async fn serve<H>(handler: H) -> String
where
    H: ServerHandler + Clone + Send + Sync + 'static,
{
    serve_counted(handler).await.0
}

/// [`serve`], and the count of the TCP connections it accepted so far.
pub(crate) async fn serve_counted<H>(handler: H) -> (String, Arc<AtomicUsize>)
where
    H: ServerHandler + Clone + Send + Sync + 'static,
{
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let listener = listener.tap_io(move |tcp| {
        counted.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await
    });
    (url, accepted)
}
