use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{select, Either};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use super::record::{DedupeRecord, Execution, RecordState, StoredError};
use super::service::{Counters, Plan, Shared};
use super::store::{finish_detached, ClaimOutcome, Completion, DedupeStore, Finalized, StoreError};
use crate::control::ShadowLayer;
use crate::envelope::{DedupeMode, ToolCall};
use crate::error::{ErrorCode, ToolError};
use crate::middleware::{shadow_decision, Passthrough};
use crate::outcome::{
    CacheMatch, CallRecord, MatchedOn, ShadowDecision, ShadowVerdict, ShortCircuit, ToolOutput,
};
use crate::time::millis;

type BoxedOutcome = crate::BoxToolFuture;

pin_project! {
    /// The response future of [`Idempotency`](super::Idempotency): the inner call when the
    /// call is not deduplicated, the deduplicated execution, or a refusal known when the call
    /// was made.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = Projection]
    enum State<F> {
        Passthrough { future: Pin<Box<Passthrough<F>>> },
        Deduplicated { future: BoxedOutcome },
        Ready { result: Option<Result<ToolOutput, ToolError>> },
    }
}

impl<F> ResponseFuture<F> {
    /// The inner call without the store: the call is not deduplicated, or the layer is in
    /// shadow mode and would have answered it from the store.
    ///
    /// The inner future is boxed, as a deduplicated execution is: kept inline, it would make
    /// this future, and every future of the layers outside, as large as the inner one, and
    /// each layer would copy it once more on every call.
    pub(super) fn passthrough(future: Passthrough<F>) -> Self {
        ResponseFuture {
            state: State::Passthrough {
                future: Box::pin(future),
            },
        }
    }

    pub(super) fn deduplicated(future: BoxedOutcome) -> Self {
        ResponseFuture {
            state: State::Deduplicated { future },
        }
    }

    /// A future that answers `result` at its first poll: a refusal.
    pub(super) fn ready(result: Result<ToolOutput, ToolError>) -> Self {
        ResponseFuture {
            state: State::Ready {
                result: Some(result),
            },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Passthrough { .. } => "passthrough",
            State::Deduplicated { .. } => "deduplicated",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    type Output = Result<ToolOutput, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projection::Passthrough { future } => future.as_mut().poll(cx),
            Projection::Deduplicated { future } => future.as_mut().poll(cx),
            Projection::Ready { result } => Poll::Ready(
                result
                    .take()
                    .expect("ResponseFuture polled after completion"),
            ),
        }
    }
}

/// Runs `call` at most once for its key: claims the key and runs the tool, or answers from
/// the record that holds the key, waiting for it when it is in flight and the mode is
/// `enforced`. `first` is the outcome of a claim already made, if any.
pub(super) async fn deduplicate<S>(
    shared: Arc<Shared>,
    mut inner: S,
    call: ToolCall,
    plan: Plan,
    mut first: Option<Result<Claim, StoreError>>,
) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    let store = &shared.store;
    let mut joined = false;
    // The running call's chunks, sent on to a joining caller that reads chunks: kept across
    // waits, so that each chunk reaches it once.
    let mut relay = None;
    loop {
        if relay.is_some() && call.chunks_sent() > 0 {
            // The joined call ended without a result after its first chunks reached this
            // caller: running the tool here would send them a second stream.
            return Err(joined_stream_ended(&plan));
        }
        let claimed = match first.take() {
            Some(claimed) => claimed,
            None => {
                let claimed = match store.claim_now(&plan.claim) {
                    Some(claimed) => claimed,
                    None => store.claim(&plan.claim).await,
                };
                claimed.map(|outcome| Claim::new(outcome, &shared, &plan))
            }
        };
        let (mut record, now_ms) = match claimed {
            Ok(Claim::Held { guard }) => {
                let tool = inner.call(call);
                return execute(Box::pin(tool), plan, guard).await;
            }
            Ok(Claim::Existing { record, now_ms }) => (record, now_ms),
            Err(error) => return Box::pin(store_failed(&shared, error, inner, call, &plan)).await,
        };
        loop {
            let error = match found(&shared, &call, &plan, &record, now_ms, joined) {
                Found::Answer(answer) => return answer,
                Found::Shadowed(decision) => {
                    return Passthrough::shadowed(inner.call(call), decision).await;
                }
                Found::Unreadable(error) => error,
                Found::Free => break,
                Found::Running => {
                    joined = true;
                    if relay.is_none() {
                        relay = call
                            .chunk_tap()
                            .and_then(|tap| shared.live.relay(&record.key, tap));
                    }
                    // Boxed: only joins pay for the waiting machinery.
                    let wait = Box::pin(store.wait(&record));
                    let wait = async {
                        match relay.as_mut() {
                            Some(relay) => relay.during(wait).await,
                            None => wait.await,
                        }
                    };
                    // The deadline is absolute: reading the clocks now or at the call's start
                    // gives the same instant.
                    let waited = match call.deadline_from(Instant::now()) {
                        Some(deadline) => match tokio::time::timeout_at(deadline, wait).await {
                            Ok(waited) => waited,
                            Err(_) => return Err(deadline_passed(&plan)),
                        },
                        None => wait.await,
                    };
                    match waited {
                        Ok(Some(next)) if next.state != RecordState::Cancelled => {
                            record = Arc::new(next);
                            continue;
                        }
                        // Free again: claim it.
                        Ok(_) => break,
                        Err(error) => error,
                    }
                }
            };
            return Box::pin(store_failed(&shared, error, inner, call, &plan)).await;
        }
    }
}

/// What a claim found, with the key guarded from the moment it is claimed: a response
/// future dropped before it runs the tool frees the key.
pub(super) enum Claim {
    /// The key was free: the guard holds the record that holds it for the call.
    Held { guard: ClaimGuard },
    /// Another record holds the key.
    Existing {
        record: Arc<DedupeRecord>,
        now_ms: u64,
    },
}

impl Claim {
    pub(super) fn new(outcome: ClaimOutcome, shared: &Arc<Shared>, plan: &Plan) -> Self {
        match outcome {
            ClaimOutcome::Claimed(record) => Claim::Held {
                guard: ClaimGuard {
                    shared: shared.clone(),
                    claimed: Some(record),
                    keep_cancelled_for: plan.failed_ttl,
                },
            },
            ClaimOutcome::Existing { record, now_ms } => Claim::Existing { record, now_ms },
        }
    }
}

/// What a call does about the record that holds its key.
enum Found {
    /// Answer with this (a cached result, or a refusal).
    Answer(Result<ToolOutput, ToolError>),
    /// Run the tool, leaving the store alone: the layer is in shadow mode and would have
    /// answered otherwise.
    Shadowed(ShadowDecision),
    /// The record cannot be read: the store failed.
    Unreadable(StoreError),
    /// The key is free again: claim it.
    Free,
    /// The record is in flight and the mode is `enforced`: wait for it.
    Running,
}

/// What `call` does about `record`, read from the store at `now_ms`; `joined` when the call
/// waited for it to run. Counts what it answers.
///
/// In shadow mode, what it would have answered is a [`Found::Shadowed`] decision instead;
/// a record that leaves the key free is claimed as when enforcing.
fn found(
    shared: &Shared,
    call: &ToolCall,
    plan: &Plan,
    record: &DedupeRecord,
    now_ms: u64,
    joined: bool,
) -> Found {
    let counters = &shared.counters;
    // Two claims under one derived key have the same params: the key hashes them.
    let same_params = (record.key_derived_from_params && plan.claim.key_derived_from_params())
        || *record.request.params_digest == *plan.claim.params_digest();
    let shadowed = |verdict| {
        let decision = || Found::Shadowed(shadow_decision(call, ShadowLayer::Idempotency, verdict));
        plan.shadow.then(decision)
    };
    if !same_params {
        if let Some(shadowed) = shadowed(ShadowVerdict::WouldConflict) {
            return shadowed;
        }
        Counters::bump(&counters.key_conflicts);
        return Found::Answer(Err(key_reused(plan)));
    }
    match record.state {
        RecordState::Done | RecordState::Failed => {
            let would = if joined {
                ShadowVerdict::WouldJoin
            } else {
                ShadowVerdict::WouldReplay
            };
            if let Some(shadowed) = shadowed(would) {
                return shadowed;
            }
            let matched_on = if joined {
                MatchedOn::Inflight
            } else {
                MatchedOn::Completed
            };
            // A joined call's record was written after `now_ms`: its age is 0.
            match answer_from(record, plan, matched_on, now_ms) {
                Ok(answer) => {
                    Counters::bump(if joined {
                        &counters.inflight_joins
                    } else {
                        &counters.completed_hits
                    });
                    tracing::debug!(
                        request_id = call.request_id(),
                        tool = call.tool_name(),
                        matched_on = ?matched_on,
                        "tool call answered by the idempotency cache"
                    );
                    Found::Answer(answer)
                }
                Err(error) => Found::Unreadable(error),
            }
        }
        RecordState::Cancelled => Found::Free,
        RecordState::Inflight => {
            // Joined when enforced, refused as in flight when best effort.
            if let Some(shadowed) = shadowed(ShadowVerdict::WouldJoin) {
                return shadowed;
            }
            if plan.mode == DedupeMode::BestEffort {
                Counters::bump(&counters.in_flight_rejections);
                Found::Answer(Err(in_flight(plan)))
            } else {
                Found::Running
            }
        }
    }
}

/// Awaits `tool`, the call whose claim `guard` holds, renewing the lease while it runs, and
/// stores the result.
///
/// The tool's future comes boxed: held by value, it would be stored in this future's state
/// twice (as the argument, and again where it is pinned to be polled), and the response future
/// that boxes this one would be more than twice as large.
pub(super) async fn execute<F>(
    mut tool: Pin<Box<F>>,
    plan: Plan,
    mut guard: ClaimGuard,
) -> Result<ToolOutput, ToolError>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    let counters = &guard.shared.counters;
    Counters::bump(&counters.executions);
    let _live =
        (plan.claim.call.chunk_tap()).map(|tap| guard.shared.live.publish(&plan.claim.key, tap));
    let claimed = guard.claimed();
    let (started_at_ms, version) = (claimed.created_at_ms, claimed.version);
    let started = Instant::now();
    let outcome = renewing_lease(
        tool.as_mut(),
        &*guard.shared.store,
        claimed,
        plan.claim.lease,
    )
    .await;

    if let Err(error) = &outcome {
        if error.is_not_processed() {
            // Nothing happened: free the key rather than keep an error for it.
            Counters::bump(&counters.released_unprocessed);
            Box::pin(guard.release()).await;
            return outcome;
        }
    }
    let finished_at_ms = started_at_ms.saturating_add(millis(started.elapsed()));
    // Made again only if the first write fails.
    let completion = || Completion {
        result: match &outcome {
            Ok(output) => {
                let mut stored = ToolOutput::new(output.content.clone());
                stored.metadata.clone_from(&output.metadata);
                Ok(stored)
            }
            Err(error) => Err(StoredError::from_error(error)),
        },
        execution: Execution::from_outcome(&outcome, started_at_ms, finished_at_ms),
        ttl: if outcome.is_ok() {
            plan.done_ttl
        } else {
            plan.failed_ttl
        },
    };
    // The claim stays guarded until the result is stored; a store that stores it at once is
    // given the guard's reference to the record.
    let claimed = guard.claimed.take().expect("the claim is held");
    let finalized = match guard.shared.store.finalize_now(claimed, &completion) {
        Ok(finalized) => Ok(finalized),
        Err(claimed) => {
            guard.claimed = Some(claimed);
            let finalized = (guard.shared.store)
                .finalize(guard.claimed(), completion())
                .await;
            if finalized.is_ok() {
                guard.claimed = None;
            }
            finalized
        }
    };
    let call = &plan.claim.call;
    match finalized {
        Ok(Finalized::Written) => {}
        Ok(Finalized::Stale { current_version }) => {
            Counters::bump(&counters.stale_results);
            tracing::warn!(
                request_id = call.request_id(),
                tool = call.tool_name(),
                idempotency_key_hash = %plan.key_fingerprint(),
                version,
                current_version,
                "the lease of this call ended and another call took its idempotency key over; \
                 its result was not stored"
            );
        }
        Err(error) if plan.repeat_is_safe => {
            // Running the tool again is harmless: the guard releases the key, so that waiters
            // do not wait for the lease to end.
            Counters::bump(&counters.store_errors);
            tracing::warn!(
                request_id = call.request_id(),
                tool = call.tool_name(),
                idempotency_key_hash = %plan.key_fingerprint(),
                error = %error,
                "the result of the tool call could not be stored; its key is free"
            );
        }
        Err(error) => {
            // The tool may have acted: freeing the key would let a waiting duplicate run it a
            // second time. The key stays held, and the result is written again until the
            // lease ends; after that, the lease's rule applies (SPEC §5).
            Counters::bump(&counters.store_errors);
            tracing::warn!(
                request_id = call.request_id(),
                tool = call.tool_name(),
                idempotency_key_hash = %plan.key_fingerprint(),
                error = %error,
                "the result of the tool call could not be stored; its key stays held while \
                 the result is written again"
            );
            if let Some(claimed) = guard.claimed.take() {
                let store = guard.shared.store.clone();
                let retry = finalize_until(store, claimed, completion(), plan.claim.lease);
                if !finish_detached(retry) {
                    tracing::warn!("no Tokio runtime: the key stays held until its lease ends");
                }
            }
        }
    }
    outcome
}

/// Writes `completion` for `claimed` again, with growing pauses, until it is written, the
/// claim no longer holds, or `lease` has passed.
async fn finalize_until(
    store: Arc<dyn DedupeStore>,
    claimed: Arc<DedupeRecord>,
    completion: Completion,
    lease: Duration,
) {
    let deadline = Instant::now() + lease;
    let mut pause = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::warn!(
                idempotency_key_hash = %record_fingerprint(&claimed),
                "the result could not be stored within the lease; the key is free once it ends"
            );
            return;
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
        match store.finalize(&claimed, completion.clone()).await {
            Ok(Finalized::Written) => {
                tracing::info!(
                    idempotency_key_hash = %record_fingerprint(&claimed),
                    "the result of the tool call is stored after all"
                );
                return;
            }
            Ok(Finalized::Stale { .. }) => return,
            Err(_) => {}
        }
    }
}

/// Polls `tool` to completion and, every half lease while it runs, renews the lease.
async fn renewing_lease<F>(
    mut tool: Pin<&mut F>,
    store: &dyn DedupeStore,
    claimed: &DedupeRecord,
    lease: Duration,
) -> Result<ToolOutput, ToolError>
where
    F: Future<Output = Result<ToolOutput, ToolError>>,
{
    // A tool that answers at once never needs a renewal: the renewer is made (and boxed, to
    // keep this future small) only for one that does not.
    let first = poll_fn(|cx| Poll::Ready(tool.as_mut().poll(cx))).await;
    if let Poll::Ready(outcome) = first {
        return outcome;
    }
    let renew = Box::pin(renew_periodically(store, claimed, lease));
    match select(tool, renew).await {
        Either::Left((outcome, _)) => outcome,
        Either::Right(((), tool)) => tool.await,
    }
}

/// Renews the lease of `claimed` every half lease; never ends.
async fn renew_periodically(store: &dyn DedupeStore, claimed: &DedupeRecord, lease: Duration) {
    let every = (lease / 2).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(every).await;
        match store.renew(claimed, lease).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    idempotency_key_hash = %record_fingerprint(claimed),
                    version = claimed.version,
                    "the in-flight lease could not be renewed: another call holds the key"
                );
                break;
            }
            Err(error) => tracing::warn!(
                idempotency_key_hash = %record_fingerprint(claimed),
                error = %error,
                "the in-flight lease could not be renewed; trying again"
            ),
        }
    }
    std::future::pending::<()>().await;
}

/// What logs name the key of `record` by.
fn record_fingerprint(record: &DedupeRecord) -> String {
    record.fingerprint()
}

/// Answers from a settled record, with a copy of its output or error.
fn answer_from(
    record: &DedupeRecord,
    plan: &Plan,
    matched_on: MatchedOn,
    store_now_ms: u64,
) -> Result<Result<ToolOutput, ToolError>, StoreError> {
    let cache = CacheMatch {
        matched_on,
        age_ms: store_now_ms.saturating_sub(record.updated_at_ms),
        key_fingerprint: plan.key_fingerprint(),
    };
    let cached_record = CallRecord {
        attempts: record.execution.as_ref().map(|e| e.attempt_count),
        from_cache: true,
        cache: Some(cache),
        short_circuit: Some(match matched_on {
            MatchedOn::Inflight => ShortCircuit::InflightJoin,
            MatchedOn::Completed => ShortCircuit::CacheHit,
        }),
        ..CallRecord::default()
    };
    match (record.state, &record.payload, &record.error) {
        (RecordState::Done, Some(output), _) => Ok(Ok(output.clone().with_record(cached_record))),
        (RecordState::Failed, _, Some(stored)) => {
            let mut error = stored.to_error();
            *error.record_mut() = cached_record;
            Ok(Err(error))
        }
        (state, _, _) => Err(StoreError::Corrupt(format!(
            "a `{}` record without its {}",
            state.as_str(),
            if state == RecordState::Done {
                "output"
            } else {
                "error"
            }
        ))),
    }
}

/// The store failed: refuse the call, or run it without deduplication when the policy fails
/// open.
async fn store_failed<S>(
    shared: &Shared,
    error: StoreError,
    mut inner: S,
    call: ToolCall,
    plan: &Plan,
) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    Counters::bump(&shared.counters.store_errors);
    let fingerprint = plan.key_fingerprint();
    if plan.fail_open {
        Counters::bump(&shared.counters.fail_open_runs);
        tracing::warn!(
            request_id = call.request_id(),
            tool = call.tool_name(),
            idempotency_key_hash = %fingerprint,
            error = %error,
            "dedupe store failed; running the tool without deduplication (fail open)"
        );
        return inner.call(call).await;
    }
    tracing::warn!(
        request_id = call.request_id(),
        tool = call.tool_name(),
        idempotency_key_hash = %fingerprint,
        key_source = plan.key_source.as_str(),
        error = %error,
        "dedupe store failed; tool call rejected (fail closed)"
    );
    Err(error.into())
}

fn key_reused(plan: &Plan) -> ToolError {
    refusal(
        ErrorCode::IdempotencyKeyReused,
        ShortCircuit::KeyConflict,
        plan,
        |fingerprint| {
            format!(
                "the {} idempotency key (fingerprint {fingerprint}) was used before with other \
             params; use a new idempotency key for new params",
                plan.key_source.as_str()
            )
        },
    )
}

fn in_flight(plan: &Plan) -> ToolError {
    refusal(
        ErrorCode::IdempotencyInFlight,
        ShortCircuit::InflightJoin,
        plan,
        |fingerprint| {
            format!(
            "a call with the same idempotency key (fingerprint {fingerprint}) is still running; \
             wait for its result, or try again later"
        )
        },
    )
}

fn joined_stream_ended(plan: &Plan) -> ToolError {
    refusal(
        ErrorCode::IdempotencyInFlight,
        ShortCircuit::InflightJoin,
        plan,
        |fingerprint| {
            format!(
                "the running call with the same idempotency key (fingerprint {fingerprint}), \
                 whose chunks this call was reading, ended without a result; send the call again"
            )
        },
    )
}

fn deadline_passed(plan: &Plan) -> ToolError {
    refusal(
        ErrorCode::Timeout,
        ShortCircuit::InflightJoin,
        plan,
        |fingerprint| {
            format!(
                "the call's deadline passed while it waited for a running call with the same \
             idempotency key (fingerprint {fingerprint}); try again later"
            )
        },
    )
}

/// A refusal whose message and details name the key by its fingerprint.
fn refusal(
    code: ErrorCode,
    path: ShortCircuit,
    plan: &Plan,
    message: impl FnOnce(&str) -> String,
) -> ToolError {
    let fingerprint = plan.key_fingerprint();
    ToolError::rejected(code, message(&fingerprint))
        .short_circuited(path)
        .with_details(serde_json::json!({ "keyFingerprint": fingerprint }))
}

/// Holds a claim until the result is stored; dropped while armed (the caller dropped the
/// response future, or the tool panicked), it cancels the record so that the key is free.
pub(super) struct ClaimGuard {
    shared: Arc<Shared>,
    claimed: Option<Arc<DedupeRecord>>,
    keep_cancelled_for: Duration,
}

impl ClaimGuard {
    /// The claimed record, while the guard holds it.
    fn claimed(&self) -> &DedupeRecord {
        self.claimed
            .as_deref()
            .expect("a claim guard holds its record until it is disarmed or released")
    }

    /// Cancels the record now.
    async fn release(&mut self) {
        if let Some(claimed) = self.claimed.take() {
            cancel_claim(self.shared.store.clone(), claimed, self.keep_cancelled_for).await;
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(claimed) = self.claimed.take() else {
            return;
        };
        // A store that answers at once (the memory store) is done at once; another finishes
        // the release on the runtime.
        let release = cancel_claim(self.shared.store.clone(), claimed, self.keep_cancelled_for);
        if !finish_detached(release) {
            tracing::warn!(
                "a dropped tool call could not release its idempotency key: no Tokio runtime; \
                 the key stays held until its lease ends"
            );
        }
    }
}

async fn cancel_claim(store: Arc<dyn DedupeStore>, claimed: Arc<DedupeRecord>, keep_for: Duration) {
    match store.cancel(&claimed, keep_for).await {
        Ok(true) => tracing::debug!(
            idempotency_key_hash = %record_fingerprint(&claimed),
            "idempotency key released: the call ended before its result"
        ),
        Ok(false) => {}
        Err(error) => tracing::warn!(
            idempotency_key_hash = %record_fingerprint(&claimed),
            error = %error,
            "idempotency key could not be released; it stays held until its lease ends"
        ),
    }
}
