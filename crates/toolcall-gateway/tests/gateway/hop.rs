//! The hop to an upstream: its connections pooled and kept alive, so that a call costs no
//! new connection.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::{http, lively, tls, written, HttpGateway};

/// A call of the upstream's `send` in session `session`, told apart by `n`.
fn send(id: &str, session: &str, n: u32) -> serde_json::Value {
    json!({
        "contractVersion": "1.1", "requestId": id, "toolNamespace": "lively",
        "toolName": "send", "target": {"sessionKey": session, "actorId": "a"},
        "payload": {"version": "1.0", "params": {"n": n}}
    })
}

#[tokio::test]
async fn a_thousand_calls_to_an_http_upstream_open_no_new_connection_each() {
    let upstream = lively::Lively::default();
    let (url, accepted) = http::serve_counted(upstream.clone()).await;
    let config = written(
        "pooled",
        &format!("[[upstreams]]\nname = \"lively\"\nurl = \"{url}\"\ntrust = \"trusted\"\n"),
    );
    let gateway = HttpGateway::start(&config).await;
    let at_start = accepted.load(Ordering::Relaxed);
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..8u32 {
        let probe = HttpGateway::probe(gateway.address.clone());
        callers.spawn(async move {
            for n in 0..125u32 {
                let call = send(&format!("r-{caller}-{n}"), &format!("s-{caller}"), n);
                let (status, body) = probe.call(&call).await;
                assert_eq!(status, 200, "{body}");
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.unwrap();
    }
    assert_eq!(upstream.send.counts().1, 1000);
    // At most one connection per call in flight, and some to spare: not one per call.
    let opened = accepted.load(Ordering::Relaxed) - at_start;
    assert!(opened <= 16, "{opened} connections opened for 1 000 calls");
    // The pool outlives a pause shorter than its idle timeout.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let probe = HttpGateway::probe(gateway.address.clone());
    let call = send("r-after-pause", "s-pause", 1000);
    assert_eq!(probe.call(&call).await.0, 200);
    assert_eq!(accepted.load(Ordering::Relaxed) - at_start, opened);
}

#[tokio::test]
async fn without_keep_alive_each_call_has_a_connection_of_its_own() {
    let upstream = lively::Lively::default();
    let (url, accepted) = http::serve_counted(upstream.clone()).await;
    let config = written(
        "unpooled",
        &format!(
            "[[upstreams]]\nname = \"lively\"\nurl = \"{url}\"\ntrust = \"trusted\"\n\
             keep_alive = false\n"
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    let at_start = accepted.load(Ordering::Relaxed);
    let probe = HttpGateway::probe(gateway.address.clone());
    for n in 0..20u32 {
        let call = send(&format!("r-{n}"), "s", n);
        assert_eq!(probe.call(&call).await.0, 200);
    }
    let opened = accepted.load(Ordering::Relaxed) - at_start;
    assert!(opened >= 20, "{opened} connections for 20 calls");
}

#[tokio::test]
async fn an_https_upstream_is_reached_with_its_ca_over_kept_alive_connections_and_refused_without_it(
) {
    let (ca, cert, key) = tls::test_ca();
    let upstream = lively::Lively::default();
    let (url, accepted) = tls::serve_tls(upstream.clone(), &cert, &key).await;
    let dir = written("https-upstream", "").with_file_name("ca.pem");
    std::fs::write(&dir, &ca).unwrap();
    let entry = |extra: &str| {
        format!(
            "[[upstreams]]\nname = \"lively\"\nurl = \"{url}\"\ntrust = \"trusted\"\n\
             startup_timeout_ms = 5000\n{extra}"
        )
    };
    // With its CA: the calls go through, over kept-alive connections.
    let config = written(
        "https-upstream",
        &entry(&format!("tls_ca_file = \"{}\"\n", dir.display())),
    );
    let gateway = HttpGateway::start(&config).await;
    let at_start = accepted.load(Ordering::Relaxed);
    let probe = HttpGateway::probe(gateway.address.clone());
    for n in 0..200u32 {
        let call = send(&format!("r-{n}"), "s", n);
        let (status, body) = probe.call(&call).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(upstream.send.counts().1, 200);
    // One handshake serves many calls.
    let opened = accepted.load(Ordering::Relaxed) - at_start;
    assert!(opened <= 4, "{opened} TLS connections for 200 calls");
    drop(gateway);
    // Without it: the start-up says why, naming the certificate.
    let config = written("https-unknown-ca", &entry(""));
    let checked = super::operate::logging_gateway(&config, &[], "warn");
    let output = tokio::time::timeout(Duration::from_secs(10), async {
        let mut child = checked;
        let mut stderr = child.stderr.take().unwrap();
        let mut said = Vec::new();
        let mut buf = [0u8; 4096];
        use tokio::io::AsyncReadExt;
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            said.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&said).contains("upstream_down") {
                break;
            }
        }
        String::from_utf8_lossy(&said).into_owned()
    })
    .await
    .expect("the gateway says the upstream is down");
    let down = output
        .lines()
        .find(|line| line.contains("upstream_down"))
        .unwrap_or_else(|| panic!("no upstream_down line: {output}"));
    assert!(down.contains("upstream lively"), "{down}");
    assert!(
        down.contains("invalid peer certificate: UnknownIssuer"),
        "the reason names the certificate: {down}"
    );
}
