//! The pure part of loop detection: one session's recent calls and the rules that find a loop
//! in them.
//!
//! [`SessionHistory::observe`] takes the time, the call's [`Signature`] and the [`Limits`] in
//! force, and returns the [`Decision`]; [`SessionHistory::record_outcome`] tells it how an
//! admitted call ended. Nothing here reads a clock or takes a lock: the service does both.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ErrorCode;
use crate::registry::LoopMode;

/// What identifies a call for loop detection: a keyed hash of its tool and canonical params.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Signature(u64);

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
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn from_raw(raw: u64) -> Self {
        Signature(raw)
    }

    /// The hash, for logs.
    pub(crate) fn raw(self) -> u64 {
        self.0
    }
}

/// The limits in force for one call, resolved from the configuration tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Identical consecutive calls that make a loop.
    pub(crate) max_repeats: u32,
    /// How long a call is remembered.
    pub(crate) ttl: Duration,
    /// What a detection does.
    pub(crate) mode: LoopMode,
    /// The tool polls: identical calls count only while their results stay the same.
    pub(crate) poller: bool,
    /// Cycles of different calls; `None` when that rule is off.
    pub(crate) cycles: Option<CycleLimits>,
    /// Identical failures in a row that make a loop; `None` when that rule is off.
    pub(crate) failures: Option<u32>,
}

/// The cycle rule's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CycleLimits {
    /// Full repetitions of a cycle that make a loop.
    pub(crate) repetitions: u32,
    /// The longest cycle looked for, in calls.
    pub(crate) max_length: usize,
}

impl Limits {
    /// How many past calls the rules need to see.
    pub(crate) fn history_len(&self) -> usize {
        let repeats = self.max_repeats.saturating_sub(1) as usize;
        let cycles = self.cycles.map_or(0, |c| {
            (c.repetitions as usize * c.max_length).saturating_sub(1)
        });
        let failures = self.failures.unwrap_or(0) as usize;
        repeats.max(cycles).max(failures)
    }
}

/// How an admitted call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The tool answered; the fingerprint of its output (only computed for pollers).
    Succeeded(u64),
    /// The tool failed with this code.
    Failed(ErrorCode),
}

/// What [`SessionHistory::observe`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Run the call; report its outcome under this sequence number.
    Admit(u64),
    /// Do not run the call.
    Reject(Detection),
}

/// A loop found in a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Detection {
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
    /// The same poll, consecutively, with the same result each time.
    UnchangedPoll,
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
            Rule::UnchangedPoll => "unchanged_poll",
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

/// The recent calls of one session.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionHistory {
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
    poller: bool,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Admitted; no outcome yet (or the caller gave up on it).
    Pending,
    /// Rejected by this layer.
    Rejected,
    /// Admitted and finished.
    Done(Outcome),
}

/// One remembered call, as a store keeps it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredCall {
    pub(crate) at: Instant,
    pub(crate) signature: Signature,
    pub(crate) poller: bool,
    pub(crate) state: State,
}

impl SessionHistory {
    /// A history that a store kept: its calls, oldest first, the sequence number of the call
    /// after the last, and the call last given a chance.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn restore(
        calls: impl IntoIterator<Item = StoredCall>,
        next_seq: u64,
        chance: Option<(Signature, Instant)>,
    ) -> Self {
        SessionHistory {
            entries: calls
                .into_iter()
                .map(|call| Entry {
                    at: call.at,
                    signature: call.signature,
                    poller: call.poller,
                    state: call.state,
                })
                .collect(),
            next_seq,
            chance,
        }
    }

    /// The call last given a chance, and when.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn chance(&self) -> Option<(Signature, Instant)> {
        self.chance
    }

    /// How many calls are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Looks at one call made at `now` and decides whether it runs. The call is remembered
    /// either way: a refused repeat is still a repeat.
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        signature: Signature,
        limits: &Limits,
    ) -> Decision {
        self.forget_before(now, limits.ttl);
        let found = self
            .failures(signature, limits)
            .or_else(|| self.repeats(signature, limits))
            .or_else(|| self.cycle(signature, limits));
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
                poller: limits.poller,
                state,
            });
        }
        decision
    }

    /// Records how the admitted call `seq` ended. Calls already forgotten are ignored.
    pub(crate) fn record_outcome(&mut self, seq: u64, outcome: Outcome) {
        let first = self.next_seq - self.entries.len() as u64;
        let Some(index) = seq.checked_sub(first) else {
            return;
        };
        if let Some(entry) = self.entries.get_mut(index as usize) {
            if entry.state == State::Pending {
                entry.state = State::Done(outcome);
            }
        }
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

    /// The same call, consecutively; for a poller, only while its results stay the same.
    fn repeats(&self, signature: Signature, limits: &Limits) -> Option<(Rule, u32, u32)> {
        let mut count = 1u32;
        let mut result = None;
        for entry in self.entries.iter().rev() {
            if entry.signature != signature {
                break;
            }
            if limits.poller && entry.poller {
                if let State::Done(outcome) = entry.state {
                    match result {
                        None => result = Some(outcome),
                        Some(newer) if newer != outcome => break,
                        Some(_) => {}
                    }
                }
            }
            count += 1;
        }
        let rule = if limits.poller {
            Rule::UnchangedPoll
        } else {
            Rule::Repeat
        };
        (count >= limits.max_repeats).then_some((rule, count, limits.max_repeats))
    }

    /// The same call failed with the same code `failures` times in a row.
    fn failures(&self, signature: Signature, limits: &Limits) -> Option<(Rule, u32, u32)> {
        let threshold = limits.failures?;
        let mut code = None;
        let mut count = 0u32;
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
    /// with this call completing the last repetition.
    fn cycle(&self, signature: Signature, limits: &Limits) -> Option<(Rule, u32, u32)> {
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
            // A poll whose result changed is not a repetition, whichever call closes the
            // cycle. `a` and `b` are calls of the same tool: they agree on polling.
            match (self.entries.get(i), self.entries.get(j)) {
                (Some(a), Some(b)) if a.poller => match (a.state, b.state) {
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
            if !shorter {
                return Some((Rule::Cycle { length }, rule.repetitions, rule.repetitions));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0xA;
    const B: u64 = 0xB;
    const C: u64 = 0xC;

    fn limits() -> Limits {
        Limits {
            max_repeats: 4,
            ttl: Duration::from_secs(120),
            mode: LoopMode::Break,
            poller: false,
            cycles: Some(CycleLimits {
                repetitions: 3,
                max_length: 3,
            }),
            failures: Some(3),
        }
    }

    /// One step of a case: a call at `secs`, its signature, and how it ends if admitted.
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
            match history.observe(now, Signature::from_raw(step.signature), &limits) {
                Decision::Admit(seq) => {
                    marks.push('.');
                    if let Some(outcome) = step.outcome {
                        history.record_outcome(seq, outcome);
                    }
                }
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
            poller: true,
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
        assert_eq!((found[0].count, found[0].threshold), (3, 3));
        let poller = Limits {
            poller: true,
            ..limits()
        };
        let steps: Vec<Step> = (0..4)
            .map(|i| returning(i, A, Outcome::Succeeded(1)))
            .collect();
        let (_, found) = run(poller, &steps);
        assert_eq!(found[0].rule, Rule::UnchangedPoll);
    }

    #[test]
    fn a_poll_whose_result_changes_is_no_repetition_whichever_call_closes_the_cycle() {
        // A status poll, whose result changes, alternating with a wait, which does not poll.
        let poller = Limits {
            poller: true,
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
            match history.observe(now, Signature::from_raw(signature), &limits) {
                Decision::Admit(seq) => history.record_outcome(seq, Outcome::Succeeded(i)),
                refused => panic!("call {i} was refused: {refused:?}"),
            }
        }
    }

    #[test]
    fn names_and_raw_hashes() {
        assert_eq!(Signature::from_raw(0x5EED).raw(), 0x5EED);
        let rules = [
            Rule::Repeat,
            Rule::UnchangedPoll,
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
            history.observe(t0, Signature::from_raw(i), &limits());
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
        history.observe(t0, Signature::from_raw(1), &only_repeats);
        assert_eq!(history.len(), 3);
    }

    #[test]
    fn outcomes_of_forgotten_calls_are_ignored() {
        let mut history = SessionHistory::default();
        let t0 = Instant::now();
        let Decision::Admit(first) = history.observe(t0, Signature::from_raw(A), &limits()) else {
            panic!("the first call is admitted");
        };
        for i in 0..20u64 {
            history.observe(t0, Signature::from_raw(100 + i), &limits());
        }
        history.record_outcome(first, Outcome::Failed(ErrorCode::Timeout));
        history.record_outcome(u64::MAX, Outcome::Failed(ErrorCode::Timeout));
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
