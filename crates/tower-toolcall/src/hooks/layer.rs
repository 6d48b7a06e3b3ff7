use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::Hook;
use super::ToolHooks;

/// Applies [`Hook`] to a service: `hooks` before and after every attempt. See the
/// [module docs](crate::hooks).
///
/// Clones, and the services they make, share `hooks` behind an [`Arc`].
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use serde_json::json;
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_toolcall::hooks::{HookLayer, ToolHooks};
/// use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};
///
/// #[derive(Debug, Default)]
/// struct LastAttempt(AtomicU32);
///
/// impl ToolHooks for LastAttempt {
///     fn after_attempt(&self, call: &ToolCall, _outcome: &Result<ToolOutput, ToolError>) {
///         self.0.store(call.attempt(), Ordering::SeqCst);
///     }
/// }
///
/// # tokio_test::block_on(async {
/// let layer = HookLayer::new(LastAttempt::default());
/// let mut svc = ServiceBuilder::new()
///     .layer(layer.clone())
///     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("done"))) }));
/// let call = ToolCall::builder("ns", "tool").session("s").actor("u").build().unwrap();
/// svc.ready().await.unwrap().call(call).await.unwrap();
/// assert_eq!(layer.hooks().0.load(Ordering::SeqCst), 1);
/// # });
/// ```
pub struct HookLayer<H> {
    hooks: Arc<H>,
}

impl<H: ToolHooks> HookLayer<H> {
    /// A layer that runs `hooks` around every attempt.
    pub fn new(hooks: H) -> Self {
        HookLayer {
            hooks: Arc::new(hooks),
        }
    }

    /// The hooks.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }
}

impl<H> Clone for HookLayer<H> {
    fn clone(&self) -> Self {
        HookLayer {
            hooks: self.hooks.clone(),
        }
    }
}

impl<H: fmt::Debug> fmt::Debug for HookLayer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookLayer")
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl<S, H> Layer<S> for HookLayer<H> {
    type Service = Hook<S, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Hook::new(inner, self.hooks.clone())
    }
}
