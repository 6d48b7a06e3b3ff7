//! Run with: `cargo run -p tower-toolcall-examples --bin quickstart`
//!
//! Two tools behind the whole stack: a read-only web search whose upstream fails now and then,
//! and a file write that needs schema-valid params and the user's confirmation. Calls go
//! through validation, loop detection, rate limiting, idempotency, retry, the circuit breaker
//! and the attempt timeout; each answer is printed as the `ToolResult` envelope the agent
//! would get back. Hooks count every attempt and every short cut, and at the end the kill
//! switch (`TOOL_RELIABILITY_ENABLED`, here flipped at run time) turns every layer into a
//! pass-through.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::hooks::ToolHooks;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{
    tool_fn, ErrorCode, ResultEnvelopeLayer, ShortCircuit, ToolCall, ToolError, ToolOutput,
    ToolStack,
};

/// Counts the attempts that reached the tools and the calls answered without them.
#[derive(Debug, Default)]
struct Counting {
    attempts: AtomicUsize,
    short_circuits: AtomicUsize,
}

impl ToolHooks for Counting {
    fn before_attempt(&self, _call: &mut ToolCall) -> Result<(), ToolError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn on_short_circuit(
        &self,
        _call: &ToolCall,
        _path: ShortCircuit,
        _outcome: &Result<ToolOutput, ToolError>,
    ) {
        self.short_circuits.fetch_add(1, Ordering::SeqCst);
    }
}

/// How often each tool really ran.
#[derive(Default)]
struct Runs {
    search: AtomicUsize,
    create_file: AtomicUsize,
}

/// The web search: read-only; its upstream answers 503 to every third request.
fn search(call: &ToolCall, runs: &Runs) -> Result<ToolOutput, ToolError> {
    let run = runs.search.fetch_add(1, Ordering::SeqCst);
    if run.is_multiple_of(3) {
        return Err(ToolError::from_http_status(
            503,
            "search upstream is overloaded",
        ));
    }
    let query = call
        .params()
        .as_map()
        .get("query")
        .and_then(|q| q.as_str())
        .unwrap_or_default();
    let hits: Vec<_> = [
        "tower: a library of modular components",
        "tokio: an async runtime",
    ]
    .into_iter()
    .filter(|doc| doc.contains(query))
    .collect();
    Ok(ToolOutput::new(json!({ "query": query, "hits": hits })))
}

/// The file write: mutating; pretends to write and returns the new etag.
fn create_file(call: &ToolCall, runs: &Runs) -> Result<ToolOutput, ToolError> {
    runs.create_file.fetch_add(1, Ordering::SeqCst);
    let params = call.params().as_map();
    let path = params["path"].as_str().unwrap_or_default();
    let content = params["content"].as_str().unwrap_or_default();
    Ok(
        ToolOutput::new(json!({ "path": path, "etag": format!("{:08x}", content.len()) }))
            .with_metadata("bytes", json!(content.len())),
    )
}

fn registry(control: ReliabilityControl) -> Result<ToolRegistry, tower_toolcall::ConfigError> {
    ToolRegistry::builder()
        .control(control)
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_idempotent(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {"query": {"type": "string", "minLength": 1}}
                })),
        )
        .tool(
            ToolDescriptor::new("vault", "createFile", RiskLevel::Writes)
                .with_confirmation_required(true)
                .with_input_schema(json!({
                    "type": "object",
                    "required": ["path", "content"],
                    "properties": {
                        "path": {"type": "string", "pattern": "\\.md$"},
                        "content": {"type": "string"}
                    },
                    "additionalProperties": false
                })),
        )
        .deny("agents.tools.shell::*")
        .build()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The operator's switches, as the environment sets them.
    let control = ReliabilityControl::from_env()?;
    let registry = registry(control.clone())?;
    let runs = Arc::new(Runs::default());
    let hooks = Arc::new(Counting::default());

    // One service for every tool: it dispatches on the tool's name.
    let tools = {
        let runs = runs.clone();
        tool_fn(move |call: ToolCall| {
            let runs = runs.clone();
            async move {
                match (call.tool_namespace(), call.tool_name()) {
                    ("agents.tools.web", "search") => search(&call, &runs),
                    ("vault", "createFile") => create_file(&call, &runs),
                    (ns, name) => Err(ToolError::new(
                        ErrorCode::NotFound,
                        format!("no implementation for {ns}::{name}"),
                    )),
                }
            }
        })
    };

    // Every layer in the recommended order, built from the one registry; the hooks see each
    // attempt and each call a layer answers itself.
    let reliability = ToolStack::builder(registry).hooks(hooks.clone()).build()?;
    let mut stack = ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(reliability)
        .service(tools);

    let search_call = |query: &str| {
        ToolCall::builder("agents.tools.web", "search")
            .session("sess-42")
            .actor("user-7")
            .params(json!({ "query": query }))
    };
    let write_call = || {
        ToolCall::builder("vault", "createFile")
            .session("sess-42")
            .actor("user-7")
            .idempotency_key("create-today-1")
            .confirmation_id("confirm-1")
            .params(json!({"path": "notes/today.md", "content": "hello"}))
    };
    let calls = [
        (
            "a search whose upstream fails once: retried",
            search_call("tower"),
        ),
        ("a confirmed file write", write_call()),
        (
            "the same write again (a client retry): answered from the cache",
            write_call(),
        ),
        (
            "a file write without confirmation",
            ToolCall::builder("vault", "createFile")
                .session("sess-42")
                .actor("user-7")
                .params(json!({"path": "notes/today.md", "content": "hello"})),
        ),
        (
            "a file write whose params break the schema",
            ToolCall::builder("vault", "createFile")
                .session("sess-42")
                .actor("user-7")
                .confirmation_id("confirm-2")
                .params(json!({"path": "notes/today.txt", "content": 42, "force": true})),
        ),
        (
            "a denied tool",
            ToolCall::builder("agents.tools.shell", "exec")
                .session("sess-42")
                .actor("user-7")
                .params(json!({"cmd": "rm -rf /"})),
        ),
        (
            "an unknown tool",
            ToolCall::builder("agents.tools.mail", "send")
                .session("sess-42")
                .actor("user-7"),
        ),
        (
            "a model in a loop: 1st identical search",
            search_call("tokio"),
        ),
        (
            "a model in a loop: 2nd identical search",
            search_call("tokio"),
        ),
        (
            "a model in a loop: 3rd identical search",
            search_call("tokio"),
        ),
        (
            "a model in a loop: 4th identical search",
            search_call("tokio"),
        ),
    ];

    for (what, builder) in calls {
        let call = builder.build()?;
        let result = stack.ready().await?.call(call).await?;
        println!("# {what}\n{}\n", serde_json::to_string_pretty(&result)?);
    }

    // Envelopes that arrive as JSON are checked as they are parsed.
    let malformed = br#"{"contractVersion": "1.1", "requestId": "r-1", "toolName": "search",
        "toolNamespace": "agents.tools.web", "target": {"actorId": "user-7"},
        "payload": {"version": "1.0", "params": {"query": "tower"}}}"#;
    if let Err(err) = ToolCall::from_json(malformed) {
        println!(
            "# a malformed envelope\n{}: {}\n",
            err.code(),
            err.message()
        );
    }

    // The kill switch: from the next call on, every layer passes calls straight through, so
    // the same write runs again instead of coming from the cache.
    control.set_enabled(false);
    let result = stack.ready().await?.call(write_call().build()?).await?;
    println!(
        "# the same write with reliability switched off: fromCache = {}\n",
        result.from_cache
    );

    println!(
        "# the tools ran: search {} times, createFile {} time(s); hooks saw {} attempts and {} \
         calls answered without the tools",
        runs.search.load(Ordering::SeqCst),
        runs.create_file.load(Ordering::SeqCst),
        hooks.attempts.load(Ordering::SeqCst),
        hooks.short_circuits.load(Ordering::SeqCst)
    );
    Ok(())
}
