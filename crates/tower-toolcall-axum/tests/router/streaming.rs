//! Streamed answers over real HTTP: server-sent chunk envelopes, reassembled by a client
//! byte for byte; and a write that a client leaves mid-stream runs to its end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tower_toolcall::envelope::{ChunkEnvelope, FinalChunk};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ResultStatus, ToolCall, ToolOutput, ToolStack};
use tower_toolcall_axum::ToolRouter;
use tower_toolcall_test::stacked;

/// The parts the tool streams: multi-byte text, quotes, new lines and an empty part.
const PARTS: [&str; 6] = [
    "Tower ",
    "layers\ncompose: ",
    "«guillemets» ",
    "",
    "\"quoted\" 😀 ",
    "data: not an event\n\n",
];

struct Streaming {
    addr: SocketAddr,
    finished: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
}

async fn streaming_gateway() -> Streaming {
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new("docs", "summarize", RiskLevel::ReadOnly).with_streaming(true))
        .tool(ToolDescriptor::new("pay", "charge", RiskLevel::Writes).with_streaming(true))
        .tool(ToolDescriptor::new("web", "search", RiskLevel::ReadOnly))
        .build()
        .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let finished = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let (done, counted) = (finished.clone(), runs.clone());
    let tools = stacked(
        &stack,
        tool_fn(move |call: ToolCall| {
            let done = done.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut whole = String::new();
                match call.tool_name() {
                    "summarize" => {
                        for part in PARTS {
                            call.chunks().send(json!(part));
                            whole.push_str(part);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                    "charge" => {
                        call.chunks().send(json!("charging "));
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        call.chunks().send(json!("charged"));
                        whole.push_str("charging charged");
                    }
                    _ => whole.push_str("hits"),
                }
                done.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::new(json!(whole)))
            }
        }),
    );
    let app = ToolRouter::new(stack.registry().clone(), tools).into_router();
    let addr = super::serve_on_loopback(app).await;
    Streaming {
        addr,
        finished,
        runs,
    }
}

/// One server-sent event: its `event` and its `data`.
#[derive(Debug)]
struct Event {
    kind: String,
    data: String,
}

/// The events of an SSE body, by the format's rules (fields per line, events split by a
/// blank line, comment lines ignored).
fn events(body: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (mut kind, mut data) = (String::from("message"), Vec::new());
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                kind = value.trim_start().to_owned();
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push(value.strip_prefix(' ').unwrap_or(value).to_owned());
            }
        }
        if !data.is_empty() {
            events.push(Event {
                kind,
                data: data.join("\n"),
            });
        }
    }
    events
}

impl Streaming {
    async fn post(&self, body: String, accept: Option<&str>) -> (StatusCode, String, String) {
        let mut sender = super::connect(self.addr).await;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/v1/tools/call", self.addr))
            .header("host", self.addr.to_string())
            .header("content-type", "application/json");
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = sender
            .send_request(
                request
                    .body(Full::new(axum::body::Bytes::from(body)))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let kind = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, kind, String::from_utf8(bytes.to_vec()).unwrap())
    }
}

fn summarize(prefer_streaming: bool) -> String {
    let mut call = json!({
        "contractVersion": "1.1",
        "requestId": "req-stream-1",
        "toolName": "summarize",
        "toolNamespace": "docs",
        "target": {"sessionKey": "s-1", "actorId": "u-1"},
        "payload": {"version": "1.0", "params": {"doc": "tower"}}
    });
    if prefer_streaming {
        call["payload"]["callHints"] = json!({"preferStreaming": true});
    }
    call.to_string()
}

/// Checks the events of one streamed answer and returns the text its chunks make.
fn reassembled(body: &str) -> (String, FinalChunk) {
    let events = events(body);
    let (last, chunks) = events.split_last().expect("at least the result");
    let mut text = String::new();
    for (n, event) in chunks.iter().enumerate() {
        assert_eq!(event.kind, "chunk");
        let chunk: ChunkEnvelope = serde_json::from_str(&event.data).unwrap();
        assert_eq!(chunk.status, ResultStatus::Partial);
        assert!(chunk.is_streaming && !chunk.final_chunk);
        assert_eq!(chunk.chunk_index as usize, n);
        assert_eq!(chunk.request_id, "req-stream-1");
        text.push_str(chunk.output.content.as_str().unwrap());
    }
    assert_eq!(last.kind, "result");
    let last: FinalChunk = serde_json::from_str(&last.data).unwrap();
    assert!(last.final_chunk && !last.is_streaming);
    assert_eq!(last.chunk_index as usize, chunks.len());
    (text, last)
}

#[tokio::test]
async fn an_event_stream_carries_each_chunk_then_the_whole_result() {
    let gateway = streaming_gateway().await;
    let (status, kind, body) = gateway
        .post(summarize(false), Some("text/event-stream"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kind, "text/event-stream");
    let (text, last) = reassembled(&body);
    let whole: String = PARTS.concat();
    assert_eq!(
        text.as_bytes(),
        whole.as_bytes(),
        "reassembled byte for byte"
    );
    assert_eq!(last.result.status, ResultStatus::Success);
    assert_eq!(last.result.output.unwrap().content, json!(whole));
    assert_eq!(last.result.streamed.unwrap().chunks, PARTS.len() as u32);
}

#[tokio::test]
async fn prefer_streaming_in_the_call_hints_asks_for_the_stream_too() {
    let gateway = streaming_gateway().await;
    let (_, kind, body) = gateway.post(summarize(true), None).await;
    assert_eq!(kind, "text/event-stream");
    let (text, _) = reassembled(&body);
    assert_eq!(text, PARTS.concat());
}

#[tokio::test]
async fn a_caller_that_asks_for_no_stream_gets_the_whole_result_as_json() {
    let gateway = streaming_gateway().await;
    let (status, kind, body) = gateway.post(summarize(false), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kind, "application/json");
    let result: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(result["output"]["content"], json!(PARTS.concat()));
    assert!(result.get("streamed").is_none(), "{result}");
}

#[tokio::test]
async fn a_refused_call_streams_its_refusal_as_the_last_envelope() {
    let gateway = streaming_gateway().await;
    let body = json!({
        "contractVersion": "1.1", "requestId": "req-stream-1", "toolName": "summarize",
        "toolNamespace": "docs", "target": {"sessionKey": "s-1", "actorId": "u-1"},
        "payload": {"version": "1.0", "params": {"doc": "tower"}},
        "control": {"deadlineAtMs": 1}
    });
    let (_, _, body) = gateway
        .post(body.to_string(), Some("text/event-stream"))
        .await;
    let (text, last) = reassembled(&body);
    assert!(text.is_empty());
    assert_eq!(last.result.error.unwrap().code.as_str(), "TIMEOUT");
    assert_eq!(gateway.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_listing_says_which_tools_stream() {
    let gateway = streaming_gateway().await;
    let mut sender = super::connect(gateway.addr).await;
    let request = Request::builder()
        .uri(format!("http://{}/v1/tools", gateway.addr))
        .header("host", gateway.addr.to_string())
        .body(Full::new(axum::body::Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let listing: Value = serde_json::from_slice(&bytes).unwrap();
    let supported = |name: &str| {
        listing["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap()["capabilities"]["streaming"]["supported"]
            .clone()
    };
    assert_eq!(supported("summarize"), json!(true));
    assert_eq!(supported("search"), json!(false));
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_does_not_stop_a_write() {
    let gateway = streaming_gateway().await;
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let body = json!({
        "contractVersion": "1.1", "requestId": "req-pay-1", "toolName": "charge",
        "toolNamespace": "pay", "target": {"sessionKey": "s-1", "actorId": "u-1"},
        "payload": {"version": "1.0", "params": {"amount": 5}, "idempotencyKey": "pay-1"}
    });
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{}/v1/tools/call", gateway.addr))
        .header("host", gateway.addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Full::new(axum::body::Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("charging"));
    // The client goes away after the first chunk.
    drop(body);
    drop(sender);
    connection.abort();
    assert_eq!(gateway.finished.load(Ordering::SeqCst), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while gateway.finished.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the write never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A re-send with the key gets the result the write kept, without running it again.
    let body = json!({
        "contractVersion": "1.1", "requestId": "req-pay-2", "toolName": "charge",
        "toolNamespace": "pay", "target": {"sessionKey": "s-1", "actorId": "u-1"},
        "payload": {"version": "1.0", "params": {"amount": 5}, "idempotencyKey": "pay-1"}
    });
    let (_, _, answer) = gateway.post(body.to_string(), None).await;
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["fromCache"], true);
    assert_eq!(answer["output"]["content"], "charging charged");
    assert_eq!(gateway.runs.load(Ordering::SeqCst), 1);
}
