use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tower_service::Service;

use super::future::{ResponseFuture, Waiting};
use super::limiter::{Sweeper, ToolLimit};
use super::store::RateLimitStore;
use crate::control::ShadowLayer;
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::middleware::shadow_decision;
use crate::outcome::{ShadowVerdict, ToolOutput};
use crate::redact::identifier;
use crate::registry::RateLimitKey;
use crate::shared_store::Outages;
use crate::time::millis;
use crate::tool_table::ToolTable;

/// Holds calls to their tool's quota; made by [`RateLimitLayer`](super::RateLimitLayer).
#[derive(Clone, Debug)]
pub struct RateLimit<S> {
    inner: S,
    limits: Arc<Limits>,
}

/// What the clones of a layer share.
#[derive(Debug)]
pub(crate) struct Limits {
    /// Per tool; `None` where the tool is not limited.
    pub(super) tools: ToolTable<Option<Arc<ToolLimit>>>,
    pub(super) sweeper: Sweeper,
    /// Where the quotas are kept when replicas share them.
    pub(super) store: Option<Arc<dyn RateLimitStore>>,
    pub(super) outages: Outages,
}

impl Limits {
    pub(super) fn all(&self) -> impl Iterator<Item = &ToolLimit> {
        self.tools.values().filter_map(|limit| limit.as_deref())
    }
}

impl<S> RateLimit<S> {
    pub(super) fn new(inner: S, limits: Arc<Limits>) -> Self {
        RateLimit { inner, limits }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for RateLimit<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Quotas are per call: an exhausted quota refuses (or delays) in `call`, so that one
        // busy tool never holds up the others.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let Some(acting) = self.limits.tools.gate(&call, Some(ShadowLayer::RateLimit)) else {
            return ResponseFuture::called(self.inner.call(call));
        };
        let (limit, shadow) = (acting.tool, acting.shadow);
        let key = limit.key_for(&call);
        if let Some(store) = &self.limits.store {
            // The store answers later: the ready service waits for its answer.
            let check = store.acquire(&key, limit.quota());
            let clone = self.inner.clone();
            let service = mem::replace(&mut self.inner, clone);
            let waiting = Waiting::new(service, call, limit.clone(), key, shadow);
            return ResponseFuture::checking(waiting, self.limits.clone(), check);
        }
        let decision = limit.check(&key);
        self.limits.sweeper.tend(self.limits.all());
        match decision {
            Ok(()) => ResponseFuture::called(self.inner.call(call)),
            Err(wait) if shadow => {
                let verdict = if limit.waits_for(wait) {
                    ShadowVerdict::WouldWait
                } else {
                    ShadowVerdict::WouldLimit
                };
                let decision = shadow_decision(&call, ShadowLayer::RateLimit, verdict);
                ResponseFuture::shadowed(self.inner.call(call), decision)
            }
            Err(wait) if limit.waits_for(wait) => {
                // The ready service makes the call once the quota allows it.
                let clone = self.inner.clone();
                let service = mem::replace(&mut self.inner, clone);
                let waiting = Waiting::new(service, call, limit.clone(), key, false);
                ResponseFuture::waiting(waiting, self.limits.clone(), wait)
            }
            Err(wait) => ResponseFuture::rejected(refused(&call, limit, wait)),
        }
    }
}

/// The error of a call refused for being over its quota, logged.
pub(super) fn refused(call: &ToolCall, limit: &ToolLimit, wait: Duration) -> ToolError {
    tracing::debug!(
        event = "tool_call_blocked",
        requestId = &*identifier(call.request_id()),
        toolName = call.tool_name(),
        retry_after_ms = millis(wait),
        "rate limit rejected the call"
    );
    over_limit(call, limit, wait)
}

/// The error of a call over its quota.
pub(super) fn over_limit(call: &ToolCall, limit: &ToolLimit, wait: Duration) -> ToolError {
    let (key, whose) = match limit.key {
        RateLimitKey::Tool => ("tool", ""),
        RateLimitKey::ToolTenant => ("tool_tenant", " for this tenant"),
        RateLimitKey::ToolSession => ("tool_session", " for this session"),
        RateLimitKey::ToolActor => ("tool_actor", " for this caller"),
    };
    let wait_ms = millis(wait).max(1);
    ToolError::rejected(
        ErrorCode::RateLimited,
        format!(
            "{} is over its rate limit of {} calls a second (bursts of {}){whose}: it was not \
             called; retry after {wait_ms} ms",
            call.tool_name(),
            limit.per_second,
            limit.burst
        ),
    )
    .with_retry_after(wait)
    .with_details(json!({
        "retryAfterMs": wait_ms,
        "perSecond": limit.per_second,
        "burst": limit.burst,
        "key": key,
    }))
}
