//! The hop to an upstream: its connections pooled and kept alive, so that a call costs no
//! new connection.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::{http, lively, written, HttpGateway};

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
                let call = json!({
                    "contractVersion": "1.1", "requestId": format!("r-{caller}-{n}"),
                    "toolNamespace": "lively", "toolName": "send",
                    "target": {"sessionKey": format!("s-{caller}"), "actorId": "a"},
                    "payload": {"version": "1.0", "params": {"n": n, "caller": caller}}
                });
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
    let call = json!({
        "contractVersion": "1.1", "requestId": "r-after-pause", "toolNamespace": "lively",
        "toolName": "send", "target": {"sessionKey": "s-pause", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"n": 1000}}
    });
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
        let call = json!({
            "contractVersion": "1.1", "requestId": format!("r-{n}"), "toolNamespace": "lively",
            "toolName": "send", "target": {"sessionKey": "s", "actorId": "a"},
            "payload": {"version": "1.0", "params": {"n": n}}
        });
        assert_eq!(probe.call(&call).await.0, 200);
    }
    let opened = accepted.load(Ordering::Relaxed) - at_start;
    assert!(opened >= 20, "{opened} connections for 20 calls");
}
