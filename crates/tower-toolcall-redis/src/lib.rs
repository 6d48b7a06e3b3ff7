//! Redis stores for [`tower_toolcall`], shared by every replica of a fleet.
//!
//! Behind a load balancer, each replica of a gateway keeps its own idempotency records,
//! quotas and loop histories, and an operator's switch reaches one replica out of N. This
//! crate keeps them in Redis (7.0 or later), through the store seams of the core:
//!
//! | type | seam of the core | what every replica then shares |
//! |---|---|---|
//! | [`RedisDedupeStore`] | [`DedupeStore`](tower_toolcall::idempotency::DedupeStore) | idempotency records: a call runs once in the fleet |
//! | [`RedisRateLimitStore`] | [`RateLimitStore`](tower_toolcall::rate_limit::RateLimitStore) | rate-limit quotas: 10 calls a second is 10 for the fleet |
//! | [`RedisLoopStore`] | [`LoopStore`](tower_toolcall::loop_detect::LoopStore) | loop-detection histories and a session's own settings |
//! | [`FleetControl`] | [`FleetActions`](tower_toolcall::stack::FleetActions) | operator actions: force-open, resets, the kill switch, shadow mode |
//!
//! Every operation is bounded by a timeout (1 s by default); what a layer does while Redis
//! cannot be reached is its [`FailurePolicy`](tower_toolcall::shared_store::FailurePolicy).
//! The stores of one process on one server share what they know of its outages: once one
//! times out, the others fail at once until the server answers again.
//!
//! # Example
//!
//! The whole stack, its records, quotas and loop histories in Redis, and the fleet's
//! operator actions through it:
//!
//! ```no_run
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::ToolStack;
//! use tower_toolcall_redis::{FleetControl, RedisDedupeStore, RedisLoopStore, RedisRateLimitStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "redis://127.0.0.1:6379/";
//! let stack = ToolStack::builder(ToolRegistry::open())
//!     .store(RedisDedupeStore::open(url)?)
//!     .rate_limit(|limits| limits.per_second(20))
//!     .rate_limit_store(RedisRateLimitStore::open(url)?)
//!     .loop_store(RedisLoopStore::open(url)?)
//!     .build()?;
//! let fleet = FleetControl::builder(url).join(&stack)?;
//! fleet.sync().await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod dedupe;
pub mod fleet;
mod loop_store;
mod rate_limit;
mod support;
mod target;

pub use dedupe::{
    RedisDedupeStore, RedisDedupeStoreBuilder, RedisStoreStats, DEFAULT_FALLBACK_POLL_INTERVAL,
    DEFAULT_REDIS_KEY_PREFIX, DEFAULT_REDIS_OPERATION_TIMEOUT,
};
pub use fleet::{FleetControl, FleetControlBuilder, FleetStats, DEFAULT_FLEET_KEY_PREFIX};
pub use loop_store::{RedisLoopStore, RedisLoopStoreBuilder, DEFAULT_LOOP_KEY_PREFIX};
pub use rate_limit::{
    RedisRateLimitStore, RedisRateLimitStoreBuilder, DEFAULT_RATE_LIMIT_KEY_PREFIX,
};
pub use target::RedisTarget;
