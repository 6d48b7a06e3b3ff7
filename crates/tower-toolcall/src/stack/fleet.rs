//! [`FleetActions`]: the operator actions that a fleet of replicas shares, each an
//! [`OperatorAction`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::breaker::BreakerKey;
use crate::control::ShadowLayer;
use crate::error::ToolError;

/// An operator action on its way to every replica.
pub type FleetFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ToolError>> + Send + 'a>>;

/// An operator action that a fleet of replicas shares: what a [`FleetActions`] sends to
/// every replica.
///
/// ```
/// use tower_toolcall::breaker::BreakerKey;
/// use tower_toolcall::control::ShadowLayer;
/// use tower_toolcall::stack::OperatorAction;
///
/// let actions = [
///     OperatorAction::ForceOpen(BreakerKey::tool("web", "search")),
///     OperatorAction::SetEnabled(false),
///     OperatorAction::SetShadow(ShadowLayer::RateLimit, true),
/// ];
/// assert_eq!(actions[1], OperatorAction::SetEnabled(false));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorAction {
    /// Holds the breaker open on every replica until it is reset.
    ForceOpen(BreakerKey),
    /// Closes the breaker on every replica.
    ResetBreaker(BreakerKey),
    /// Forgets the session's loop history on every replica (and in the shared loop store, if
    /// the stack uses one); its settings stay.
    ResetSession(String),
    /// Turns every layer of every replica on (`true`), or into a pass-through (`false`): the
    /// kill switch.
    SetEnabled(bool),
    /// Puts the layer in (`true`) or out of shadow mode on every replica.
    SetShadow(ShadowLayer, bool),
}

/// The operator actions that a fleet of replicas shares: behind a load balancer, an operator
/// who force-opens a breaker through one replica's handle changes one replica out of N; an
/// implementation sends each [`OperatorAction`] to every replica of the fleet
/// (`FleetControl`, of the crate `tower-toolcall-redis`, does it through Redis pub/sub). The
/// admin router of `tower-toolcall-axum` sends its actions through one, when given one
/// (`AdminRouter::fleet`).
///
/// An implementation gives [`act`](FleetActions::act); the other methods send one action
/// each through it.
///
/// Each action is done on every replica, this one included, when its future answers `Ok`.
/// An error is a [`ToolError`]: `VALIDATION_ERROR` for an action no replica can apply (an
/// empty session, or an action the implementation does not carry), `STORE_UNAVAILABLE` when
/// the fleet could not be reached, in which case the action was applied nowhere.
///
/// ```
/// use tower_toolcall::control::ShadowLayer;
/// use tower_toolcall::stack::{FleetActions, FleetFuture, OperatorAction};
///
/// /// A fleet of one: this replica's own switches.
/// #[derive(Debug)]
/// struct Alone(tower_toolcall::control::ReliabilityControl);
///
/// impl FleetActions for Alone {
///     fn act(&self, action: OperatorAction) -> FleetFuture<'_> {
///         match action {
///             OperatorAction::SetEnabled(enabled) => self.0.set_enabled(enabled),
///             OperatorAction::SetShadow(layer, shadow) => self.0.set_shadow(layer, shadow),
///             _ => {}
///         }
///         Box::pin(async { Ok(()) })
///     }
/// }
///
/// # tokio_test::block_on(async {
/// let alone = Alone(Default::default());
/// alone.set_shadow(ShadowLayer::Breaker, true).await?;
/// assert!(alone.0.is_shadow(ShadowLayer::Breaker));
/// # Ok::<(), tower_toolcall::ToolError>(())
/// # }).unwrap();
/// ```
pub trait FleetActions: fmt::Debug + Send + Sync + 'static {
    /// Does `action` on every replica.
    fn act(&self, action: OperatorAction) -> FleetFuture<'_>;

    /// Holds the breaker `key` open on every replica until it is reset.
    fn force_open(&self, key: &BreakerKey) -> FleetFuture<'_> {
        self.act(OperatorAction::ForceOpen(key.clone()))
    }

    /// Closes the breaker `key` on every replica.
    fn reset_breaker(&self, key: &BreakerKey) -> FleetFuture<'_> {
        self.act(OperatorAction::ResetBreaker(key.clone()))
    }

    /// Forgets `session`'s loop history on every replica (and in the shared loop store, if
    /// the stack uses one); its settings stay.
    fn reset_session(&self, session: &str) -> FleetFuture<'_> {
        self.act(OperatorAction::ResetSession(session.to_owned()))
    }

    /// Turns every layer of every replica on, or into a pass-through (the kill switch).
    fn set_enabled(&self, enabled: bool) -> FleetFuture<'_> {
        self.act(OperatorAction::SetEnabled(enabled))
    }

    /// Puts `layer` in or out of shadow mode on every replica.
    fn set_shadow(&self, layer: ShadowLayer, shadow: bool) -> FleetFuture<'_> {
        self.act(OperatorAction::SetShadow(layer, shadow))
    }
}
