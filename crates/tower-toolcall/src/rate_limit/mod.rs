//! [`RateLimitLayer`]: a quota of calls per second for each tool, on governor's keyed
//! limiter.
//!
//! A tool's quota comes from its `policy.rate_limit` (`per_second`, `burst`), or from the
//! layer's default rate when it sets one; a tool with neither, or with
//! `rate_limit = "off"`, is not limited. The quota is kept per key, by policy:
//!
//! - `tool` (default): one quota for all calls of the tool;
//! - `tool_tenant`: one per tool and `target.tenantId` (calls without a tenant share one);
//! - `tool_session`: one per tool and `target.sessionKey`.
//!
//! A call over its quota is, by policy ([`OnLimit`](crate::registry::OnLimit)), either
//! rejected with `RATE_LIMITED` — retriable, not processed, with a retry-after of the time
//! until the quota allows a call — or made to wait that long, up to `max_wait`; a call that
//! would wait longer is rejected.
//!
//! Each tool's limiter holds at most `max_keys` keys (10 000 by default), at every moment: a
//! new key beyond them takes the place of the least recently used one, which has usually been
//! idle long enough for its quota to be full again (a key that made room before then starts
//! over with a full burst when it returns). On a schedule (every minute by default) the layer
//! also drops the keys whose quota is full again: they are as good as new.
//!
//! While the operator turns every layer off (`TOOL_RELIABILITY_ENABLED=false`, see
//! [`control`](crate::control)), calls pass untouched and draw on no quota. In shadow mode
//! (`TOOL_RELIABILITY_SHADOW=rate_limit`) quotas are counted as usual but a call over its
//! quota runs at once, with `would_limit` (or `would_wait`) in its record's
//! [shadow decisions](crate::ShadowDecision).
//!
//! Time is tokio's, so paused time drives the limits in tests.
//!
//! # Quotas shared by replicas
//!
//! Behind a load balancer, each replica's quota adds up: 10 calls a second becomes 10·N. With
//! a [`RateLimitStore`] (`RedisRateLimitStore` of the crate `tower-toolcall-redis`) set by
//! [`RateLimitLayerBuilder::store`], every replica draws on one quota per key, kept by the
//! store (GCRA on the server's clock, one round trip per check; concurrent checks of one
//! quota share a round trip and are each answered as if alone), and the retry-after of a
//! refused call is the store's answer. When the store cannot answer within its timeout, the
//! call follows the layer's [failure policy](crate::shared_store): by default it proceeds,
//! and the outage is counted in [`RateLimitLayer::store_health`] and logged once.
//!
//! ```
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::registry::{RateLimitSettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry};
//! use tower_toolcall::{tool_fn, ErrorCode, RateLimitLayer, ToolCall, ToolOutput};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let registry = ToolRegistry::builder()
//!     .tool(ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
//!         .with_policy(ToolPolicy::default()
//!             .with_rate_limit(RateLimitSettings::default().with_per_second(2))))
//!     .build()
//!     .unwrap();
//! let mut svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(registry))
//!     .service(tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!([]))) }));
//! let call = ToolCall::builder("agents.tools.web", "search").session("s").actor("u").build().unwrap();
//! for _ in 0..2 {
//!     svc.ready().await.unwrap().call(call.clone()).await.unwrap();
//! }
//! let err = svc.ready().await.unwrap().call(call).await.unwrap_err();
//! assert_eq!(err.code(), ErrorCode::RateLimited);
//! assert!(err.retry_after().is_some());
//! # }
//! ```

mod future;
mod layer;
mod limiter;
mod memory;
mod service;
mod store;

pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use memory::InMemoryRateLimitStore;
pub use service::RateLimit;
pub use store::{Admission, Quota, RateLimitStore};
