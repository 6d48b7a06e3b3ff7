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

pub mod redis_server;
