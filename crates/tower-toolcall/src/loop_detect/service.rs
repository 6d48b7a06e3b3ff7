use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use super::config::Tiers;
use super::detector::{CallFacts, Decision, Limits, Outcome, Resend, Signature};
use super::future::{OutcomeReport, ResponseFuture};
use super::noise::Noise;
use super::report;
use super::store::{LoopCall, LoopStore};
use super::tracker::{lock, Tracker};
use crate::canonical::{canonical_json, CanonicalOptions};
use crate::control::ShadowLayer;
use crate::envelope::ToolCall;
use crate::error::ToolError;
use crate::middleware::{shadow_decision, Passthrough};
use crate::outcome::{ShadowDecision, ShadowVerdict, ToolOutput};
use crate::redact::Redactor;
use crate::registry::{LoopDetectSettings, ToolRegistry};
use crate::resend::{ResendKey, Resends};
use crate::shared_store::Outages;
use crate::tool_table::ToolTable;

/// Stops calls that repeat in a loop; made by [`LoopDetectLayer`](super::LoopDetectLayer).
#[derive(Clone, Debug)]
pub struct LoopDetect<S> {
    inner: S,
    monitor: Arc<Monitor>,
}

/// What the layer resolved once for one tool.
#[derive(Debug)]
pub(super) struct ToolLoop {
    /// The tool is registered as read-only or as running commands (whose output says
    /// whether they made progress, as a log read through a shell does): its answers decide
    /// whether a call repeats. A tool that writes is judged on its arguments alone.
    pub(super) answers_decide: bool,
    /// The members its calls and answers are compared without.
    pub(super) noise: Arc<Noise>,
    /// The tool's own settings, the tool tier (its `ignore_members` are in `noise`).
    pub(super) settings: LoopDetectSettings,
}

/// The state every clone of the layer and its services shares.
#[derive(Debug)]
pub(super) struct Monitor {
    pub(super) registry: ToolRegistry,
    pub(super) tools: ToolTable<ToolLoop>,
    /// The idempotency layer behind, when the layer knows which calls it answers.
    pub(super) resends: Option<Resends>,
    pub(super) tiers: Tiers,
    pub(super) tracker: Tracker,
    pub(super) canonical: CanonicalOptions,
    /// Applied to everything the layer logs.
    pub(super) redactor: Redactor,
    /// Keyed, fast hashing of signatures and results; the key is random per layer, or the
    /// shared store's, which every replica uses.
    pub(super) hasher: foldhash::quality::FixedState,
    /// Where the sessions' histories are kept when replicas share them.
    pub(super) store: Option<Arc<dyn LoopStore>>,
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
    Shared(SharedCheck),
}

/// What a decision means for the call.
pub(super) enum Judgement {
    /// Run it, and report its outcome under this sequence number.
    Admit(u64),
    /// Run it untracked: the idempotency layer behind answers it from its record.
    Resend,
    /// Refuse it with this error.
    Refuse(ToolError),
    /// Run it although it loops: the layer is in shadow mode.
    Shadow(ShadowDecision),
}

/// A call whose session history is in the shared store: what judging it needs.
pub(super) struct SharedCheck {
    pub(super) store: Arc<dyn LoopStore>,
    /// The call's facts, and what the tiers below the session decide; the store holds the
    /// session's settings.
    pub(super) call: LoopCall,
    /// The members the tool's answers are compared without.
    pub(super) noise: Arc<Noise>,
}

impl Monitor {
    pub(super) fn inspect(self: &Arc<Self>, call: &ToolCall) -> Verdict {
        if self.registry.policy_for(call).loop_detect.is_off() {
            return Verdict::Untracked;
        }
        let facts = self.tools.for_call(call);
        let tool = &facts.settings;
        if let Some(store) = &self.store {
            // The session's settings are in the store, read with its history.
            let signature = match self.signature(call, &facts.noise) {
                Ok((signature, _)) => signature,
                Err(error) => return Verdict::Rejected(error),
            };
            return Verdict::Shared(SharedCheck {
                store: store.clone(),
                call: LoopCall {
                    facts: CallFacts {
                        signature,
                        resend: self.resend(call),
                    },
                    below: self.tiers.below_session(call, tool, facts.answers_decide),
                },
                noise: facts.noise.clone(),
            });
        }
        let Some(limits) = self.tiers.limits(call, tool, facts.answers_decide) else {
            return Verdict::Untracked;
        };
        let (signature, canonical) = match self.signature(call, &facts.noise) {
            Ok(signed) => signed,
            Err(error) => return Verdict::Rejected(error),
        };
        let now = Instant::now();
        let history = self.tracker.session(call.session_key(), now, limits.ttl);
        let observed = CallFacts {
            signature,
            resend: self.resend(call),
        };
        let decision = lock(&history).observe(now, &observed, &limits);
        match self.judge(call, decision, &limits, signature, &canonical) {
            Judgement::Admit(seq) => {
                let answers = limits
                    .result_aware
                    .then(|| Answers::new(self.clone(), facts.noise.clone()));
                Verdict::Tracked(OutcomeReport::new(history, seq, answers))
            }
            Judgement::Resend => Verdict::Untracked,
            Judgement::Refuse(error) => Verdict::Rejected(error),
            Judgement::Shadow(decision) => Verdict::Shadowed(decision),
        }
    }

    /// The signature of `call`, without the `noise` members, and its params in canonical
    /// form (with them: the form idempotency keys use, cached in the params).
    fn signature<'c>(
        &self,
        call: &'c ToolCall,
        noise: &Noise,
    ) -> Result<(Signature, Cow<'c, str>), ToolError> {
        let canonical = call.params().canonical(&self.canonical)?;
        let quiet = match noise.strip(call.params().as_value()) {
            Cow::Borrowed(_) => None,
            Cow::Owned(stripped) => Some(canonical_json(&stripped, &self.canonical)?),
        };
        let signature = Signature::new(
            &self.hasher,
            call.tool_namespace(),
            call.tool_name(),
            quiet.as_deref().unwrap_or(&canonical),
        );
        Ok((signature, canonical))
    }

    /// How the idempotency layer behind answers a re-send of `call`, if the layer knows it.
    fn resend(&self, call: &ToolCall) -> Option<Resend> {
        let key = self.resends.as_ref()?.0.resend_key(call)?;
        let (namespace, name) = (call.tool_namespace(), call.tool_name());
        let (id, settled_for) = match key {
            ResendKey::Given { key, settled_for } => (
                self.hasher.hash_one(("given", namespace, name, &*key)),
                settled_for,
            ),
            ResendKey::Derived {
                with_actor,
                settled_for,
            } => {
                let canonical = call.params().canonical(&self.canonical).ok()?;
                let actor = if with_actor { call.actor_id() } else { "" };
                let parts = ("derived", namespace, name, &*canonical, actor);
                (self.hasher.hash_one(parts), settled_for)
            }
        };
        Some(Resend {
            id: id.max(1),
            settled_for,
        })
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
            Decision::Resend => Judgement::Resend,
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

    /// How a call ended, for its session's history: a result-aware call's answer is
    /// digested.
    pub(super) fn outcome_of(
        answers: Option<(&Monitor, &Noise)>,
        result: &Result<ToolOutput, ToolError>,
        seq: u64,
    ) -> Outcome {
        match result {
            Ok(output) => Outcome::Succeeded(answers.map_or(0, |(monitor, noise)| {
                monitor.answer_digest(noise, output, seq)
            })),
            Err(error) => Outcome::Failed(error.code()),
        }
    }

    /// A digest of the answer's canonical form without its `noise` members, to tell a
    /// changed answer from the same one.
    fn answer_digest(&self, noise: &Noise, output: &ToolOutput, seq: u64) -> u64 {
        let content = noise.strip(&output.content);
        match canonical_json(&content, &self.canonical) {
            Ok(canonical) => self.hasher.hash_one(canonical.as_str()),
            // Output too deep to write canonically: count it as a change, never as a repeat.
            Err(_) => self.hasher.hash_one(("unwritable output", seq)),
        }
    }

    /// Forgets `session`'s history: in this process, and in the shared store.
    pub(super) fn forget_history(&self, session: &str) -> super::handle::StoreWrite {
        self.tracker.remove(session);
        if let Some(store) = &self.store {
            return super::handle::StoreWrite::spawn(store.reset(session));
        }
        super::handle::StoreWrite::done()
    }
}

/// What digests a result-aware call's answers: the layer and the tool's noise.
#[derive(Debug)]
pub(super) struct Answers {
    monitor: Arc<Monitor>,
    noise: Arc<Noise>,
}

impl Answers {
    pub(super) fn new(monitor: Arc<Monitor>, noise: Arc<Noise>) -> Self {
        Answers { monitor, noise }
    }

    pub(super) fn parts(&self) -> (&Monitor, &Noise) {
        (&self.monitor, &self.noise)
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
            Verdict::Shared(check) => {
                // The store answers later: the ready service waits for its answer.
                let clone = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::shared(service, call, check, self.monitor.clone())
            }
        }
    }
}
