//! `[servers.NAME] max_concurrent`: the places of all a server's tools together, refused at
//! once when they and the queue are full, another server untouched, kept across a reload,
//! and the metrics of it and of a tool's own bulkhead.

use std::time::Duration;

use serde_json::{json, Value};

use super::{http, lively, written, HttpGateway};

/// A call of `namespace::name`, holding the upstream `hold_ms`.
fn call(id: &str, namespace: &str, name: &str, hold_ms: u64) -> Value {
    json!({
        "contractVersion": "1.1", "requestId": id, "toolNamespace": namespace,
        "toolName": name, "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"holdMs": hold_ms}}
    })
}

/// The value of the series `name` in a Prometheus text exposition, if it is there.
fn value_of(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[tokio::test]
async fn a_server_limited_to_one_call_refuses_a_second_and_leaves_another_server_alone() {
    let limited = lively::Lively::default();
    let other = lively::Lively::default();
    let limited_url = http::serve(limited.clone()).await;
    let other_url = http::serve(other.clone()).await;
    let text = |extra: &str| {
        format!(
            "[servers.lively]\nmax_concurrent = 1\nmax_queued = 0\n\n\
             [servers.other.tools.scan]\npolicy = {{ bulkhead = {{ max_concurrent = 2 }} }}\n\n\
             {extra}\n\
             [[upstreams]]\nname = \"lively\"\nurl = \"{limited_url}\"\ntrust = \"trusted\"\n\n\
             [[upstreams]]\nname = \"other\"\nurl = \"{other_url}\"\ntrust = \"trusted\"\n"
        )
    };
    let config = written("server-bulkhead", &text(""));
    let gateway = HttpGateway::start(&config).await;

    // A send holds the server's only place for 6 s.
    let probe = HttpGateway::probe(gateway.address.clone());
    let holding =
        tokio::spawn(async move { probe.call(&call("send-1", "lively", "send", 6000)).await });
    for _ in 0..100 {
        if limited.send.counts().0 == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limited.send.counts().0, 1, "the send reached the upstream");

    // Another tool of the same server is refused at once; another server's tool runs.
    let started = std::time::Instant::now();
    let (status, body) = gateway.call(&call("scan-1", "lively", "scan", 0)).await;
    assert!(started.elapsed() < Duration::from_millis(1000), "at once");
    assert_eq!(status, 429, "{body}");
    let refused: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(refused["error"]["code"], "RATE_LIMITED", "{body}");
    assert_eq!(refused["error"]["retryAfterMs"], 1000, "{body}");
    assert_eq!(refused["error"]["details"]["limit"], "namespace", "{body}");
    assert_eq!(
        limited.scan.counts().0,
        0,
        "the scan never reached the upstream"
    );
    let (status, body) = gateway.call(&call("scan-2", "other", "scan", 0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(other.scan.counts(), (1, 1, 0));

    // The metrics while the send holds the place.
    let (status, exposition) = gateway.get("/metrics").await;
    assert_eq!(status, 200);
    for (series, value) in [
        (
            "toolcall_namespace_bulkhead_in_use{namespace=\"lively\"}",
            1.0,
        ),
        (
            "toolcall_namespace_bulkhead_queued{namespace=\"lively\"}",
            0.0,
        ),
        (
            "toolcall_namespace_bulkhead_refused_total{namespace=\"lively\"}",
            1.0,
        ),
    ] {
        assert_eq!(
            value_of(&exposition, series),
            Some(value),
            "{series} in {exposition}"
        );
    }
    assert!(
        !exposition.contains("namespace=\"other\""),
        "the other server has no limit: {exposition}"
    );
    // A tool with a bulkhead of its own: its gauges, its call done.
    for series in [
        "toolcall_tool_bulkhead_in_use{tool=\"other::scan\"}",
        "toolcall_tool_bulkhead_queued{tool=\"other::scan\"}",
    ] {
        assert_eq!(
            value_of(&exposition, series),
            Some(0.0),
            "{series} in {exposition}"
        );
    }
    assert!(
        !exposition.contains("toolcall_tool_rate_limited_total"),
        "a bulkhead's refusal is not a rate limit's: {exposition}"
    );

    // A reload (which limits `other` too) keeps the place the send holds.
    std::fs::write(&config, text("[servers.other]\nmax_concurrent = 5\n")).unwrap();
    super::hang_up(&gateway);
    let other_limited = "toolcall_namespace_bulkhead_in_use{namespace=\"other\"}";
    let mut exposition = String::new();
    for _ in 0..100 {
        exposition = gateway.get("/metrics").await.1;
        if value_of(&exposition, other_limited).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        value_of(&exposition, other_limited),
        Some(0.0),
        "reloaded: {exposition}"
    );
    assert_eq!(
        value_of(
            &exposition,
            "toolcall_namespace_bulkhead_in_use{namespace=\"lively\"}"
        ),
        Some(1.0),
        "the send still holds its place: {exposition}"
    );
    let (status, body) = gateway.call(&call("scan-3", "lively", "scan", 0)).await;
    assert_eq!(status, 429, "the limit holds across the reload: {body}");
    assert_eq!(limited.send.counts().1, 0, "the send still runs");

    let (status, body) = holding.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (_, exposition) = gateway.get("/metrics").await;
    assert_eq!(
        value_of(
            &exposition,
            "toolcall_namespace_bulkhead_in_use{namespace=\"lively\"}"
        ),
        Some(0.0),
        "{exposition}"
    );
}
