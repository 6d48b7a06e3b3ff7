//! [`ToolHooks`]: code of the application that runs before and after every attempt of a call,
//! and once when a layer answers a call without running the tool.
//!
//! One hooks object serves two places of the stack:
//!
//! - [`HookLayer`], innermost, just around the tool (inside the
//!   [`TimeoutLayer`](crate::TimeoutLayer)), calls [`before_attempt`](ToolHooks::before_attempt)
//!   and [`after_attempt`](ToolHooks::after_attempt) once per attempt: a call that the
//!   [`RetryLayer`](crate::RetryLayer) tries three times fires three of each, numbered by
//!   [`ToolCall::attempt`]. `before_attempt` may change what the tool receives, or deny the
//!   attempt with an error: the tool is not called, and that error, marked
//!   [rejected](crate::ToolError::is_rejected), is the attempt's outcome, which
//!   `after_attempt` sees like any other.
//! - [`TraceLayer::hooks`](crate::trace::TraceLayer::hooks), outermost, calls
//!   [`on_short_circuit`](ToolHooks::on_short_circuit) once for a call a layer answered
//!   without running the tool — a refused call, a cache hit, a joined in-flight call, an
//!   open breaker — with the [`ShortCircuit`] path the answer's
//!   [`CallRecord`](crate::CallRecord) names. An attempt that never reached the tool fires no
//!   `before_attempt`/`after_attempt`, so every path fires exactly once.
//!
//! Share the object with an [`Arc`]: `ToolHooks` is implemented for
//! `Arc<T>`. The hook layer is not a reliability layer: it fires whether or not the
//! registry's [kill switch](crate::control) is on, so turning reliability off leaves the
//! hooks as they were.
//!
//! An attempt dropped before it finished — its timeout passed, or the caller stopped waiting —
//! is reported to `after_attempt` as a `CANCELLED` error, since the layer around the tool
//! never learns the error the caller gets instead.
//!
//! # The recommended stack
//!
//! [`ToolStack::hooks`](crate::ToolStackBuilder::hooks) gives one hooks object to both places:
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::*;
//!
//! /// Tags every attempt and counts what happens.
//! #[derive(Debug, Default)]
//! struct Audit {
//!     attempts: AtomicUsize,
//!     short_circuits: AtomicUsize,
//! }
//!
//! impl ToolHooks for Audit {
//!     fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
//!         self.attempts.fetch_add(1, Ordering::SeqCst);
//!         call.envelope_mut().control.from_hook = Some("audit".into());
//!         Ok(())
//!     }
//!
//!     fn on_short_circuit(
//!         &self,
//!         _call: &ToolCall,
//!         path: ShortCircuit,
//!         _outcome: &Result<ToolOutput, ToolError>,
//!     ) {
//!         assert_eq!(path, ShortCircuit::CacheHit);
//!         self.short_circuits.fetch_add(1, Ordering::SeqCst);
//!     }
//! }
//!
//! # tokio_test::block_on(async {
//! let hooks = Arc::new(Audit::default());
//! let stack = ToolStack::builder(ToolRegistry::open()).hooks(hooks.clone()).build().unwrap();
//! let mut stack = ServiceBuilder::new()
//!     .layer(ResultEnvelopeLayer::new())
//!     .layer(stack)
//!     .service(tool_fn(|call: ToolCall| async move {
//!         Ok(ToolOutput::new(json!({"tagged by": call.control().from_hook})))
//!     }));
//!
//! let call = || {
//!     ToolCall::builder("vault", "createFile")
//!         .session("s")
//!         .actor("u")
//!         .idempotency_key("create-1")
//!         .params(json!({"path": "a.md"}))
//!         .build()
//!         .unwrap()
//! };
//! let first = stack.ready().await.unwrap().call(call()).await.unwrap();
//! let again = stack.ready().await.unwrap().call(call()).await.unwrap();
//! assert_eq!(first.output.unwrap().content, json!({"tagged by": "audit"}));
//! assert!(again.from_cache);
//! assert_eq!(hooks.attempts.load(Ordering::SeqCst), 1);
//! assert_eq!(hooks.short_circuits.load(Ordering::SeqCst), 1);
//! # });
//! ```

mod future;
mod layer;
mod service;

use std::fmt;
use std::sync::Arc;

pub use future::ResponseFuture;
pub use layer::HookLayer;
pub use service::Hook;

use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::outcome::{record_of, ShortCircuit, ToolOutput};

/// What the application runs around the attempts of a call. Every method does nothing unless
/// overridden. See the [module docs](self) for where each one fires.
///
/// Hooks run on the call path, synchronously: keep them short, and hand slow work to a task
/// of their own.
pub trait ToolHooks: Send + Sync + 'static {
    /// Runs before each attempt, with the call the tool is about to receive.
    ///
    /// It may change the call — tag it in `call.envelope_mut().control`, for example — and
    /// the tool receives the changed call. An error denies the attempt: the tool is not
    /// called, and the error, marked [rejected](ToolError::is_rejected), is the attempt's
    /// outcome. The layers outside treat it like any other rejection: it is not retried, a
    /// breaker does not count it, and it is not counted as an attempt.
    fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
        let _ = call;
        Ok(())
    }

    /// Runs after each attempt with its outcome, a denied one included: every
    /// [`before_attempt`](ToolHooks::before_attempt) is followed by exactly one call of this.
    fn after_attempt(&self, call: &ToolCall, outcome: &Result<ToolOutput, ToolError>) {
        let _ = (call, outcome);
    }

    /// Runs once for a call a layer answered without running the tool on its last attempt,
    /// with the `path` it took and the outcome the caller gets.
    fn on_short_circuit(
        &self,
        call: &ToolCall,
        path: ShortCircuit,
        outcome: &Result<ToolOutput, ToolError>,
    ) {
        let _ = (call, path, outcome);
    }
}

impl<T: ToolHooks + ?Sized> ToolHooks for Arc<T> {
    fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
        (**self).before_attempt(call)
    }

    fn after_attempt(&self, call: &ToolCall, outcome: &Result<ToolOutput, ToolError>) {
        (**self).after_attempt(call, outcome)
    }

    fn on_short_circuit(
        &self,
        call: &ToolCall,
        path: ShortCircuit,
        outcome: &Result<ToolOutput, ToolError>,
    ) {
        (**self).on_short_circuit(call, path, outcome)
    }
}

/// A hooks object of any type, as the trace layer keeps it.
#[derive(Clone)]
pub(crate) struct SharedHooks(Arc<dyn ToolHooks>);

impl SharedHooks {
    pub(crate) fn new(hooks: impl ToolHooks) -> Self {
        SharedHooks(Arc::new(hooks))
    }

    /// Fires [`ToolHooks::on_short_circuit`] when a layer answered `outcome` without running
    /// the tool.
    pub(crate) fn short_circuited(&self, call: &ToolCall, outcome: &Result<ToolOutput, ToolError>) {
        if let Some(path) = record_of(outcome).short_circuit {
            self.0.on_short_circuit(call, path, outcome);
        }
    }
}

impl fmt::Debug for SharedHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedHooks")
    }
}
