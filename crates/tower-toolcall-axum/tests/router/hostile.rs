//! The gateway against hostile or careless clients: disconnects, other content types, slow
//! and idle sockets, floods of calls, and headers and ids made to confuse it.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tower_toolcall_axum::{serve, ServeConfig};

use super::*;

/// A gateway whose tools wait for a permit of `gate` before they answer, counting their runs
/// and telling `started` when one begins; served by `serve` with `config`.
struct Parked {
    gateway: Gateway,
    started: Arc<Notify>,
    gate: Arc<Semaphore>,
}

async fn parked(router: impl FnOnce(ToolRouter) -> ToolRouter, config: ServeConfig) -> Parked {
    let stack = ToolStack::builder(registry()).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let gate = Arc::new(Semaphore::new(0));
    let tools = stacked(&stack, {
        let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
        tool_fn(move |call: ToolCall| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let (started, gate) = (started.clone(), gate.clone());
            async move {
                started.notify_one();
                gate.acquire().await.unwrap().forget();
                Ok(ToolOutput::new(json!({"run": n, "params": call.params()})))
            }
        })
    });
    let admin = AdminRouter::new(&stack, TOKEN).unwrap();
    let app = router(ToolRouter::new(stack.registry().clone(), tools).admin(admin)).into_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        serve(listener, app, config, std::future::pending())
            .await
            .unwrap()
    });
    Parked {
        gateway: Gateway {
            addr,
            runs,
            audit: Lines::default(),
            audit_log: AuditLog::with_sink(Lines::default(), 1, Redactor::default()),
        },
        started,
        gate,
    }
}

/// A POST of `body` to `path` with exactly `headers` (no content type unless given).
async fn post(gateway: &Gateway, path: &str, headers: &[(&str, &str)], body: String) -> Answer {
    let mut sender = super::connect(gateway.addr).await;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{}{path}", gateway.addr))
        .header("host", gateway.addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, HeaderValue::from_bytes(value.as_bytes()).unwrap());
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// What a raw socket reads until the server closes it, and how long that took; panics if
/// the server keeps it open past `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut read = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut read))
        .await
        .expect("the server closed the connection in time")
        .ok();
    (String::from_utf8_lossy(&read).into_owned(), start.elapsed())
}

fn raw_call(call: &ToolCall, key: &str) -> Vec<u8> {
    let body = call.to_json();
    format!(
        "POST /v1/tools/call HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{}",
        body.len(),
        body
    )
    .into_bytes()
}

#[tokio::test]
async fn a_client_that_disconnects_and_sends_again_runs_the_tool_once() {
    let parked = parked(|router| router, ServeConfig::default()).await;
    let call = create_file("s-disconnect", json!({"path": "/once.txt"}));

    // The first client sends the call and goes away while the tool runs.
    let mut first = TcpStream::connect(parked.gateway.addr).await.unwrap();
    first
        .write_all(&raw_call(&call, "disconnect-1"))
        .await
        .unwrap();
    parked.started.notified().await;
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // It sends the call again over a new connection: it joins the first one's run.
    let resend = {
        let gateway = parked.gateway.clone();
        let call = call.clone();
        tokio::spawn(async move {
            gateway
                .call(&call, &[("idempotency-key", "disconnect-1")])
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    parked.gate.add_permits(1);
    let resend = resend.await.unwrap();
    assert_eq!(resend.status, StatusCode::OK, "{}", resend.body);
    assert_eq!(resend.body["output"]["content"]["run"], 1);
    assert_eq!(parked.gateway.runs(), 1, "the tool ran once");

    // And later the result is kept.
    let later = parked
        .gateway
        .call(&call, &[("idempotency-key", "disconnect-1")])
        .await;
    assert_eq!(later.body["fromCache"], true);
    assert_eq!(later.body["output"]["content"]["run"], 1);
    assert_eq!(parked.gateway.runs(), 1);
}

#[tokio::test]
async fn only_json_bodies_are_taken() {
    let gateway = gateway().await;
    let body = || create_file("s-type", json!({"path": "/t"})).to_json();
    for refused in [
        &[("content-type", "text/plain")][..],
        &[("content-type", "application/x-www-form-urlencoded")],
        &[("content-type", "multipart/form-data; boundary=x")],
        &[("content-type", "application/jsonx")],
        &[],
    ] {
        let answer = post(&gateway, "/v1/tools/call", refused, body()).await;
        assert_eq!(
            answer.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{refused:?}"
        );
        assert_eq!(answer.body["error"]["code"], "VALIDATION_ERROR");
        assert_eq!(answer.body["error"]["details"]["field"], "content-type");
    }
    assert_eq!(gateway.runs(), 0, "no other content type reached a tool");
    for taken in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.toolcall+json",
    ] {
        let call = create_file(&format!("s-type-{taken}"), json!({"path": "/t"}));
        let body = call.to_json();
        let answer = post(&gateway, "/v1/tools/call", &[("content-type", taken)], body).await;
        assert_eq!(answer.status, StatusCode::OK, "{taken}: {}", answer.body);
    }
    assert_eq!(gateway.runs(), 4);
}

#[tokio::test]
async fn slow_and_idle_connections_are_closed() {
    let timeout = Duration::from_millis(300);
    let parked = parked(
        |router| router.body_timeout(timeout),
        ServeConfig::default().header_read_timeout(timeout),
    )
    .await;
    let addr = parked.gateway.addr;

    // A connection that sends nothing.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let (_, took) = read_until_closed(&mut idle, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");

    // Headers that never end.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /v1/tools/call HTTP/1.1\r\nhost: gateway\r\n")
        .await
        .unwrap();
    read_until_closed(&mut slow, Duration::from_secs(3)).await;

    // A body that never ends: 408, then closed.
    let mut body = TcpStream::connect(addr).await.unwrap();
    body.write_all(
        b"POST /v1/tools/call HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
          content-length: 1000\r\n\r\n{\"contractVersion\"",
    )
    .await
    .unwrap();
    let (answer, _) = read_until_closed(&mut body, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"TIMEOUT\""), "{answer}");

    // A keep-alive connection left idle after its answer.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /v1/tools HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut kept, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(parked.gateway.runs(), 0);
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let parked = parked(|router| router, ServeConfig::default().max_connections(1)).await;
    let addr = parked.gateway.addr;
    let holder = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut waiting = TcpStream::connect(addr).await.unwrap();
    waiting
        .write_all(b"GET /v1/tools HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), waiting.read(&mut first)).await;
    assert!(early.is_err(), "served while the only slot was taken");

    drop(holder);
    let (answer, _) = read_until_closed(&mut waiting, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn calls_over_the_limit_are_refused_at_once_with_retry_after() {
    let parked = parked(
        |router| router.max_calls_in_flight(2),
        ServeConfig::default(),
    )
    .await;
    let mut running = Vec::new();
    for n in 0..2 {
        let gateway = parked.gateway.clone();
        running.push(tokio::spawn(async move {
            gateway
                .call(&create_file("s-busy", json!({"path": n})), &[])
                .await
        }));
        parked.started.notified().await;
    }

    let start = Instant::now();
    let refused = parked
        .gateway
        .call(&create_file("s-busy", json!({"path": "third"})), &[])
        .await;
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["error"]["code"], "UPSTREAM_UNAVAILABLE");
    assert_eq!(refused.body["error"]["retryAfterMs"], 1000);
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(
        parked.gateway.runs(),
        2,
        "the third call did not reach the tool"
    );

    parked.gate.add_permits(2);
    for call in running {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    parked.gate.add_permits(1);
    let after = parked
        .gateway
        .call(&create_file("s-busy", json!({"path": "fourth"})), &[])
        .await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    assert_eq!(parked.gateway.runs(), 3);
}

#[tokio::test]
async fn headers_and_ids_made_to_confuse_are_refused_naming_the_field() {
    let gateway = gateway().await;
    let json_type = ("content-type", "application/json");
    let call = create_file("s-confuse", json!({"path": "/c"}));
    let body = || call.to_json();

    let two_keys = post(
        &gateway,
        "/v1/tools/call",
        &[
            json_type,
            ("idempotency-key", "a"),
            ("idempotency-key", "b"),
        ],
        body(),
    )
    .await;
    assert_eq!(two_keys.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        two_keys.body["error"]["details"]["field"],
        "idempotency-key"
    );

    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let two_parents = post(
        &gateway,
        "/v1/tools/call",
        &[json_type, ("traceparent", parent), ("traceparent", parent)],
        body(),
    )
    .await;
    assert_eq!(two_parents.status, StatusCode::BAD_REQUEST);
    assert_eq!(two_parents.body["error"]["details"]["field"], "traceparent");

    let long = "0".repeat(600);
    let long_parent = post(
        &gateway,
        "/v1/tools/call",
        &[json_type, ("traceparent", &long)],
        body(),
    )
    .await;
    assert_eq!(long_parent.status, StatusCode::BAD_REQUEST);
    assert_eq!(long_parent.body["error"]["details"]["field"], "traceparent");

    let mut in_body = serde_json::to_value(&call).unwrap();
    in_body["trace"] = json!({"traceparent": long});
    let answer = post(
        &gateway,
        "/v1/tools/call",
        &[json_type],
        in_body.to_string(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.body["error"]["details"]["field"],
        "trace.traceparent"
    );

    for (path, id) in [
        (&["target", "sessionKey"][..], "s\r\nx-forged: 1"),
        (&["target", "actorId"], "user\u{0}1"),
        (&["requestId"], "r\n1"),
        (&["payload", "idempotencyKey"], "k\r1"),
    ] {
        let mut bad = serde_json::to_value(&call).unwrap();
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut bad;
        for member in parents {
            at = &mut at[*member];
        }
        at[*last] = json!(id);
        let answer = post(&gateway, "/v1/tools/call", &[json_type], bad.to_string()).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{path:?}: {}",
            answer.body
        );
        assert_eq!(answer.body["error"]["details"]["field"], path.join("."));
    }
    assert_eq!(gateway.runs(), 0);

    // A body's `dedupeMode: disabled` does not switch the tool's deduplication off.
    let mut disabled = serde_json::to_value(&call).unwrap();
    disabled["transport"] = json!({"dedupeMode": "disabled"});
    for _ in 0..2 {
        let answer = post(
            &gateway,
            "/v1/tools/call",
            &[json_type, ("idempotency-key", "confuse-1")],
            disabled.to_string(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    assert_eq!(gateway.runs(), 1, "the key held");
}

#[tokio::test]
async fn the_admin_api_refuses_keys_no_tool_has_and_an_unscoped_flush() {
    let gateway = gateway().await;
    let long = format!("tool:vault::{}", "x".repeat(60_000));
    for key in [
        "tool:vault::createFiel",
        "tool:vault::create%00File",
        "dependency:nowhere",
        long.as_str(),
    ] {
        let answer = gateway
            .admin(Method::POST, &format!("/breakers/{key}/force-open"), "")
            .await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{}",
            &key[..key.len().min(40)]
        );
        assert_eq!(answer.body["error"]["details"]["field"], "key");
    }
    let listed = gateway.admin(Method::GET, "/breakers", "").await;
    assert!(
        listed
            .body
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["state"] == "closed"),
        "{}",
        listed.body
    );
    let known = gateway
        .admin(Method::POST, "/breakers/dependency:vault/force-open", "")
        .await;
    assert_eq!(known.status, StatusCode::OK, "{}", known.body);

    let unscoped = gateway
        .admin(Method::POST, "/dedupe/flush", r#"{"prefix": ""}"#)
        .await;
    assert_eq!(unscoped.status, StatusCode::BAD_REQUEST);
    assert_eq!(unscoped.body["error"]["details"]["field"], "prefix");
    let all = gateway
        .admin(
            Method::POST,
            "/dedupe/flush",
            r#"{"prefix": "", "all": true}"#,
        )
        .await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
}

#[tokio::test]
async fn every_admin_path_is_refused_alike_without_the_token() {
    let gateway = gateway().await;
    let mut refusals = Vec::new();
    for (method, path) in [
        (Method::GET, "/admin/breakers"),
        (Method::GET, "/admin/no-such-route"),
        (Method::DELETE, "/admin/breakers"),
        (Method::GET, "/admin/dedupe/records/secret/deeper"),
    ] {
        let answer = gateway.send(method, path, &[], "").await;
        refusals.push((answer.status, answer.body));
    }
    assert!(
        refusals.iter().all(|refusal| *refusal == refusals[0]),
        "{refusals:?}"
    );
    assert_eq!(refusals[0].0, StatusCode::UNAUTHORIZED);
    // With the token, a path that does not exist is a 404.
    let missing = gateway.admin(Method::GET, "/no-such-route", "").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}
