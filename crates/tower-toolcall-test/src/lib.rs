//! The test support that the suites and benches of the `tower-toolcall` crates share, as a
//! crate of its own (never published) that each of them names in its `[dev-dependencies]`.
//!
//! - Tools that stand in for real ones ([`Counter`], [`ScriptedTool`]) and the calls,
//!   registries and stacks the suites build ([`call_of`], [`registry_of`], [`call_once`],
//!   [`stacked`]).
//! - What a test observes: the `tracing` events and spans of its thread ([`capture`]), the
//!   series a metrics recorder holds ([`metrics_series`]), a condition it waits for
//!   ([`eventually`]).
//! - Real Redis where users have it: a `redis-server` of a test's own on a free loopback port
//!   ([`redis_server`]), and with the feature `cluster` a Redis Cluster of six nodes
//!   (`cluster`).
//! - The calls of the idempotency benches ([`dedupe_calls`]), the same for every store.
//!
//! What a single crate's suites use alone stays in that crate's `tests/support`.

#![forbid(unsafe_code)]

mod calls;
pub mod capture;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod dedupe_calls;
pub mod metrics_series;
mod monitor;
pub mod redis_server;
mod tools;
mod wait;

pub use calls::{call_of, call_once, registry_of, stacked};
pub use monitor::Monitor;
pub use tools::{Counter, ScriptedTool, Step};
pub use wait::eventually;
