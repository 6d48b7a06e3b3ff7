//! The pure part of loop detection: one session's recent calls and the rules that find a loop
//! in them.
//!
//! [`SessionHistory::observe`] takes the time, the call's [`CallFacts`] and the [`Limits`] in
//! force, and returns the [`Decision`]; [`SessionHistory::record_outcome`] tells it how an
//! admitted call ended, and when. Nothing here reads a clock or takes a lock: the service
//! does both.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ErrorCode;
use crate::registry::LoopMode;

/// What identifies a call for loop detection: a keyed hash of its tool and canonical params
/// (without the members the layer ignores as per-call noise).
///
/// ```
/// use tower_toolcall::loop_detect::store::Signature;
///
/// assert_eq!(Signature::from_raw(0x5eed).raw(), 0x5eed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature(u64);

impl Signature {
    /// The signature of `namespace::name` called with `canonical` params.
    pub(crate) fn new(
        hasher: &impl BuildHasher,
        namespace: &str,
        name: &str,
        canonical: &str,
    ) -> Self {
        let mut h = hasher.build_hasher();
        namespace.hash(&mut h);
        name.hash(&mut h);
        canonical.hash(&mut h);
        Signature(h.finish())
    }

    /// A signature from a raw hash (a stored one).
    pub fn from_raw(raw: u64) -> Self {
        Signature(raw)
    }

    /// The hash, for logs and stores.
    pub fn raw(self) -> u64 {
        self.0
    }
}

/// What the rules know of a call before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallFacts {
    pub(crate) signature: Signature,
    /// How the idempotency layer behind would answer the call from a record; `None` when no
    /// layer behind answers it.
    pub(crate) resend: Option<Resend>,
}

impl CallFacts {
    /// A call known by its signature alone.
    #[cfg(test)]
    pub(crate) fn plain(signature: Signature) -> Self {
        CallFacts {
            signature,
            resend: None,
        }
    }
}

/// How the idempotency layer behind the loop layer answers a call from its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resend {
    /// What the record is kept under (a hash of the idempotency key's parts); never 0.
    pub(crate) id: u64,
    /// How long after the earlier call ended its record answers; `None`: only while it runs.
    pub(crate) settled_for: Option<Duration>,
}

/// The limits in force for one call, resolved from the configuration tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Identical consecutive calls that make a loop.
    pub(crate) max_repeats: u32,
    /// How long a call is remembered.
    pub(crate) ttl: Duration,
    /// What a detection does.
    pub(crate) mode: LoopMode,
    /// The call's answer decides whether it repeats (read-only tools and pollers):
    /// identical calls count only while their answers stay the same.
    pub(crate) result_aware: bool,
    /// Cycles of different calls; `None` when that rule is off.
    pub(crate) cycles: Option<CycleLimits>,
    /// Identical calls that make a loop when the earlier ones failed alike; `None` when that
    /// rule is off.
    pub(crate) failures: Option<u32>,
    /// A retry whose wait since the previous identical failure is at least this long, and
    /// that waits longer each time, is no repeat; `None` when every retry counts.
    pub(crate) backoff: Option<Duration>,
    /// How unchanged answers of a result-aware call are judged.
    pub(crate) polls: PollLimits,
}

/// How long unchanged answers may go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PollLimits {
    /// Repetitions spaced at least this far apart on average are a patient poll: counted by
    /// time (`budget`), not by number.
    pub(crate) patient_gap: Duration,
    /// How long a patient poll's answer may stay the same; `None`: without end.
    pub(crate) budget: Option<Duration>,
}

/// The cycle rule's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CycleLimits {
    /// Full repetitions of a cycle that make a loop.
    pub(crate) repetitions: u32,
    /// The longest cycle looked for, in calls.
    pub(crate) max_length: usize,
}

/// A wait grows when it is at least this many times the one before (exponential back-off
/// doubles it; jitter takes some of that away).
const BACKOFF_GROWTH: f64 = 1.5;

impl Limits {
    /// How long a call is remembered: the session's window.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Identical consecutive calls that make a loop.
    pub fn max_repeats(&self) -> u32 {
        self.max_repeats
    }

    /// Whether the call's answer decides whether it repeats (read-only tools and pollers).
    pub fn result_aware(&self) -> bool {
        self.result_aware
    }

    /// These limits with `max_repeats` identical consecutive calls making a loop.
    pub fn with_max_repeats(self, max_repeats: u32) -> Self {
        Limits {
            max_repeats,
            ..self
        }
    }

    /// How many past calls the rules need to see.
    pub fn history_len(&self) -> usize {
        let repeats = self.max_repeats.saturating_sub(1) as usize;
        let cycles = self.cycles.map_or(0, |c| {
            (c.repetitions as usize * c.max_length).saturating_sub(1)
        });
        let failures = self.failures.map_or(0, |f| f.saturating_sub(1)) as usize;
        repeats.max(cycles).max(failures)
    }
}

/// How an admitted call ended. Exhaustive, as every [`LoopStore`](super::LoopStore) writes
/// each variant: a new one is a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The tool answered; the digest of its answer (only computed for result-aware calls).
    Succeeded(u64),
    /// The tool failed with this code.
    Failed(ErrorCode),
}

/// What the rules decided about a call. Exhaustive, as every
/// [`LoopStore`](super::LoopStore) keeps the call by it: a new one is a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run the call; report its outcome under this sequence number.
    Admit(u64),
    /// Run the call untracked: it re-sends an earlier call, which the idempotency layer
    /// behind answers from its record.
    Resend,
    /// Do not run the call.
    Reject(Detection),
}

/// A loop found in a session: which rule found it and how far it counted (what the layer
/// logs and answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detection {
    /// The rule that found it.
    pub(crate) rule: Rule,
    /// What the layer does about it.
    pub(crate) action: Action,
    /// How far the rule counted.
    pub(crate) count: u32,
    /// The count at which the rule fires.
    pub(crate) threshold: u32,
}

/// The rule that found a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The same call, consecutively.
    Repeat,
    /// The same read, consecutively, with the same answer each time: in quick succession,
    /// or for longer than the poll budget (`for_secs` is then how long).
    UnchangedPoll { for_secs: Option<u64> },
    /// A cycle of `length` different calls, repeated.
    Cycle { length: usize },
    /// The same call failing with the same code, consecutively.
    Failures { code: ErrorCode },
}

impl Rule {
    /// The rule's name in logs and error details.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Rule::Repeat => "repeat",
            Rule::UnchangedPoll { .. } => "unchanged_poll",
            Rule::Cycle { .. } => "cycle",
            Rule::Failures { .. } => "failures",
        }
    }
}

/// What the layer does about a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Refuse the call with `LOOP_DETECTED`.
    Break,
    /// Refuse the call with advice to change approach; the next repeat breaks.
    Chance,
}

impl Action {
    /// The action's name in logs and error details.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Break => "break",
            Action::Chance => "chance",
        }
    }
}

/// The recent calls of one session, and the rules that judge a new call on them: what a
/// [`LoopStore`](super::LoopStore) restores from what it keeps.
#[derive(Clone, Debug, Default)]
pub struct SessionHistory {
    entries: VecDeque<Entry>,
    /// The sequence number of the next call; the last entry has `next_seq - 1`.
    next_seq: u64,
    /// The call last given a chance, and when.
    chance: Option<(Signature, Instant)>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    at: Instant,
    signature: Signature,
    result_aware: bool,
    state: State,
    /// When the call ended (its start until then).
    ended: Instant,
    /// Since when its answer has been the same (its start when it changed).
    since: Instant,
    /// The record the idempotency layer keeps it under; 0 for none.
    resend: u64,
}

/// Where a remembered call stands. Exhaustive, as every [`LoopStore`](super::LoopStore)
/// writes each variant: a new one is a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Admitted; no outcome yet (or the caller gave up on it).
    Pending,
    /// Rejected by this layer.
    Rejected,
    /// Admitted and finished.
    Done(Outcome),
    /// Answered from the idempotency layer's record: no call of its own. Only a shared
    /// store keeps such calls, and the rules never see them.
    Resent,
}

/// One remembered call, as a store keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredCall {
    /// When the call came.
    pub at: Instant,
    /// The call's signature.
    pub signature: Signature,
    /// Whether its answer decides whether it repeats.
    pub result_aware: bool,
    /// Where it stands.
    pub state: State,
    /// When it ended (when it came, until then).
    pub ended: Instant,
    /// Since when its answer has been the same (when it came, when the answer changed).
    pub since: Instant,
    /// The idempotency record that answers a re-send of it; 0 for none.
    pub resend: u64,
}

impl StoredCall {
    /// A call that came `at` with `signature`, in `state`; it ended `ended`, its answer had
    /// been the same `since`, and `resend` names its idempotency record (0 for none).
    pub fn new(
        at: Instant,
        signature: Signature,
        result_aware: bool,
        state: State,
        ended: Instant,
        since: Instant,
        resend: u64,
    ) -> Self {
        StoredCall {
            at,
            signature,
            result_aware,
            state,
            ended,
            since,
            resend,
        }
    }
}

/// When a call's unchanged answers began: `at` (its start) unless the previous identical
/// call answered the same, whose streak it continues.
pub(crate) fn streak_since(
    previous: Option<(Outcome, Instant)>,
    outcome: Outcome,
    at: Instant,
) -> Instant {
    match previous {
        Some((answered, since)) if answered == outcome => since,
        _ => at,
    }
}

impl SessionHistory {
    /// A history that a store kept: its calls, oldest first, the sequence number of the call
    /// after the last, and the call last given a chance.
    pub fn restore(
        calls: impl IntoIterator<Item = StoredCall>,
        next_seq: u64,
        chance: Option<(Signature, Instant)>,
    ) -> Self {
        SessionHistory {
            entries: calls
                .into_iter()
                .filter(|call| call.state != State::Resent)
                .map(|call| Entry {
                    at: call.at,
                    signature: call.signature,
                    result_aware: call.result_aware,
                    state: call.state,
                    ended: call.ended,
                    since: call.since,
                    resend: call.resend,
                })
                .collect(),
            next_seq,
            chance,
        }
    }

    /// The call last given a chance, and when.
    pub fn chance(&self) -> Option<(Signature, Instant)> {
        self.chance
    }

    /// The sequence number of the next call.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Forgets every call and the chance; the numbering goes on.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.chance = None;
    }

    /// How many calls are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The latest finished call of `signature` before the call `seq` (all calls when `seq` is
    /// past the last): how it ended and since when its answer had been the same.
    pub(crate) fn previous_answer(
        &self,
        signature: Signature,
        seq: u64,
    ) -> Option<(Outcome, Instant)> {
        let first = self.next_seq - self.entries.len() as u64;
        let before = seq.saturating_sub(first).min(self.entries.len() as u64) as usize;
        self.entries
            .range(..before)
            .rev()
            .filter(|e| e.signature == signature)
            .find_map(|e| match e.state {
                State::Done(outcome) => Some((outcome, e.since)),
                _ => None,
            })
    }

    /// Looks at one call made at `now` and decides whether it runs. The call is remembered
    /// either way, unless it re-sends an earlier one: a refused repeat is still a repeat.
    pub(crate) fn observe(&mut self, now: Instant, call: &CallFacts, limits: &Limits) -> Decision {
        self.forget_before(now, limits.ttl);
        if call.resend.is_some_and(|resend| self.resends(now, resend)) {
            return Decision::Resend;
        }
        let signature = call.signature;
        let found = if self.backing_off(now, signature, limits) {
            None
        } else {
            self.failures(signature, limits)
                .or_else(|| self.repeats(now, signature, limits))
        }
        .or_else(|| self.cycle(now, signature, limits));
        let seq = self.next_seq;
        self.next_seq += 1;
        let (decision, state) = match found {
            None => (Decision::Admit(seq), State::Pending),
            Some((rule, count, threshold)) => {
                let action = self.act(now, signature, limits.mode);
                let detection = Detection {
                    rule,
                    action,
                    count,
                    threshold,
                };
                (Decision::Reject(detection), State::Rejected)
            }
        };
        // Room first, so that a full history never grows.
        let keep = limits.history_len();
        while !self.entries.is_empty() && self.entries.len() >= keep {
            self.entries.pop_front();
        }
        if keep > 0 {
            self.entries.push_back(Entry {
                at: now,
                signature,
                result_aware: limits.result_aware,
                state,
                ended: now,
                since: now,
                resend: call.resend.map_or(0, |r| r.id),
            });
        }
        decision
    }

    /// Records how the admitted call `seq` ended, at `now`. Calls already forgotten are
    /// ignored.
    pub(crate) fn record_outcome(&mut self, seq: u64, outcome: Outcome, now: Instant) {
        let first = self.next_seq - self.entries.len() as u64;
        let Some(index) = seq.checked_sub(first) else {
            return;
        };
        let Some(entry) = self.entries.get(index as usize).copied() else {
            return;
        };
        if entry.state != State::Pending {
            return;
        }
        let since = streak_since(
            self.previous_answer(entry.signature, seq),
            outcome,
            entry.at,
        );
        let entry = &mut self.entries[index as usize];
        entry.state = State::Done(outcome);
        entry.ended = now;
        entry.since = since;
    }

    fn forget_before(&mut self, now: Instant, ttl: Duration) {
        let expired = |at: Instant| now.saturating_duration_since(at) >= ttl;
        while self.entries.front().is_some_and(|e| expired(e.at)) {
            self.entries.pop_front();
        }
        if self.chance.is_some_and(|(_, at)| expired(at)) {
            self.chance = None;
        }
    }

    /// Whether an earlier call kept under the same record is still running (the new one
    /// joins it) or ended recently enough for its record to answer.
    fn resends(&self, now: Instant, resend: Resend) -> bool {
        self.entries
            .iter()
            .filter(|e| e.resend == resend.id)
            .any(|e| match e.state {
                State::Pending => true,
                State::Done(_) => resend
                    .settled_for
                    .is_some_and(|window| now.saturating_duration_since(e.ended) < window),
                State::Rejected | State::Resent => false,
            })
    }

    /// Break, or give the call its one chance in the window.
    fn act(&mut self, now: Instant, signature: Signature, mode: LoopMode) -> Action {
        match mode {
            LoopMode::Break => Action::Break,
            LoopMode::ChanceThenBreak => {
                if self.chance.is_some_and(|(given, _)| given == signature) {
                    Action::Break
                } else {
                    self.chance = Some((signature, now));
                    Action::Chance
                }
            }
        }
    }

    /// Whether the call retries identical failures with back-off: each wait since the
    /// previous identical call at least [`BACKOFF_GROWTH`] times the one before, the last
    /// at least `limits.backoff`.
    fn backing_off(&self, now: Instant, signature: Signature, limits: &Limits) -> bool {
        let Some(min_wait) = limits.backoff else {
            return false;
        };
        let mut later = now;
        let mut previous_wait: Option<Duration> = None;
        let mut failures = 0;
        for entry in self.entries.iter().rev() {
            if entry.signature != signature
                || !matches!(entry.state, State::Done(Outcome::Failed(_)))
            {
                break;
            }
            let wait = later.saturating_duration_since(entry.at);
            match previous_wait {
                None if wait < min_wait => return false,
                Some(newer) if newer.as_secs_f64() < wait.as_secs_f64() * BACKOFF_GROWTH => {
                    return false
                }
                _ => {}
            }
            previous_wait = Some(wait);
            later = entry.at;
            failures += 1;
        }
        failures > 0
    }

    /// The same call, consecutively; for a result-aware call, only while its answers stay
    /// the same, and then only in quick succession or past the poll budget.
    fn repeats(
        &self,
        now: Instant,
        signature: Signature,
        limits: &Limits,
    ) -> Option<(Rule, u32, u32)> {
        let mut count = 1u32;
        let mut result = None;
        let mut threshold_at = now;
        let mut since = now;
        for entry in self.entries.iter().rev() {
            if entry.signature != signature {
                break;
            }
            if limits.result_aware && entry.result_aware {
                if let State::Done(outcome) = entry.state {
                    match result {
                        None => result = Some(outcome),
                        Some(newer) if newer != outcome => break,
                        Some(_) => {}
                    }
                    since = since.min(entry.since);
                }
            }
            count += 1;
            if count <= limits.max_repeats {
                threshold_at = entry.at;
            }
        }
        if count < limits.max_repeats {
            return None;
        }
        if !limits.result_aware {
            return Some((Rule::Repeat, count, limits.max_repeats));
        }
        let rule = unchanged(now, threshold_at, since, limits.max_repeats, &limits.polls)?;
        Some((rule, count, limits.max_repeats))
    }

    /// The same call failed with the same code, each of the last `max_failures - 1` times.
    fn failures(&self, signature: Signature, limits: &Limits) -> Option<(Rule, u32, u32)> {
        let threshold = limits.failures?;
        let mut code = None;
        let mut count = 1u32;
        for entry in self.entries.iter().rev() {
            if entry.signature != signature {
                break;
            }
            match entry.state {
                State::Rejected => continue,
                State::Done(Outcome::Failed(failed)) if code.is_none_or(|c| c == failed) => {
                    code = Some(failed);
                    count += 1;
                    if count >= threshold {
                        return Some((Rule::Failures { code: failed }, count, threshold));
                    }
                }
                _ => break,
            }
        }
        None
    }

    /// A cycle of 2 to `max_length` calls, not all the same, repeated `repetitions` times
    /// with this call completing the last repetition. A cycle of result-aware calls whose
    /// answers stay the same is judged as an unchanged poll.
    fn cycle(
        &self,
        now: Instant,
        signature: Signature,
        limits: &Limits,
    ) -> Option<(Rule, u32, u32)> {
        let rule = limits.cycles?;
        let past = self.entries.len();
        let total = past + 1;
        // Position `i` of the sequence of remembered calls followed by this one.
        let signature_at = |i: usize| {
            if i == past {
                signature
            } else {
                self.entries[i].signature
            }
        };
        let same = |i: usize, j: usize| {
            if signature_at(i) != signature_at(j) {
                return false;
            }
            // A read whose answer changed is not a repetition, whichever call closes the
            // cycle. `a` and `b` are calls of the same tool: they agree on results.
            match (self.entries.get(i), self.entries.get(j)) {
                (Some(a), Some(b)) if a.result_aware => match (a.state, b.state) {
                    (State::Done(x), State::Done(y)) => x == y,
                    _ => true,
                },
                _ => true,
            }
        };
        for length in 2..=rule.max_length {
            let span = length * rule.repetitions as usize;
            if span > total {
                break;
            }
            let start = total - span;
            let repeats = (start + length..total).all(|i| same(i, i - length));
            if !repeats {
                continue;
            }
            // A,A,A,A is a run of one call, not a cycle of two.
            let block = total - length;
            let shorter = (1..length)
                .filter(|d| length % d == 0)
                .any(|d| (block + d..total).all(|i| signature_at(i) == signature_at(i - d)));
            if shorter {
                continue;
            }
            let found = Rule::Cycle { length };
            let all_reads =
                limits.result_aware && self.entries.range(start..).all(|e| e.result_aware);
            if !all_reads {
                return Some((found, rule.repetitions, rule.repetitions));
            }
            let since = self
                .entries
                .range(start..)
                .map(|e| e.since)
                .min()
                .unwrap_or(now);
            let first = self.entries[start].at;
            if unchanged(now, first, since, rule.repetitions, &limits.polls).is_some() {
                return Some((found, rule.repetitions, rule.repetitions));
            }
        }
        None
    }
}

/// Whether `repetitions` of unchanged answers, the first at `first` and the same since
/// `since`, are a loop: in quick succession (less than the patient gap apart on average), or
/// for longer than the poll budget.
fn unchanged(
    now: Instant,
    first: Instant,
    since: Instant,
    repetitions: u32,
    polls: &PollLimits,
) -> Option<Rule> {
    let span = now.saturating_duration_since(first);
    let patient = polls
        .patient_gap
        .saturating_mul(repetitions.saturating_sub(1));
    if span < patient {
        return Some(Rule::UnchangedPoll { for_secs: None });
    }
    let unchanged_for = now.saturating_duration_since(since);
    polls
        .budget
        .filter(|budget| unchanged_for >= *budget)
        .map(|_| Rule::UnchangedPoll {
            for_secs: Some(unchanged_for.as_secs()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0xA;
    const B: u64 = 0xB;
    const C: u64 = 0xC;
    const D: u64 = 0xD;
    const E: u64 = 0xE;

    fn limits() -> Limits {
        Limits {
            max_repeats: 4,
            ttl: Duration::from_secs(120),
            mode: LoopMode::Break,
            result_aware: false,
            cycles: Some(CycleLimits {
                repetitions: 3,
                max_length: 3,
            }),
            failures: Some(4),
            backoff: None,
            polls: PollLimits {
                patient_gap: Duration::from_secs(20),
                budget: Some(Duration::from_secs(600)),
            },
        }
    }

    /// One step of a case: a call at `secs`, its signature, and how it ends if admitted.
    #[derive(Clone)]
    struct Step {
        secs: u64,
        signature: u64,
        outcome: Option<Outcome>,
    }

    fn at(secs: u64, signature: u64) -> Step {
        Step {
            secs,
            signature,
            outcome: Some(Outcome::Succeeded(0)),
        }
    }

    fn returning(secs: u64, signature: u64, outcome: Outcome) -> Step {
        Step {
            secs,
            signature,
            outcome: Some(outcome),
        }
    }

    fn pending(secs: u64, signature: u64) -> Step {
        Step {
            secs,
            signature,
            outcome: None,
        }
    }

    /// What each step came to: `.` admitted, `B` broken, `C` given a chance.
    fn run(limits: Limits, steps: &[Step]) -> (String, Vec<Detection>) {
        let t0 = Instant::now();
        let mut history = SessionHistory::default();
        let mut marks = String::new();
        let mut detections = Vec::new();
        for step in steps {
            let now = t0 + Duration::from_secs(step.secs);
            match history.observe(
                now,
                &CallFacts::plain(Signature::from_raw(step.signature)),
                &limits,
            ) {
                Decision::Admit(seq) => {
                    marks.push('.');
                    if let Some(outcome) = step.outcome {
                        history.record_outcome(seq, outcome, now);
                    }
                }
                Decision::Resend => marks.push('r'),
                Decision::Reject(detection) => {
                    marks.push(match detection.action {
                        Action::Break => 'B',
                        Action::Chance => 'C',
                    });
                    detections.push(detection);
                }
            }
            assert!(history.len() <= limits.history_len());
        }
        (marks, detections)
    }

    fn seq(signatures: &[u64]) -> Vec<Step> {
        signatures
            .iter()
            .enumerate()
            .map(|(i, &s)| at(i as u64, s))
            .collect()
    }

    #[test]
    fn rules_table() {
        let failed = Outcome::Failed(ErrorCode::UpstreamError);
        let other_failure = Outcome::Failed(ErrorCode::NotFound);
        let result = |r| Outcome::Succeeded(r);
        let no_cycles = Limits {
            cycles: None,
            ..limits()
        };
        let high = Limits {
            max_repeats: 10,
            ..limits()
        };
        let poller = Limits {
            result_aware: true,
            ..limits()
        };
        let chance = Limits {
            mode: LoopMode::ChanceThenBreak,
            ..limits()
        };
        let higher = Limits {
            max_repeats: 20,
            ..limits()
        };
        let longer_cycles = Limits {
            cycles: Some(CycleLimits {
                repetitions: 3,
                max_length: 4,
            }),
            ..limits()
        };
        let cases: Vec<(&str, Limits, Vec<Step>, &str)> = vec![
            (
                "break at the fourth identical call",
                limits(),
                seq(&[A, A, A, A, A]),
                "...BB",
            ),
            (
                "a different call resets the count",
                limits(),
                seq(&[A, A, A, B, A, A, A]),
                ".......",
            ),
            (
                "entries older than the window are forgotten",
                limits(),
                vec![
                    at(0, A),
                    at(1, A),
                    at(2, A),
                    at(122, A),
                    at(123, A),
                    at(124, A),
                    at(125, A),
                ],
                "......B",
            ),
            (
                "exactly the window's age is outside it",
                limits(),
                vec![at(0, A), at(0, A), at(0, A), at(120, A)],
                "....",
            ),
            (
                "A,B repeated three times",
                limits(),
                seq(&[A, B, A, B, A, B, A]),
                ".....BB",
            ),
            (
                "A,B,C repeated three times",
                limits(),
                seq(&[A, B, C, A, B, C, A, B, C]),
                "........B",
            ),
            (
                "A,A,B twice is no loop",
                limits(),
                seq(&[A, A, B, A, A, B]),
                "......",
            ),
            (
                "A,A,B three times is",
                limits(),
                seq(&[A, A, B, A, A, B, A, A, B]),
                "........B",
            ),
            (
                "cycles can be switched off",
                no_cycles,
                seq(&[A, B, A, B, A, B, A, B]),
                "........",
            ),
            (
                "a cycle must fit in the window",
                limits(),
                vec![at(0, A), at(1, B), at(2, A), at(3, B), at(4, A), at(121, B)],
                "......",
            ),
            (
                "three identical failures break below max_repeats",
                high,
                vec![
                    returning(0, A, failed),
                    returning(1, A, failed),
                    returning(2, A, failed),
                    returning(3, A, failed),
                ],
                "...B",
            ),
            (
                "failures with different codes do not",
                high,
                vec![
                    returning(0, A, failed),
                    returning(1, A, other_failure),
                    returning(2, A, failed),
                    returning(3, A, failed),
                ],
                "....",
            ),
            (
                "a success between failures resets them",
                high,
                vec![
                    returning(0, A, failed),
                    returning(1, A, failed),
                    at(2, A),
                    returning(3, A, failed),
                    returning(4, A, failed),
                ],
                ".....",
            ),
            (
                "unfinished calls are not failures",
                high,
                vec![pending(0, A), pending(1, A), pending(2, A), pending(3, A)],
                "....",
            ),
            (
                "a poll whose result changes is never a loop",
                poller,
                (0..12).map(|i| returning(i, A, result(i))).collect(),
                "............",
            ),
            (
                "a poll whose result stays the same is",
                poller,
                (0..5).map(|i| returning(i, A, result(7))).collect(),
                "...BB",
            ),
            (
                "a poll counts from its last change",
                poller,
                vec![
                    returning(0, A, result(1)),
                    returning(1, A, result(1)),
                    returning(2, A, result(2)),
                    returning(3, A, result(2)),
                    returning(4, A, result(2)),
                    returning(5, A, result(2)),
                ],
                ".....B",
            ),
            (
                "a poll cycling with changing results is no cycle",
                poller,
                (0..9)
                    .map(|i| returning(i, if i % 2 == 0 { A } else { B }, result(i)))
                    .collect(),
                ".........",
            ),
            (
                "chance, then a different call runs",
                chance,
                seq(&[A, A, A, A, B]),
                "...C.",
            ),
            (
                "chance, then the same call breaks",
                chance,
                seq(&[A, A, A, A, A, A]),
                "...CBB",
            ),
            (
                "the chance is spent for the window",
                chance,
                seq(&[A, A, A, A, B, A, A, A, A]),
                "...C....B",
            ),
            (
                "another loop gets its own chance",
                chance,
                seq(&[A, A, A, A, B, B, B, B, B]),
                "...C...CB",
            ),
            (
                "a chance expires with the window",
                chance,
                vec![
                    at(0, A),
                    at(1, A),
                    at(2, A),
                    at(3, A),
                    at(200, A),
                    at(201, A),
                    at(202, A),
                    at(203, A),
                ],
                "...C...C",
            ),
            (
                "results do not matter for a tool that does not poll",
                limits(),
                (0..5).map(|i| returning(i, A, result(i))).collect(),
                "...BB",
            ),
            (
                "nor in a cycle of tools that do not poll",
                limits(),
                (0..7)
                    .map(|i| returning(i, if i % 2 == 0 { A } else { B }, result(i)))
                    .collect(),
                ".....BB",
            ),
            (
                "a refused call does not end a run of failures",
                high,
                (0..5).map(|i| returning(i, A, failed)).collect(),
                "...BB",
            ),
            (
                "a run of one call is no cycle",
                high,
                seq(&[A, A, A, A, A, A, A, A, A]),
                ".........",
            ),
            (
                "nor after other calls",
                higher,
                seq(&[B, B, B, B, B, B, B, B, A, A, A, A, A, A]),
                "..............",
            ),
            (
                "a cycle needs all of its repetitions",
                limits(),
                seq(&[C, B, A, B, A, B]),
                "......",
            ),
            (
                "A,B,C,B repeated three times when cycles of four are looked for",
                longer_cycles,
                seq(&[A, B, C, B, A, B, C, B, A, B, C, B]),
                "...........B",
            ),
        ];
        for (name, limits, steps, expected) in cases {
            let (marks, _) = run(limits, &steps);
            assert_eq!(marks, expected, "case: {name}");
        }
    }

    /// The defaults the layer resolves: cycles of up to 5 calls, 4 identical calls with
    /// identical failures, back-off from 1 s, patient polls 28 s apart for 10 minutes.
    fn defaults() -> Limits {
        Limits {
            cycles: Some(CycleLimits {
                repetitions: 3,
                max_length: 5,
            }),
            failures: Some(4),
            backoff: Some(Duration::from_secs(1)),
            ..limits()
        }
    }

    /// `n` calls of `signature`, `gap` seconds apart, each ending with `outcome`.
    fn every(gap: u64, n: u64, signature: u64, outcome: Outcome) -> Vec<Step> {
        (0..n)
            .map(|i| returning(i * gap, signature, outcome))
            .collect()
    }

    #[test]
    fn rules_beyond_repetition_table() {
        let failed = Outcome::Failed(ErrorCode::UpstreamUnavailable);
        let same = Outcome::Succeeded(7);
        let reads = Limits {
            result_aware: true,
            polls: PollLimits {
                patient_gap: Duration::from_secs(28),
                budget: Some(Duration::from_secs(600)),
            },
            ..defaults()
        };
        let at_secs = |secs: &[u64], outcome: Outcome| -> Vec<Step> {
            secs.iter().map(|&s| returning(s, A, outcome)).collect()
        };
        let cases: Vec<(&str, Limits, Vec<Step>, &str)> = vec![
            (
                "identical failures stop the fourth call",
                defaults(),
                every(1, 5, A, failed),
                "...BB",
            ),
            (
                "identical failures of a read, spaced like a patient poll, too",
                reads,
                every(30, 4, A, failed),
                "...B",
            ),
            (
                "fewer failures allowed stop earlier than the repeat rule",
                Limits {
                    failures: Some(3),
                    ..defaults()
                },
                every(1, 3, A, failed),
                "..B",
            ),
            (
                "a retry that waits longer each time is no repeat",
                defaults(),
                at_secs(&[0, 2, 6, 14, 30, 62], failed),
                "......",
            ),
            (
                "retries at a steady pace are",
                defaults(),
                at_secs(&[0, 5, 10, 15, 20], failed),
                "...BB",
            ),
            (
                "a retry whose wait shrinks ends the back-off",
                defaults(),
                at_secs(&[0, 2, 6, 7], failed),
                "...B",
            ),
            (
                "waits shorter than the least back-off are no back-off",
                defaults(),
                vec![returning(0, A, failed); 4],
                "...B",
            ),
            (
                "a tight loop of one read with the same answer stops at the fourth call",
                reads,
                every(1, 5, A, same),
                "...BB",
            ),
            (
                "a patient poll (every 30 s for 8 min) with the same answer runs",
                reads,
                every(30, 17, A, same),
                ".................",
            ),
            (
                "a patient poll stops once its answer stayed the same for 10 min",
                reads,
                every(30, 22, A, same),
                "....................BB",
            ),
            (
                "a poll that waits then reads, patiently, runs",
                reads,
                (0..16)
                    .map(|i| returning(i * 15, if i % 2 == 0 { A } else { B }, same))
                    .collect(),
                "................",
            ),
            (
                "the same cycle in quick succession stops",
                reads,
                (0..7)
                    .map(|i| returning(i, if i % 2 == 0 { A } else { B }, same))
                    .collect(),
                ".....BB",
            ),
            (
                "a write is judged on its arguments: new ids in its answers change nothing",
                defaults(),
                (0..5)
                    .map(|i| returning(i * 30, A, Outcome::Succeeded(i)))
                    .collect(),
                "...BB",
            ),
            (
                "A,B,C,D repeated three times",
                defaults(),
                seq(&[A, B, C, D, A, B, C, D, A, B, C, D]),
                "...........B",
            ),
            (
                "A,B,C,D,E repeated three times",
                defaults(),
                seq(&[A, B, C, D, E, A, B, C, D, E, A, B, C, D, E]),
                "..............B",
            ),
            (
                "A,B,C,D,E twice and another call is no loop",
                defaults(),
                seq(&[A, B, C, D, E, A, B, C, D, E, A, B, C, D, A]),
                "...............",
            ),
        ];
        for (name, limits, steps, expected) in cases {
            let (marks, _) = run(limits, &steps);
            assert_eq!(marks, expected, "case: {name}");
        }
        let (_, found) = run(reads, &every(30, 21, A, same));
        assert_eq!(
            found[0].rule,
            Rule::UnchangedPoll {
                for_secs: Some(600)
            }
        );
    }

    #[test]
    fn a_resend_answered_from_a_record_is_never_a_repeat() {
        let t0 = Instant::now();
        let window = Duration::from_secs(30);
        let resend = |id| CallFacts {
            signature: Signature::from_raw(A),
            resend: Some(Resend {
                id,
                settled_for: Some(window),
            }),
        };
        let mut history = SessionHistory::default();
        let at = |secs| t0 + Duration::from_secs(secs);
        let Decision::Admit(first) = history.observe(at(0), &resend(1), &defaults()) else {
            panic!("the first call runs");
        };
        // While it runs, a re-send joins it; once it ended, for 30 s, the record answers.
        for secs in [1, 2, 3, 4] {
            assert_eq!(
                history.observe(at(secs), &resend(1), &defaults()),
                Decision::Resend
            );
        }
        history.record_outcome(first, Outcome::Succeeded(0), at(5));
        for secs in [6, 20, 34] {
            assert_eq!(
                history.observe(at(secs), &resend(1), &defaults()),
                Decision::Resend
            );
        }
        // Past the window it runs again, and counts as the second identical call.
        assert!(matches!(
            history.observe(at(35), &resend(1), &defaults()),
            Decision::Admit(_)
        ));
        // Other records are other calls: the third and fourth identical calls.
        assert!(matches!(
            history.observe(at(36), &resend(2), &defaults()),
            Decision::Admit(_)
        ));
        assert!(matches!(
            history.observe(at(37), &resend(3), &defaults()),
            Decision::Reject(_)
        ));
        // A refused call keeps no record: the same call again is refused too.
        assert!(matches!(
            history.observe(at(38), &resend(3), &defaults()),
            Decision::Reject(_)
        ));
        // A record that answers only while its call runs.
        let mut history = SessionHistory::default();
        let joins = CallFacts {
            signature: Signature::from_raw(B),
            resend: Some(Resend {
                id: 9,
                settled_for: None,
            }),
        };
        let Decision::Admit(seq) = history.observe(at(0), &joins, &defaults()) else {
            panic!("the first call runs");
        };
        assert_eq!(
            history.observe(at(1), &joins, &defaults()),
            Decision::Resend
        );
        history.record_outcome(seq, Outcome::Succeeded(0), at(2));
        assert!(matches!(
            history.observe(at(3), &joins, &defaults()),
            Decision::Admit(_)
        ));
    }

    #[test]
    fn an_answer_s_streak_continues_only_while_it_stays_the_same() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(streak_since(None, Outcome::Succeeded(1), at(5)), at(5));
        assert_eq!(
            streak_since(
                Some((Outcome::Succeeded(1), at(0))),
                Outcome::Succeeded(1),
                at(5)
            ),
            at(0)
        );
        assert_eq!(
            streak_since(
                Some((Outcome::Succeeded(2), at(0))),
                Outcome::Succeeded(1),
                at(5)
            ),
            at(5)
        );
    }

    #[test]
    fn detections_say_which_rule_and_how_far_it_counted() {
        let (_, found) = run(limits(), &seq(&[A, A, A, A]));
        assert_eq!(
            found,
            [Detection {
                rule: Rule::Repeat,
                action: Action::Break,
                count: 4,
                threshold: 4
            }]
        );
        let (_, found) = run(limits(), &seq(&[A, B, C, A, B, C, A, B, C]));
        assert_eq!(found[0].rule, Rule::Cycle { length: 3 });
        assert_eq!((found[0].count, found[0].threshold), (3, 3));
        let failed = Outcome::Failed(ErrorCode::Timeout);
        let high = Limits {
            max_repeats: 10,
            ..limits()
        };
        let steps: Vec<Step> = (0..4).map(|i| returning(i, A, failed)).collect();
        let (_, found) = run(high, &steps);
        assert_eq!(
            found[0].rule,
            Rule::Failures {
                code: ErrorCode::Timeout
            }
        );
        assert_eq!((found[0].count, found[0].threshold), (4, 4));
        let poller = Limits {
            result_aware: true,
            ..limits()
        };
        let steps: Vec<Step> = (0..4)
            .map(|i| returning(i, A, Outcome::Succeeded(1)))
            .collect();
        let (_, found) = run(poller, &steps);
        assert_eq!(found[0].rule, Rule::UnchangedPoll { for_secs: None });
    }

    #[test]
    fn a_poll_whose_result_changes_is_no_repetition_whichever_call_closes_the_cycle() {
        // A status poll, whose result changes, alternating with a wait, which does not poll.
        let poller = Limits {
            result_aware: true,
            ..limits()
        };
        let t0 = Instant::now();
        let mut history = SessionHistory::default();
        for i in 0..9u64 {
            let (signature, limits) = if i % 2 == 0 {
                (A, poller)
            } else {
                (B, limits())
            };
            let now = t0 + Duration::from_secs(i);
            match history.observe(
                now,
                &CallFacts::plain(Signature::from_raw(signature)),
                &limits,
            ) {
                Decision::Admit(seq) => history.record_outcome(seq, Outcome::Succeeded(i), now),
                refused => panic!("call {i} was refused: {refused:?}"),
            }
        }
    }

    #[test]
    fn names_and_raw_hashes() {
        assert_eq!(Signature::from_raw(0x5EED).raw(), 0x5EED);
        let rules = [
            Rule::Repeat,
            Rule::UnchangedPoll { for_secs: None },
            Rule::Cycle { length: 2 },
            Rule::Failures {
                code: ErrorCode::Timeout,
            },
        ];
        assert_eq!(
            rules.map(Rule::as_str),
            ["repeat", "unchanged_poll", "cycle", "failures"]
        );
        assert_eq!(
            [Action::Break, Action::Chance].map(Action::as_str),
            ["break", "chance"]
        );
    }

    #[test]
    fn history_stays_within_what_the_rules_need() {
        let mut history = SessionHistory::default();
        let t0 = Instant::now();
        for i in 0..1000u64 {
            history.observe(t0, &CallFacts::plain(Signature::from_raw(i)), &limits());
        }
        assert_eq!(
            history.len(),
            8,
            "3 repetitions of 3 calls, less the next one"
        );
        let only_repeats = Limits {
            cycles: None,
            failures: None,
            ..limits()
        };
        history.observe(t0, &CallFacts::plain(Signature::from_raw(1)), &only_repeats);
        assert_eq!(history.len(), 3);
    }

    #[test]
    fn outcomes_of_forgotten_calls_are_ignored() {
        let mut history = SessionHistory::default();
        let t0 = Instant::now();
        let Decision::Admit(first) =
            history.observe(t0, &CallFacts::plain(Signature::from_raw(A)), &limits())
        else {
            panic!("the first call is admitted");
        };
        for i in 0..20u64 {
            history.observe(
                t0,
                &CallFacts::plain(Signature::from_raw(100 + i)),
                &limits(),
            );
        }
        history.record_outcome(first, Outcome::Failed(ErrorCode::Timeout), t0);
        history.record_outcome(u64::MAX, Outcome::Failed(ErrorCode::Timeout), t0);
        assert_eq!(history.len(), 8);
    }

    #[test]
    fn signatures_depend_on_tool_and_params() {
        let hasher = std::collections::hash_map::RandomState::new();
        let a = Signature::new(&hasher, "ns", "search", r#"{"q":"x"}"#);
        assert_eq!(a, Signature::new(&hasher, "ns", "search", r#"{"q":"x"}"#));
        assert_ne!(a, Signature::new(&hasher, "ns", "search", r#"{"q":"y"}"#));
        assert_ne!(a, Signature::new(&hasher, "ns", "fetch", r#"{"q":"x"}"#));
        assert_ne!(
            a,
            Signature::new(&hasher, "other", "search", r#"{"q":"x"}"#)
        );
        // The parts are delimited: moving characters between them changes the signature.
        assert_ne!(
            Signature::new(&hasher, "ab", "c", "{}"),
            Signature::new(&hasher, "a", "bc", "{}")
        );
    }
}
