//! Fake tools for the executor's tests: each tool of a `Toolbox` answers by its script and
//! the box counts calls, records what it received and the most calls in flight at once.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ErrorCode, ToolCall, ToolError, ToolOutput};

/// How a tool answers one call.
#[derive(Clone, Debug)]
pub enum Answer {
    /// After this long, the value (`{"tool": name, "args": params}` when `None`).
    Ok(Duration, Option<Value>),
    /// After this long, this error.
    Fail(Duration, ToolError),
    /// Never.
    Hang,
}

pub fn ok(ms: u64) -> Answer {
    Answer::Ok(Duration::from_millis(ms), None)
}

pub fn ok_with(ms: u64, value: Value) -> Answer {
    Answer::Ok(Duration::from_millis(ms), Some(value))
}

pub fn permanent(ms: u64) -> Answer {
    Answer::Fail(
        Duration::from_millis(ms),
        ToolError::new(ErrorCode::NotFound, "no such thing"),
    )
}

pub fn transient(ms: u64) -> Answer {
    Answer::Fail(
        Duration::from_millis(ms),
        ToolError::from_http_status(503, "busy, try later"),
    )
}

pub fn breaker_open() -> Answer {
    Answer::Fail(
        Duration::ZERO,
        ToolError::rejected(ErrorCode::CircuitOpen, "the breaker of the tool is open"),
    )
}

#[derive(Default)]
struct State {
    /// Per tool: its answers in order (the last repeats).
    scripts: HashMap<String, Vec<Answer>>,
    calls: Vec<ToolCall>,
    per_tool: HashMap<String, usize>,
    in_flight: usize,
    max_in_flight: usize,
    tool_in_flight: HashMap<String, usize>,
    tool_max: HashMap<String, usize>,
    times: Vec<(String, Instant)>,
}

/// A set of scripted tools behind one service.
#[derive(Clone, Default)]
pub struct Toolbox {
    state: Arc<Mutex<State>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Toolbox::default()
    }

    /// `tool` (`namespace::name`) answers `answers` in order, then the last one again.
    pub fn script(self, tool: &str, answers: Vec<Answer>) -> Self {
        assert!(!answers.is_empty(), "a script needs an answer");
        self.state
            .lock()
            .unwrap()
            .scripts
            .insert(tool.to_owned(), answers);
        self
    }

    pub fn calls(&self) -> Vec<ToolCall> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn count(&self, tool: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .per_tool
            .get(tool)
            .copied()
            .unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.state.lock().unwrap().calls.len()
    }

    /// Calls in the tools right now.
    pub fn in_flight(&self) -> usize {
        self.state.lock().unwrap().in_flight
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.lock().unwrap().max_in_flight
    }

    pub fn max_in_flight_of(&self, tool: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .tool_max
            .get(tool)
            .copied()
            .unwrap_or(0)
    }

    /// When each call of `tool` came.
    pub fn times(&self, tool: &str) -> Vec<Instant> {
        let state = self.state.lock().unwrap();
        state
            .times
            .iter()
            .filter(|(t, _)| t == tool)
            .map(|(_, at)| *at)
            .collect()
    }

    pub fn service(
        &self,
    ) -> impl tower::Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    > + Clone {
        let state = self.state.clone();
        tool_fn(move |call: ToolCall| {
            let state = state.clone();
            async move {
                let tool = format!("{}::{}", call.tool_namespace(), call.tool_name());
                let answer = {
                    let mut s = state.lock().unwrap();
                    let n = s.per_tool.get(&tool).copied().unwrap_or(0);
                    *s.per_tool.entry(tool.clone()).or_insert(0) += 1;
                    s.calls.push(call.clone());
                    s.times.push((tool.clone(), Instant::now()));
                    s.in_flight += 1;
                    s.max_in_flight = s.max_in_flight.max(s.in_flight);
                    let t = s.tool_in_flight.entry(tool.clone()).or_insert(0);
                    *t += 1;
                    let now = *t;
                    let max = s.tool_max.entry(tool.clone()).or_insert(0);
                    *max = (*max).max(now);
                    let script = s
                        .scripts
                        .get(&tool)
                        .unwrap_or_else(|| panic!("no script for {tool}"));
                    script[n.min(script.len() - 1)].clone()
                };
                let _guard = Leave(state.clone(), tool.clone());
                match answer {
                    Answer::Ok(after, value) => {
                        tokio::time::sleep(after).await;
                        Ok(ToolOutput::new(value.unwrap_or_else(
                            || json!({"tool": tool, "args": call.params().as_value()}),
                        )))
                    }
                    Answer::Fail(after, error) => {
                        tokio::time::sleep(after).await;
                        Err(error)
                    }
                    Answer::Hang => std::future::pending().await,
                }
            }
        })
    }
}

/// Leaves the in-flight counts when the call ends or is dropped.
struct Leave(Arc<Mutex<State>>, String);

impl Drop for Leave {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap();
        s.in_flight -= 1;
        *s.tool_in_flight.get_mut(&self.1).unwrap() -= 1;
    }
}

/// The registry of the tests: read-only travel tools and one writing tool.
pub fn registry() -> ToolRegistry {
    let read = |name: &str| ToolDescriptor::new("travel", name, RiskLevel::ReadOnly);
    ToolRegistry::builder()
        .tool(read("flights").with_input_schema(json!({
            "type": "object",
            "required": ["to"],
            "properties": {"to": {"type": "string"}}
        })))
        .tool(read("hotels"))
        .tool(read("weather"))
        .tool(read("cars"))
        .tool(read("cars_backup"))
        .tool(read("search"))
        .tool(read("fetch"))
        .tool(ToolDescriptor::new("vault", "write", RiskLevel::Writes))
        .build()
        .unwrap()
}
