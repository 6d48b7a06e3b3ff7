//! An MCP server of the tests' own over HTTPS, and the CA that signed its certificate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;

/// A CA made for a test, and a server certificate it signed for `127.0.0.1` and
/// `localhost`: the CA's certificate (PEM), and the server's certificate and key (PEM).
pub(crate) fn test_ca() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "toolcall-gateway test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);
    let server_key = KeyPair::generate().unwrap();
    let mut server =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "toolcall-gateway test server");
    let server = server.signed_by(&server_key, &issuer).unwrap();
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

/// An MCP server as `super::http::serve` makes one, over TLS with the certificate `cert` and
/// key `key` (PEM): its `https://` URL, and the count of the TLS connections it accepted.
pub(crate) async fn serve_tls<H>(handler: H, cert: &str, key: &str) -> (String, Arc<AtomicUsize>)
where
    H: ServerHandler + Clone + Send + Sync + 'static,
{
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/mcp", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let listener = TlsListener {
        accepted: accepted.clone(),
        tcp: listener,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await
    });
    (url, accepted)
}

/// A TCP listener whose connections are TLS: a handshake that fails drops the connection.
struct TlsListener {
    accepted: Arc<AtomicUsize>,
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, address)) = self.tcp.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                self.accepted.fetch_add(1, Ordering::Relaxed);
                return (tls, address);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
