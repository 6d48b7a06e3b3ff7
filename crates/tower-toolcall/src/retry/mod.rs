//! [`RetryLayer`]: tries a failed call again when another attempt may succeed and repeating
//! it is safe, within a number of attempts, a deadline and a global retry budget.
//!
//! # What is retried
//!
//! The [classifier](crate::classify) decides: only [retriable](crate::classify::Verdict)
//! failures are retried — timeouts, connection failures, 408, 429 and 5xx answers, throttles.
//! Terminal failures come back at once, and so does `CIRCUIT_OPEN`: while a breaker is open,
//! nothing is retried.
//!
//! A mutating tool (`writes`, `commands`, or any unregistered tool) is retried only with a
//! reason to believe a repeat is safe: the tool is idempotent; the call carries an
//! idempotency key that the tool forwards (`policy.retry.forwards_idempotency_key`); the error
//! says the request was not processed (connection refused, 429, 503 — see
//! [`ToolError::is_not_processed`](crate::ToolError::is_not_processed)); or the caller vouches
//! for it with `callHints.expectedRetrySafe`. A call marked `callHints.safetyCritical` is
//! retried only when it was not processed.
//!
//! # How often and how long
//!
//! Defaults: 4 attempts in all, a [`Backoff`] of `random(0, min(4 s, 200 ms · 2^(k−1)))`
//! before retry `k` (full jitter; equal, decorrelated and ±percent jitter are selectable), and
//! 30 s for all attempts and sleeps. A tool's `policy.retry` overrides them. A call's
//! `transport.retryBudget` narrows the attempts (`maxAttempts`) and the time (`maxElapsedMs`),
//! `control.deadlineAtMs` sets a deadline of its own, and `callHints.timeoutMs` narrows the
//! time of each attempt through [`TimeoutLayer`](crate::TimeoutLayer) below (it bounds one
//! attempt, not the retries). A `Retry-After` on the error replaces the backoff when it fits
//! before the deadline.
//!
//! The deadline bounds the attempt in flight and the sleeps: an attempt still running when
//! it passes is dropped, and a retry whose delay would end past it is not made.
//!
//! Every call deposits into the [`GlobalRetryBudget`] shared by the layer's clones, and every
//! retry withdraws from it: retries stay below 20 % of calls plus 10 a second, so that an
//! outage cannot become a retry storm.
//!
//! # Hedging
//!
//! A slow attempt may get a second one beside it, a *hedge*, when the tool's `policy.retry`
//! asks for it (off by default): `hedge_delay_ms` after the attempt started, or, with
//! `hedge_percentile`, after that percentile of the tool's latest latencies (kept for its
//! last 128 answered calls; `hedge_delay_ms` applies until 16 are known). The first answer
//! wins, and the other attempt is dropped, which cancels it; a failure of one while the
//! other runs waits for the other. A call is hedged at most once.
//!
//! A hedge repeats a call that may already be running, so it follows the rule of a retry
//! after an attempt that may have been processed: a read-only or idempotent tool, a keyed
//! call of a tool that forwards keys, or a caller's `callHints.expectedRetrySafe` — never a
//! write without a key, never a `callHints.safetyCritical` call, and never a call whose
//! caller reads the answer in chunks ([`stream`](crate::stream)), which two attempts would
//! both send. It is not sent while the
//! breaker over the call is not closed, so that a hedge is never a probe of a half-open
//! breaker (the layer reads the breakers it is given with
//! [`RetryLayerBuilder::breakers`]; [`ToolStack`](crate::ToolStack) gives it its own). Each
//! hedge is an attempt (it needs one left within `max_attempts`) and withdraws from the
//! [`GlobalRetryBudget`]: a refused withdrawal sends no hedge. The deadline bounds both
//! attempts.
//!
//! A hedged call's [`CallRecord`](crate::CallRecord) has the [`HedgeRecord`](crate::HedgeRecord)
//! (the attempt hedged, the delay, the attempt that answered) and counts both attempts in
//! `attempts`; [`RetryLayer::hedges`] counts the hedges of each tool, and each logs a
//! `tool_call_hedge` event.
//!
//! ```
//! use std::time::Duration;
//! use serde_json::json;
//! use tokio::time::Instant;
//! use tower::{Layer, Service, ServiceExt};
//! use tower_toolcall::registry::{RetrySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry};
//! use tower_toolcall::{tool_fn, RetryLayer, ToolCall, ToolOutput};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let hedged = ToolPolicy::default().with_retry(RetrySettings::default().with_hedge_delay_ms(100));
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly).with_policy(hedged))
//!     .build()
//!     .unwrap();
//! let layer = RetryLayer::new(registry);
//! // The first attempt takes 2 s, the hedge 20 ms.
//! let mut svc = layer.layer(tool_fn(|call: ToolCall| async move {
//!     let took = if call.attempt() == 1 { 2_000 } else { 20 };
//!     tokio::time::sleep(Duration::from_millis(took)).await;
//!     Ok(ToolOutput::new(json!({"took": took})))
//! }));
//! let call = ToolCall::builder("agents.tools.web", "search")
//!     .session("s").actor("u").build().unwrap();
//! let start = Instant::now();
//! let out = svc.ready().await.unwrap().call(call).await.unwrap();
//! assert_eq!(start.elapsed(), Duration::from_millis(120));
//! let hedge = out.record().hedge.unwrap();
//! assert_eq!((hedge.attempt, hedge.delay_ms, hedge.winner), (1, 100, Some(2)));
//! assert_eq!(layer.hedges("agents.tools.web", "search"), 1);
//! # }
//! ```
//!
//! # What comes back
//!
//! A call that succeeds after retries has `attempts` and `retried_by` (attempt, delay, reason
//! code, latency of each failed attempt) in its [`CallRecord`](crate::CallRecord). A call the
//! layer gives up on fails with
//!
//! - `RETRY_EXHAUSTED` (status `retry_exhausted`) when every allowed attempt failed, when the
//!   global budget is spent, or when no time is left within the retry deadline (policy or
//!   `retryBudget.maxElapsedMs`);
//! - `TIMEOUT` (status `timeout`) when the call's own deadline, `control.deadlineAtMs`, ends
//!   it;
//!
//! each with the last error's code and message in its message and in its details
//! (`{"reason", "attempts", "lastError": {"code", "message", "httpStatus"}}`), the last error
//! as its [source](std::error::Error::source), and the record of every attempt. A failure
//! that is not retried comes back as it is. The record of a retried call lists the
//! [shadow decisions](crate::ShadowDecision) of layers below about every attempt, the
//! earlier attempts' first. A tool whose policy sets `retry = "off"` is passed through
//! untouched, and so is every call while the operator turns every layer off
//! (`TOOL_RELIABILITY_ENABLED=false`, see [`control`](crate::control)): no retry, and no
//! deposit into the budget.
//!
//! Each attempt runs in a `tool_attempt` span and each sleep in a `tool_backoff` span; each
//! retry logs a `tool_call_retry` event.
//!
//! # Why not tower's `Retry`
//!
//! tower's [`Retry`](https://docs.rs/tower/latest/tower/retry/struct.Retry.html) with a
//! policy of ours would classify and back off well enough, but its policy only acts between
//! attempts, so it cannot bound the attempt in flight by the call's deadline; it clones the
//! whole policy and service for every call; and its policy would have to look the tool's
//! policy up, narrow it per call and rewrite the final error from inside `retry`. This
//! service does all of it in one state machine: attempt, sleep, wait for readiness, with the
//! deadline raced against each, and the per-tool policy resolved once, when the layer is
//! built.
//!
//! # Why not tower's `TpsBudget`
//!
//! tower's [`TpsBudget`](https://docs.rs/tower/latest/tower/retry/budget/struct.TpsBudget.html)
//! is Finagle's budget, and [`GlobalRetryBudget`] is the token bucket SPEC §6 asks for ("as
//! gRPC and AWS SDKs do"); they allow different retries:
//!
//! - *what a call earns*: `TpsBudget` forgets a deposit after its `ttl` (1 to 60 s, in ten
//!   slots); here a call's `retry_ratio` stays in the bucket until a retry spends it, up to
//!   `capacity`, which `TpsBudget` does not have;
//! - *the floor*: `TpsBudget` grants `min_per_sec · ttl` retries per window, an integer that
//!   starts with the window; here `min_per_second` (any non-negative number) refills the
//!   bucket continuously, and the bucket starts full;
//! - *the ratio*: `TpsBudget` turns `retry_percent` into whole deposit and withdrawal amounts
//!   (a ratio of 0.3 withdraws 3 per deposit, so 33 % are retried); here the ratio is exact;
//! - *what it reports and refuses*: `TpsBudget` panics on numbers out of range and has no
//!   counters; here bad numbers are a [`ConfigError`](crate::ConfigError) naming the field,
//!   and [`GlobalRetryBudget::stats`] counts what was granted and refused;
//! - *its clock*: a withdrawal here takes the `now` of the attempt, so that the budget's tests
//!   count tokens exactly under paused tokio time ("50 calls earn 10 retries", "half a second
//!   earns 5"), which `TpsBudget`'s windows would not reproduce.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
//! use tower_toolcall::{tool_fn, RetryLayer, ToolCall, ToolError, ToolOutput};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly))
//!     .build()
//!     .unwrap();
//! let calls = Arc::new(AtomicUsize::new(0));
//! let seen = calls.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::builder(registry).seed(7).build().unwrap())
//!     .service(tool_fn(move |_call: ToolCall| {
//!         let n = seen.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             if n == 0 {
//!                 Err(ToolError::from_http_status(503, "search backend is down"))
//!             } else {
//!                 Ok(ToolOutput::new(json!({"hits": 3})))
//!             }
//!         }
//!     }));
//! let call = ToolCall::builder("agents.tools.web", "search")
//!     .session("s").actor("u").build().unwrap();
//! let out = svc.ready().await.unwrap().call(call).await.unwrap();
//! assert_eq!(out.record().attempts, Some(2));
//! assert_eq!(out.record().retried_by[0].reason_code, "UPSTREAM_UNAVAILABLE");
//! # }
//! ```

mod backoff;
mod budget;
mod future;
mod hedge;
mod layer;
mod policy;
mod service;

pub use backoff::Backoff;
pub use budget::{BudgetStats, GlobalRetryBudget, GlobalRetryBudgetBuilder};
pub use future::ResponseFuture;
pub use layer::{RetryLayer, RetryLayerBuilder};
pub use policy::RetryPolicy;
pub use service::Retry;
