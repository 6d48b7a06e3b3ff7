//! The tool router over real HTTP: a server on a bound loopback port, a hyper client.

mod hostile;
mod rollout;
mod streaming;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{AuditLog, AuditSink, AuditStream, Redactor};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};
use tower_toolcall_axum::{AdminRouter, ToolRouter};
use tower_toolcall_test::{capture, stacked};

const TOKEN: &str = "test-admin-token-0123456789";

fn registry() -> ToolRegistry {
    ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true,
             "description": "Searches the web.",
             "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
            {"namespace": "vault", "name": "createFile", "risk": "writes",
             "policy": {"retry": "off", "breaker": {"consecutive_failures": 2}}}
        ]}"#,
    )
    .unwrap()
}

/// Lines the audit log wrote, by stream.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<(AuditStream, Value)>>>);

impl AuditSink for Lines {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> std::io::Result<()> {
        let value = serde_json::from_slice(line).unwrap();
        self.0.lock().unwrap().push((stream, value));
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serves `app` on a free port of 127.0.0.1; its address.
async fn serve_on_loopback(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// An HTTP/1 connection to `addr`, driven on a task of its own.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// A gateway on 127.0.0.1, its tools counting their runs.
#[derive(Clone)]
struct Gateway {
    addr: SocketAddr,
    runs: Arc<AtomicUsize>,
    audit: Lines,
    audit_log: AuditLog,
}

async fn gateway() -> Gateway {
    let stack = ToolStack::builder(registry()).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let tools = stacked(
        &stack,
        tool_fn(move |call: ToolCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                match (call.tool_name(), call.params().as_map().get("fail")) {
                    (_, Some(_)) => Err(ToolError::from_http_status(503, "down")),
                    ("search", _) => Ok(ToolOutput::new(json!({"hits": [call.params()]}))),
                    ("createFile", _) => Ok(ToolOutput::new(json!({"created": true}))),
                    (other, _) => Err(ToolError::invalid_field(
                        "toolName",
                        format!("is unknown: {other}"),
                    )),
                }
            }
        }),
    );
    let audit = Lines::default();
    let audit_log = AuditLog::with_sink(audit.clone(), 1024, Redactor::default());
    let admin = AdminRouter::new(&stack, TOKEN)
        .unwrap()
        .audit(audit_log.clone());
    let app = ToolRouter::new(stack.registry().clone(), tools)
        .body_limit(16 * 1024)
        .admin(admin)
        .into_router();
    let addr = serve_on_loopback(app).await;
    Gateway {
        addr,
        runs,
        audit,
        audit_log,
    }
}

/// What the server answered.
struct Answer {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Value,
}

impl Gateway {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        let mut sender = connect(self.addr).await;
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("host", self.addr.to_string())
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, HeaderValue::from_str(value).unwrap());
        }
        let response = sender
            .send_request(request.body(Full::new(body.into())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn call(&self, call: &ToolCall, headers: &[(&str, &str)]) -> Answer {
        self.send(Method::POST, "/v1/tools/call", headers, call.to_json())
            .await
    }

    async fn admin(&self, method: Method, path: &str, body: &str) -> Answer {
        let auth = format!("Bearer {TOKEN}");
        self.send(
            method,
            &format!("/admin{path}"),
            &[("authorization", &auth)],
            body.to_owned(),
        )
        .await
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn search(session: &str, query: &str) -> ToolCall {
    ToolCall::builder("web", "search")
        .session(session)
        .actor("user-1")
        .params(json!({"query": query}))
        .build()
        .unwrap()
}

fn create_file(session: &str, params: Value) -> ToolCall {
    ToolCall::builder("vault", "createFile")
        .session(session)
        .actor("user-1")
        .params(params)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_duplicate_with_the_same_idempotency_key_is_answered_from_the_cache() {
    let gateway = gateway().await;
    let key = [("idempotency-key", "\"create-report-1\"")];
    let first = gateway
        .call(&create_file("s-dup", json!({"path": "/r.txt"})), &key)
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(first.body["status"], "success");
    assert_eq!(first.body["fromCache"], false);
    // another request id, the same key and params: the same operation
    let second = gateway
        .call(&create_file("s-dup", json!({"path": "/r.txt"})), &key)
        .await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(second.body["fromCache"], true);
    assert_eq!(second.body["output"], first.body["output"]);
    assert_eq!(gateway.runs(), 1, "the tool ran once");
}

#[tokio::test]
async fn header_and_body_keys_that_disagree_are_a_bad_request() {
    let gateway = gateway().await;
    let mut call = create_file("s-keys", json!({"path": "/a"}));
    call.envelope_mut().payload.idempotency_key = Some("body-key".to_owned());
    let answer = gateway
        .call(&call, &[("idempotency-key", "\"header-key\"")])
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.body["error"]["code"], "VALIDATION_ERROR");
    assert_eq!(
        answer.body["error"]["details"]["field"],
        "payload.idempotencyKey"
    );
    assert_eq!(answer.body["requestId"], call.request_id());
    assert_eq!(answer.body["attempts"], 0);
    // the same key in both is fine
    let same = gateway
        .call(&call, &[("idempotency-key", "body-key")])
        .await;
    assert_eq!(same.status, StatusCode::OK, "{}", same.body);
    assert_eq!(gateway.runs(), 1);
}

#[tokio::test]
async fn the_fourth_identical_call_is_a_loop() {
    let gateway = gateway().await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        let answer = gateway.call(&search("s-loop", "same"), &[]).await;
        answers.push((
            answer.status,
            answer.body["fromCache"].clone(),
            answer.body["error"]["code"].clone(),
        ));
    }
    assert_eq!(
        answers,
        [
            (StatusCode::OK, json!(false), Value::Null),
            (StatusCode::OK, json!(false), Value::Null),
            (StatusCode::OK, json!(false), Value::Null),
            (StatusCode::CONFLICT, json!(false), json!("LOOP_DETECTED")),
        ]
    );
    // A finished read runs again (a derived key does not serve it from the record); the
    // fourth, stopped, never ran.
    assert_eq!(gateway.runs(), 3);
}

#[tokio::test]
async fn a_malformed_body_is_a_bad_request_naming_the_field() {
    let gateway = gateway().await;
    let mut body = serde_json::to_value(search("s-bad", "q")).unwrap();
    body["target"].as_object_mut().unwrap().remove("sessionKey");
    let answer = gateway
        .send(Method::POST, "/v1/tools/call", &[], body.to_string())
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.body["status"], "error");
    assert_eq!(answer.body["error"]["code"], "VALIDATION_ERROR");
    assert_eq!(
        answer.body["error"]["details"]["field"],
        "target.sessionKey"
    );
    assert!(answer.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`target.sessionKey`"));
    assert_eq!(answer.body["toolName"], "search");

    let not_json = gateway
        .send(Method::POST, "/v1/tools/call", &[], "{\"toolName\": ")
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert!(not_json.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    let too_large = gateway
        .send(Method::POST, "/v1/tools/call", &[], vec![b' '; 32 * 1024])
        .await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.body["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(gateway.runs(), 0);
}

#[tokio::test]
async fn a_breaker_forced_open_through_the_admin_api_answers_503_with_retry_after() {
    let (capture, _guard) = capture::capture();
    let gateway = gateway().await;
    let forced = gateway
        .admin(
            Method::POST,
            "/breakers/tool:vault::createFile/force-open",
            "",
        )
        .await;
    assert_eq!(forced.status, StatusCode::OK, "{}", forced.body);
    assert_eq!(forced.body["state"], "forced_open");
    assert_eq!(
        forced.body["key"],
        json!({"scope": "tool", "namespace": "vault", "name": "createFile"})
    );

    let refused = gateway
        .call(&create_file("s-open", json!({"path": "/x"})), &[])
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["error"]["code"], "CIRCUIT_OPEN");
    assert_eq!(refused.headers["retry-after"], "30");
    assert_eq!(refused.body["error"]["retryAfterMs"], 30_000);
    assert_eq!(gateway.runs(), 0);

    let listed = gateway.admin(Method::GET, "/breakers", "").await;
    assert_eq!(listed.body[0]["state"], "forced_open");
    let reset = gateway
        .admin(Method::POST, "/breakers/tool:vault::createFile/reset", "")
        .await;
    assert_eq!(reset.body["reset"], true);
    let read = gateway
        .admin(Method::GET, "/breakers/tool:vault::createFile", "")
        .await;
    assert_eq!(read.body["state"], "closed");
    let ok = gateway
        .call(&create_file("s-open", json!({"path": "/x"})), &[])
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);

    // every change went to the audit log
    gateway.audit_log.shutdown();
    let changes: Vec<Value> = gateway
        .audit
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(stream, line)| *stream == AuditStream::Events && line["type"] == "admin.change")
        .map(|(_, line)| line["payload"]["action"].clone())
        .collect();
    assert_eq!(changes, [json!("force_open"), json!("reset")]);
    // and to the log, at INFO
    let logged: Vec<(String, String)> = capture
        .events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::INFO && e.fields.contains_key("target_of_change"))
        .map(|e| {
            (
                e.fields["message"].clone(),
                e.fields["target_of_change"].clone(),
            )
        })
        .collect();
    assert_eq!(
        logged,
        [
            (
                "breaker forced open".to_owned(),
                "tool:vault::createFile".to_owned()
            ),
            (
                "breaker reset".to_owned(),
                "tool:vault::createFile".to_owned()
            ),
        ]
    );
}

#[tokio::test]
async fn a_breaker_opened_by_failures_tells_when_to_come_back() {
    let gateway = gateway().await;
    for n in 0..2 {
        let failed = gateway
            .call(&create_file("s-fail", json!({"fail": n})), &[])
            .await;
        assert_eq!(
            failed.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            failed.body
        );
        assert_eq!(failed.body["error"]["code"], "UPSTREAM_UNAVAILABLE");
    }
    let refused = gateway
        .call(&create_file("s-fail", json!({"fail": 3})), &[])
        .await;
    assert_eq!(refused.body["error"]["code"], "CIRCUIT_OPEN");
    let after_ms = refused.body["error"]["retryAfterMs"].as_u64().unwrap();
    assert!(after_ms > 0 && after_ms <= 30_000, "{after_ms}");
    let seconds: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(seconds, after_ms.div_ceil(1000));
    assert_eq!(gateway.runs(), 2);
}

#[tokio::test]
async fn the_admin_api_needs_the_right_token() {
    let gateway = gateway().await;
    let none = gateway.send(Method::GET, "/admin/breakers", &[], "").await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    let wrong = gateway
        .send(
            Method::GET,
            "/admin/breakers",
            &[("authorization", "Bearer test-admin-token-0123456788")],
            "",
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let forced = gateway
        .send(
            Method::POST,
            "/admin/breakers/tool:web::search/force-open",
            &[("authorization", "Bearer nope")],
            "",
        )
        .await;
    assert_eq!(forced.status, StatusCode::UNAUTHORIZED);
    let right = gateway.admin(Method::GET, "/breakers", "").await;
    assert_eq!(right.status, StatusCode::OK);
    let states: Vec<&Value> = right
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["state"])
        .collect();
    assert!(
        states.iter().all(|s| *s == "closed"),
        "the refused force-open changed nothing: {states:?}"
    );
}

#[tokio::test]
async fn the_tools_are_listed_with_schemas_and_capabilities() {
    let gateway = gateway().await;
    let answer = gateway.send(Method::GET, "/v1/tools", &[], "").await;
    assert_eq!(answer.status, StatusCode::OK);
    let tools = answer.body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2);
    let by_name = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    let search = by_name("search");
    assert_eq!(search["namespace"], "web");
    assert_eq!(search["name"], "search");
    assert_eq!(search["risk"], "read-only");
    assert_eq!(
        search["inputSchema"]["properties"]["query"]["type"],
        "string"
    );
    let capabilities = &search["capabilities"];
    assert_eq!(capabilities["idempotency"]["enabled"], true);
    assert_eq!(capabilities["idempotency"]["idempotent"], true);
    assert_eq!(capabilities["caching"]["enabled"], true);
    assert_eq!(capabilities["retry"]["enabled"], true);
    assert_eq!(capabilities["streaming"]["supported"], false);
    assert!(capabilities["timeout"].is_object());
    assert_eq!(
        by_name("createFile")["capabilities"]["retry"]["enabled"],
        false
    );
}

#[tokio::test]
async fn switches_loop_sessions_and_dedupe_records_through_the_admin_api() {
    let gateway = gateway().await;
    let switches = gateway.admin(Method::GET, "/switches", "").await;
    assert_eq!(switches.body["enabled"], true);
    assert_eq!(switches.body["shadow"]["breaker"], false);
    let changed = gateway
        .admin(
            Method::PUT,
            "/switches",
            r#"{"openMode": false, "shadow": {"loop_detect": true}}"#,
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    assert_eq!(changed.body["openMode"], false);
    assert_eq!(changed.body["shadow"]["loop_detect"], true);
    let bad = gateway
        .admin(Method::PUT, "/switches", r#"{"shadow": {"retry": true}}"#)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.body["error"]["details"]["field"], "shadow.retry");
    let unknown = gateway
        .admin(Method::PUT, "/switches", r#"{"enabled": "no"}"#)
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown.body["error"]["details"]["field"], "enabled");

    // loop detection in shadow mode: the fourth identical call runs
    for _ in 0..4 {
        let answer = gateway.call(&search("s-admin", "again"), &[]).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    let session = gateway.admin(Method::GET, "/loops/s-admin", "").await;
    assert_eq!(session.status, StatusCode::OK);
    assert_eq!(session.body["session"], "s-admin");
    let reset = gateway
        .admin(Method::POST, "/loops/s-admin/reset", "")
        .await;
    assert_eq!(reset.body["reset"], true);

    // a dedupe record, read by its store key and flushed by prefix
    let call = create_file("s-admin", json!({"path": "/d"}));
    gateway.call(&call, &[("idempotency-key", "d-1")]).await;
    let key = "/vault::createFile/s/s-admin/user-1/d-1";
    let record = gateway
        .admin(
            Method::GET,
            &format!("/dedupe/records?key={}", key.replace('/', "%2F")),
            "",
        )
        .await;
    assert_eq!(record.status, StatusCode::OK, "{}", record.body);
    assert_eq!(record.body["record"]["state"], "done");
    let fingerprint = record.body["fingerprint"].as_str().unwrap().to_owned();
    assert_eq!(fingerprint.len(), 16);
    let by_fingerprint = gateway
        .admin(Method::GET, &format!("/dedupe/records/{fingerprint}"), "")
        .await;
    assert_eq!(
        by_fingerprint.status,
        StatusCode::OK,
        "{}",
        by_fingerprint.body
    );
    assert_eq!(by_fingerprint.body["record"], record.body["record"]);
    // the fingerprint a cached result shows finds its record
    let cached = gateway.call(&call, &[("idempotency-key", "d-1")]).await;
    assert_eq!(cached.body["fromCache"], true);
    assert_eq!(cached.body["cache"]["keyFingerprint"], fingerprint.as_str());
    let flushed = gateway
        .admin(Method::POST, "/dedupe/flush", r#"{"prefix": "/"}"#)
        .await;
    assert!(
        flushed.body["deleted"].as_u64().unwrap() >= 1,
        "{}",
        flushed.body
    );
    let gone = gateway
        .admin(
            Method::GET,
            &format!("/dedupe/records?key={}", key.replace('/', "%2F")),
            "",
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_traceparent_header_becomes_the_calls_trace_parent() {
    let seen = Arc::new(Mutex::new(None));
    let seen_by_tool = seen.clone();
    let stack = ToolStack::builder(registry()).build().unwrap();
    let tools = stacked(
        &stack,
        tool_fn(move |call: ToolCall| {
            *seen_by_tool.lock().unwrap() = call.trace().traceparent.clone();
            async { Ok(ToolOutput::new(json!(null))) }
        }),
    );
    let app = ToolRouter::new(stack.registry().clone(), tools).into_router();
    let addr = serve_on_loopback(app).await;
    let gateway = Gateway {
        addr,
        runs: Arc::default(),
        audit: Lines::default(),
        audit_log: AuditLog::with_sink(Lines::default(), 1, Redactor::default()),
    };
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = gateway
        .call(&search("s-trace", "q"), &[("traceparent", parent)])
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(seen.lock().unwrap().as_deref(), Some(parent));
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_the_call_in_flight_finish() {
    let started = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicUsize::new(0));
    let stack = ToolStack::builder(registry()).build().unwrap();
    let tools = stacked(&stack, {
        let (started, finished) = (started.clone(), finished.clone());
        tool_fn(move |_call: ToolCall| {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.notify_one();
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::new(json!({"report": "done"})))
            }
        })
    });
    let app = ToolRouter::new(stack.registry().clone(), tools).into_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                stopped.await.ok();
            })
            .await
    });
    let gateway = Gateway {
        addr,
        runs: Arc::default(),
        audit: Lines::default(),
        audit_log: AuditLog::with_sink(Lines::default(), 1, Redactor::default()),
    };

    let client = tokio::spawn(async move { gateway.call(&search("s-stop", "slow"), &[]).await });
    started.notified().await;
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("the server stops once the call is answered")
        .unwrap()
        .unwrap();
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "the server waited for the call in flight"
    );
    let answer = client.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["status"], "success");
    assert_eq!(answer.body["output"]["content"], json!({"report": "done"}));
}
