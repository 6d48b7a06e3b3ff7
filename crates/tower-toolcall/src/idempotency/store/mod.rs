//! Dedupe stores: the [`DedupeStore`] trait and its implementations.
//!
//! A store keeps one [`DedupeRecord`] per store key and makes each step of its life atomic:
//! claiming a free key under an in-flight lease, finalizing it with the result by
//! compare-and-set on the record's version, cancelling it, renewing the lease. It also lets a
//! duplicate wait for a running execution without polling.
//!
//! [`InMemoryDedupeStore`] keeps records in the process; `RedisDedupeStore` (crate `tower-toolcall-redis`)
//! shares them between replicas.

mod memory;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

pub use memory::{InMemoryDedupeStore, InMemoryDedupeStoreBuilder, MemoryStoreStats};

use super::record::{DedupeRecord, Execution, RecordRequest, RecordState, StoredError};
use crate::envelope::ToolCall;
use crate::error::{ErrorCode, ToolError};
use crate::outcome::ToolOutput;
pub use crate::shared_store::StoreError;
use crate::shared_store::StoreFuture;
use crate::time::millis;

/// A store of dedupe records, held by the layer as an `Arc<dyn DedupeStore>`.
///
/// Every method is atomic with respect to the others for one key. Freeness: a key is free
/// when it has no record, when its record is `cancelled`, or when its in-flight lease has
/// ended. A free key is claimed with a version larger than any the key had.
///
/// A store that answers without waiting (the memory store) also answers
/// [`claim_now`](Self::claim_now) and [`finalize_now`](Self::finalize_now), and the layer
/// claims and settles keys in it as the call is made, without a future.
///
/// ```
/// use std::sync::Arc;
/// use tower_toolcall::idempotency::{DedupeStore, IdempotencyLayer, InMemoryDedupeStore};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let store: Arc<dyn DedupeStore> = Arc::new(InMemoryDedupeStore::new());
/// let layer = IdempotencyLayer::new(ToolRegistry::open(), store.clone());
/// assert!(Arc::ptr_eq(layer.store(), &store));
/// ```
pub trait DedupeStore: fmt::Debug + Send + Sync + 'static {
    /// Claims the key of `request` for a new execution when it is free (and, when
    /// `request.take_over_retriable_failure` is set, when it holds a retriable failure with
    /// the same params digest); otherwise returns the record that holds it.
    ///
    /// A claim whose answer its caller never reads (the future is dropped, or the store
    /// fails after sending it) must not hold the key with nobody to own it: a store that
    /// cannot tell whether it was applied releases it by its version.
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome>;

    /// [`claim`](Self::claim), answered at once by a store that can; `None` (the default)
    /// when the store answers only through `claim`.
    fn claim_now(&self, request: &ClaimRequest) -> Option<Result<ClaimOutcome, StoreError>> {
        let _ = request;
        None
    }

    /// The record of `key`, if the store has a live one.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<DedupeRecord>>;

    /// Writes the result of the execution that claimed `claimed`, if its claim still holds
    /// (the record is in flight with `claimed.version`); wakes every waiter.
    fn finalize<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        completion: Completion,
    ) -> StoreFuture<'a, Finalized>;

    /// [`finalize`](Self::finalize), answered at once by a store that can, with the
    /// completion that `completion` makes. It is given the caller's reference to the claimed
    /// record, so that it can settle the record where it lies. The default makes nothing and
    /// hands the record back: the caller then finalizes through `finalize`.
    fn finalize_now(
        &self,
        claimed: Arc<DedupeRecord>,
        completion: &dyn Fn() -> Completion,
    ) -> Result<Finalized, Arc<DedupeRecord>> {
        let _ = completion;
        Err(claimed)
    }

    /// Marks the record `cancelled` (kept for `keep_for`, the key free), if the claim still
    /// holds; wakes every waiter. `true` when it did.
    fn cancel<'a>(&'a self, claimed: &'a DedupeRecord, keep_for: Duration)
        -> StoreFuture<'a, bool>;

    /// Extends the lease of `claimed` to `lease` from now, if the claim still holds. `true`
    /// when it did.
    fn renew<'a>(&'a self, claimed: &'a DedupeRecord, lease: Duration) -> StoreFuture<'a, bool>;

    /// Waits, without polling, until the in-flight record `seen` is settled, cancelled,
    /// replaced or gone, or its lease ends. Returns the record that replaced it, or `None`
    /// when the key has no live record any more (claim it again).
    fn wait<'a>(&'a self, seen: &'a DedupeRecord) -> StoreFuture<'a, Option<DedupeRecord>>;

    /// Deletes the record of `key`. `true` when there was one.
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;

    /// Deletes every record whose store key starts with `prefix` (see
    /// [`tenant_prefix`](super::tenant_prefix)); returns how many.
    fn flush_prefix<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, u64>;

    /// Removes the records that have expired; returns how many. Stores whose backend
    /// expires records itself return 0.
    fn sweep_expired(&self) -> StoreFuture<'_, u64>;

    /// How many records the store holds.
    fn size(&self) -> StoreFuture<'_, u64>;

    /// The live record whose key results and logs name by `fingerprint`: the
    /// [`key_fingerprint`](super::key_fingerprint) of its store key, or the first 16 hex
    /// digits of a key derived from the params. It scans the store: for operators, not for
    /// the path of a call.
    fn find_by_fingerprint<'a>(
        &'a self,
        fingerprint: &'a str,
    ) -> StoreFuture<'a, Option<DedupeRecord>>;
}

/// What a call asks of [`DedupeStore::claim`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The store key.
    pub key: Arc<str>,
    /// The idempotency key.
    pub idempotency_key: Arc<str>,
    /// The call that claims the key.
    pub call: ToolCall,
    /// The in-flight lease.
    pub lease: Duration,
    /// Take over a `failed` record whose error is retriable and whose params digest is the
    /// same (dedupe mode `bestEffort`).
    pub take_over_retriable_failure: bool,
    /// A settled (`done` or `failed`) record answers this claim. `false` for a derived key
    /// that reuses no result (a read-only tool without a read cache, or a zero re-send
    /// window): the call runs again once the first has finished.
    pub reuse_settled: bool,
    /// `hex(sha256(canonical_json(params)))`.
    params_digest: Arc<str>,
    /// The idempotency key was derived from the canonical params.
    pub(crate) key_derived_from_params: bool,
}

impl ClaimRequest {
    /// A claim of `key` (for the idempotency key `idempotency_key`) by `call`, whose params
    /// digest is `params_digest`, under an in-flight lease of `lease`; it does not take
    /// retriable failures over.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_toolcall::idempotency::ClaimRequest;
    /// use tower_toolcall::ToolCall;
    ///
    /// let call = ToolCall::builder("vault", "createFile").session("s").actor("a").build()?;
    /// let request = ClaimRequest::new("/vault::createFile/g/k", "k", "d1", call, Duration::from_secs(120));
    /// assert_eq!(request.params_digest(), "d1");
    /// # Ok::<(), tower_toolcall::ToolError>(())
    /// ```
    pub fn new(
        key: impl Into<Arc<str>>,
        idempotency_key: impl Into<Arc<str>>,
        params_digest: impl Into<Arc<str>>,
        call: ToolCall,
        lease: Duration,
    ) -> ClaimRequest {
        ClaimRequest {
            key: key.into(),
            idempotency_key: idempotency_key.into(),
            call,
            lease,
            take_over_retriable_failure: false,
            reuse_settled: true,
            params_digest: params_digest.into(),
            key_derived_from_params: false,
        }
    }

    /// `hex(sha256(canonical_json(params)))` of the call.
    pub fn params_digest(&self) -> &str {
        &self.params_digest
    }

    /// `true` when the idempotency key was derived from the canonical params: a record
    /// claimed under it by another derived claim has the same params.
    pub fn key_derived_from_params(&self) -> bool {
        self.key_derived_from_params
    }

    /// The in-flight record a store writes for this claim.
    pub fn inflight_record(&self, version: u64, now_ms: u64) -> DedupeRecord {
        let lease_ms = millis(self.lease);
        let lock_until_ms = now_ms.saturating_add(lease_ms);
        let call = &self.call;
        DedupeRecord {
            key: self.key.clone(),
            tool: [call.tool_namespace(), "::", call.tool_name()]
                .concat()
                .into(),
            idempotency_key: self.idempotency_key.clone(),
            state: RecordState::Inflight,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            expires_at_ms: lock_until_ms,
            ttl_ms: lease_ms,
            request: RecordRequest {
                session_key: call.session_key().into(),
                actor_id: call.actor_id().into(),
                request_id: call.request_id().into(),
                tool_call_id: call.envelope().tool_call_id.as_deref().map(Arc::from),
                params_digest: self.params_digest.clone(),
            },
            key_derived_from_params: self.key_derived_from_params,
            execution: None,
            payload: None,
            error: None,
            lock_until_ms: Some(lock_until_ms),
            version,
        }
    }

    /// `true` when `record` holds the key against this claim.
    ///
    /// The rule every store applies: a cancelled record and an in-flight record whose lease
    /// ended at `now_ms` never hold it; a settled record does not hold it when the claim
    /// reuses no settled result; a retriable failure with the same params digest does not
    /// hold it when the claim takes such failures over.
    pub fn is_held_by(&self, record: &DedupeRecord, now_ms: u64) -> bool {
        match record.state {
            RecordState::Cancelled => false,
            RecordState::Inflight => record.lock_until_ms.is_some_and(|until| until > now_ms),
            RecordState::Done | RecordState::Failed if !self.reuse_settled => false,
            RecordState::Failed => {
                let retriable = record.error.as_ref().is_some_and(|e| e.retriable);
                !(self.take_over_retriable_failure
                    && retriable
                    && *record.request.params_digest == *self.params_digest())
            }
            RecordState::Done => true,
        }
    }
}

/// What [`DedupeStore::claim`] found.
///
/// Records are shared, never copied: a store hands out the record it holds (the memory
/// store) or the one it decoded (Redis).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The key was free: this in-flight record now holds it for the caller.
    Claimed(Arc<DedupeRecord>),
    /// Another record holds the key.
    Existing {
        /// That record.
        record: Arc<DedupeRecord>,
        /// The store's clock when it was read, in Unix milliseconds.
        now_ms: u64,
    },
}

/// The result of an execution, for [`DedupeStore::finalize`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Completion {
    /// The output, or the error.
    pub result: Result<ToolOutput, StoredError>,
    /// The attempts it took.
    pub execution: Execution,
    /// How long the record is kept.
    pub ttl: Duration,
}

impl Completion {
    /// The completion of an execution that ended with `result` after `execution`, to be kept
    /// for `ttl`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use serde_json::json;
    /// use tower_toolcall::idempotency::{Completion, Execution};
    /// use tower_toolcall::ToolOutput;
    ///
    /// let output = ToolOutput::new(json!({"etag": "abc123"}));
    /// let execution = Execution::from_outcome(&Ok(output.clone()), 1_000, 1_040);
    /// let completion = Completion::new(Ok(output), execution, Duration::from_secs(60));
    /// assert_eq!(completion.execution.attempt_count, 1);
    /// ```
    pub fn new(
        result: Result<ToolOutput, StoredError>,
        execution: Execution,
        ttl: Duration,
    ) -> Self {
        Completion {
            result,
            execution,
            ttl,
        }
    }

    /// The settled record that `claimed` becomes at `now_ms`.
    pub fn settle(self, claimed: &DedupeRecord, now_ms: u64) -> DedupeRecord {
        let mut record = claimed.clone();
        self.apply(&mut record, now_ms);
        record
    }

    /// Settles the in-flight record `record` in place at `now_ms`.
    pub fn apply(self, record: &mut DedupeRecord, now_ms: u64) {
        let ttl_ms = millis(self.ttl);
        let (state, payload, error) = match self.result {
            Ok(output) => (RecordState::Done, Some(output), None),
            Err(error) => (RecordState::Failed, None, Some(error)),
        };
        record.state = state;
        record.updated_at_ms = now_ms;
        record.expires_at_ms = now_ms.saturating_add(ttl_ms);
        record.ttl_ms = ttl_ms;
        record.execution = Some(self.execution);
        record.payload = payload;
        record.error = error;
        record.lock_until_ms = None;
    }
}

/// What [`DedupeStore::finalize`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finalized {
    /// The result is stored.
    Written,
    /// The claim no longer held (its lease ended and another call took the key over, or the
    /// record was deleted): nothing was written.
    Stale {
        /// The version that holds the key now, if any.
        current_version: Option<u64>,
    },
}

impl From<StoreError> for ToolError {
    /// `STORE_UNAVAILABLE`, retriable, the tool not run.
    fn from(error: StoreError) -> ToolError {
        let advice = match error {
            StoreError::CapacityExhausted { .. } => {
                "raise the store's capacity or lower the in-flight lease"
            }
            _ => "try again later",
        };
        ToolError::rejected(
            ErrorCode::StoreUnavailable,
            format!("the idempotency check failed ({error}); the tool was not run; {advice}"),
        )
        .with_source(error)
    }
}

/// Runs `work`, which its caller leaves behind (the caller's future is being dropped), to its
/// end: it is polled once here, so that a store that answers at once is done and a command is
/// on its way before any the caller's task sends next, then it runs on the Tokio runtime.
/// `false` when it could not finish: it was pending and there is no runtime.
pub(crate) fn finish_detached(work: impl Future<Output = ()> + Send + 'static) -> bool {
    let mut work = Box::pin(work);
    if work
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
    {
        return true;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(work);
            true
        }
        Err(_) => false,
    }
}

pub(crate) use crate::time::at_least_a_millisecond;
