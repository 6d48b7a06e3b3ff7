//! The labelled corpus (`corpus/*.json`, see its README) replayed through `LoopDetectLayer`
//! with the default settings: each trace in its own session, each call at its recorded time
//! (paused tokio time), answered by a tool that returns the recorded result or error. The
//! figures the crate promises are asserted here, so that a change that costs precision fails.
//!
//! `LOOP_CORPUS_OUT=path` also writes each trace's outcome as one JSON line there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::loop_detect::{InMemoryLoopStore, LoopDetectLayer};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolError, ToolOutput};

/// Loops stopped in time: at least this share.
const MIN_IN_TIME: f64 = 0.65;
/// Productive sessions stopped: at most this share.
const MAX_FALSE_STOPS: f64 = 0.10;
/// Median of the calls a stopped loop ran past its earliest stop: at most this many.
const MAX_MEDIAN_PAST_EARLIEST: f64 = 1.0;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Trace {
    id: String,
    family: String,
    label: Label,
    #[allow(dead_code)]
    reason: String,
    earliest_stop: Option<usize>,
    latest_stop: Option<usize>,
    tools: BTreeMap<String, ToolInfo>,
    calls: Vec<Call>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Label {
    Loop,
    Productive,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolInfo {
    risk: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Call {
    tool: String,
    args: Value,
    at_ms: u64,
    result: Option<Value>,
    error: Option<RecordedError>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordedError {
    code: String,
    message: String,
}

/// What became of one trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A loop refused from its earliest to its latest stop.
    InTime,
    /// A loop refused before its earliest stop: a false stop.
    Early,
    /// A loop refused after its latest stop.
    Late,
    /// A loop never refused.
    Missed,
    /// A productive session that ran to its end.
    Passed,
    /// A productive session refused.
    FalseStop,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::InTime => "in_time",
            Verdict::Early => "early",
            Verdict::Late => "late",
            Verdict::Missed => "missed",
            Verdict::Passed => "passed",
            Verdict::FalseStop => "false_stop",
        }
    }
}

fn split_tool(tool: &str) -> (&str, &str) {
    tool.rsplit_once("::")
        .unwrap_or_else(|| panic!("tool {tool:?} is not namespace::name"))
}

fn registry(trace: &Trace) -> ToolRegistry {
    let mut builder = ToolRegistry::builder();
    for (tool, info) in &trace.tools {
        let risk = match info.risk.as_str() {
            "read-only" => RiskLevel::ReadOnly,
            "writes" => RiskLevel::Writes,
            "commands" => RiskLevel::Commands,
            other => panic!("{}: unknown risk {other:?}", trace.id),
        };
        let (namespace, name) = split_tool(tool);
        builder = builder.tool(ToolDescriptor::new(namespace, name, risk));
    }
    builder.build().expect("a valid registry")
}

/// Replays `trace` through `layer`: the index of the first refused call and the rule that
/// refused it.
async fn replay(trace: &Trace, layer: LoopDetectLayer) -> Option<(usize, String)> {
    let answers: Arc<Mutex<Vec<Call>>> = Arc::new(Mutex::new(Vec::new()));
    let tool = {
        let answers = answers.clone();
        tool_fn(move |_call: ToolCall| {
            let recorded = answers.lock().unwrap().pop().expect("a recorded answer");
            async move {
                match (recorded.result, recorded.error) {
                    (Some(result), None) => Ok(ToolOutput::new(result)),
                    (None, Some(error)) => {
                        let code = ErrorCode::parse(&error.code)
                            .unwrap_or_else(|| panic!("unknown error code {}", error.code));
                        Err(ToolError::new(code, error.message))
                    }
                    _ => panic!("a call records one result or one error"),
                }
            }
        })
    };
    let mut svc = ServiceBuilder::new().layer(layer).service(tool);
    let start = tokio::time::Instant::now();
    for (index, call) in trace.calls.iter().enumerate() {
        let at = start + Duration::from_millis(call.at_ms);
        tokio::time::advance(at.saturating_duration_since(tokio::time::Instant::now())).await;
        let (namespace, name) = split_tool(&call.tool);
        let tool_call = ToolCall::builder(namespace, name)
            .session(trace.id.as_str())
            .actor("agent")
            .params(call.args.clone())
            .build()
            .unwrap_or_else(|e| panic!("{} call {index}: {e}", trace.id));
        *answers.lock().unwrap() = vec![call.clone()];
        match svc.ready().await.unwrap().call(tool_call).await {
            Err(error) if error.code() == ErrorCode::LoopDetected => {
                let rule = error.details().map_or(Value::Null, |d| d["rule"].clone());
                return Some((index, rule.as_str().unwrap_or_default().to_owned()));
            }
            Ok(_) | Err(_) => {}
        }
    }
    None
}

fn verdict(trace: &Trace, refused: Option<usize>) -> Verdict {
    match (trace.label, refused) {
        (Label::Productive, None) => Verdict::Passed,
        (Label::Productive, Some(_)) => Verdict::FalseStop,
        (Label::Loop, None) => Verdict::Missed,
        (Label::Loop, Some(at)) => {
            let (earliest, latest) = (
                trace.earliest_stop.expect("a loop has an earliest stop"),
                trace.latest_stop.expect("a loop has a latest stop"),
            );
            if at < earliest {
                Verdict::Early
            } else if at <= latest {
                Verdict::InTime
            } else {
                Verdict::Late
            }
        }
    }
}

fn load() -> Vec<Trace> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/loop_detect/corpus");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the corpus directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            serde_json::from_str::<Vec<Trace>>(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// Counts of verdicts, for one family or all.
#[derive(Default)]
struct Tally {
    loops: usize,
    productive: usize,
    in_time: usize,
    early: usize,
    late: usize,
    missed: usize,
    false_stops: usize,
    past_earliest: Vec<usize>,
}

impl Tally {
    fn add(&mut self, trace: &Trace, verdict: Verdict, refused: Option<usize>) {
        match trace.label {
            Label::Loop => self.loops += 1,
            Label::Productive => self.productive += 1,
        }
        match verdict {
            Verdict::InTime => self.in_time += 1,
            Verdict::Early => self.early += 1,
            Verdict::Late => self.late += 1,
            Verdict::Missed => self.missed += 1,
            Verdict::FalseStop => self.false_stops += 1,
            Verdict::Passed => {}
        }
        if let (Some(at), Some(earliest)) = (refused, trace.earliest_stop) {
            if at >= earliest {
                self.past_earliest.push(at - earliest);
            }
        }
    }

    fn median_past_earliest(&self) -> f64 {
        let mut past = self.past_earliest.clone();
        past.sort_unstable();
        match past.len() {
            0 => 0.0,
            n if n % 2 == 1 => past[n / 2] as f64,
            n => (past[n / 2 - 1] + past[n / 2]) as f64 / 2.0,
        }
    }

    fn row(&self, name: &str) -> String {
        format!(
            "| {name:<22} | {:>3} | {:>3} | {:>5} | {:>3} | {:>3} | {:>6} | {:>11} | {:>6} |",
            self.loops,
            self.in_time,
            self.early,
            self.late,
            self.missed,
            self.productive,
            self.false_stops,
            self.median_past_earliest(),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn the_labelled_corpus_meets_the_promised_figures() {
    let traces = load();
    assert!(traces.len() >= 150, "{} traces", traces.len());
    let mut out = std::env::var_os("LOOP_CORPUS_OUT").map(|path| {
        std::fs::File::create(&path)
            .unwrap_or_else(|e| panic!("LOOP_CORPUS_OUT {}: {e}", path.to_string_lossy()))
    });
    let mut total = Tally::default();
    let mut families: BTreeMap<String, Tally> = BTreeMap::new();
    for trace in &traces {
        let refusal = replay(trace, LoopDetectLayer::new(registry(trace))).await;
        let refused = refusal.as_ref().map(|(at, _)| *at);
        let verdict = verdict(trace, refused);
        total.add(trace, verdict, refused);
        families
            .entry(trace.family.clone())
            .or_default()
            .add(trace, verdict, refused);
        if let Some(file) = out.as_mut() {
            use std::io::Write;
            let line = json!({
                "id": trace.id,
                "family": trace.family,
                "label": if trace.label == Label::Loop { "loop" } else { "productive" },
                "stoppedAt": refused,
                "rule": refusal.as_ref().map(|(_, rule)| rule.as_str()),
                "earliestStop": trace.earliest_stop,
                "latestStop": trace.latest_stop,
                "outcome": verdict.as_str(),
            });
            writeln!(file, "{line}").unwrap();
        }
    }
    println!(
        "| family                 | loops | in time | early | late | missed | productive | false stops | median past earliest |"
    );
    println!(
        "| {:<22} | {:>3} | {:>3} | {:>5} | {:>3} | {:>3} | {:>6} | {:>11} | {:>6} |",
        "", "lp", "ok", "early", "lt", "mis", "prod", "false", "med"
    );
    for (family, tally) in &families {
        println!("{}", tally.row(family));
    }
    println!("{}", total.row("all"));
    let in_time = total.in_time as f64 / total.loops as f64;
    let false_stops = total.false_stops as f64 / total.productive as f64;
    let median = total.median_past_earliest();
    println!(
        "loops stopped in time: {}/{} ({:.1} %); productive sessions falsely stopped: {}/{} \
         ({:.1} %); loops stopped too early: {}; median calls past the earliest stop: {median}",
        total.in_time,
        total.loops,
        in_time * 100.0,
        total.false_stops,
        total.productive,
        false_stops * 100.0,
        total.early,
    );
    assert!(
        in_time >= MIN_IN_TIME,
        "loops stopped in time: {:.1} %",
        in_time * 100.0
    );
    assert!(
        false_stops <= MAX_FALSE_STOPS,
        "productive sessions falsely stopped: {:.1} %",
        false_stops * 100.0
    );
    assert!(
        median <= MAX_MEDIAN_PAST_EARLIEST,
        "median past the earliest stop: {median}"
    );
}

#[tokio::test(start_paused = true)]
async fn through_the_memory_store_every_trace_stops_where_it_stops_without() {
    for trace in &load() {
        let alone = replay(trace, LoopDetectLayer::new(registry(trace))).await;
        let stored = LoopDetectLayer::builder(registry(trace))
            .store(Arc::new(InMemoryLoopStore::new()))
            .build()
            .expect("a valid configuration");
        assert_eq!(replay(trace, stored).await, alone, "{}", trace.id);
    }
}
