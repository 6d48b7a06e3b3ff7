//! A run's scheduling, as pure state: how a failed try is classified, what it leads to, the
//! retries waiting for their time, and the run's state ([`state`]: steps, calls in flight by
//! key, limits). The clock is passed in and nothing here does I/O, so the tables below test
//! it without a runtime; the run's shell ([`crate::run`]) drives it.

use std::path::PathBuf;

use serde_json::Value;
use tokio::time::{Duration, Instant};

mod state;

pub(crate) use state::{Phase, RunState, Signals};

use tower_toolcall::envelope::ToolResult;
use tower_toolcall::trace::ExecutionEvent;
use tower_toolcall::ToolCall;

use crate::outcome::{Classification, Recovery};

/// A call in flight, as the run and its state both name it: keys are given in dispatch
/// order and never reused within a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct CallKey(pub(crate) u64);

/// A call the state decided to make: the shell hands `call` to the service and reports its
/// end under `key`.
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub(crate) key: CallKey,
    pub(crate) call: ToolCall,
}

/// The run's record, `run.json`, as the state built it: where it goes and what it says,
/// already redacted. The shell writes it as it is.
#[derive(Debug)]
pub(crate) struct RunRecord {
    /// `<audit dir>/<runId>/run.json`.
    pub(crate) path: PathBuf,
    /// The record, redacted with the executor's redactor.
    pub(crate) contents: Value,
}

/// What becomes of a call in flight when the run stops (a cancellation, the deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It runs on, and its end is reported as usual.
    Keep,
    /// It is dropped: the tool may have acted.
    Drop,
    /// It is left to finish in the background, its end unread.
    Detach,
}

/// What the run must do with the world outside its state, in the order it was decided.
#[derive(Debug)]
pub(crate) enum Action {
    /// Send the event to the stream, the audit and the kept record.
    Emit(Box<ExecutionEvent>),
    /// Write the call envelope to `calls.jsonl`.
    RecordCall(ToolCall),
    /// Write the result envelope to `results.jsonl`.
    RecordResult(Box<ToolResult>),
    /// Write `run.json`: the record, with the run's status once it has ended. The actions
    /// after it wait for the write, so that a failure to write it is reported before them.
    WriteRecord(Box<RunRecord>),
}

/// What is known of a failed try when deciding what comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) classification: Classification,
    /// Tries of this tool for this unit so far, the failed one included.
    pub(crate) tries: u32,
    /// The most tries of a tool the step's `retry` allows (1 without one).
    pub(crate) max_tries: u32,
    /// The tool tried: 0 for the step's own, then its alternatives.
    pub(crate) tool: usize,
    /// The step's tools: its own and its alternatives.
    pub(crate) tools: usize,
}

/// How a failure is classified: an open breaker first, then the classifier's verdict.
pub(crate) fn classify(breaker_open: bool, retriable: bool) -> Classification {
    if breaker_open {
        Classification::BreakerOpen
    } else if retriable {
        Classification::Transient
    } else {
        Classification::Permanent
    }
}

/// What a step that cannot get an output of its own does: its default, a skip, or the
/// turn's failure.
pub(crate) fn fallback(has_default: bool, required: bool) -> Recovery {
    if has_default {
        Recovery::Default
    } else if required {
        Recovery::Escalate
    } else {
        Recovery::Skip
    }
}

/// What a failed try leads to: another try of the same tool while a transient failure has
/// tries left, else the next alternative, else the step's `fallback`; nothing once the run
/// is stopping.
pub(crate) fn recovery(failure: Failure, fallback: Recovery, stopping: bool) -> Option<Recovery> {
    if stopping {
        None
    } else if failure.classification == Classification::Transient
        && failure.tries < failure.max_tries
    {
        Some(Recovery::Retry)
    } else if failure.tool + 1 < failure.tools {
        Some(Recovery::Alternative)
    } else {
        Some(fallback)
    }
}

/// The instant `wait` after `now`, or one far in the future when that cannot be told.
pub(crate) fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

/// Retries waiting for their time, in the order they were scheduled.
#[derive(Debug)]
pub(crate) struct Retries<T> {
    waiting: Vec<(Instant, T)>,
}

impl<T> Default for Retries<T> {
    fn default() -> Self {
        Retries {
            waiting: Vec::new(),
        }
    }
}

impl<T> Retries<T> {
    /// `item` waits `pause` from `now`.
    pub(crate) fn schedule(&mut self, now: Instant, pause: Duration, item: T) {
        self.waiting.push((after(now, pause), item));
    }

    /// The retries due at `now`, in the order they were scheduled.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<T> {
        let mut due = Vec::new();
        let mut k = 0;
        while k < self.waiting.len() {
            if self.waiting[k].0 <= now {
                due.push(self.waiting.remove(k).1);
            } else {
                k += 1;
            }
        }
        due
    }

    /// When the next retry is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.waiting.iter().map(|(at, _)| *at).min()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Classification::{BreakerOpen, Permanent, Transient};
    use Recovery::{Alternative, Default, Escalate, Retry, Skip};

    #[test]
    fn classification() {
        // (breaker open, retriable) → classification
        let table = [
            (true, true, BreakerOpen),
            (true, false, BreakerOpen),
            (false, true, Transient),
            (false, false, Permanent),
        ];
        for (open, retriable, expected) in table {
            assert_eq!(classify(open, retriable), expected, "{open} {retriable}");
        }
    }

    #[test]
    fn fallbacks() {
        // (has a default, required) → fallback
        let table = [
            (true, true, Default),
            (true, false, Default),
            (false, true, Escalate),
            (false, false, Skip),
        ];
        for (default, required, expected) in table {
            assert_eq!(
                fallback(default, required),
                expected,
                "{default} {required}"
            );
        }
    }

    #[test]
    fn what_a_failure_leads_to() {
        struct Case {
            name: &'static str,
            classification: Classification,
            tries: u32,
            max_tries: u32,
            tool: usize,
            tools: usize,
            stopping: bool,
            expected: Option<Recovery>,
        }
        let case =
            |name, classification, (tries, max_tries), (tool, tools), stopping, expected| Case {
                name,
                classification,
                tries,
                max_tries,
                tool,
                tools,
                stopping,
                expected,
            };
        let table = [
            case(
                "transient with tries left",
                Transient,
                (1, 3),
                (0, 1),
                false,
                Some(Retry),
            ),
            case(
                "transient, last try, no alternative",
                Transient,
                (3, 3),
                (0, 1),
                false,
                Some(Skip),
            ),
            case(
                "transient, last try, an alternative",
                Transient,
                (3, 3),
                (0, 2),
                false,
                Some(Alternative),
            ),
            case(
                "transient on the last alternative",
                Transient,
                (1, 1),
                (1, 2),
                false,
                Some(Skip),
            ),
            case(
                "permanent never retries",
                Permanent,
                (1, 3),
                (0, 1),
                false,
                Some(Skip),
            ),
            case(
                "permanent goes to the alternative",
                Permanent,
                (1, 3),
                (0, 3),
                false,
                Some(Alternative),
            ),
            case(
                "permanent on the second of three",
                Permanent,
                (1, 3),
                (1, 3),
                false,
                Some(Alternative),
            ),
            case(
                "an open breaker is not retried",
                BreakerOpen,
                (1, 3),
                (0, 1),
                false,
                Some(Skip),
            ),
            case(
                "an open breaker goes to the alternative",
                BreakerOpen,
                (1, 3),
                (0, 2),
                false,
                Some(Alternative),
            ),
            case(
                "nothing once the run stops",
                Transient,
                (1, 3),
                (0, 2),
                true,
                None,
            ),
        ];
        for c in table {
            let failure = Failure {
                classification: c.classification,
                tries: c.tries,
                max_tries: c.max_tries,
                tool: c.tool,
                tools: c.tools,
            };
            assert_eq!(
                recovery(failure, Skip, c.stopping),
                c.expected,
                "{}",
                c.name
            );
        }
        // The fallback is whatever the step has.
        let last = Failure {
            classification: Permanent,
            tries: 1,
            max_tries: 1,
            tool: 0,
            tools: 1,
        };
        for fallback in [Default, Skip, Escalate] {
            assert_eq!(recovery(last, fallback, false), Some(fallback));
        }
    }

    #[test]
    fn retries_come_due_in_the_order_they_were_scheduled() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut retries = Retries::default();
        // (now in ms, what happens, the retries due, the next due in ms)
        enum Step {
            Schedule(u64, &'static str),
            Take,
            Clear,
        }
        use Step::{Clear, Schedule, Take};
        let table: Vec<(u64, Step, Vec<&str>, Option<u64>)> = vec![
            (0, Take, vec![], None),
            (0, Schedule(100, "a"), vec![], Some(100)),
            (0, Schedule(50, "b"), vec![], Some(50)),
            (10, Schedule(90, "c"), vec![], Some(50)),
            (49, Take, vec![], Some(50)),
            (50, Take, vec!["b"], Some(100)),
            (100, Take, vec!["a", "c"], None),
            (100, Schedule(0, "now"), vec![], Some(100)),
            (100, Take, vec!["now"], None),
            (
                200,
                Schedule(u64::MAX, "never"),
                vec![],
                Some(200 + 30 * 365 * 86_400_000),
            ),
            (300, Schedule(10, "d"), vec![], Some(310)),
            (400, Clear, vec![], None),
        ];
        for (i, (now, step, due, next)) in table.into_iter().enumerate() {
            let taken = match step {
                Schedule(pause, item) => {
                    // `u64::MAX` stands for a pause no clock can add.
                    let pause = match pause {
                        u64::MAX => Duration::MAX,
                        ms => Duration::from_millis(ms),
                    };
                    retries.schedule(at(now), pause, item);
                    vec![]
                }
                Take => retries.take_due(at(now)),
                Clear => {
                    retries.clear();
                    vec![]
                }
            };
            assert_eq!(taken, due, "step {i}");
            assert_eq!(retries.next_due(), next.map(at), "step {i}");
            assert_eq!(retries.is_empty(), next.is_none(), "step {i}");
        }
    }
}
