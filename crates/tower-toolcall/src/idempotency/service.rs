use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::{deduplicate, execute, Claim, ResponseFuture};
use super::key::{self, KeySource};
use super::store::{ClaimRequest, DedupeStore};
use crate::canonical::{self, CanonicalOptions};
use crate::control::ShadowLayer;
use crate::envelope::{DedupeMode, ToolCall};
use crate::error::ToolError;
use crate::middleware::Passthrough;
use crate::outcome::ToolOutput;
use crate::registry::{
    IdempotencySettings, KeyScope, LayerSetting, OnStoreError, ParamsMismatch, RiskLevel,
    ToolDescriptor,
};
use crate::tool_table::ToolTable;

/// Executes each idempotency key at most once; made by
/// [`IdempotencyLayer`](super::IdempotencyLayer). See the [module docs](super).
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What every clone of a layer and its services share.
pub(super) struct Shared {
    /// Each tool's settings; `None` where the tool's policy switches the layer off.
    pub(super) tools: ToolTable<Option<Settings>>,
    /// The store. One that answers at once (the memory store) has a key claimed when the
    /// call is made, and a response future dropped before it is polled releases the key
    /// through its guard.
    pub(super) store: Arc<dyn DedupeStore>,
    pub(super) canonical: CanonicalOptions,
    /// The layer's settings, for `Debug`.
    pub(super) defaults: Settings,
    pub(super) counters: Counters,
    /// The chunk streams of the calls running here, for the duplicates that join them.
    pub(super) live: Arc<super::live::LiveStreams>,
}

/// How the calls of one tool are deduplicated: the layer's settings with the tool's policy
/// over them, resolved once when the layer is built.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) mode: DedupeMode,
    pub(super) scope: KeyScope,
    pub(super) derive_keys: bool,
    pub(super) done_ttl: Duration,
    pub(super) failed_ttl: Duration,
    pub(super) inflight_lease: Duration,
    pub(super) on_params_mismatch: ParamsMismatch,
    pub(super) on_store_error: OnStoreError,
    /// How long a completed result answers a derived key's re-send (tools that are not
    /// read-only); zero: never.
    pub(super) resend_window: Duration,
    /// How long a read-only tool's completed result answers a derived key; `None`: never,
    /// the read runs again.
    pub(super) read_cache_ttl: Option<Duration>,
    /// The tool is registered as read-only.
    pub(super) read_only: bool,
    /// Running the tool again does no harm (read-only or idempotent).
    pub(super) repeat_is_safe: bool,
    /// Whether a call may ask for a looser dedupe mode than `mode`.
    pub(super) callers_may_loosen: bool,
}

impl Settings {
    /// The dedupe mode of a call that asks for `asked`: the call's when it is at least as
    /// strict as the tool's, or when the tool lets callers loosen it; the tool's otherwise.
    fn mode_for(&self, asked: Option<DedupeMode>) -> DedupeMode {
        fn strictness(mode: DedupeMode) -> u8 {
            match mode {
                DedupeMode::Disabled => 0,
                DedupeMode::BestEffort => 1,
                DedupeMode::Enforced => 2,
            }
        }
        match asked {
            Some(asked)
                if self.callers_may_loosen || strictness(asked) >= strictness(self.mode) =>
            {
                asked
            }
            _ => self.mode,
        }
    }

    /// These settings with a tool's `policy.idempotency` over them, for the tool of
    /// `descriptor` (`None`: unregistered, not read-only); `None` when the layer is off.
    pub(super) fn for_tool(
        &self,
        descriptor: Option<&ToolDescriptor>,
        setting: &LayerSetting<IdempotencySettings>,
    ) -> Option<Self> {
        let read_only = descriptor.is_some_and(|d| d.risk == RiskLevel::ReadOnly);
        let repeat_is_safe = descriptor.is_some_and(ToolDescriptor::repeat_is_safe);
        let settings = match setting {
            LayerSetting::Off => return None,
            LayerSetting::Default => self.clone(),
            LayerSetting::On(tool) => self.with_settings(tool),
        };
        Some(Settings {
            read_only,
            repeat_is_safe,
            ..settings
        })
    }

    /// These settings with `o` over them.
    pub(super) fn with_settings(&self, o: &IdempotencySettings) -> Self {
        let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
        Settings {
            resend_window: ms(o.resend_window_ms, self.resend_window),
            read_cache_ttl: o
                .read_cache_ttl_ms
                .map(Duration::from_millis)
                .or(self.read_cache_ttl),
            mode: o.dedupe_mode.unwrap_or(self.mode),
            scope: o.scope.unwrap_or(self.scope),
            derive_keys: o.derive_key.unwrap_or(self.derive_keys),
            done_ttl: ms(o.done_ttl_ms, self.done_ttl),
            failed_ttl: ms(o.failed_ttl_ms, self.failed_ttl),
            inflight_lease: ms(o.inflight_lease_ms, self.inflight_lease),
            on_params_mismatch: o.on_params_mismatch.unwrap_or(self.on_params_mismatch),
            on_store_error: o.on_store_error.unwrap_or(self.on_store_error),
            callers_may_loosen: o.callers_may_loosen.unwrap_or(self.callers_may_loosen),
            ..self.clone()
        }
    }
}

/// What one call is deduplicated with.
#[derive(Debug)]
pub(super) struct Plan {
    /// `Enforced` or `BestEffort`.
    pub(super) mode: DedupeMode,
    pub(super) claim: ClaimRequest,
    pub(super) key_source: KeySource,
    pub(super) done_ttl: Duration,
    pub(super) failed_ttl: Duration,
    pub(super) fail_open: bool,
    /// Whether the layer is in shadow mode for the call: it notes what the record would have
    /// answered and runs the call.
    pub(super) shadow: bool,
    /// Running the tool again does no harm: a result that cannot be stored frees the key.
    pub(super) repeat_is_safe: bool,
}

impl Shared {
    /// How `call` is deduplicated, or `None` when it passes through: the layer is off for its
    /// tool, its dedupe mode is `disabled` (the call's own only when the tool lets callers
    /// loosen its mode), or it has no key and derivation is off (by the
    /// tool's policy or by the operator).
    pub(super) fn plan(
        &self,
        call: &ToolCall,
        settings: &Settings,
        shadow: bool,
    ) -> Result<Option<Plan>, ToolError> {
        let mode = settings.mode_for(call.transport().dedupe_mode);
        if mode == DedupeMode::Disabled {
            return Ok(None);
        }
        let derive = settings.derive_keys && self.tools.control().derives_idempotency_keys();
        let tool_scope = key::within_principal(call, settings.scope);
        let Some((idempotency_key, key_source)) =
            key::idempotency_key(call, derive, tool_scope, &self.canonical)?
        else {
            return Ok(None);
        };
        let scope = key::within_principal(call, key::scope_of(call, key_source, tool_scope));
        let canonical_params = call.params().canonical(&self.canonical)?;
        let digest: Arc<str> = canonical::params_digest_hex(&canonical_params)
            .as_str()
            .into();
        let independent = settings.on_params_mismatch == ParamsMismatch::Independent;
        let store_key = key::store_key(
            call,
            &idempotency_key,
            scope,
            independent.then_some(&*digest),
        );
        let mut claim = ClaimRequest::new(
            store_key,
            idempotency_key,
            digest,
            call.clone(),
            settings.inflight_lease,
        );
        claim.key_derived_from_params = key_source == KeySource::Derived;
        claim.take_over_retriable_failure = mode == DedupeMode::BestEffort;
        let (mut done_ttl, mut failed_ttl) = (settings.done_ttl, settings.failed_ttl);
        if key_source == KeySource::Derived {
            match settings.derived_reuse() {
                Some(window) => {
                    done_ttl = window;
                    failed_ttl = failed_ttl.min(window);
                }
                None => {
                    // Kept only for the calls already waiting on it: a later call runs.
                    claim.reuse_settled = false;
                    (done_ttl, failed_ttl) = (SETTLED_FOR_WAITERS, SETTLED_FOR_WAITERS);
                }
            }
        }
        Ok(Some(Plan {
            mode,
            claim,
            key_source,
            done_ttl,
            failed_ttl,
            fail_open: settings.on_store_error == OnStoreError::FailOpen,
            shadow,
            repeat_is_safe: settings.repeat_is_safe,
        }))
    }
}

/// How long the settled record of a derived key that reuses no result is kept: waiters
/// already have its result, and no later call reads it.
const SETTLED_FOR_WAITERS: Duration = Duration::from_millis(1);

impl Settings {
    /// How long a settled record of a derived key answers later calls: a read-only tool's
    /// cache TTL, another tool's re-send window (never longer than the done TTL); `None`
    /// when it answers none.
    pub(super) fn derived_reuse(&self) -> Option<Duration> {
        let window = if self.read_only {
            self.read_cache_ttl?
        } else {
            self.resend_window.min(self.done_ttl)
        };
        (!window.is_zero()).then_some(window)
    }
}

impl Plan {
    /// What results and logs name the key by (see [`key::fingerprint`]).
    pub(super) fn key_fingerprint(&self) -> String {
        key::fingerprint(
            &self.claim.key,
            &self.claim.idempotency_key,
            self.claim.key_derived_from_params(),
        )
    }
}

/// Counts of what the layer did, shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) executions: AtomicU64,
    pub(super) completed_hits: AtomicU64,
    pub(super) inflight_joins: AtomicU64,
    pub(super) in_flight_rejections: AtomicU64,
    pub(super) key_conflicts: AtomicU64,
    pub(super) released_unprocessed: AtomicU64,
    pub(super) stale_results: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) fail_open_runs: AtomicU64,
}

impl Counters {
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> IdempotencyStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IdempotencyStats {
            executions: get(&self.executions),
            completed_hits: get(&self.completed_hits),
            inflight_joins: get(&self.inflight_joins),
            in_flight_rejections: get(&self.in_flight_rejections),
            key_conflicts: get(&self.key_conflicts),
            released_unprocessed: get(&self.released_unprocessed),
            stale_results: get(&self.stale_results),
            store_errors: get(&self.store_errors),
            fail_open_runs: get(&self.fail_open_runs),
        }
    }
}

/// What an [`IdempotencyLayer`](super::IdempotencyLayer) has done, counted over all its
/// services.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotencyStats {
    /// Calls that claimed their key and ran the tool.
    pub executions: u64,
    /// Calls answered from a completed record.
    pub completed_hits: u64,
    /// Calls that waited for a running call with their key and took its result.
    pub inflight_joins: u64,
    /// `bestEffort` calls refused with `IDEMPOTENCY_IN_FLIGHT`.
    pub in_flight_rejections: u64,
    /// Calls refused with `IDEMPOTENCY_KEY_REUSED`.
    pub key_conflicts: u64,
    /// Executions whose error said the request was not processed: the key was released
    /// instead of keeping the error.
    pub released_unprocessed: u64,
    /// Results not stored because another call had taken the key over (a late finisher).
    pub stale_results: u64,
    /// Store operations that failed.
    pub store_errors: u64,
    /// Calls run without deduplication because the store failed and the policy fails open.
    pub fail_open_runs: u64,
}

impl<S> Idempotency<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Idempotency { inner, shared }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("defaults", &self.shared.defaults)
            .finish()
    }
}

impl<S> Service<ToolCall> for Idempotency<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let gate = self
            .shared
            .tools
            .gate(&call, Some(ShadowLayer::Idempotency));
        let Some(acting) = gate else {
            return ResponseFuture::passthrough(Passthrough::new(self.inner.call(call)));
        };
        match self.shared.plan(&call, acting.tool, acting.shadow) {
            Ok(None) => ResponseFuture::passthrough(Passthrough::new(self.inner.call(call))),
            Ok(Some(plan)) => {
                let shared = &self.shared;
                let first = (shared.store.claim_now(&plan.claim))
                    .map(|claimed| claimed.map(|outcome| Claim::new(outcome, shared, &plan)));
                match first {
                    // The key is held: the ready service runs the tool.
                    Some(Ok(Claim::Held { guard })) => {
                        let tool = self.inner.call(call);
                        ResponseFuture::deduplicated(Box::pin(execute(Box::pin(tool), plan, guard)))
                    }
                    first => {
                        // The ready service goes into the future; this one keeps a fresh clone.
                        let clone = self.inner.clone();
                        let inner = mem::replace(&mut self.inner, clone);
                        let shared = self.shared.clone();
                        let future = deduplicate(shared, inner, call, plan, first);
                        ResponseFuture::deduplicated(Box::pin(future))
                    }
                }
            }
            Err(error) => ResponseFuture::ready(Err(error)),
        }
    }
}

impl crate::resend::ResendSource for Shared {
    /// The key a re-send of `call` finds its record under, by the precedence of
    /// [`key::idempotency_key`], and how long a finished call's record answers a re-send: a
    /// caller's or a hook's key as long as its record is kept, a derived key within its
    /// re-send window, while the first call runs otherwise. A read-only tool's read cache is
    /// no re-send window: a model that reads the same thing again and again is looping even
    /// when the cache answers it.
    fn resend_key(&self, call: &ToolCall) -> Option<crate::resend::ResendKey> {
        use crate::resend::ResendKey;
        let settings = self.tools.for_call(call).as_ref()?;
        if settings.mode_for(call.transport().dedupe_mode) == DedupeMode::Disabled {
            return None;
        }
        let given = call
            .idempotency_key()
            .filter(|k| !k.trim().is_empty())
            .or_else(|| call.hook_idempotency_key().filter(|k| !k.trim().is_empty()));
        if let Some(key) = given {
            return Some(ResendKey::Given {
                key: Arc::from(key),
                settled_for: Some(settings.done_ttl.max(settings.failed_ttl)),
            });
        }
        let derive = settings.derive_keys && self.tools.control().derives_idempotency_keys();
        derive.then(|| ResendKey::Derived {
            with_actor: settings.scope != KeyScope::Global,
            settled_for: if settings.read_only {
                None
            } else {
                settings.derived_reuse()
            },
        })
    }
}
