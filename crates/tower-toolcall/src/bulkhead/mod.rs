//! [`BulkheadLayer`]: a limit on the calls of each tool (and of each namespace's tools
//! together) running at once, with a bounded queue ordered by the calls' priority.
//!
//! A tool's limit comes from its `policy.bulkhead` (`max_concurrent`, `max_queued`), or from
//! the layer's settings when they set one; a tool with neither, or with `bulkhead = "off"`,
//! is not limited. A burst of one tool's calls then takes at most `max_concurrent` places,
//! and leaves the process's other work alone. The tools an open registry does not know share
//! one set of places, that of the registry's unregistered policy: their number is not
//! bounded, and one set keeps what they hold bounded.
//!
//! - A call that finds a free place runs at once, and holds its place until it ends: across
//!   its retries, since the stack puts the bulkhead outside [`RetryLayer`](crate::RetryLayer).
//! - A call that finds every place taken waits in the tool's queue, of at most `max_queued`
//!   calls (by default as many as `max_concurrent`; 0 for none). When a place frees, the
//!   waiting call of the highest `payload.callHints.priority` gets it (`high`, then `normal`,
//!   the default, then `low`), and among calls of one priority the one that began to wait
//!   first ([`Priority`](crate::envelope::Priority)).
//! - A call that finds the queue full is refused at once with `RATE_LIMITED`: retriable, not
//!   processed, with a retry-after (`retry_after_ms`, 1 s by default), and
//!   [`ShortCircuit::BulkheadFull`](crate::ShortCircuit::BulkheadFull) in its record. Such a
//!   refusal never reaches the breaker or the retry layer inside the bulkhead, and the
//!   classifier ignores it as any layer's rejection.
//! - Time in the queue counts against the call's deadline: a call whose `control.deadlineAtMs`
//!   (or whose `transport.retryBudget.maxElapsedMs`, counted from its arrival) passes while it
//!   waits leaves the queue with `TIMEOUT`, and the tool never runs it.
//! - A waiting call whose caller goes away (its future dropped) leaves the queue; its place
//!   there and any place it was just given are free again.
//!
//! A namespace may be limited as a whole with
//! [`BulkheadLayerBuilder::namespace`]: its registered tools share `max_concurrent` places and
//! a queue of `max_queued`, beside any limit of their own, so that the tools of one
//! dependency (an upstream server behind a gateway, whose tools it registers under its name)
//! cannot take every place of the process between them. Its places and queue are the same
//! kind as a tool's, with the same rules: priority then arrival, a full queue refuses at once
//! with `RATE_LIMITED` (its details say `"limit": "namespace"`), time waiting counts against
//! the deadline. A call takes its tool's place first, then its namespace's: while it waits
//! for its tool, it holds nothing the namespace's other tools could use, and its deadline
//! covers both waits. A tool whose own bulkhead is `"off"` still shares its namespace's
//! places; unregistered tools share none, whatever their namespace. The limit is set on the
//! layer, as the dependency breakers' settings are, since it is no one tool's policy.
//!
//! A layer built to replace another (a server that rebuilds its stack on a reload) keeps the
//! places of each tool and namespace whose limits did not change with
//! [`BulkheadLayerBuilder::carry`], so that the calls still running on the old stack count
//! against the new one's limits.
//!
//! [`BulkheadLayer::in_use`], [`queued`](BulkheadLayer::queued) and
//! [`refused`](BulkheadLayer::refused) count each tool's calls, and
//! [`namespace_in_use`](BulkheadLayer::namespace_in_use) and its siblings each namespace's.
//! With the `metrics` feature, `ToolMetrics::record_bulkheads` turns these counts into gauges
//! at scrape time, at no cost to the calls, and the refusals are counted from each call's
//! record (`trace::metrics` lists the series). While the operator turns every
//! layer off (`TOOL_RELIABILITY_ENABLED=false`, see [`control`](crate::control)), calls pass
//! untouched and take no place. The layer has no shadow mode. Time is tokio's, so paused time
//! drives the deadlines in tests. The queue is `priority-semaphore`'s: no unsafe code, first
//! in first out within a priority, and a dropped wait never keeps a place.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceExt};
//! use tower_toolcall::registry::{BulkheadSettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry};
//! use tower_toolcall::{tool_fn, BulkheadLayer, ErrorCode, ToolCall, ToolOutput};
//! use tower::Layer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "fetch", RiskLevel::ReadOnly)
//!         .with_policy(ToolPolicy::default().with_bulkhead(
//!             BulkheadSettings::default().with_max_concurrent(1).with_max_queued(0),
//!         )))
//!     .build()
//!     .unwrap();
//! let layer = BulkheadLayer::new(registry);
//! let mut svc = layer.layer(tool_fn(|_call: ToolCall| async {
//!     tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//!     Ok(ToolOutput::new(json!("page")))
//! }));
//! let call = ToolCall::builder("agents.tools.web", "fetch").session("s").actor("u").build().unwrap();
//! let running = svc.ready().await.unwrap().call(call.clone()); // takes the only place
//! assert_eq!(layer.in_use("agents.tools.web", "fetch"), 1);
//! let err = svc.ready().await.unwrap().call(call).await.unwrap_err();
//! assert_eq!(err.code(), ErrorCode::RateLimited);
//! assert!(err.retry_after().is_some());
//! assert_eq!(layer.refused("agents.tools.web", "fetch"), 1);
//! running.await.unwrap();
//! assert_eq!(layer.in_use("agents.tools.web", "fetch"), 0);
//! # }
//! ```

mod future;
mod layer;
mod places;
mod service;

pub use future::ResponseFuture;
pub use layer::{BulkheadLayer, BulkheadLayerBuilder};
pub use service::Bulkhead;
