//! Run with: `cargo bench -p tower-toolcall-axum --bench router`, then
//! `python3 crates/tower-toolcall/benches/medians.py router bare_router` and
//! `python3 crates/tower-toolcall/benches/medians.py router_http bare_router`.
//!
//! What the whole [`ToolStack`] costs behind axum, against the bare router with the same
//! handler (a [`ToolRouter`] over the bare tool: the same extractor, envelope and status),
//! measured in one run:
//!
//! - `router`: `POST /v1/tools/call` through `tower::ServiceExt::oneshot` on the axum
//!   `Router`, no network; `bare_router` and `gateway` differ only by the stack.
//!   `tool_alone` and `stack_alone` are the same calls, already parsed, made on the tool and
//!   on the stack without the router, each on a clone of the service by `oneshot`, as the
//!   router calls its service: the stack's own cost in the same run.
//! - `router_http`: loopback HTTP/1.1 throughput. Both routers are served on 127.0.0.1:0 in
//!   this process; a load generator (hyper's client, 64 keep-alive connections opened before
//!   the measurement) sends the measured number of requests spread over the 64 connections,
//!   each connection one request after another. Criterion reports the time per request;
//!   requests per second are its inverse.
//!
//! Every request carries fresh params (a counter), so that the idempotency layer stores a
//! new record and loop detection sees a new call each time, as in the `stack` bench.

use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};
use tower_toolcall_axum::ToolRouter;

/// The offset of the template a load generator's connection fills in with its counter.
const SENTINEL: u64 = 918_273_645;

/// Concurrent connections of the load generator.
const CONNECTIONS: usize = 64;

/// The body of call `n` in `session`: about 200 bytes of params, as in the `stack` bench.
fn body(session: &str, n: u64) -> Vec<u8> {
    call(session, n).to_json().into()
}

/// Call `n` in `session`.
fn call(session: &str, n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session(session)
        .actor("user-7")
        .params(json!({
            "query": "tower middleware retry with exponential backoff",
            "limit": 10,
            "offset": n,
            "safe": true,
            "region": "eu-west-1",
            "filters": {"lang": "en", "site": "docs.rs", "after": "2024-01-01", "kind": "article"}
        }))
        .build()
        .unwrap()
}

fn bare_tool() -> impl tower::Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    tool_fn(|_call: ToolCall| std::future::ready(Ok(ToolOutput::new(Value::Null))))
}

/// The two routers: the bare tool, and the tool behind the whole stack.
fn routers() -> [(&'static str, Router); 2] {
    let registry = ToolRegistry::open();
    let bare = ToolRouter::new(registry.clone(), bare_tool()).into_router();
    let stack = ToolStack::builder(registry.clone()).build().unwrap();
    let tools = tower::Layer::layer(&stack, bare_tool());
    let gateway = ToolRouter::new(registry, tools).into_router();
    [("bare_router", bare), ("gateway", gateway)]
}

fn request(session: &str, n: u64) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/v1/tools/call")
        .header("content-type", "application/json")
        .body(Body::from(body(session, n)))
        .unwrap()
}

/// Requests built in small batches just before they are sent: warm in the cache, as a
/// request a server has just read.
const FRESH: BatchSize = BatchSize::NumIterations(64);

fn oneshot(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Built inside the runtime: the stack's timers and sweepers need one.
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("router");
    for (name, router) in routers() {
        let mut n = 0;
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    request("sess-bench", n)
                },
                |request| {
                    let response = runtime.block_on(router.clone().oneshot(request)).unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    black_box(response)
                },
                FRESH,
            )
        });
    }
    // The same calls without the router, for the stack's own cost in this run. The router
    // calls a clone of its service for each request (axum hands each request its own copy
    // of the state); so do these rows.
    let stack = ToolStack::builder(ToolRegistry::open()).build().unwrap();
    let services = [
        ("tool_alone", BoxCloneSyncService::new(bare_tool())),
        (
            "stack_alone",
            BoxCloneSyncService::new(tower::Layer::layer(&stack, bare_tool())),
        ),
    ];
    for (name, service) in services {
        let mut n = 0;
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    call("sess-bench", n)
                },
                |call| {
                    let outcome = runtime.block_on(service.clone().oneshot(call));
                    black_box(outcome.unwrap())
                },
                FRESH,
            )
        });
    }
    group.finish();
}

/// `router` served on a free loopback port.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends `requests` requests over `connections`, each one after another on its connection;
/// the connections come back for the next batch, with the time the batch took.
async fn load(
    addr: SocketAddr,
    connections: Vec<SendRequest<Full<Bytes>>>,
    requests: u64,
    counter: Arc<AtomicU64>,
) -> (Vec<SendRequest<Full<Bytes>>>, Duration) {
    let count = connections.len() as u64;
    let start = Instant::now();
    let tasks: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, mut sender)| {
            let share = requests / count + u64::from((i as u64) < requests % count);
            let counter = counter.clone();
            // The envelope is built once; each request puts its counter in the params.
            let template = String::from_utf8(body(&format!("sess-{i}"), SENTINEL)).unwrap();
            let (head, tail) = template.split_once(&SENTINEL.to_string()).unwrap();
            let (head, tail) = (head.to_owned(), tail.to_owned());
            tokio::spawn(async move {
                for _ in 0..share {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let body = format!("{head}{n}{tail}");
                    let request = Request::builder()
                        .method(Method::POST)
                        .uri(format!("http://{addr}/v1/tools/call"))
                        .header("host", "127.0.0.1")
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .unwrap();
                    sender.ready().await.unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    black_box(response.into_body().collect().await.unwrap());
                }
                sender
            })
        })
        .collect();
    let mut connections = Vec::with_capacity(tasks.len());
    for task in tasks {
        connections.push(task.await.unwrap());
    }
    (connections, start.elapsed())
}

fn http_throughput(c: &mut Criterion) {
    // Server and load generator share the runtime, as they share the machine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("router_http");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(8));
    let counter = Arc::new(AtomicU64::new(0));
    for (name, router) in routers() {
        let (addr, connections) = runtime.block_on(async {
            let addr = serve(router).await;
            let mut connections = Vec::with_capacity(CONNECTIONS);
            for _ in 0..CONNECTIONS {
                connections.push(connect(addr).await);
            }
            (addr, connections)
        });
        let mut connections = Some(connections);
        group.bench_function(name, |b| {
            b.iter_custom(|requests| {
                let (back, took) = runtime.block_on(load(
                    addr,
                    connections.take().unwrap(),
                    requests,
                    counter.clone(),
                ));
                connections = Some(back);
                took
            })
        });
    }
    group.finish();
}

criterion_group!(benches, oneshot, http_throughput);
criterion_main!(benches);
