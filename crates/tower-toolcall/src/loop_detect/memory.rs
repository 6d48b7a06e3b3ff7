//! [`InMemoryLoopStore`]: the [`LoopStore`] of one process.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::config::{SessionTier, DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSION_BYTES};
use super::detector::Decision;
use super::store::{LoopCall, LoopStore, Observed, Settled, Signature, Tracked};
use super::tracker::{lock, Tracker};
use super::LoopSettingKey;
use crate::bounds::entropy_seed;
use crate::contract::time::unix_now_ms;
use crate::registry::LoopDetectSettings;
use crate::shared_store::StoreFuture;

/// Keeps the sessions' histories and own settings in this process, with the tracker and the
/// rules a [`LoopDetectLayer`](super::LoopDetectLayer) uses without a store: the store of one
/// replica, behind the [`LoopStore`] trait (for tests of the trait's users, or a layer whose
/// store is chosen at run time). Clones share the sessions.
///
/// Every operation is done when it is called, and its future answers at once. At most
/// 100 000 sessions keep calls (and as many keep settings), within 64 MiB; the least
/// recently used make room. A session's calls go
/// with its window; its settings stay until it is forgotten or makes room.
///
/// ```
/// use std::sync::Arc;
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_toolcall::loop_detect::{InMemoryLoopStore, LoopDetectLayer};
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolOutput};
///
/// # tokio_test::block_on(async {
/// let layer = LoopDetectLayer::builder(ToolRegistry::open())
///     .store(Arc::new(InMemoryLoopStore::new()))
///     .build()?;
/// let mut svc = ServiceBuilder::new()
///     .layer(layer)
///     .service(tool_fn(|_: ToolCall| async { Ok(ToolOutput::new(serde_json::json!("ok"))) }));
/// let call = ToolCall::builder("agents.tools.web", "search")
///     .session("sess-1")
///     .actor("user-7")
///     .params(serde_json::json!({"query": "same"}))
///     .build()?;
/// for _ in 0..3 {
///     svc.ready().await?.call(call.clone()).await?;
/// }
/// let refused = svc.ready().await?.call(call).await.unwrap_err();
/// assert_eq!(refused.code(), ErrorCode::LoopDetected);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct InMemoryLoopStore {
    sessions: Arc<Sessions>,
}

/// The sessions' calls and settings, and the seed of their signatures.
#[derive(Debug)]
struct Sessions {
    calls: Tracker,
    settings: SessionTier,
    seed: u64,
}

impl InMemoryLoopStore {
    /// An empty store, with a random signature seed.
    pub fn new() -> Self {
        InMemoryLoopStore {
            sessions: Arc::new(Sessions {
                calls: Tracker::new(DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSION_BYTES),
                settings: SessionTier::new(DEFAULT_MAX_SESSIONS),
                seed: entropy_seed(),
            }),
        }
    }
}

impl Default for InMemoryLoopStore {
    fn default() -> Self {
        InMemoryLoopStore::new()
    }
}

/// An answer that is there already.
fn ready<T: Send + 'static>(answer: T) -> StoreFuture<'static, T> {
    Box::pin(std::future::ready(Ok(answer)))
}

impl LoopStore for InMemoryLoopStore {
    /// Judges the call on its session's history, as the layer does without a store; a
    /// refused call is marked refused there and then, so its refusal needs no writing.
    fn check(&self, session: &str, call: LoopCall) -> StoreFuture<'static, Observed> {
        let settings = self.sessions.settings.get(session).unwrap_or_default();
        let (tracked, limits) = call.under(&settings);
        if !tracked {
            return ready(Observed::new(settings, None));
        }
        let now = Instant::now();
        let history = self.sessions.calls.session(session, now, limits.ttl());
        let mut history = lock(&history);
        let next = history.next_seq();
        let decision = call.judge(&mut history, now, &limits);
        let seq = match decision {
            Decision::Admit(seq) => seq,
            Decision::Resend | Decision::Reject(_) => next,
        };
        // How the call ends is recorded on this history, which knows the previous answers:
        // `finish` reads no streak, and the session's chance changed in the history already.
        let tracked = Tracked::new(decision, seq, unix_now_ms());
        ready(Observed::new(settings, Some(tracked)))
    }

    /// Records how an admitted call ended; a refusal or a re-send was written by
    /// [`check`](LoopStore::check) already.
    fn finish(
        &self,
        session: &str,
        seq: u64,
        ending: Settled,
        _chance: Option<(Signature, Instant)>,
    ) -> StoreFuture<'static, ()> {
        if let Settled::Done { outcome, .. } = ending {
            if let Some(history) = self.sessions.calls.get(session) {
                lock(&history).record_outcome(seq, outcome, Instant::now());
            }
        }
        ready(())
    }

    /// Sessions with settings of their own are bounded by number, not by `window`.
    fn change_settings(
        &self,
        session: &str,
        set: LoopDetectSettings,
        unset: &[LoopSettingKey],
        _window: Duration,
    ) -> StoreFuture<'static, ()> {
        let off = set.enabled == Some(false);
        self.sessions.settings.change(session, set, unset);
        if off {
            self.sessions.calls.remove(session);
        }
        ready(())
    }

    /// Drops the session's calls; the numbering of its calls goes on, so that a call still
    /// running when the session was reset finishes none of the calls after it.
    fn reset(&self, session: &str) -> StoreFuture<'static, ()> {
        if let Some(history) = self.sessions.calls.get(session) {
            lock(&history).clear();
        }
        ready(())
    }

    fn forget(&self, session: &str) -> StoreFuture<'static, ()> {
        self.sessions.settings.clear(session);
        self.sessions.calls.remove(session);
        ready(())
    }

    fn signature_seed(&self) -> u64 {
        self.sessions.seed
    }
}
