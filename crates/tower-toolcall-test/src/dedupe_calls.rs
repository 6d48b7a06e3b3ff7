//! The calls of the idempotency benches, the same for every store: the memory store's in the
//! core's benches, the Redis store's in those of `tower-toolcall-redis`.

use std::future::Future;

use futures::FutureExt;
use serde_json::{json, Value};
use tower::Service;
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};

/// A typical search call: 200 bytes of canonical params; `n` makes its key fresh.
pub fn params(n: u64) -> Value {
    json!({
        "query": "tower middleware retry with exponential backoff",
        "limit": 10,
        "offset": n,
        "safe": true,
        "region": "eu-west-1",
        "filters": {"lang": "en", "site": "docs.rs", "after": "2024-01-01", "kind": "article"}
    })
}

/// A search call of [`params`]`(n)`.
pub fn call(n: u64) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(params(n))
        .build()
        .unwrap()
}

/// Calls with fresh keys, one per iteration.
pub fn fresh_calls() -> impl FnMut() -> ToolCall {
    let mut n = 1_000_000_000;
    move || {
        n += 1;
        call(n)
    }
}

/// A tool that answers at once: whether the call came without params.
pub fn bare_tool() -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send,
> + Clone
       + Send
       + 'static {
    tool_fn(|call: ToolCall| async move {
        Ok(ToolOutput::new(Value::Bool(
            call.params().as_map().is_empty(),
        )))
    })
}

/// Calls `svc` once; every future on the memory path is ready at its first poll.
pub fn call_once<S>(svc: &mut S, call: ToolCall) -> ToolOutput
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.call(call)
        .now_or_never()
        .expect("ready at once")
        .unwrap()
}
