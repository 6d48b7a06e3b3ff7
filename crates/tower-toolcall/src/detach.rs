//! Calls that outlive their connection: [`detached`] runs a call on a task of its own, so
//! that a caller who goes away does not cancel it.
//!
//! In process, dropping a call's future cancels it: the idempotency layer marks its record
//! `cancelled` and frees the key, so the caller may send it again (SPEC §5, "a dropped caller
//! frees the key"). At an adapter's edge (HTTP, MCP) the caller is a connection, and
//! connections drop for reasons of their own: a proxy's timeout, a client that gives up and
//! sends the call again with the same idempotency key. Cancelling there would run the tool
//! a second time — exactly what the key was sent to prevent. So an adapter hands every call
//! it dispatches to [`detached`]: the call runs to its end (bounded by the stack's timeouts
//! and deadline), its record stays in flight meanwhile, and a re-send joins it or gets its
//! result.

use std::future::Future;

use tower::ServiceExt;
use tower_service::Service;
use tracing::Instrument;

use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};

/// Sends `call` through `service` on a task of its own and returns the future of its answer.
///
/// The task is spawned at once, before the returned future is first polled; dropping the
/// future leaves the call running to its end. The task runs in the caller's `tracing` span.
/// A panic in the service, or a runtime that shuts down under the call, comes back as an
/// `INTERNAL_ERROR` [`ToolError`]; the service's own errors come back through
/// `Into<ToolError>`.
///
/// It must be called inside a tokio runtime.
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use tower_toolcall::detach::detached;
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (done, finished) = tokio::sync::oneshot::channel();
/// let mut done = Some(done);
/// let tool = tool_fn(move |_call: ToolCall| {
///     let done = done.take();
///     async move {
///         tokio::time::sleep(Duration::from_millis(10)).await;
///         if let Some(done) = done {
///             done.send(()).ok();
///         }
///         Ok(ToolOutput::new(json!("written")))
///     }
/// });
/// let call = ToolCall::builder("vault", "createFile").session("s").actor("u").build().unwrap();
/// // The caller goes away at once: the call still runs to its end.
/// drop(detached(tool, call));
/// finished.await.unwrap();
/// # }
/// ```
pub fn detached<S>(
    service: S,
    call: ToolCall,
) -> impl Future<Output = Result<S::Response, ToolError>>
where
    S: Service<ToolCall> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<ToolError> + Send + 'static,
{
    detach(service.oneshot(call))
}

/// Runs `work`, a call's whole future, on a task of its own, as [`detached`] does; for an
/// adapter whose call keeps more than the service's future alive (its request's bookkeeping,
/// say) until the call ends.
pub fn detach<F, T, E>(work: F) -> impl Future<Output = Result<T, ToolError>>
where
    F: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Into<ToolError> + Send + 'static,
{
    let task = tokio::spawn(work.in_current_span());
    async move {
        match task.await {
            Ok(answer) => answer.map_err(Into::into),
            Err(failure) => Err(ToolError::new(
                ErrorCode::InternalError,
                if failure.is_panic() {
                    "the tool failed unexpectedly while running the call; its outcome is \
                     unknown: check before sending it again"
                } else {
                    "the call was stopped because the server is shutting down; its outcome is \
                     unknown: check before sending it again"
                },
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::outcome::ToolOutput;
    use crate::tool_fn;

    fn call() -> ToolCall {
        ToolCall::builder("ns", "tool")
            .session("s")
            .actor("a")
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_caller_leaves_the_call_running_to_its_end() {
        let finished = Arc::new(AtomicUsize::new(0));
        let counted = finished.clone();
        let tool = tool_fn(move |_call: ToolCall| {
            let counted = counted.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::new(serde_json::json!(1)))
            }
        });
        let answer = detached(tool.clone(), call());
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(answer);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        // and a caller who stays gets the answer
        let output = detached(tool, call()).await.unwrap();
        assert_eq!(output.content, serde_json::json!(1));
    }

    #[tokio::test]
    async fn a_panic_is_an_internal_error() {
        let tool = tool_fn(|_call: ToolCall| async move {
            if true {
                panic!("boom");
            }
            Ok(ToolOutput::new(serde_json::json!(null)))
        });
        let error = detached(tool, call()).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InternalError);
        assert!(!error.message().contains("boom"), "{}", error.message());
    }
}
