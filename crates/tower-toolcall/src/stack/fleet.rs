//! [`FleetActions`]: the operator actions that a fleet of replicas shares.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::breaker::BreakerKey;
use crate::control::ShadowLayer;
use crate::error::ToolError;

/// An operator action on its way to every replica.
pub type FleetFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ToolError>> + Send + 'a>>;

/// The operator actions that a fleet of replicas shares: behind a load balancer, an operator
/// who force-opens a breaker through one replica's handle changes one replica out of N; an
/// implementation sends each action to every replica of the fleet (`FleetControl`, of the
/// crate `tower-toolcall-redis`, does it through Redis pub/sub). The admin router of
/// `tower-toolcall-axum` sends its actions through one, when given one (`AdminRouter::fleet`).
///
/// Each action is done on every replica, this one included, when its future answers `Ok`.
/// An error is a [`ToolError`]: `VALIDATION_ERROR` for an action no replica can apply (an
/// empty session), `STORE_UNAVAILABLE` when the fleet could not be reached, in which case
/// the action was applied nowhere.
///
/// ```
/// use tower_toolcall::breaker::BreakerKey;
/// use tower_toolcall::control::ShadowLayer;
/// use tower_toolcall::stack::{FleetActions, FleetFuture};
///
/// /// A fleet of one: this replica's own switches.
/// #[derive(Debug)]
/// struct Alone(tower_toolcall::control::ReliabilityControl);
///
/// impl FleetActions for Alone {
///     fn force_open(&self, _key: &BreakerKey) -> FleetFuture<'_> {
///         Box::pin(async { Ok(()) })
///     }
///     fn reset_breaker(&self, _key: &BreakerKey) -> FleetFuture<'_> {
///         Box::pin(async { Ok(()) })
///     }
///     fn reset_session(&self, _session: &str) -> FleetFuture<'_> {
///         Box::pin(async { Ok(()) })
///     }
///     fn set_enabled(&self, enabled: bool) -> FleetFuture<'_> {
///         self.0.set_enabled(enabled);
///         Box::pin(async { Ok(()) })
///     }
///     fn set_shadow(&self, layer: ShadowLayer, shadow: bool) -> FleetFuture<'_> {
///         self.0.set_shadow(layer, shadow);
///         Box::pin(async { Ok(()) })
///     }
/// }
/// ```
pub trait FleetActions: fmt::Debug + Send + Sync + 'static {
    /// Holds the breaker `key` open on every replica until it is reset.
    fn force_open(&self, key: &BreakerKey) -> FleetFuture<'_>;

    /// Closes the breaker `key` on every replica.
    fn reset_breaker(&self, key: &BreakerKey) -> FleetFuture<'_>;

    /// Forgets `session`'s loop history on every replica (and in the shared loop store, if
    /// the stack uses one); its settings stay.
    fn reset_session(&self, session: &str) -> FleetFuture<'_>;

    /// Turns every layer of every replica on, or into a pass-through (the kill switch).
    fn set_enabled(&self, enabled: bool) -> FleetFuture<'_>;

    /// Puts `layer` in or out of shadow mode on every replica.
    fn set_shadow(&self, layer: ShadowLayer, shadow: bool) -> FleetFuture<'_>;
}
