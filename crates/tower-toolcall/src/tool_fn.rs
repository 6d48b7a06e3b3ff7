//! [`tool_fn`]: a tool service from an async closure; [`BoxToolFuture`], the future of a
//! tool service written by hand.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::ToolOutput;

/// The boxed future of a tool call's outcome: the `Future` of a `Service<ToolCall>` written by
/// hand whose calls are async blocks.
///
/// ```
/// use std::task::{Context, Poll};
/// use serde_json::json;
/// use tower_toolcall::{BoxToolFuture, ToolCall, ToolError, ToolOutput};
///
/// #[derive(Clone)]
/// struct Echo;
///
/// impl tower::Service<ToolCall> for Echo {
///     type Response = ToolOutput;
///     type Error = ToolError;
///     type Future = BoxToolFuture;
///
///     fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
///         Poll::Ready(Ok(()))
///     }
///
///     fn call(&mut self, call: ToolCall) -> BoxToolFuture {
///         Box::pin(async move { Ok(ToolOutput::new(json!({"echo": call.params().as_map().len()}))) })
///     }
/// }
/// ```
pub type BoxToolFuture = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>;

/// Makes a tool service from a closure that takes the call and returns a future of its
/// outcome. The service is always ready, and `Clone` when the closure is.
///
/// ```
/// use serde_json::json;
/// use tower::{Service, ServiceExt};
/// use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let mut search = tool_fn(|call: ToolCall| async move {
///     let query = call.params().as_map().get("query").and_then(|q| q.as_str()).unwrap_or_default().to_owned();
///     Ok::<_, ToolError>(ToolOutput::new(json!({"query": query, "hits": []})))
/// });
/// let call = ToolCall::builder("agents.tools.web", "search")
///     .session("s").actor("u").params(json!({"query": "tower"})).build().unwrap();
/// let out = search.ready().await.unwrap().call(call).await.unwrap();
/// assert_eq!(out.content["query"], "tower");
/// # });
/// ```
pub fn tool_fn<F, Fut>(f: F) -> ToolFn<F>
where
    F: FnMut(ToolCall) -> Fut,
    Fut: Future<Output = Result<ToolOutput, ToolError>>,
{
    ToolFn { f }
}

/// A tool service made from a closure by [`tool_fn`].
#[derive(Clone, Copy)]
pub struct ToolFn<F> {
    f: F,
}

impl<F> fmt::Debug for ToolFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

impl<F, Fut> Service<ToolCall> for ToolFn<F>
where
    F: FnMut(ToolCall) -> Fut,
    Fut: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = Fut;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Fut {
        (self.f)(call)
    }
}
