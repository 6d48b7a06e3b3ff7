//! Where the sessions' histories are kept when replicas share them: the [`LoopStore`] trait
//! and what it speaks.
//!
//! Without a store, a [`LoopDetectLayer`](super::LoopDetectLayer) keeps each session's
//! recent calls in its process and judges a call synchronously. With one
//! ([`LoopDetectLayerBuilder::store`](super::LoopDetectLayerBuilder::store)), each call is
//! one [`check`](LoopStore::check): the store appends the call to the session it keeps and
//! judges it with the layer's own rules, [`LoopCall::judge`], on the [`SessionHistory`] it
//! restores from what it kept. How an admitted call ended, when the rules need it, is then
//! written with [`finish`](LoopStore::finish).
//!
//! [`InMemoryLoopStore`](super::InMemoryLoopStore) is the store of one process, on the
//! tracker and rules the layer uses without a store; `RedisLoopStore`, of the crate
//! `tower-toolcall-redis`, is the store of a fleet. Both run the same loop-detection cases.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::config::BelowSession;
use super::detector::CallFacts;
pub use super::detector::{
    Decision, Detection, Limits, Outcome, SessionHistory, Signature, State, StoredCall,
};
use super::LoopSettingKey;
use crate::error::ConfigError;
use crate::registry::LoopDetectSettings;
use crate::shared_store::StoreFuture;

/// Where a loop layer keeps its sessions' histories and own settings when replicas share
/// them. Every operation answers within the store's own timeout; a failed one follows the
/// layer's [`FailurePolicy`](crate::shared_store::FailurePolicy).
pub trait LoopStore: fmt::Debug + Send + Sync + 'static {
    /// Appends `call` to `session`'s history, unless the session's own settings switch
    /// detection off, and answers with those settings and, when they track the call, its
    /// judgement on the history before it ([`LoopCall::judge`]).
    fn check(&self, session: &str, call: LoopCall) -> StoreFuture<'static, Observed>;

    /// Writes how the call `seq` of `session` ended, and the session's `chance` (the call
    /// last given a chance, and when) when the call changed it.
    fn finish(
        &self,
        session: &str,
        seq: u64,
        ending: Settled,
        chance: Option<(Signature, Instant)>,
    ) -> StoreFuture<'static, ()>;

    /// Changes `session`'s own settings: sets those `set` has, removes `unset`. Switching
    /// detection off drops the session's calls. `window` is how long the session lasts when
    /// its settings do not say.
    fn change_settings(
        &self,
        session: &str,
        set: LoopDetectSettings,
        unset: &[LoopSettingKey],
        window: Duration,
    ) -> StoreFuture<'static, ()>;

    /// Drops `session`'s calls; its settings stay.
    fn reset(&self, session: &str) -> StoreFuture<'static, ()>;

    /// Forgets `session`: its calls and its settings.
    fn forget(&self, session: &str) -> StoreFuture<'static, ()>;

    /// The seed of the keyed hash of calls, which every replica that shares the store must
    /// use.
    fn signature_seed(&self) -> u64;
}

/// Checks a session's own settings as the layer checks them when they are set: only the six
/// that [`LoopSettingKey`] names, each in range. A store reads back only settings that pass;
/// the error names the field.
pub fn check_session_settings(settings: &LoopDetectSettings) -> Result<(), ConfigError> {
    settings.check_session()
}

/// A call on its way to a [`LoopStore`]: its signature, and the settings of the tiers below
/// its session (the store holds the session's own).
#[derive(Clone, Copy, Debug)]
pub struct LoopCall {
    pub(super) facts: CallFacts,
    pub(super) below: BelowSession,
}

impl LoopCall {
    /// The call's signature.
    pub fn signature(&self) -> Signature {
        self.facts.signature
    }

    /// The idempotency record that answers a re-send of the call (a hash, never 0); 0 when
    /// no idempotency layer behind answers it.
    pub fn resend_id(&self) -> u64 {
        self.facts.resend.map_or(0, |resend| resend.id)
    }

    /// Whether the tiers below the session track the call.
    pub fn enabled(&self) -> bool {
        self.below.enabled
    }

    /// The limits of the tiers below the session.
    pub fn limits(&self) -> Limits {
        self.below.limits
    }

    /// Whether the call is tracked, and its limits, under the session's own `settings`.
    pub fn under(&self, settings: &LoopDetectSettings) -> (bool, Limits) {
        self.below.under(settings)
    }

    /// Judges the call, made at `now`, on `history` under `limits` (from
    /// [`under`](Self::under)), with the rules of the layer; the call is appended to
    /// `history` unless it re-sends an earlier one.
    pub fn judge(&self, history: &mut SessionHistory, now: Instant, limits: &Limits) -> Decision {
        history.observe(now, &self.facts, limits)
    }
}

/// What a [`LoopStore`] answered for one call: the session's own settings, and when they
/// track the call, its judgement.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Observed {
    /// The session's own settings.
    pub settings: LoopDetectSettings,
    /// `None` when the session's settings do not track the call.
    pub tracked: Option<Tracked>,
}

impl Observed {
    /// The answer for a call of a session with `settings`, judged `tracked`.
    pub fn new(settings: LoopDetectSettings, tracked: Option<Tracked>) -> Self {
        Observed { settings, tracked }
    }
}

/// A tracked call, judged on the history the store answered.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Tracked {
    /// What the rules decided.
    pub decision: Decision,
    /// The call's sequence number in its session.
    pub seq: u64,
    /// The session's chance, when the call changed it.
    pub chance: Option<(Signature, Instant)>,
    /// When the call came, in Unix ms.
    pub at_ms: u64,
    /// How the latest earlier identical call ended, and since when (Unix ms) its answer had
    /// been the same.
    pub previous: Option<(Outcome, u64)>,
}

impl Tracked {
    /// The call `seq`, which came at `at_ms` (Unix ms), judged `decision`.
    pub fn new(decision: Decision, seq: u64, at_ms: u64) -> Self {
        Tracked {
            decision,
            seq,
            chance: None,
            at_ms,
            previous: None,
        }
    }

    /// The session's chance, as the call changed it.
    pub fn with_chance(mut self, chance: Option<(Signature, Instant)>) -> Self {
        self.chance = chance;
        self
    }

    /// How the latest earlier identical call ended, and since when (Unix ms) its answer had
    /// been the same.
    pub fn with_previous(mut self, previous: Option<(Outcome, u64)>) -> Self {
        self.previous = previous;
        self
    }
}

/// How a call ended, as the replica that made it writes it. Exhaustive, as every store
/// writes each variant: a new one is a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Refused by the rules.
    Rejected,
    /// Answered from the idempotency layer's record.
    Resent,
    /// Ran and ended; its answer had been the same since `since_ms` (Unix ms).
    Done {
        /// How it ended.
        outcome: Outcome,
        /// Since when its answer had been the same, in Unix ms.
        since_ms: u64,
    },
}
