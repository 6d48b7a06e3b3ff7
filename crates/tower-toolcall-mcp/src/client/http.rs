//! The HTTP client of a streamable-HTTP server: one pool of kept-alive connections, and TLS
//! (rustls) that trusts the web PKI's roots, so that `https://` works as it is.

use std::time::Duration;

/// How long a pooled connection to a streamable-HTTP server may stay idle before it is
/// closed: 30 s.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP client [`McpClient::http_with`](crate::McpClient::http_with) makes: see
/// [`pooled_http_client_builder`].
pub fn pooled_http_client() -> reqwest::Result<reqwest::Client> {
    pooled_http_client_builder().build()
}

/// The builder of [`pooled_http_client`], for settings of your own on top (a CA of your
/// own with `tls_certs_merge`, a client certificate with `identity`):
///
/// - one pool of keep-alive connections ([`DEFAULT_HTTP_IDLE_TIMEOUT`] idle at most),
///   `TCP_NODELAY`, and no redirect followed (a server that moved is configured anew);
/// - TLS by rustls (the process's default crypto provider when one is installed, else
///   reqwest's), trusting the web PKI's roots (Mozilla's, built in: no system CA bundle
///   needed) and the roots you add.
///
/// A server that leaves Nagle's algorithm on (a tokio server that does not set
/// `TCP_NODELAY`) can answer a request on a kept-alive connection up to 40 ms late, when
/// its answer follows a first event in a separate write: give it a client without a pool
/// (`pool_max_idle_per_host(0)`) with
/// [`McpClient::http_with_client`](crate::McpClient::http_with_client).
///
/// ```
/// use tower_toolcall_mcp::pooled_http_client_builder;
///
/// # fn run(ca_pem: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
/// let client = pooled_http_client_builder()
///     .tls_certs_merge(tower_toolcall_mcp::reqwest::Certificate::from_pem_bundle(ca_pem)?)
///     .build()?;
/// # let _ = client;
/// # Ok(()) }
/// # let _ = run;
/// ```
pub fn pooled_http_client_builder() -> reqwest::ClientBuilder {
    let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .filter_map(|der| reqwest::Certificate::from_der(der).ok());
    reqwest::Client::builder()
        .pool_idle_timeout(DEFAULT_HTTP_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_only(roots)
}

/// Why `url` cannot be reached with `client`, when a request to it fails before any answer:
/// the innermost cause (a certificate no root vouches for, a refused connection), which
/// rmcp's own error for a connection that could not be made does not keep.
pub(super) async fn why_unreachable(client: &reqwest::Client, url: &str) -> Option<String> {
    let err = client
        .head(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .err()?;
    Some(super::upstream::root_cause(&err))
}
