//! Run with: `cargo bench -p tower-toolcall --bench envelope`
//!
//! The cost of the envelope layer over the bare tool call: validation without a schema, with
//! a typical schema, and canonicalization plus key derivation for a 200-byte params object.

use criterion::{criterion_group, criterion_main, Criterion};
use futures::FutureExt;
use serde_json::{json, Value};
use std::hint::black_box;
use tower::{Layer, Service};
use tower_toolcall::canonical::{canonical_json, derive_key, CanonicalOptions};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, EnvelopeValidateLayer, ToolCall, ToolError, ToolOutput};

/// A typical search call: 200 bytes of canonical params.
fn params() -> Value {
    json!({
        "query": "tower middleware retry with exponential backoff",
        "limit": 10,
        "offset": 20,
        "safe": true,
        "region": "eu-west-1",
        "filters": {"lang": "en", "site": "docs.rs", "after": "2024-01-01", "kind": "article"}
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "required": ["query"],
        "additionalProperties": false,
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            "offset": {"type": "integer", "minimum": 0},
            "safe": {"type": "boolean"},
            "region": {"enum": ["eu-west-1", "us-east-1", "ap-south-1"]},
            "filters": {
                "type": "object",
                "properties": {
                    "lang": {"type": "string", "maxLength": 8},
                    "site": {"type": "string"},
                    "after": {"type": "string"},
                    "kind": {"enum": ["article", "video", "repo"]}
                }
            }
        }
    })
}

fn call() -> ToolCall {
    ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(params())
        .build()
        .unwrap()
}

fn registry(with_schema: bool) -> ToolRegistry {
    let mut search = ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly);
    if with_schema {
        search = search.with_input_schema(schema());
    }
    ToolRegistry::builder()
        .tool(search)
        .tool(ToolDescriptor::new(
            "vault",
            "createFile",
            RiskLevel::Writes,
        ))
        .build()
        .unwrap()
}

fn bare_tool() -> impl Service<
    ToolCall,
    Response = ToolOutput,
    Error = ToolError,
    Future = impl std::future::Future<Output = Result<ToolOutput, ToolError>>,
> + Clone {
    tool_fn(|call: ToolCall| async move {
        Ok(ToolOutput::new(Value::Bool(
            call.params().as_map().is_empty(),
        )))
    })
}

/// Calls `svc` once; every future here is ready at its first poll.
fn call_once<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.call(call).now_or_never().expect("ready at once")
}

fn bench(c: &mut Criterion) {
    let canonical_len = canonical_json(&params(), &CanonicalOptions::default())
        .unwrap()
        .len();
    assert!(
        (190..=210).contains(&canonical_len),
        "params are {canonical_len} bytes"
    );
    let call = call();

    let mut group = c.benchmark_group("envelope");
    let mut bare = bare_tool();
    group.bench_function("bare", |b| {
        b.iter(|| black_box(call_once(&mut bare, black_box(call.clone())).unwrap()))
    });

    let mut no_schema = EnvelopeValidateLayer::new(registry(false)).layer(bare_tool());
    group.bench_function("validate_no_schema", |b| {
        b.iter(|| black_box(call_once(&mut no_schema, black_box(call.clone())).unwrap()))
    });

    let mut with_schema = EnvelopeValidateLayer::new(registry(true)).layer(bare_tool());
    group.bench_function("validate_schema", |b| {
        b.iter(|| black_box(call_once(&mut with_schema, black_box(call.clone())).unwrap()))
    });

    let opts = CanonicalOptions::default();
    let value = params();
    group.bench_function("canonicalize_and_derive_key", |b| {
        b.iter(|| {
            let canonical = canonical_json(black_box(&value), &opts).unwrap();
            black_box(derive_key(
                "agents.tools.web",
                "search",
                &canonical,
                "sess-42",
                "user-7",
            ))
        })
    });

    group.bench_function("validate_schema_and_derive_key", |b| {
        b.iter(|| {
            let out = call_once(&mut with_schema, black_box(call.clone())).unwrap();
            let canonical = canonical_json(black_box(&value), &opts).unwrap();
            black_box((
                out,
                derive_key(
                    "agents.tools.web",
                    "search",
                    &canonical,
                    "sess-42",
                    "user-7",
                ),
            ))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
