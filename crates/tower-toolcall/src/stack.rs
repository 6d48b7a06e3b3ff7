//! [`ToolStack`]: every layer of the crate in one [`Layer`], in the order that makes them
//! work together, built from one registry.
//!
//! The layers are independent and each is usable alone, but a stack built by hand is easy
//! to get subtly wrong: ten layers in an order that matters, the same registry (and with it
//! the operator switches) handed to each, one hooks object given to two places, the same
//! canonical options and redactor to the layers that share their work. [`ToolStack`] does
//! all of it:
//!
//! ```text
//! Trace → EnvelopeValidate → LoopDetect → RateLimit → Idempotency → Bulkhead → Retry → CircuitBreaker → Timeout → Hook → tool
//! ```
//!
//! Loop detection sees every repeat the model issues before the idempotency cache answers
//! it; idempotency wraps the whole retried execution as one record, and answers a duplicate
//! before it takes a place in the bulkhead; a call holds its bulkhead place across its
//! retries, and neither retry nor the breaker sees the bulkhead's refusals; the breaker sits inside
//! retry, so that it counts each attempt and an open breaker stops the retries; the timeout
//! bounds each attempt; the hooks run around the tool, once per attempt, and so does the
//! trace layer's [audit log](crate::trace::AuditLog::attempt_hooks), innermost, so that it
//! writes only the attempts that reach the tool.
//!
//! The stack answers with the crate's own types (`ToolOutput` / `ToolError`), so that it
//! composes with other tower middleware; put a [`ResultEnvelopeLayer`](crate::ResultEnvelopeLayer)
//! outside it where results go back to the agent as [`ToolResult`](crate::ToolResult)
//! envelopes.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::{tool_fn, ResultEnvelopeLayer, ToolCall, ToolOutput, ToolStack};
//!
//! # tokio_test::block_on(async {
//! let stack = ToolStack::builder(ToolRegistry::open()).build()?;
//! let mut service = ServiceBuilder::new()
//!     .layer(ResultEnvelopeLayer::new())
//!     .layer(stack.clone())
//!     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("done"))) }));
//!
//! let call = || {
//!     ToolCall::builder("vault", "createFile")
//!         .session("s")
//!         .actor("u")
//!         .idempotency_key("create-1")
//!         .build()
//!         .unwrap()
//! };
//! let first = service.ready().await?.call(call()).await?;
//! let again = service.ready().await?.call(call()).await?;
//! assert!(!first.from_cache && again.from_cache);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod fleet;

pub use fleet::{FleetActions, FleetFuture, OperatorAction};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::util::Either;
use tower::ServiceBuilder;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{BreakerAdmin, CircuitBreakerLayer, CircuitBreakerLayerBuilder};
use crate::bulkhead::{BulkheadLayer, BulkheadLayerBuilder};
use crate::canonical::CanonicalOptions;
use crate::control::ReliabilityControl;
use crate::envelope::ToolCall;
use crate::error::{ConfigError, ToolError};
use crate::event::EventSink;
use crate::hooks::{HookLayer, ToolHooks};
use crate::idempotency::{DedupeStore, IdempotencyLayer, IdempotencyLayerBuilder};
use crate::loop_detect::{LoopDetectHandle, LoopDetectLayer, LoopDetectLayerBuilder};
use crate::outcome::ToolOutput;
use crate::rate_limit::{RateLimitLayer, RateLimitLayerBuilder};
use crate::registry::ToolRegistry;
use crate::retry::{RetryLayer, RetryLayerBuilder};
use crate::stack_part::{StackPart, StackShared};
use crate::timeout::{TimeoutLayer, TimeoutLayerBuilder};
use crate::trace::{AuditAttempts, Redactor, TraceLayer};
use crate::validate::{EnvelopeValidateLayer, EnvelopeValidateLayerBuilder};

/// The hooks object the stack hands to its trace layer and to the layer around the tool.
type SharedHooks = Arc<dyn ToolHooks>;

/// One layer of the stack, or the service below it untouched when that layer is off.
type Stage<L, S> = Either<<L as Layer<S>>::Service, S>;

/// The services of the layers `L1, L2, …` (outermost first) over `S`.
macro_rules! stacked {
    ($inner:ty;) => { $inner };
    ($inner:ty; $layer:ty $(, $rest:ty)*) => { Stage<$layer, stacked!($inner; $($rest),*)> };
}

/// Builds the parts of the list innermost first, each into a variable named after its field.
macro_rules! build_inner_first {
    ($builder:ident, $shared:ident, $on:ident;) => {};
    ($builder:ident, $shared:ident, $on:ident;
     ($variant:ident, $field:ident) $(, ($v:ident, $f:ident))*) => {
        build_inner_first!($builder, $shared, $on; $(($v, $f)),*);
        let $field = if $on(StackLayer::$variant) {
            Some(StackPart::build_part($builder.$field, &mut $shared)?)
        } else {
            None
        };
    };
}

/// The stack's layers, outermost first: each its [`StackLayer`] variant, its field in
/// [`ToolStack`] and [`ToolStackBuilder`], its layer and its builder (a [`StackPart`]). A new
/// layer is one line here.
macro_rules! stack_layers {
    ($($(#[$doc:meta])* $variant:ident($field:ident: $layer:ty, $builder:ty),)*) => {
        /// A layer of the stack, to switch off with [`ToolStackBuilder::without`].
        ///
        /// ```
        /// use tower_toolcall::registry::ToolRegistry;
        /// use tower_toolcall::{StackLayer, ToolStack};
        ///
        /// let stack = ToolStack::builder(ToolRegistry::open())
        ///     .without(StackLayer::LoopDetect)
        ///     .build()?;
        /// assert!(stack.loop_sessions().is_none());
        /// # Ok::<(), tower_toolcall::ConfigError>(())
        /// ```
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum StackLayer {
            $($(#[$doc])* $variant,)*
        }

        /// Every layer of the crate, in the recommended order, as one [`Layer`]. See the
        /// [module docs](self).
        ///
        /// Made by [`ToolStack::builder`]. Clones share every layer's state (breakers, loop
        /// sessions, quotas, the dedupe store), as do the services they make: build the stack
        /// once and apply it to as many tools as you like.
        ///
        /// It also hands out what operators act on: [`breakers`](ToolStack::breakers),
        /// [`loop_sessions`](ToolStack::loop_sessions), the
        /// [`dedupe_store`](ToolStack::dedupe_store) and the [`control`](ToolStack::control)
        /// switches.
        ///
        /// ```
        /// use serde_json::json;
        /// use tower::Layer;
        /// use tower_toolcall::registry::ToolRegistry;
        /// use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
        ///
        /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
        /// // One stack for two tools: they share its breakers, loop sessions and dedupe store.
        /// let search = stack.layer(tool_fn(|_: ToolCall| async { Ok(ToolOutput::new(json!([]))) }));
        /// let fetch = stack.layer(tool_fn(|_: ToolCall| async { Ok(ToolOutput::new(json!(""))) }));
        /// # drop((search, fetch));
        /// # Ok::<(), tower_toolcall::ConfigError>(())
        /// ```
        #[derive(Clone)]
        pub struct ToolStack {
            registry: ToolRegistry,
            $($field: Option<$layer>,)*
            hooks: Option<HookLayer<SharedHooks>>,
            /// The trace layer's audit log writing each attempt, innermost.
            audit_attempts: Option<HookLayer<AuditAttempts>>,
        }

        impl fmt::Debug for ToolStack {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let on = |present: bool| if present { "on" } else { "off" };
                f.debug_struct("ToolStack")
                    .field("registry", &self.registry)
                    $(.field(stringify!($field), &on(self.$field.is_some())))*
                    .field("hooks", &on(self.hooks.is_some()))
                    .finish()
            }
        }

        /// The services of the stack, outermost first.
        type Stacked<S> = stacked!(
            Stage<HookLayer<SharedHooks>, Stage<HookLayer<AuditAttempts>, S>>;
            $($layer),*
        );

        impl<S> Layer<S> for ToolStack {
            type Service = ToolStackService<S>;

            fn layer(&self, tool: S) -> Self::Service {
                let inner = ServiceBuilder::new()
                    $(.option_layer(self.$field.clone()))*
                    .option_layer(self.hooks.clone())
                    .option_layer(self.audit_attempts.clone())
                    .service(tool);
                ToolStackService { inner }
            }
        }

        /// Builds a [`ToolStack`]; made by [`ToolStack::builder`].
        ///
        /// Each layer starts from its own defaults over the stack's registry; the closures
        /// given to [`retry`](Self::retry), [`breaker`](Self::breaker) and the other
        /// per-layer methods change them with that layer's builder, whose `settings` take
        /// the layer's settings type (the one a tool's policy uses for it). What several
        /// layers must agree on is set once here: the dedupe [`store`](Self::store), the
        /// [`hooks`](Self::hooks), the [`redactor`](Self::redactor), the
        /// [`canonical_options`](Self::canonical_options) and the
        /// [event sinks](Self::on_event) (the metrics, for one).
        ///
        /// ```
        /// use tower_toolcall::control::ReliabilityControl;
        /// use tower_toolcall::registry::{RetrySettings, TimeoutSettings, ToolRegistry};
        /// use tower_toolcall::{StackLayer, ToolStack};
        ///
        /// let control = ReliabilityControl::new();
        /// let retry = RetrySettings::default().with_max_attempts(3);
        /// let timeout = TimeoutSettings::default().with_attempt_timeout_ms(5_000);
        /// let stack = ToolStack::builder(ToolRegistry::open().with_control(control.clone()))
        ///     .retry(|builder| builder.settings(retry).seed(7)) // a seed: repeatable jitter
        ///     .timeout(|builder| builder.settings(timeout))
        ///     .without(StackLayer::RateLimit)
        ///     .build()?;
        /// assert!(stack.rate_limits().is_none());
        /// control.set_enabled(false); // every layer of `stack` now passes calls through
        /// assert!(!stack.control().is_enabled());
        /// # Ok::<(), tower_toolcall::ConfigError>(())
        /// ```
        #[must_use]
        pub struct ToolStackBuilder {
            registry: ToolRegistry,
            $($field: $builder,)*
            shared: StackShared,
            without: Vec<StackLayer>,
        }

        impl ToolStack {
            /// A builder of the stack over `registry`, whose tools, policies and operator
            /// switches ([`ReliabilityControl`], set with [`ToolRegistry::with_control`])
            /// every layer shares. Idempotency records go to a fresh
            /// [`InMemoryDedupeStore`](crate::idempotency::InMemoryDedupeStore) unless
            /// [`store`](ToolStackBuilder::store) says otherwise.
            ///
            /// ```
            /// use tower_toolcall::registry::ToolRegistry;
            /// use tower_toolcall::ToolStack;
            ///
            /// let registry = ToolRegistry::from_toml_str(
            ///     r#"
            ///     [[tools]]
            ///     namespace = "agents.tools.web"
            ///     name = "search"
            ///     risk = "read-only"
            ///     "#,
            /// )?;
            /// let stack = ToolStack::builder(registry).build()?;
            /// # Ok::<(), tower_toolcall::ConfigError>(())
            /// ```
            pub fn builder(registry: ToolRegistry) -> ToolStackBuilder {
                ToolStackBuilder {
                    $($field: <$builder as StackPart>::part(&registry),)*
                    registry,
                    shared: StackShared::default(),
                    without: Vec::new(),
                }
            }
        }

        impl ToolStackBuilder {
            $(
                #[doc = concat!(
                    "Changes the [`", stringify!($layer), "`] through its builder: its ",
                    "`settings`, the defaults of every tool, and what else the builder sets."
                )]
                pub fn $field(mut self, configure: impl FnOnce($builder) -> $builder) -> Self {
                    self.$field = configure(self.$field);
                    self
                }
            )*

            fn build_parts(self) -> Result<ToolStack, ConfigError> {
                let on = |layer: StackLayer| !self.without.contains(&layer);
                let mut shared = self.shared;
                let builder = ToolStackBuilderParts { $($field: self.$field,)* };
                build_inner_first!(builder, shared, on; $(($variant, $field)),*);
                Ok(ToolStack {
                    $($field,)*
                    hooks: shared.hooks.map(HookLayer::new),
                    audit_attempts: None,
                    registry: self.registry,
                })
            }
        }

        /// The builders of the parts, moved out of the stack's builder to be built.
        struct ToolStackBuilderParts {
            $($field: $builder,)*
        }
    };
}

stack_layers! {
    /// [`TraceLayer`]: span, events, metrics, audit, short-circuit hooks.
    Trace(trace: TraceLayer, TraceLayer),
    /// [`EnvelopeValidateLayer`].
    Validate(validate: EnvelopeValidateLayer, EnvelopeValidateLayerBuilder),
    /// [`LoopDetectLayer`].
    LoopDetect(loop_detect: LoopDetectLayer, LoopDetectLayerBuilder),
    /// [`RateLimitLayer`].
    RateLimit(rate_limit: RateLimitLayer, RateLimitLayerBuilder),
    /// [`IdempotencyLayer`].
    Idempotency(idempotency: IdempotencyLayer, IdempotencyLayerBuilder),
    /// [`BulkheadLayer`].
    Bulkhead(bulkhead: BulkheadLayer, BulkheadLayerBuilder),
    /// [`RetryLayer`].
    Retry(retry: RetryLayer, RetryLayerBuilder),
    /// [`CircuitBreakerLayer`].
    CircuitBreaker(breaker: CircuitBreakerLayer, CircuitBreakerLayerBuilder),
    /// [`TimeoutLayer`].
    Timeout(timeout: TimeoutLayer, TimeoutLayerBuilder),
}

impl ToolStack {
    /// The registry every layer resolves its tools in.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// assert!(stack.registry().is_open());
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The operator switches every layer reads: kill switch, breaker enforcement, key
    /// derivation, shadow mode. A change through this handle (or any clone of it) takes effect
    /// on the next call.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// stack.control().set_enabled(false); // the kill switch: every layer passes calls through
    /// assert!(!stack.control().is_enabled());
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn control(&self) -> &ReliabilityControl {
        self.registry.control()
    }

    /// The breakers: read their state, force them open, reset them, listen to transitions.
    /// `None` when the breaker layer is switched off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::breaker::BreakerKey;
    /// use tower_toolcall::BreakerState;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// let breakers = stack.breakers().expect("the breaker layer is on");
    /// let charge = BreakerKey::tool("payments", "charge");
    /// breakers.force_open(&charge); // calls of payments::charge now fail fast
    /// assert_eq!(breakers.state("payments", "charge"), BreakerState::ForcedOpen);
    /// assert!(breakers.reset(&charge));
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn breakers(&self) -> Option<BreakerAdmin> {
        self.breaker.as_ref().map(CircuitBreakerLayer::admin)
    }

    /// The loop detector's sessions: their settings at run time, resets, counts. `None` when
    /// loop detection is switched off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// let sessions = stack.loop_sessions().expect("loop detection is on");
    /// sessions.apply_command("sess-42", "!/set(tool-loop-max-repeats=6)")?;
    /// assert_eq!(sessions.session_settings("sess-42").max_repeats, Some(6));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn loop_sessions(&self) -> Option<LoopDetectHandle> {
        self.loop_detect.as_ref().map(LoopDetectLayer::handle)
    }

    /// The store of idempotency records. `None` when idempotency is switched off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::idempotency::DedupeStore;
    ///
    /// # tokio_test::block_on(async {
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// let store = stack.dedupe_store().expect("idempotency is on");
    /// assert_eq!(store.size().await?, 0);
    /// store.flush_prefix("tenant-a:").await?; // forget every record of one tenant
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn dedupe_store(&self) -> Option<&Arc<dyn DedupeStore>> {
        self.idempotency.as_ref().map(IdempotencyLayer::store)
    }

    /// The idempotency layer itself, for its counters and the store key of a call. `None`
    /// when idempotency is switched off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::ToolCall;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
    /// let call = ToolCall::builder("vault", "createFile")
    ///     .session("s")
    ///     .actor("u")
    ///     .idempotency_key("create-1")
    ///     .build()?;
    /// let idempotency = stack.idempotency().expect("idempotency is on");
    /// assert!(idempotency.store_key(&call)?.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn idempotency(&self) -> Option<&IdempotencyLayer> {
        self.idempotency.as_ref()
    }

    /// The rate-limit layer, for the keys it tracks. `None` when rate limits are switched
    /// off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::registry::RateLimitSettings;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open())
    ///     .rate_limit(|limits| limits.settings(RateLimitSettings::default().with_per_second(20)))
    ///     .build()?;
    /// let limits = stack.rate_limits().expect("rate limits are on");
    /// assert_eq!(limits.tracked_keys("agents.tools.web", "search"), 0);
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn rate_limits(&self) -> Option<&RateLimitLayer> {
        self.rate_limit.as_ref()
    }

    /// The bulkhead layer, for each tool's calls running, waiting and refused. `None` when
    /// the bulkhead is switched off.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::registry::BulkheadSettings;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open())
    ///     .bulkhead(|bulkhead| bulkhead.settings(BulkheadSettings::default().with_max_concurrent(4)))
    ///     .build()?;
    /// let bulkhead = stack.bulkheads().expect("the bulkhead is on");
    /// assert_eq!(bulkhead.limits("agents.tools.web", "search"), Some((4, 4)));
    /// assert_eq!(bulkhead.in_use("agents.tools.web", "search"), 0);
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn bulkheads(&self) -> Option<&BulkheadLayer> {
        self.bulkhead.as_ref()
    }
}

/// The service of [`ToolStack`]: a tool behind every layer of the stack.
///
/// It answers with `ToolOutput` / `ToolError`, so that other tower middleware composes
/// around it.
///
/// ```
/// use serde_json::json;
/// use tower::{Layer, ServiceExt};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::{tool_fn, ToolCall, ToolOutput, ToolStack};
///
/// # tokio_test::block_on(async {
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let search = stack.layer(tool_fn(|_: ToolCall| async { Ok(ToolOutput::new(json!([]))) }));
/// let call = ToolCall::builder("agents.tools.web", "search")
///     .session("s")
///     .actor("u")
///     .build()?;
/// let output = search.oneshot(call).await?;
/// assert_eq!(output.content, json!([]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct ToolStackService<S> {
    inner: Stacked<S>,
}

impl<S: Clone> Clone for ToolStackService<S> {
    fn clone(&self) -> Self {
        ToolStackService {
            inner: self.inner.clone(),
        }
    }
}

impl<S> fmt::Debug for ToolStackService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolStackService").finish_non_exhaustive()
    }
}

impl<S> Service<ToolCall> for ToolStackService<S>
where
    Stacked<S>: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<<Stacked<S> as Service<ToolCall>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(call),
        }
    }
}

pin_project! {
    /// The response future of [`ToolStackService`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl fmt::Debug for ToolStackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolStackBuilder")
            .field("registry", &self.registry)
            .field("idempotency", &self.idempotency)
            .field("hooks", &self.shared.hooks.is_some())
            .field("without", &self.without)
            .finish_non_exhaustive()
    }
}

impl ToolStackBuilder {
    /// Keeps idempotency records in `store` (a [`RedisDedupeStore`](crate::idempotency) to
    /// share them between replicas) instead of a fresh in-memory store. The idempotency
    /// settings made so far are kept.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use std::sync::Arc;
    /// use tower_toolcall::idempotency::{DedupeStore, InMemoryDedupeStore};
    ///
    /// let store: Arc<dyn DedupeStore> =
    ///     Arc::new(InMemoryDedupeStore::builder().capacity(1_000).build()?);
    /// let stack = ToolStack::builder(ToolRegistry::open()).store(store.clone()).build()?;
    /// assert!(Arc::ptr_eq(stack.dedupe_store().unwrap(), &store));
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn store(mut self, store: Arc<dyn DedupeStore>) -> Self {
        self.idempotency = self.idempotency.store(store);
        self
    }

    /// Runs `hooks` before and after every attempt, around the tool, and once for every
    /// call a layer answers without running the tool (from the trace layer; see
    /// [`hooks`](crate::hooks)). Both places get the same object.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::{ToolCall, ToolError, ToolHooks};
    ///
    /// /// Tells the tools which tenant calls them.
    /// #[derive(Debug)]
    /// struct Tenant;
    ///
    /// impl ToolHooks for Tenant {
    ///     fn before_attempt(&self, call: &mut ToolCall) -> Result<(), ToolError> {
    ///         call.envelope_mut().control.from_hook = Some("tenant".into());
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open()).hooks(Tenant).build()?;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn hooks(mut self, hooks: impl ToolHooks) -> Self {
        self.shared.hooks = Some(Arc::new(hooks));
        self
    }

    /// Redacts secrets with `redactor` in the trace layer's events and audit, and in loop
    /// detection's warnings.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::trace::Redactor;
    ///
    /// let redactor = Redactor::builder().secret_name("x-tenant-secret").build()?;
    /// let stack = ToolStack::builder(ToolRegistry::open()).redactor(redactor).build()?;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.shared.redactor = Some(redactor);
        self
    }

    /// Canonicalizes params with `options` in validation, loop detection and idempotency,
    /// which share the canonical form of a call's params.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::canonical::CanonicalOptions;
    ///
    /// // A `nonce` member changes on every call: two calls that differ only there are the same.
    /// let options = CanonicalOptions::default().with_volatile_members(["clientTs", "nonce"]);
    /// let stack = ToolStack::builder(ToolRegistry::open()).canonical_options(options).build()?;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn canonical_options(mut self, options: CanonicalOptions) -> Self {
        self.shared.canonical = Some(options);
        self
    }

    /// Tells `sink` what every layer reports ([`LayerEvent`](crate::event::LayerEvent)):
    /// each call's end from the trace layer, the breakers' transitions, the shared stores'
    /// outages and, when the stack is built, the dedupe settings of every tool. Give it the
    /// metrics (`ToolMetrics`, feature `metrics`; install the recorder first) to count them.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::event::LayerEvent;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open())
    ///     .on_event(|event: &LayerEvent<'_>| {
    ///         if let LayerEvent::BreakerTransition(change) = event {
    ///             eprintln!("{} is now {}", change.key, change.to.as_str());
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn on_event(mut self, sink: impl EventSink) -> Self {
        self.shared.sinks.push(Arc::new(sink));
        self
    }

    /// Keeps the rate-limit quotas in `store` (a
    /// `RedisRateLimitStore` (of `tower-toolcall-redis`) to share them between
    /// replicas) instead of in this process. The rate-limit settings made so far are kept.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use std::sync::Arc;
    /// use tower_toolcall::rate_limit::{Admission, Quota, RateLimitStore};
    /// use tower_toolcall::shared_store::StoreFuture;
    ///
    /// #[derive(Debug)]
    /// struct AlwaysAllowed;
    ///
    /// impl RateLimitStore for AlwaysAllowed {
    ///     fn acquire(&self, _key: &str, _quota: Quota) -> StoreFuture<'static, Admission> {
    ///         Box::pin(async { Ok(Admission::Allowed) })
    ///     }
    /// }
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open())
    ///     .rate_limit(|limits| {
    ///         limits.settings(tower_toolcall::registry::RateLimitSettings::default().with_per_second(20))
    ///     })
    ///     .rate_limit_store(Arc::new(AlwaysAllowed))
    ///     .build()?;
    /// assert!(stack.rate_limits().unwrap().store_health().available);
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn rate_limit_store(mut self, store: Arc<dyn crate::rate_limit::RateLimitStore>) -> Self {
        self.rate_limit = self.rate_limit.store(store);
        self
    }

    /// Keeps loop detection's session histories in `store`, shared by every replica that
    /// uses it, instead of in this process. The loop-detection settings made so far are kept.
    ///
    /// `RedisLoopStore`, of the crate `tower-toolcall-redis`, is such a store.
    pub fn loop_store(mut self, store: Arc<dyn crate::loop_detect::LoopStore>) -> Self {
        self.loop_detect = self.loop_detect.store(store);
        self
    }

    /// Leaves `layer` out of the stack. A layer can also be switched off for some tools only,
    /// in their policy, or shadowed at run time through the [control](ToolStack::control).
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::StackLayer;
    ///
    /// let stack = ToolStack::builder(ToolRegistry::open())
    ///     .without(StackLayer::RateLimit)
    ///     .without(StackLayer::CircuitBreaker)
    ///     .build()?;
    /// assert!(stack.rate_limits().is_none() && stack.breakers().is_none());
    /// # Ok::<(), tower_toolcall::ConfigError>(())
    /// ```
    pub fn without(mut self, layer: StackLayer) -> Self {
        self.without.push(layer);
        self
    }

    /// Checks every layer's configuration and builds the stack; the error names the field.
    ///
    /// ```
    /// # use tower_toolcall::{registry::ToolRegistry, ToolStack};
    /// use tower_toolcall::registry::RetrySettings;
    ///
    /// let error = ToolStack::builder(ToolRegistry::open())
    ///     .retry(|retry| retry.settings(RetrySettings::default().with_max_attempts(0)))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(error.to_string().contains("max_attempts"));
    /// ```
    pub fn build(self) -> Result<ToolStack, ConfigError> {
        let mut stack = self.build_parts()?;
        // The audit log writes each attempt innermost, where only attempts that reach the
        // tool pass.
        stack.audit_attempts = stack
            .trace
            .as_ref()
            .and_then(TraceLayer::audit_log)
            .map(|audit| HookLayer::new(audit.attempt_hooks()));
        Ok(stack)
    }
}
