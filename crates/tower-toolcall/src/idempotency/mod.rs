//! [`IdempotencyLayer`]: each idempotency key runs the tool at most once, across retries,
//! reconnects and replicas.
//!
//! # Keys
//!
//! A call's key is, in order: the caller's `payload.idempotencyKey`; a key a hook put on the
//! call ([`ToolCall::set_hook_idempotency_key`](crate::ToolCall::set_hook_idempotency_key));
//! else, when derivation is on (the default), the key derived from the tool, the
//! canonical params, the session and the actor (see [`canonical::derive_key`]). A call
//! without a key passes through. The store key is scoped to the session and actor (or, for
//! tools whose policy says `scope = "global"`, shared by every session: a derived key then
//! leaves the session and actor out), always prefixed by the tenant, and names the tool. Results and logs name a key only by its
//! fingerprint, never by itself: a derived key (a SHA-256 already) by its first 16 hex digits,
//! another key by the [fingerprint](key_fingerprint) of its store key.
//!
//! # Derived keys absorb re-sends, not repeats
//!
//! A caller's or a hook's key says "this is one operation": its result is kept 24 h. A
//! derived key only says "the same call again", which is either a re-send (the answer was
//! lost on the way back, a client retried) or a repeat the model means (poll the time again,
//! search again after a write). So a derived key:
//!
//! | the first call is | a tool that is not read-only | a read-only tool |
//! |---|---|---|
//! | in flight | joins it | joins it |
//! | completed | reuses its result within the re-send window (30 s; `resend_window_ms` of the [settings](IdempotencyLayerBuilder::settings), `0` off), then runs again | runs again, unless the tool has a read cache TTL (`read_cache_ttl_ms`): within it, reuses the result |
//!
//! The record of a derived key is kept only that long, so the store does not fill with a
//! day of derived keys. Every answer taken from a record says so: `fromCache`, and
//! `cache.matchedOn` and `cache.ageMs` in the result envelope. A client that needs a result
//! kept longer sends its own key.
//!
//! # What a call finds
//!
//! The first call claims its key atomically with an in-flight lease (2 min by default,
//! renewed every half lease while the tool runs), runs the tool and stores the result by
//! compare-and-set on the record's version: under a caller's or a hook's key, a success for
//! 24 h and a failure for 5 min (a derived key: see above). A
//! failure whose error says the request was not processed (a refusal before any effect) is
//! not kept: the key is freed instead. A duplicate finds:
//!
//! | record | `enforced` (default) | `bestEffort` |
//! |---|---|---|
//! | in flight | waits for it, takes its result (`cache.matchedOn = "inflight"`) | `IDEMPOTENCY_IN_FLIGHT` at once |
//! | done | the cached output (`matchedOn = "completed"`, `cache.ageMs`) | the same |
//! | failed | the cached error | runs again when the error was retriable |
//! | cancelled, or lease ended | claims the key and runs | the same |
//! | other params digest | `IDEMPOTENCY_KEY_REUSED` | the same |
//!
//! `dedupeMode = disabled` (from the call, else the tool's policy, else the layer's default)
//! means no deduplication. A call may ask for a stricter mode than its tool's, never a looser
//! one (`bestEffort` under `enforced`, `disabled`) unless the tool's policy says
//! `callers_may_loosen = true` (or the layer's builder does): otherwise the request is
//! ignored and the tool's mode applies. With `on_params_mismatch = "independent"` a reused key with other
//! params is another key (the digest is appended to the store key), so both calls run.
//! A derived key hashes the params, so a duplicate found under it by another derived call has
//! the same params; the digests are compared when the record was written under a key from a
//! caller or a hook, or read back from a shared store.
//!
//! When the caller drops the response future before the result is stored, the record becomes
//! `cancelled` and the key is free. When a holder's lease ends without a result (the process
//! died), the next call takes the key over with a larger version; the late holder's result is
//! refused by the version check and logged at WARN.
//!
//! When the store fails, the call is refused with `STORE_UNAVAILABLE` and the tool does not
//! run (fail closed), unless the layer or the tool's policy says `on_store_error =
//! "fail_open"`: then the tool runs without deduplication.
//!
//! Put the layer inside `EnvelopeValidateLayer`, so a call it refuses never reaches the
//! store; a call this layer refuses leaves no record either.
//!
//! # Operator switches
//!
//! From [`control`](crate::control): while every layer is turned off
//! (`TOOL_RELIABILITY_ENABLED=false`), calls pass untouched and the store is not used.
//! `TOOL_RELIABILITY_DERIVE_IDEMPOTENCY=off` derives no key: only the caller's or a hook's key
//! deduplicates, and a call with neither passes through. In shadow mode
//! (`TOOL_RELIABILITY_SHADOW=idempotency`) a call that would have been answered from the
//! store — a completed record, an in-flight one, or a key reused with other params — runs
//! the tool instead, leaving that record as it is, with `would_replay`, `would_join` or
//! `would_conflict` in its record's [shadow decisions](crate::ShadowDecision); a call that
//! finds its key free claims it and stores its result as usual, so that later decisions
//! stay accurate.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use serde_json::json;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_toolcall::idempotency::IdempotencyLayer;
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::{tool_fn, MatchedOn, ToolCall, ToolOutput};
//!
//! # tokio_test::block_on(async {
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counted = runs.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::in_memory(ToolRegistry::open()))
//!     .service(tool_fn(move |_call: ToolCall| {
//!         let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
//!         async move { Ok(ToolOutput::new(json!({"run": n}))) }
//!     }));
//!
//! let call = ToolCall::builder("vault", "createFile")
//!     .session("sess-42").actor("user-7")
//!     .params(json!({"path": "XYZ/Foo.md"}))
//!     .idempotency_key("create-foo-1")
//!     .build()?;
//! let first = svc.ready().await?.call(call.clone()).await?;
//! let again = svc.ready().await?.call(call).await?;
//! assert_eq!(runs.load(Ordering::SeqCst), 1);
//! assert_eq!(again.content, first.content);
//! assert!(again.record().from_cache);
//! assert_eq!(again.record().cache.as_ref().unwrap().matched_on, MatchedOn::Completed);
//! # Ok::<(), tower_toolcall::ToolError>(())
//! # }).unwrap();
//! ```
//!
//! # Stores
//!
//! [`InMemoryDedupeStore`] (the default) keeps records in the process; `RedisDedupeStore`
//! (crate `tower-toolcall-redis`) shares them between replicas. Both implement [`DedupeStore`].
//!
//! [`canonical::derive_key`]: crate::canonical::derive_key

mod future;
mod key;
mod layer;
mod live;
mod record;
mod service;
mod store;

pub use future::ResponseFuture;
pub use key::{fingerprint_matches, key_fingerprint, tenant_prefix};
pub use layer::{IdempotencyLayer, IdempotencyLayerBuilder};
pub use record::{
    AttemptRecord, AttemptStatus, DedupeRecord, Execution, RecordRequest, RecordState, StoredError,
};
pub use service::{Idempotency, IdempotencyStats};
pub use store::{
    ClaimOutcome, ClaimRequest, Completion, DedupeStore, Finalized, InMemoryDedupeStore,
    InMemoryDedupeStoreBuilder, MemoryStoreStats, StoreError,
};
