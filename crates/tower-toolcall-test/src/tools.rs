//! Tools that stand in for real ones: one that counts its calls, one that answers from a
//! script.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tower::Service;
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};

/// A tool that counts its calls and echoes the params.
#[derive(Clone, Debug, Default)]
pub struct Counter(pub Arc<AtomicUsize>);

impl Counter {
    /// How many times the tool was called.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// The tool as a service: it answers `{"echo": <params>}`.
    pub fn tool(
        &self,
    ) -> impl Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl Future<Output = Result<ToolOutput, ToolError>>,
    > + Clone {
        let count = self.0.clone();
        tool_fn(move |call: ToolCall| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::new(json!({"echo": call.params().as_value()})))
            }
        })
    }
}

/// One answer of a [`ScriptedTool`].
#[derive(Clone, Debug)]
pub enum Step {
    /// Answer `{"ok": true}` at once.
    Ok,
    /// Fail at once with this error.
    Fail(ToolError),
    /// Wait this long (tokio time), then answer as the inner step.
    After(Duration, Box<Step>),
    /// Never answer.
    Hang,
}

/// A tool that answers from a script (the last step repeats), counts its calls and keeps
/// each call it received with the tokio time it came.
#[derive(Clone, Debug)]
pub struct ScriptedTool {
    state: Arc<Mutex<Script>>,
}

#[derive(Debug)]
struct Script {
    steps: VecDeque<Step>,
    calls: Vec<Instant>,
    received: Vec<ToolCall>,
}

impl ScriptedTool {
    /// A tool that answers its calls with `steps` in turn, then with the last one.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        let steps: VecDeque<Step> = steps.into_iter().collect();
        assert!(!steps.is_empty(), "a script needs at least one step");
        ScriptedTool {
            state: Arc::new(Mutex::new(Script {
                steps,
                calls: Vec::new(),
                received: Vec::new(),
            })),
        }
    }

    /// A tool that always answers `step`.
    pub fn always(step: Step) -> Self {
        ScriptedTool::new([step])
    }

    /// How many times the tool was called.
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls.len()
    }

    /// When each call came, on the tokio clock.
    pub fn call_times(&self) -> Vec<Instant> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The calls the tool received, as it received them.
    pub fn received(&self) -> Vec<ToolCall> {
        self.state.lock().unwrap().received.clone()
    }

    /// The tool as a service.
    pub fn service(
        &self,
    ) -> impl Service<
        ToolCall,
        Response = ToolOutput,
        Error = ToolError,
        Future = impl Future<Output = Result<ToolOutput, ToolError>> + Send,
    > + Clone
           + Send {
        let state = self.state.clone();
        tool_fn(move |call: ToolCall| {
            let step = {
                let mut script = state.lock().unwrap();
                script.calls.push(Instant::now());
                script.received.push(call);
                if script.steps.len() > 1 {
                    script.steps.pop_front().unwrap()
                } else {
                    script.steps[0].clone()
                }
            };
            play(step)
        })
    }
}

fn play(step: Step) -> Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>> {
    Box::pin(async move {
        match step {
            Step::Ok => Ok(ToolOutput::new(json!({"ok": true}))),
            Step::Fail(error) => Err(error),
            Step::After(delay, then) => {
                tokio::time::sleep(delay).await;
                play(*then).await
            }
            Step::Hang => std::future::pending().await,
        }
    })
}
