//! The adapter over real transports: an rmcp server wrapped by `McpServer` and an
//! `McpClient` behind the stack, in process over a duplex pipe (and over streamable HTTP,
//! feature `http`). The example server's tests over stdio, with its binary as a child
//! process, are the examples package's.

mod edge;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../../examples/src/bin/mcp-example-server.rs"]
mod example;
#[cfg(feature = "http")]
mod http;
mod upstream;

use std::sync::Arc;

use example::Notes;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, Implementation, RequestMetaObject,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt as _;
use serde_json::{json, Value};
use tower::{Layer, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolRegistry};
use tower_toolcall::{ErrorCode, ToolCall, ToolStack};
use tower_toolcall_mcp::{descriptor_for, registry_for, ClientEvents, McpClient, McpServer, Trust};
use tower_toolcall_test::capture::{capture, Capture, CapturedEvent};

type Client = RunningService<RoleClient, ClientConfig>;

/// A client named `name` connected over a duplex pipe to `server`, served on its own task.
async fn connect<S: rmcp::Service<rmcp::RoleServer>>(server: S, name: &str) -> Client {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    let mut info = ClientConfig::default();
    info.client_info = Implementation::new(name, "1.0");
    info.serve(client_end)
        .await
        .expect("the MCP handshake over the pipe")
}

fn params(name: &'static str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(args.as_object().unwrap().clone())
}

fn with_meta(mut params: CallToolRequestParams, meta: Value) -> CallToolRequestParams {
    let mut object = RequestMetaObject::new();
    for (key, value) in meta.as_object().unwrap() {
        object.insert(key.clone(), value.clone());
    }
    params.meta = Some(object);
    params
}

fn error_of(result: &CallToolResult) -> (&str, &str) {
    assert_eq!(result.is_error, Some(true), "an error result: {result:?}");
    assert_eq!(
        result.structured_content, None,
        "no structured content on errors"
    );
    let error = &result.meta.as_ref().unwrap()[tower_toolcall_mcp::ERROR_META];
    (
        error["code"].as_str().unwrap(),
        error["message"].as_str().unwrap(),
    )
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- the server side: every tools/call through the stack ----

#[tokio::test(start_paused = true)]
async fn a_read_only_tool_is_retried_after_a_transient_failure() {
    let notes = Notes::default();
    let client = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let result = client
        .call_tool(params("search", json!({"query": "flaky"})))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(result.structured_content, Some(json!({"hits": []})));
    assert_eq!(notes.calls("search"), 2, "the failure, then the retry");
}

#[tokio::test(start_paused = true)]
async fn a_destructive_tool_without_confirmation_is_refused() {
    let notes = Notes::default();
    let client = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let refused = client
        .call_tool(params("delete", json!({"id": "n1"})))
        .await
        .unwrap();
    let (code, message) = error_of(&refused);
    assert_eq!(code, "POLICY_DENIED");
    assert!(message.contains("confirmationId"), "{message}");
    assert!(
        text_of(&refused).starts_with("POLICY_DENIED: "),
        "{}",
        text_of(&refused)
    );
    assert_eq!(notes.calls("delete"), 0, "the tool never ran");

    let confirmed = client
        .call_tool(with_meta(
            params("delete", json!({"id": "n1"})),
            json!({"confirmationId": "approval-7"}),
        ))
        .await
        .unwrap();
    assert_ne!(confirmed.is_error, Some(true), "{confirmed:?}");
    assert_eq!(notes.calls("delete"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_meta_idempotency_key_is_answered_once() {
    let notes = Notes::default();
    let client = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let put = || {
        with_meta(
            params("put", json!({"id": "n1", "text": "buy milk"})),
            json!({"idempotencyKey": "put-n1-1"}),
        )
    };
    let (first, second) = tokio::join!(client.call_tool(put()), client.call_tool(put()));
    let third = client.call_tool(put()).await.unwrap();
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(notes.calls("put"), 1, "three requests, one run");
    assert_eq!(first.structured_content, Some(json!({"notes": 1})));
    assert_eq!(second.structured_content, first.structured_content);
    assert_eq!(third.structured_content, first.structured_content);

    let reused = client
        .call_tool(with_meta(
            params("put", json!({"id": "n1", "text": "other"})),
            json!({"idempotencyKey": "put-n1-1"}),
        ))
        .await
        .unwrap();
    assert_eq!(error_of(&reused).0, "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(notes.calls("put"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_loop_is_stopped_and_the_model_reads_why() {
    let notes = Notes::default();
    let client = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let mut results = Vec::new();
    for _ in 0..4 {
        results.push(
            client
                .call_tool(params("search", json!({"query": "milk"})))
                .await
                .unwrap(),
        );
    }
    for result in &results[..3] {
        assert_ne!(result.is_error, Some(true), "{result:?}");
    }
    let (code, message) = error_of(&results[3]);
    assert_eq!(code, "LOOP_DETECTED");
    assert!(message.contains("search"), "names the tool: {message}");
    assert!(
        message.contains("change the inputs or the strategy"),
        "tells the model what to do instead: {message}"
    );
    assert!(
        text_of(&results[3]).contains("LOOP_DETECTED"),
        "the model reads the code in the text too"
    );
    assert_eq!(
        notes.calls("search"),
        3,
        "a finished read runs again (a derived key does not serve it from the record), and \
         the fourth, stopped, never ran"
    );

    // Another connection is another session: its first call runs.
    let other = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let fresh = other
        .call_tool(params("search", json!({"query": "milk"})))
        .await
        .unwrap();
    assert_ne!(fresh.is_error, Some(true), "{fresh:?}");
    assert_eq!(notes.calls("search"), 4);
}

#[tokio::test(start_paused = true)]
async fn the_envelope_carries_session_actor_key_and_traceparent() {
    let (server, seen) = edge::recorded(|server| server);
    let session = server.session_key().to_owned();
    let client = connect(server, "claude-desktop").await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    client
        .call_tool(with_meta(
            params("put", json!({"id": "n2", "text": "t"})),
            json!({"idempotencyKey": "k-42", "traceparent": traceparent}),
        ))
        .await
        .unwrap();
    client
        .call_tool(params("search", json!({"query": "t"})))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    // The request id is the session's and the JSON-RPC request's: unique, and no ULID.
    let ids: Vec<&str> = seen.iter().map(ToolCall::request_id).collect();
    for id in &ids {
        let rpc_id = id.strip_prefix(&format!("{session}-")).expect(id);
        assert!(rpc_id.parse::<u64>().is_ok(), "{id}");
    }
    assert_ne!(ids[0], ids[1]);
    let call = &seen[0];
    assert_eq!((call.tool_namespace(), call.tool_name()), ("notes", "put"));
    assert_eq!(call.session_key(), session);
    // One user without authentication; the client's name is the call's agent.
    assert_eq!(call.actor_id(), "local");
    assert_eq!(
        call.envelope().target.agent_id.as_deref(),
        Some("claude-desktop")
    );
    assert_eq!(call.idempotency_key(), Some("k-42"));
    assert_eq!(call.trace().traceparent.as_deref(), Some(traceparent));
    assert_eq!(call.params().as_map()["text"], "t");
}

#[tokio::test(start_paused = true)]
async fn requests_other_than_tools_call_reach_the_handler_untouched() {
    let client = connect(example::stacked(Notes::default(), None).unwrap(), "agent").await;
    let listed = client.list_all_tools().await.unwrap();
    assert_eq!(listed, Notes::tools());
}

// ---- annotations as policy, and the operator's file over them ----

#[test]
fn the_annotations_become_the_policy() {
    let tools = Notes::tools();
    let trusted = registry_for("notes", &tools, Trust::Trusted, None).unwrap();
    let policy = |registry: &ToolRegistry, name: &str| {
        let d = registry.get("notes", name).unwrap().descriptor().clone();
        (d.risk, d.idempotent, d.confirmation_required)
    };
    assert_eq!(
        policy(&trusted, "search"),
        (RiskLevel::ReadOnly, false, false)
    );
    assert_eq!(policy(&trusted, "put"), (RiskLevel::Writes, true, false));
    assert_eq!(
        policy(&trusted, "delete"),
        (RiskLevel::Commands, false, true)
    );
    let search = trusted.get("notes", "search").unwrap();
    assert!(search.has_input_schema() && search.has_output_schema());

    // An untrusted server's annotations relax nothing: its writes are confirmed, never
    // retried after they may have acted; its read runs at once but is never answered from
    // an earlier call (its re-send window is 0) and is retried only as a write is.
    let untrusted = registry_for("notes", &tools, Trust::Untrusted, None).unwrap();
    for name in ["put", "delete"] {
        assert_eq!(
            policy(&untrusted, name),
            (RiskLevel::Commands, false, true),
            "{name}"
        );
    }
    assert_eq!(
        policy(&untrusted, "search"),
        (RiskLevel::Writes, false, false)
    );
    let search = untrusted.get("notes", "search").unwrap().descriptor();
    assert!(!search.repeat_is_safe());
    let tower_toolcall::registry::LayerSetting::On(idempotency) = &search.policy.idempotency else {
        panic!(
            "an untrusted read has a policy of its own: {:?}",
            search.policy
        );
    };
    assert_eq!(idempotency.resend_window_ms, Some(0));

    // No annotations: MCP's defaults (destructive, not idempotent).
    let bare = rmcp::model::Tool::new("x", "", Arc::new(serde_json::Map::new()));
    let d = descriptor_for("notes", &bare, Trust::Trusted);
    assert_eq!(
        (d.risk, d.idempotent, d.confirmation_required),
        (RiskLevel::Commands, false, true)
    );
}

const OPERATOR: &str = r#"
denied = ["notes::put"]

[[tools]]
namespace = "notes"
name = "delete"
risk = "writes"
idempotent = true

[[tools]]
namespace = "files"
name = "read"
risk = "read-only"
"#;

#[test]
fn the_registry_file_overrides_the_annotations() {
    let operator = ToolRegistry::from_toml_str(OPERATOR).unwrap();
    let registry = registry_for("notes", &Notes::tools(), Trust::Trusted, Some(&operator)).unwrap();
    let delete = registry.get("notes", "delete").unwrap();
    assert_eq!(delete.descriptor().risk, RiskLevel::Writes);
    assert!(delete.descriptor().idempotent && !delete.descriptor().confirmation_required);
    assert!(
        delete.has_input_schema(),
        "the MCP schema fills what the file leaves out"
    );
    assert_eq!(
        registry.get("notes", "search").unwrap().descriptor().risk,
        RiskLevel::ReadOnly,
        "tools the file does not name keep their annotations"
    );
    assert!(registry.is_denied("notes", "put"));
    assert!(
        registry.get("files", "read").is_some(),
        "the file's other tools stay"
    );
}

#[tokio::test(start_paused = true)]
async fn an_operator_override_changes_what_the_server_enforces() {
    let operator = ToolRegistry::from_toml_str(OPERATOR).unwrap();
    let notes = Notes::default();
    let client = connect(
        example::stacked(notes.clone(), Some(&operator)).unwrap(),
        "agent",
    )
    .await;
    let deleted = client
        .call_tool(params("delete", json!({"id": "n1"})))
        .await
        .unwrap();
    assert_ne!(
        deleted.is_error,
        Some(true),
        "no confirmation needed now: {deleted:?}"
    );
    let denied = client
        .call_tool(params("put", json!({"id": "n1", "text": "x"})))
        .await
        .unwrap();
    assert_eq!(error_of(&denied).0, "POLICY_DENIED");
    assert_eq!((notes.calls("delete"), notes.calls("put")), (1, 0));
}

// ---- the client side: a remote server's tools as a Service<ToolCall> ----

fn call(name: &str, args: Value) -> tower_toolcall::envelope::ToolCallBuilder {
    ToolCall::builder("notes", name)
        .session("agent-session")
        .actor("agent")
        .params(args)
}

#[tokio::test(start_paused = true)]
async fn the_client_stack_retries_dedupes_and_refuses_by_annotation() {
    let notes = Notes::default();
    // The bare server: whatever happens, happens in the client's stack.
    let running = connect(notes.clone(), "agent").await;
    the_stack_on_the_client_side(&notes, McpClient::new(running.peer().clone())).await;
}

/// A client behind the stack, with policy from the listed annotations, against the bare
/// server of `notes`: the read-only tool retried, the destructive one refused, a duplicate
/// key answered once, an unlisted tool not found.
async fn the_stack_on_the_client_side(notes: &Notes, client: McpClient) {
    let registry = client
        .registry("notes", Trust::Trusted, None)
        .await
        .unwrap();
    assert_eq!(
        registry.get("notes", "search").unwrap().descriptor().risk,
        RiskLevel::ReadOnly
    );
    let stack = ToolStack::builder(registry).build().unwrap();
    let tools = stack.layer(client);

    let found = tools
        .clone()
        .oneshot(call("search", json!({"query": "flaky"})).build().unwrap())
        .await
        .unwrap();
    assert_eq!(found.content, json!({"hits": []}));
    assert_eq!(
        notes.calls("search"),
        2,
        "the client retried the read-only tool"
    );

    let refused = tools
        .clone()
        .oneshot(call("delete", json!({"id": "n1"})).build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PolicyDenied);
    assert_eq!(notes.calls("delete"), 0);

    let put = || {
        call("put", json!({"id": "n1", "text": "a"}))
            .idempotency_key("p-1")
            .build()
            .unwrap()
    };
    let first = tools.clone().oneshot(put()).await.unwrap();
    let again = tools.clone().oneshot(put()).await.unwrap();
    assert!(!first.record().from_cache && again.record().from_cache);
    assert_eq!(notes.calls("put"), 1);

    let unknown = tools
        .clone()
        .oneshot(call("rename", json!({})).build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        unknown.code(),
        ErrorCode::NotFound,
        "not listed, so not registered"
    );
}

#[tokio::test(start_paused = true)]
async fn the_client_reads_a_stacked_servers_error_codes() {
    let notes = Notes::default();
    let running = connect(example::stacked(notes.clone(), None).unwrap(), "agent").await;
    let client = McpClient::new(running.peer().clone());
    // No stack on this side: the codes come from the server's stack.
    let mut loop_error = None;
    for _ in 0..4 {
        if let Err(err) = client
            .clone()
            .oneshot(call("search", json!({"query": "x"})).build().unwrap())
            .await
        {
            loop_error = Some(err);
        }
    }
    let err = loop_error.expect("the fourth repeat is stopped");
    assert_eq!(err.code(), ErrorCode::LoopDetected);
    assert!(!err.is_retriable());

    let confirmed = client
        .clone()
        .oneshot(
            call("delete", json!({"id": "n1"}))
                .confirmation_id("ok-1")
                .build()
                .unwrap(),
        )
        .await;
    assert!(
        confirmed.is_ok(),
        "the confirmation travels in _meta: {confirmed:?}"
    );
    assert_eq!(notes.calls("delete"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_closed_connection_is_a_retriable_upstream_unavailable() {
    let running = connect(Notes::default(), "agent").await;
    let client = McpClient::new(running.peer().clone());
    running.cancel().await.unwrap();
    let err = client
        .oneshot(call("search", json!({"query": "x"})).build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::UpstreamUnavailable, "{err:?}");
    assert!(err.is_retriable());
}

/// The `tool_call_progress` events captured so far.
fn progress_events(capture: &Capture) -> Vec<CapturedEvent> {
    capture
        .events()
        .into_iter()
        .filter(|e| e.fields.get("event").map(String::as_str) == Some("tool_call_progress"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_servers_progress_notifications_become_events_of_the_call() {
    let (capture, _guard) = capture();
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = example::stacked(Notes::default(), None)
            .unwrap()
            .serve(server_end)
            .await
        {
            let _ = running.waiting().await;
        }
    });
    let events = ClientEvents::default();
    let running = events.clone().serve(client_end).await.unwrap();
    let client = McpClient::new(running.peer().clone()).with_events(&events);
    let put = call("put", json!({"id": "n1", "text": "t"}))
        .build()
        .unwrap();
    let request_id = put.request_id().to_owned();
    client.oneshot(put).await.unwrap();
    // The notification precedes the response on the pipe; let its handler run.
    for _ in 0..100 {
        if !progress_events(&capture).is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let progress = progress_events(&capture);
    assert_eq!(progress.len(), 1, "{progress:?}");
    let fields = &progress[0].fields;
    assert_eq!(fields["requestId"], request_id);
    assert_eq!(fields["progress"], "1.0");
    // Not the tool's message: a chatty tool's would fill the log.
    assert_eq!(fields["message"], "tool call progress", "{fields:?}");
    assert_eq!(progress[0].level, tracing::Level::DEBUG);
}

#[tokio::test(start_paused = true)]
async fn one_breaker_per_server_when_calls_ask_for_the_dependency_scope() {
    let running = connect(Notes::default(), "agent").await;
    let client = McpClient::new(running.peer().clone());
    let registry = client
        .registry("notes", Trust::Trusted, None)
        .await
        .unwrap();
    let tools = ToolStack::builder(registry)
        .retry(|retry| {
            retry.settings(tower_toolcall::registry::RetrySettings::default().with_max_attempts(2))
        })
        .build()
        .unwrap()
        .layer(client);
    running.cancel().await.unwrap();
    let server_wide = |name: &str, args: Value| {
        call(name, args)
            .breaker_scope(tower_toolcall::BreakerScope::Dependency)
            .confirmation_id("ok")
            .build()
            .unwrap()
    };
    let mut codes = Vec::new();
    for (name, args) in [
        ("search", json!({"query": "a"})),
        ("search", json!({"query": "b"})),
        ("put", json!({"id": "1", "text": "t"})),
        ("delete", json!({"id": "1"})),
    ] {
        let err = tools
            .clone()
            .oneshot(server_wide(name, args))
            .await
            .unwrap_err();
        codes.push(err.code());
    }
    // Two attempts of each search and one of put reach the closed connection (five
    // consecutive failures of the server): its breaker opens for every tool.
    assert_eq!(
        codes,
        [
            ErrorCode::RetryExhausted,
            ErrorCode::RetryExhausted,
            ErrorCode::CircuitOpen,
            ErrorCode::CircuitOpen,
        ],
    );
}

/// A tool that waits until its request is cancelled, and counts the cancellations.
#[derive(Clone, Default)]
struct UntilCancelled(Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ServerHandler for UntilCancelled {
    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        context.ct.cancelled().await;
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(CallToolResult::success(Vec::new()).into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_cancels_its_request_on_the_server() {
    for with_progress in [false, true] {
        let tool = UntilCancelled::default();
        let (server_end, client_end) = tokio::io::duplex(64 * 1024);
        let server = tool.clone();
        tokio::spawn(async move {
            if let Ok(running) = server.serve(server_end).await {
                let _ = running.waiting().await;
            }
        });
        let events = ClientEvents::default();
        let running = events.clone().serve(client_end).await.unwrap();
        let mut client = McpClient::new(running.peer().clone());
        if with_progress {
            client = client.with_events(&events);
        }
        let slow = call("wait", json!({})).build().unwrap();
        let timed_out =
            tokio::time::timeout(std::time::Duration::from_secs(5), client.oneshot(slow)).await;
        assert!(timed_out.is_err(), "the tool waits until cancelled");
        for _ in 0..100 {
            if tool.0.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            tool.0.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the server saw the cancellation (progress events: {with_progress})"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_tools_progress_on_the_server_becomes_events_of_the_call() {
    let (capture, _guard) = capture();
    let server = example::stacked(Notes::default(), None).unwrap();
    let session = server.session_key().to_owned();
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let transport = server.progress_events(server_end);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(transport).await {
            let _ = running.waiting().await;
        }
    });
    // A bare client: every event seen is the server's.
    let client = ().serve(client_end).await.unwrap();
    let put = client
        .call_tool(params("put", json!({"id": "n1", "text": "t"})))
        .await
        .unwrap();
    assert_ne!(put.is_error, Some(true), "{put:?}");
    let progress = progress_events(&capture);
    assert_eq!(progress.len(), 1, "{progress:?}");
    let fields = &progress[0].fields;
    let request_id = &fields["requestId"];
    assert!(
        request_id.starts_with(&format!("{session}-")),
        "the call's request id, not the progress token: {request_id}"
    );
    assert_eq!(fields["progress"], "1.0");
    // Not the tool's message: a chatty tool's would fill the log.
    assert_eq!(fields["message"], "tool call progress", "{fields:?}");
    assert_eq!(progress[0].level, tracing::Level::DEBUG);
}

// ---- a call once dispatched is detached from its request ----

/// A tool that takes 10 s, or stops early when its request's cancellation token is
/// cancelled; counts the runs that started, finished and stopped.
#[derive(Clone, Default)]
struct Slow {
    started: Arc<std::sync::atomic::AtomicUsize>,
    finished: Arc<std::sync::atomic::AtomicUsize>,
    stopped: Arc<std::sync::atomic::AtomicUsize>,
}

impl Slow {
    fn count(counter: &std::sync::atomic::AtomicUsize) -> usize {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl rmcp::ServerHandler for Slow {
    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        use std::sync::atomic::Ordering::SeqCst;
        let run = self.started.fetch_add(1, SeqCst) + 1;
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(10)) => {
                self.finished.fetch_add(1, SeqCst);
                Ok(CallToolResult::structured(json!({ "run": run })).into())
            }
            () = context.ct.cancelled() => {
                self.stopped.fetch_add(1, SeqCst);
                Err(rmcp::ErrorData::internal_error("the work was cancelled", None))
            }
        }
    }
}

/// An rmcp service that drops the future of a request to the server it wraps when the
/// request is cancelled, as some transports and wrappers do.
struct DropsOnCancel<S>(S);

impl<S: rmcp::Service<rmcp::RoleServer>> rmcp::Service<rmcp::RoleServer> for DropsOnCancel<S> {
    async fn handle_request(
        &self,
        request: rmcp::model::ClientRequest,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ServerResult, rmcp::ErrorData> {
        let cancelled = context.ct.clone();
        tokio::select! {
            answer = self.0.handle_request(request, context) => answer,
            () = cancelled.cancelled() => Err(rmcp::ErrorData::internal_error("cancelled", None)),
        }
    }

    async fn handle_notification(
        &self,
        notification: rmcp::model::ClientNotification,
        context: rmcp::service::NotificationContext<rmcp::RoleServer>,
    ) -> Result<(), rmcp::ErrorData> {
        self.0.handle_notification(notification, context).await
    }

    fn get_info(&self) -> rmcp::model::ServerConfig {
        self.0.get_info()
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_or_disconnected_call_runs_once_and_its_resend_gets_the_result() {
    use rmcp::model::{CallToolRequest, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    use tower_toolcall::registry::{IdempotencySettings, KeyScope, ToolDescriptor, ToolPolicy};

    // Keys in global scope: the re-send comes over another connection, whose McpServer has
    // a session of its own.
    let registry =
        ToolRegistry::builder()
            .tool(
                ToolDescriptor::new("slow", "work", RiskLevel::Writes)
                    .with_attempt_timeout(std::time::Duration::from_secs(60))
                    .with_policy(ToolPolicy::default().with_idempotency(
                        IdempotencySettings::default().with_scope(KeyScope::Global),
                    )),
            )
            .build()
            .unwrap();
    let work = || {
        with_meta(
            params("work", json!({"x": 1})),
            json!({"idempotencyKey": "work-1"}),
        )
    };
    for case in [
        "request cancelled",
        "connection dropped",
        "request's future dropped",
    ] {
        let tool = Slow::default();
        let stack = ToolStack::builder(registry.clone()).build().unwrap();
        let server = McpServer::new(tool.clone(), "slow", stack.clone());
        let first = if case == "request's future dropped" {
            connect(DropsOnCancel(server), "agent").await
        } else {
            connect(server, "agent").await
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(work()));
        let handle = first
            .peer()
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .unwrap();
        while Slow::count(&tool.started) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if case == "connection dropped" {
            first.cancel().await.unwrap();
        } else {
            handle
                .cancel(Some("the agent gave up".into()))
                .await
                .unwrap();
        }
        // The server sees the cancellation or the end of the connection.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;

        let second = connect(McpServer::new(tool.clone(), "slow", stack), "agent").await;
        let resent = second.call_tool(work()).await.unwrap();
        assert_ne!(resent.is_error, Some(true), "{case}: {resent:?}");
        assert_eq!(
            resent.structured_content,
            Some(json!({"run": 1})),
            "{case}: the re-send gets the first run's result"
        );
        assert_eq!(Slow::count(&tool.started), 1, "{case}: the tool ran once");
        assert_eq!(Slow::count(&tool.finished), 1, "{case}: to its end");
        assert_eq!(Slow::count(&tool.stopped), 0, "{case}");
    }
}

/// A tool named `name` without a schema of its own.
fn tool(name: &'static str) -> rmcp::model::Tool {
    rmcp::model::Tool::new(name, "a tool", Arc::new(serde_json::Map::new()))
}

/// A service that no test calls.
fn uncalled() -> impl tower::Service<
    ToolCall,
    Response = tower_toolcall::ToolOutput,
    Error = tower_toolcall::ToolError,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|_call: ToolCall| async {
        Err::<tower_toolcall::ToolOutput, _>(tower_toolcall::ToolError::new(
            ErrorCode::InternalError,
            "no call in this test",
        ))
    })
}

/// A list replaced under a running server is what every session lists from then on, and
/// each connected client is told (`notifications/tools/list_changed`), which an `McpClient`
/// over [`ClientEvents`] sees.
#[tokio::test]
async fn a_replaced_tool_list_is_told_to_every_connected_client() {
    use rmcp::model::Tool;
    use tower_toolcall_mcp::ToolList;

    let names = |tools: Vec<Tool>| {
        tools
            .into_iter()
            .map(|t| t.name.to_string())
            .collect::<Vec<_>>()
    };
    let list = ToolList::new(vec![tool("search")]);
    let server = McpServer::over("notes", uncalled(), list.clone());
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (server_end, client_end) = tokio::io::duplex(64 * 1024);
        let connection = server.connection();
        tokio::spawn(async move {
            if let Ok(running) = connection.serve(server_end).await {
                let _ = running.waiting().await;
            }
        });
        let events = ClientEvents::default();
        let running = events.clone().serve(client_end).await.unwrap();
        let client = McpClient::new(running.peer().clone()).with_events(&events);
        assert_eq!(names(client.tools().await.unwrap()), ["search"]);
        clients.push((running, client.tool_list_changes(), client));
    }

    list.replace(ToolList::new(vec![tool("search"), tool("fetch")]))
        .await;
    for (_running, changes, client) in &mut clients {
        tokio::time::timeout(std::time::Duration::from_secs(5), changes.changed())
            .await
            .expect("the client is told")
            .unwrap();
        assert_eq!(*changes.borrow(), 1);
        assert_eq!(names(client.tools().await.unwrap()), ["search", "fetch"]);
    }
    // A client made without events never sees a change.
    let bare = McpClient::new(clients[0].0.peer().clone());
    assert!(bare.tool_list_changes().changed().await.is_err());
}

/// A client that stopped reading (its pipe full) holds up neither a replacement of the list
/// nor the notice to the other clients.
#[tokio::test]
async fn a_client_that_stopped_reading_never_holds_up_a_list_change() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    use tower_toolcall_mcp::ToolList;

    let list = ToolList::new(vec![tool("search")]);
    let server = McpServer::over("notes", uncalled(), list.clone());
    let serve = |end: tokio::io::DuplexStream| {
        let connection = server.connection();
        tokio::spawn(async move {
            if let Ok(running) = connection.serve(end).await {
                let _ = running.waiting().await;
            }
        });
    };
    // The first client: a raw session over a pipe of 64 bytes, which reads the answer to
    // its initialize and nothing after.
    let (server_end, stalled) = tokio::io::duplex(64);
    serve(server_end);
    let (read, mut write) = tokio::io::split(stalled);
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "stalled", "version": "1"}}
    });
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    write
        .write_all(format!("{initialize}\n{initialized}\n").as_bytes())
        .await
        .unwrap();
    let mut read = tokio::io::BufReader::new(read);
    let mut answer = String::new();
    read.read_line(&mut answer).await.unwrap();
    assert!(answer.contains("\"result\""), "{answer}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // The second: an rmcp client that reads.
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    serve(server_end);
    let events = ClientEvents::default();
    let running = events.clone().serve(client_end).await.unwrap();
    let client = McpClient::new(running.peer().clone()).with_events(&events);
    let mut changes = client.tool_list_changes();
    assert_eq!(client.tools().await.unwrap().len(), 1);

    for round in 1..=3u64 {
        let replacing = list.replace(ToolList::new(vec![tool("search"), tool("fetch")]));
        tokio::time::timeout(std::time::Duration::from_secs(1), replacing)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the list is replaced at once"));
        tokio::time::timeout(std::time::Duration::from_secs(1), changes.changed())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the reading client is told"))
            .unwrap();
        assert_eq!(*changes.borrow(), round);
    }
    drop(read);
}
