//! Helpers shared by the test suites.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};

/// The folder of the test fixtures.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every file in `tests/fixtures/envelopes` whose name starts with `prefix`, sorted.
pub fn envelope_fixtures(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fixtures_dir().join("envelopes");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_str().unwrap();
            name.starts_with(prefix) && name.ends_with(".json")
        })
        .map(|path| {
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no fixtures named {prefix}* in {}",
        dir.display()
    );
    files
}

/// An invalid fixture without its `_expect` member, and what `_expect` says.
pub fn strip_expect(bytes: &[u8]) -> Option<(Vec<u8>, Value)> {
    let mut value: Value = serde_json::from_slice(bytes).ok()?;
    let expect = value.as_object_mut()?.remove("_expect")?;
    Some((serde_json::to_vec(&value).unwrap(), expect))
}

/// A tool that counts its calls and echoes the params.
#[derive(Clone, Default)]
pub struct Counter(pub Arc<AtomicUsize>);

impl Counter {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub fn tool(
        &self,
    ) -> impl tower::Service<
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

/// A valid call of `agents.tools.web::search` with `params`.
pub fn search_call(params: Value) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(params)
        .build()
        .expect("a valid call")
}

/// One answer of a [`ScriptedTool`].
#[derive(Clone, Debug)]
pub enum Step {
    /// Answer `{"ok": true}` at once.
    Ok,
    /// Fail at once with this error.
    Fail(ToolError),
    /// Wait this long (tokio time), then answer as the inner step.
    After(std::time::Duration, Box<Step>),
    /// Never answer.
    Hang,
}

/// A tool that answers from a script (the last step repeats), counts its calls and keeps
/// each call it received with the tokio time it came.
#[derive(Clone)]
pub struct ScriptedTool {
    state: Arc<std::sync::Mutex<Script>>,
}

struct Script {
    steps: std::collections::VecDeque<Step>,
    calls: Vec<tokio::time::Instant>,
    received: Vec<ToolCall>,
}

impl ScriptedTool {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        let steps: std::collections::VecDeque<Step> = steps.into_iter().collect();
        assert!(!steps.is_empty(), "a script needs at least one step");
        ScriptedTool {
            state: Arc::new(std::sync::Mutex::new(Script {
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
    pub fn call_times(&self) -> Vec<tokio::time::Instant> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The calls the tool received, as it received them.
    pub fn received(&self) -> Vec<ToolCall> {
        self.state.lock().unwrap().received.clone()
    }

    /// The tool as a service.
    pub fn service(
        &self,
    ) -> impl tower::Service<
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
                script.calls.push(tokio::time::Instant::now());
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

fn play(
    step: Step,
) -> std::pin::Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>> {
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

/// A call of `namespace::name` in session `sess-42`.
pub fn call_of(namespace: &str, name: &str) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-42")
        .actor("user-7")
        .build()
        .expect("a valid call")
}

/// A registry of `tools`.
pub fn registry_of(
    tools: impl IntoIterator<Item = tower_toolcall::registry::ToolDescriptor>,
) -> tower_toolcall::registry::ToolRegistry {
    tools
        .into_iter()
        .fold(
            tower_toolcall::registry::ToolRegistry::builder(),
            |builder, tool| builder.tool(tool),
        )
        .build()
        .expect("a valid registry")
}

/// Calls `svc` once it is ready.
pub async fn call_once<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: tower::Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    use tower::ServiceExt;
    svc.ready().await?.call(call).await
}

/// `{"a": [{"a": [ … "leaf" … ]}]}`, `levels` deep, built in code (a parser stops at 128).
pub fn deep_value(levels: usize) -> Value {
    let mut value = json!("leaf");
    for n in 0..levels {
        value = if n % 2 == 0 {
            Value::Array(vec![value])
        } else {
            Value::Object([("a".to_owned(), value)].into_iter().collect())
        };
    }
    value
}

/// Runs `test` on a thread whose stack can drop a value 8 000 levels deep: serde_json drops
/// recursively, once per level, which the 2 MiB of a test thread cannot hold in a debug
/// build. The crate's own threads must cope with whatever the caller's could.
pub fn on_a_large_stack(test: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(test)
        .unwrap()
        .join()
        .unwrap();
}

pub mod capture;
pub mod metrics_series;
pub mod redis_server;

/// Waits (real time, at most 5 s) until `done` holds.
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within 5 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// `tool` behind the whole stack as the crate's builder assembles it: the stack the test
/// suites exercise, answering with the crate's `ToolOutput` / `ToolError`.
pub fn stacked<S>(
    stack: &tower_toolcall::ToolStack,
    tool: S,
) -> tower_toolcall::ToolStackService<S> {
    use tower::Layer;
    stack.layer(tool)
}

/// [`stacked`], answering every call with a `ToolResult` envelope.
pub fn enveloped<S>(
    stack: &tower_toolcall::ToolStack,
    tool: S,
) -> tower_toolcall::envelope::ResultEnvelope<tower_toolcall::ToolStackService<S>> {
    use tower::Layer;
    tower_toolcall::ResultEnvelopeLayer::new().layer(stacked(stack, tool))
}

/// Runs each case of a table on the in-memory store, under the test attribute given first.
/// Each case is an `async fn case(store: Store)` beside the table, where `Store` has the
/// variant `Memory`. The crate `tower-toolcall-redis` runs the same cases on a
/// `redis-server` of their own, with a macro of the same name.
#[allow(unused_macros)]
macro_rules! store_suite {
    (#[$memory:meta] $($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[$memory]
                async fn $case() {
                    super::$case(super::Store::Memory).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use store_suite;
