//! [`CircuitBreakerLayer`]: stops calling a tool (or a dependency) that keeps failing, and
//! lets it recover.
//!
//! Each tool has its own breaker by default; a call whose `transport.circuitBreakerHint` is
//! `dependency` is guarded by the breaker of its tool's namespace instead, and `global` by one
//! breaker for every tool. A breaker is
//!
//! - **closed**: calls pass and their outcomes are counted. It opens when, inside a rolling
//!   window (120 s), either 5 consecutive calls failed, or at least 50 % of the last 20 calls
//!   failed, with at least 10 of them counted;
//! - **open**: calls fail at once with `CIRCUIT_OPEN` (retriable, with a retry-after of the
//!   time left); the tool is not touched. After the cooldown (30 s) it becomes
//! - **half-open**: one probe at a time is let through (others fail fast); 2 consecutive
//!   successful probes close it, a failed probe reopens it and restarts the cooldown, and a
//!   probe that has not answered within the tool's attempt timeout (30 s if it has none) is
//!   abandoned as failed, so the breaker cannot stick half-open;
//! - **forced open** by an operator ([`BreakerAdmin::force_open`]) until reset.
//!
//! Only failures that speak of the dependency's health count — the [classifier](crate::classify)
//! decides; caller errors (validation, 4xx) and calls refused by other layers do not.
//! Results of calls admitted before a transition are counted in the stats but never re-open
//! or extend a break.
//!
//! Read-only tools start from a preset of 8 consecutive failures and a 20 s cooldown,
//! mutating tools from one of a 25 % failure rate (both changed through
//! [`CircuitBreakerLayerBuilder::read_only`] and [`mutating`](CircuitBreakerLayerBuilder::mutating)),
//! and a tool's `policy.breaker` overrides any number; `breaker = "off"` lets its calls through
//! untouched. The breakers of registered tools are made when the layer is built; those of
//! unregistered tools and namespaces on demand, in a map whose size is bounded
//! (`max_breakers` of the layer's [settings](CircuitBreakerLayerBuilder::settings)).
//!
//! Every outcome the breaker sees leaves the breaker's state in the call's
//! [`CallRecord`](crate::CallRecord). Every transition is logged (`tool_call_circuit_state`)
//! and told to the [event sinks](BreakerAdmin::on_event), after the breaker's lock is
//! released. The state machine inside is pure: it takes `now` and the
//! configuration and returns the transition; the service reads the tokio clock, so paused
//! time drives the breakers in tests.
//!
//! Put the breaker inside the [`RetryLayer`](crate::RetryLayer): each attempt is then counted,
//! and an open breaker stops the retries.
//!
//! The operator's switches ([`control`](crate::control)): while every layer is turned off
//! (`TOOL_RELIABILITY_ENABLED=false`), calls pass untouched and uncounted. With
//! `TOOL_RELIABILITY_OPEN_MODE=off`, or the breaker in shadow mode
//! (`TOOL_RELIABILITY_SHADOW=breaker`), the breakers run their state machines exactly as when
//! enforcing — transitions, probes, listeners — but never fail a call: a call a breaker
//! would have refused runs, uncounted as if refused, with `would_reject` in its record's
//! [shadow decisions](crate::ShadowDecision), and a failure that opens a breaker notes
//! `would_open`.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{tool_fn, BreakerState, CircuitBreakerLayer, ErrorCode, ToolCall, ToolError};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("vault", "createFile", RiskLevel::Writes))
//!     .build()
//!     .unwrap();
//! let breaker = CircuitBreakerLayer::new(registry);
//! let admin = breaker.admin();
//! let mut svc = ServiceBuilder::new()
//!     .layer(breaker)
//!     .service(tool_fn(|_call: ToolCall| async {
//!         Err(ToolError::from_http_status(503, "vault is down"))
//!     }));
//! let call = ToolCall::builder("vault", "createFile").session("s").actor("u").build().unwrap();
//! for _ in 0..5 {
//!     let err = svc.ready().await.unwrap().call(call.clone()).await.unwrap_err();
//!     assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
//! }
//! assert_eq!(admin.state("vault", "createFile"), BreakerState::Open);
//! let err = svc.ready().await.unwrap().call(call).await.unwrap_err();
//! assert_eq!(err.code(), ErrorCode::CircuitOpen);
//! # }
//! ```

mod admin;
mod cell;
mod future;
mod layer;
mod map;
mod service;
mod state;
mod window;

pub use crate::event::{BreakerKey, TransitionEvent, TransitionReason};
pub use admin::{BreakerAdmin, BreakerStats, BreakerStatus};
pub use future::ResponseFuture;
pub use layer::{CircuitBreakerLayer, CircuitBreakerLayerBuilder};
pub use service::CircuitBreaker;
