use std::sync::Arc;

use tower_layer::Layer;

use super::audit::AuditLog;
use super::service::Trace;
use crate::error::ConfigError;
use crate::event::{EventSink, EventSinks};
use crate::hooks::{SharedHooks, ToolHooks};
use crate::redact::Redactor;
use crate::registry::ToolRegistry;
use crate::stack_part::{StackPart, StackShared};

/// Applies [`Trace`] to a service: one `tracing` span per call, start and end events, and
/// the audit log. See the [module docs](crate::trace).
///
/// Clones share one configuration behind an [`Arc`].
///
/// ```
/// use serde_json::json;
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_toolcall::trace::TraceLayer;
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let mut svc = ServiceBuilder::new()
///     .layer(TraceLayer::new())
///     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("done"))) }));
/// let call = ToolCall::builder("ns", "tool").session("s").actor("u").build().unwrap();
/// svc.ready().await.unwrap().call(call).await.unwrap();
/// # });
/// ```
#[derive(Clone, Debug, Default)]
pub struct TraceLayer {
    config: Arc<TraceConfig>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct TraceConfig {
    pub(super) redactor: Redactor,
    pub(super) audit: Option<AuditLog>,
    pub(super) hooks: Option<SharedHooks>,
    /// Told of every call's end.
    pub(super) sinks: EventSinks,
}

impl TraceConfig {
    /// `true` when something besides the span wants to hear about calls: an audit log,
    /// an event sink (the metrics), hooks, or a subscriber of the layer's INFO events.
    pub(super) fn observes(&self) -> bool {
        self.audit.is_some()
            || !self.sinks.is_empty()
            || self.hooks.is_some()
            || tracing::enabled!(tracing::Level::INFO)
    }
}

impl TraceLayer {
    /// A layer with the default redactor and no audit log.
    pub fn new() -> Self {
        TraceLayer::default()
    }

    /// Redacts with `redactor` instead of the default one.
    pub fn redactor(self, redactor: Redactor) -> Self {
        self.with(|config| config.redactor = redactor)
    }

    /// Writes every call, result and run event to `audit`. Its attempt events come from
    /// [`AuditLog::attempt_hooks`] around the tool, which [`ToolStack`](crate::ToolStack)
    /// puts there.
    pub fn audit(self, audit: AuditLog) -> Self {
        self.with(|config| config.audit = Some(audit))
    }

    /// The audit log, if any.
    pub(crate) fn audit_log(&self) -> Option<&AuditLog> {
        self.config.audit.as_ref()
    }

    /// Calls [`ToolHooks::on_short_circuit`] of `hooks` once for every call a layer answered
    /// without running the tool (see [`hooks`](crate::hooks)). Share `hooks` with the
    /// [`HookLayer`](crate::HookLayer) around the tool through an [`Arc`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_toolcall::hooks::{HookLayer, ToolHooks};
    /// use tower_toolcall::trace::TraceLayer;
    ///
    /// #[derive(Debug)]
    /// struct Quiet;
    /// impl ToolHooks for Quiet {}
    ///
    /// let hooks = Arc::new(Quiet);
    /// let outermost = TraceLayer::new().hooks(hooks.clone());
    /// let innermost = HookLayer::new(hooks);
    /// # let _ = (outermost, innermost);
    /// ```
    pub fn hooks(self, hooks: impl ToolHooks) -> Self {
        let hooks = SharedHooks::new(hooks);
        self.with(|config| config.hooks = Some(hooks))
    }

    /// Tells `sink` of every call's end ([`LayerEvent::CallFinished`]): give it the metrics
    /// (`ToolMetrics`, feature `metrics`) to count every call.
    ///
    /// [`LayerEvent::CallFinished`]: crate::event::LayerEvent::CallFinished
    pub fn on_event(self, sink: impl EventSink) -> Self {
        self.on_shared_event(Arc::new(sink))
    }

    /// Tells `sink`, shared with other layers, what [`on_event`](Self::on_event) tells.
    pub(crate) fn on_shared_event(self, sink: Arc<dyn EventSink>) -> Self {
        self.with(|config| config.sinks.push(sink))
    }

    fn with(self, change: impl FnOnce(&mut TraceConfig)) -> Self {
        let mut config = (*self.config).clone();
        change(&mut config);
        TraceLayer {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace::new(inner, self.config.clone())
    }
}

impl StackPart for TraceLayer {
    type Layer = TraceLayer;

    fn part(_registry: &ToolRegistry) -> Self {
        TraceLayer::new()
    }

    fn build_part(self, shared: &mut StackShared) -> Result<TraceLayer, ConfigError> {
        let mut layer = match &shared.redactor {
            Some(redactor) => self.redactor(redactor.clone()),
            None => self,
        };
        for sink in &shared.sinks {
            layer = layer.on_shared_event(sink.clone());
        }
        Ok(match &shared.hooks {
            Some(hooks) => layer.hooks(hooks.clone()),
            None => layer,
        })
    }
}
