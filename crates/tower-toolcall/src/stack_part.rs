//! What a layer needs to be a part of [`ToolStack`](crate::ToolStack): its builder made over
//! the stack's registry, and built with what the stack shares between its layers.
//!
//! A layer's folder implements [`StackPart`] for its builder; `stack.rs` lists the layer once,
//! in its place in the order. The stack hands every part the same [`StackShared`], and each
//! takes from it what it uses, so that a new shared thing (or a new layer using one) changes
//! no other layer.

use std::sync::Arc;

use crate::breaker_view::Breakers;
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::event::EventSink;
use crate::hooks::ToolHooks;
use crate::redact::Redactor;
use crate::registry::ToolRegistry;
use crate::resend::Resends;

/// A layer's builder, as the stack makes and builds it.
pub(crate) trait StackPart: Sized {
    /// The layer it builds.
    type Layer: Clone;

    /// The builder over `registry`, with the layer's defaults.
    fn part(registry: &ToolRegistry) -> Self;

    /// Builds the layer with what the stack shares; may leave something in `shared` for the
    /// layers outside it, which are built after it.
    fn build_part(self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError>;
}

/// What the stack's layers share, set once on its builder. Parts are built innermost first.
#[derive(Default)]
pub(crate) struct StackShared {
    /// Run around every attempt and told of every short-circuit.
    pub(crate) hooks: Option<Arc<dyn ToolHooks>>,
    /// Redacts what the layers write or warn.
    pub(crate) redactor: Option<Redactor>,
    /// The canonical form of params that the layers share.
    pub(crate) canonical: Option<CanonicalOptions>,
    /// Told what every layer reports.
    pub(crate) sinks: Vec<Arc<dyn EventSink>>,
    /// The calls the idempotency layer answers from a record, once it is built.
    pub(crate) resends: Option<Resends>,
    /// The breakers, once the breaker layer is built: the retry layer sends no hedge while
    /// the breaker over a call is not closed.
    pub(crate) breakers: Option<Breakers>,
}
