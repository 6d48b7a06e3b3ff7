//! The fronts over HTTPS: the official Python SDK client calls through a gateway serving TLS
//! with a certificate of a CA made by the test, and a renewed certificate is served after a
//! SIGHUP without a restart.

use std::sync::Arc;

use serde_json::json;
use tokio::process::Command;
use tokio_rustls::rustls;

use super::{call, drive, everything_upstream, hang_up, kit, tls, written, HttpGateway};

/// Whether a TLS client that trusts only `ca` (PEM) completes a handshake with `address`.
async fn trusts(address: &str, ca: &str) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .is_ok()
}

#[tokio::test]
async fn the_sdk_client_calls_over_https_and_a_renewed_certificate_needs_no_restart() {
    let (ca, cert, key) = tls::test_ca();
    let config = written("https-front", "");
    let dir = config.parent().unwrap().to_owned();
    let (cert_file, key_file, ca_file) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("ca.pem"),
    );
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    std::fs::write(&ca_file, &ca).unwrap();
    let config = written(
        "https-front",
        &format!(
            "[http]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n{}",
            cert_file.display(),
            key_file.display(),
            everything_upstream()
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    let url = format!("https://{}/mcp", gateway.address);
    let plan = json!({
        "transport": {"kind": "http", "url": url, "headers": {}},
        "protocolVersion": "2025-11-25",
        "steps": [call("everything__echo", json!({"message": "over tls"}), json!({}))],
    });
    let mut python = Command::new(kit(".venv/bin/python"));
    python
        .arg(kit("clients/client.py"))
        .env("SSL_CERT_FILE", &ca_file);
    let report = drive(python, plan).await;
    assert_eq!(report["steps"][0]["ok"]["isError"], false, "{report}");
    // Plain HTTP gets no answer there.
    let address = &gateway.address;
    let plain = super::operate::raw(
        address,
        &format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(!plain.starts_with("HTTP/1.1"), "{plain}");

    // Clients that connect and never begin their handshake hold up no other.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(tokio::net::TcpStream::connect(address).await.unwrap());
    }
    let started = std::time::Instant::now();
    assert!(trusts(&gateway.address, &ca).await);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    drop(silent);

    // A renewed certificate, of another CA: served after SIGHUP, to new connections.
    let (renewed_ca, renewed_cert, renewed_key) = tls::test_ca();
    std::fs::write(&cert_file, &renewed_cert).unwrap();
    std::fs::write(&key_file, &renewed_key).unwrap();
    assert!(!trusts(&gateway.address, &renewed_ca).await);
    hang_up(&gateway);
    let mut renewed = false;
    for _ in 0..50 {
        if trusts(&gateway.address, &renewed_ca).await {
            renewed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(renewed, "the renewed certificate is served after SIGHUP");
    assert!(!trusts(&gateway.address, &ca).await);
    // A bad file is refused: the renewed certificate serves on.
    std::fs::write(&key_file, "not a key").unwrap();
    hang_up(&gateway);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(trusts(&gateway.address, &renewed_ca).await);
}
