//! Helpers of the core's test suites: the shared ones of `tower-toolcall-test`, and those
//! only these suites use.
#![allow(dead_code, unused_imports, unreachable_pub)]

use std::path::PathBuf;

use serde_json::{json, Value};
use tower_toolcall::ToolCall;

pub use tower_toolcall_test::*;

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

/// A valid call of `agents.tools.web::search` with `params`.
pub fn search_call(params: Value) -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(params)
        .build()
        .expect("a valid call")
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
