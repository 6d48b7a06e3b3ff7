use std::hash::BuildHasher;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use super::config::Tiers;
use super::detector::{Decision, Limits, Outcome, Signature};
use super::future::{OutcomeReport, ResponseFuture};
use super::report;
use super::tracker::{lock, Tracker};
use crate::canonical::{canonical_json, CanonicalOptions};
use crate::control::ShadowLayer;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::middleware::{shadow_decision, Passthrough};
use crate::outcome::{ShadowDecision, ShadowVerdict, ToolOutput};
use crate::registry::{LayerSetting, ToolRegistry};
use crate::shared_store::Outages;
use crate::trace::Redactor;

/// Stops calls that repeat in a loop; made by [`LoopDetectLayer`](super::LoopDetectLayer).
#[derive(Clone, Debug)]
pub struct LoopDetect<S> {
    inner: S,
    monitor: Arc<Monitor>,
}

/// The state every clone of the layer and its services shares.
#[derive(Debug)]
pub(super) struct Monitor {
    pub(super) registry: ToolRegistry,
    pub(super) tiers: Tiers,
    pub(super) tracker: Tracker,
    pub(super) canonical: CanonicalOptions,
    /// Applied to everything the layer logs.
    pub(super) redactor: Redactor,
    /// Keyed, fast hashing of signatures and results; the key is random per layer, or the
    /// shared store's, which every replica uses.
    pub(super) hasher: foldhash::quality::FixedState,
    /// Where the sessions' histories are kept when replicas share them.
    #[cfg(feature = "redis")]
    pub(super) store: Option<super::redis::RedisLoopStore>,
    /// The failure policy of the shared store, and its outages.
    pub(super) outages: Outages,
}

/// What the monitor decided about one call.
pub(super) enum Verdict {
    /// Detection is off for the call: pass it through untouched.
    Untracked,
    /// Run the call and report its outcome.
    Tracked(OutcomeReport),
    /// Do not run the call.
    Rejected(ToolError),
    /// Run the call although it loops: the layer is in shadow mode.
    Shadowed(ShadowDecision),
    /// The shared store is asked; the answer decides.
    #[cfg(feature = "redis")]
    Shared(SharedCheck),
}

/// What a decision means for the call.
pub(super) enum Judgement {
    /// Run it, and report its outcome under this sequence number.
    Admit(u64),
    /// Refuse it with this error.
    Refuse(ToolError),
    /// Run it although it loops: the layer is in shadow mode.
    Shadow(ShadowDecision),
}

/// A call whose session history is in the shared store: what judging it needs.
#[cfg(feature = "redis")]
pub(super) struct SharedCheck {
    pub(super) store: super::redis::RedisLoopStore,
    /// What the tiers below the session decide; the store holds the session's settings.
    pub(super) below: super::config::BelowSession,
    pub(super) signature: Signature,
}

impl Monitor {
    pub(super) fn inspect(self: &Arc<Self>, call: &ToolCall) -> Verdict {
        let tool = match &self.registry.policy_for(call).loop_detect {
            LayerSetting::Off => return Verdict::Untracked,
            LayerSetting::On(overrides) => Some(overrides),
            LayerSetting::Default => None,
        };
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            // The session's settings are in the store, read with its history.
            let signature = match self.signature(call) {
                Ok((signature, _)) => signature,
                Err(error) => return Verdict::Rejected(error),
            };
            return Verdict::Shared(SharedCheck {
                store: store.clone(),
                below: self.tiers.below_session(call, tool),
                signature,
            });
        }
        let Some(limits) = self.tiers.limits(call, tool) else {
            return Verdict::Untracked;
        };
        let (signature, canonical) = match self.signature(call) {
            Ok(signed) => signed,
            Err(error) => return Verdict::Rejected(error),
        };
        let now = Instant::now();
        let history = self.tracker.session(call.session_key(), now, limits.ttl);
        let decision = lock(&history).observe(now, signature, &limits);
        match self.judge(call, decision, &limits, signature, &canonical) {
            Judgement::Admit(seq) => {
                let results = limits.poller.then(|| self.clone());
                Verdict::Tracked(OutcomeReport::new(history, seq, results))
            }
            Judgement::Refuse(error) => Verdict::Rejected(error),
            Judgement::Shadow(decision) => Verdict::Shadowed(decision),
        }
    }

    /// The signature of `call`, and its params in canonical form.
    fn signature<'c>(
        &self,
        call: &'c ToolCall,
    ) -> Result<(Signature, std::borrow::Cow<'c, str>), ToolError> {
        let canonical = call.params().canonical(&self.canonical)?;
        let signature = Signature::new(
            &self.hasher,
            call.tool_namespace(),
            call.tool_name(),
            &canonical,
        );
        Ok((signature, canonical))
    }

    /// What `decision`, taken on `call` under `limits`, means; logs a detection.
    pub(super) fn judge(
        &self,
        call: &ToolCall,
        decision: Decision,
        limits: &Limits,
        signature: Signature,
        canonical: &str,
    ) -> Judgement {
        match decision {
            Decision::Admit(seq) => {
                tracing::debug!(
                    session_id = &*self.redactor.redact_identifier(call.session_key()),
                    tool_name = call.tool_name(),
                    signature_hash = %format_args!("{:016x}", signature.raw()),
                    "tool call recorded for loop detection"
                );
                Judgement::Admit(seq)
            }
            Decision::Reject(_)
                if self
                    .registry
                    .control()
                    .shadows(ShadowLayer::LoopDetect, call) =>
            {
                Judgement::Shadow(shadow_decision(
                    call,
                    ShadowLayer::LoopDetect,
                    ShadowVerdict::WouldBlock,
                ))
            }
            Decision::Reject(detection) => {
                report::log_detection(
                    call,
                    &detection,
                    limits,
                    signature,
                    canonical,
                    &self.canonical,
                    &self.redactor,
                );
                Judgement::Refuse(report::loop_error(call, &detection, limits))
            }
        }
    }

    /// How a call ended, for its session's history: a poller's output is fingerprinted.
    pub(super) fn outcome_of(
        poller: Option<&Monitor>,
        result: &Result<ToolOutput, ToolError>,
        seq: u64,
    ) -> Outcome {
        match result {
            Ok(output) => Outcome::Succeeded(
                poller.map_or(0, |monitor| monitor.result_fingerprint(output, seq)),
            ),
            Err(error) => Outcome::Failed(error.code()),
        }
    }

    /// Forgets `session`'s history: in this process, and in the shared store.
    pub(super) fn forget_history(&self, session: &str) -> super::handle::StoreWrite {
        self.tracker.remove(session);
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            return super::handle::StoreWrite::spawn(store.reset(session));
        }
        super::handle::StoreWrite::done()
    }

    /// A fingerprint of a poller's output, to tell a changed result from the same one.
    pub(super) fn result_fingerprint(&self, output: &ToolOutput, seq: u64) -> u64 {
        match canonical_json(&output.content, &self.canonical) {
            Ok(canonical) => self.hasher.hash_one(canonical.as_str()),
            // Output too deep to write canonically: count it as a change, never as a repeat.
            Err(_) => self.hasher.hash_one(("unwritable output", seq)),
        }
    }
}

impl<S> LoopDetect<S> {
    pub(super) fn new(inner: S, monitor: Arc<Monitor>) -> Self {
        LoopDetect { inner, monitor }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for LoopDetect<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Clone,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        if !self.monitor.registry.control().is_enabled() {
            return ResponseFuture::passthrough(Passthrough::new(self.inner.call(call)));
        }
        match self.monitor.inspect(&call) {
            Verdict::Untracked => {
                ResponseFuture::passthrough(Passthrough::new(self.inner.call(call)))
            }
            Verdict::Tracked(report) => ResponseFuture::called(self.inner.call(call), report),
            Verdict::Rejected(error) => ResponseFuture::rejected(error),
            Verdict::Shadowed(decision) => {
                ResponseFuture::passthrough(Passthrough::shadowed(self.inner.call(call), decision))
            }
            #[cfg(feature = "redis")]
            Verdict::Shared(check) => {
                // The store answers later: the ready service waits for its answer.
                let clone = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::shared(service, call, check, self.monitor.clone())
            }
        }
    }
}
