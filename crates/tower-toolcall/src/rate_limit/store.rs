//! Quotas kept where several replicas share them.

use std::fmt;
use std::time::Duration;

use crate::shared_store::StoreFuture;

/// A tool's quota, as the layer resolved it: `per_second` calls a second on average, at most
/// `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Quota {
    /// Calls a second, on average (at least 1).
    pub per_second: u32,
    /// Calls allowed at once (at least 1).
    pub burst: u32,
}

impl Quota {
    /// The time between two calls at the average rate.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_secs(1) / self.per_second.max(1)
    }
}

/// What a store answers for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// The call took one unit of its quota.
    Allowed,
    /// The quota is spent: it allows the next call after this long.
    RetryAfter(Duration),
}

/// Where the quotas of a [`RateLimitLayer`](super::RateLimitLayer) are kept when replicas
/// share them, set with
/// [`RateLimitLayerBuilder::store`](super::RateLimitLayerBuilder::store). Without one, each
/// process keeps its own quotas with governor's in-process limiter.
///
/// `RedisRateLimitStore`, of the crate `tower-toolcall-redis`, is one.
/// An implementation takes one unit of `key`'s quota atomically (GCRA: every replica sees
/// one schedule) and answers within its own timeout.
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::rate_limit::{Admission, Quota, RateLimitStore};
/// use tower_toolcall::shared_store::StoreFuture;
///
/// /// A store that refuses every call for a second.
/// #[derive(Debug)]
/// struct Closed;
///
/// impl RateLimitStore for Closed {
///     fn acquire(&self, _key: &str, _quota: Quota) -> StoreFuture<'static, Admission> {
///         Box::pin(async { Ok(Admission::RetryAfter(Duration::from_secs(1))) })
///     }
/// }
/// ```
pub trait RateLimitStore: fmt::Debug + Send + Sync + 'static {
    /// Takes one call from `key`'s `quota`, or says how long until it allows one. `key` names
    /// the tool and, by the tool's key policy, the tenant or the session.
    fn acquire(&self, key: &str, quota: Quota) -> StoreFuture<'static, Admission>;
}
