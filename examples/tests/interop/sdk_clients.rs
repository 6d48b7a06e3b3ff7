//! The example server (the notes tools behind the whole stack) driven by the official SDK
//! clients: every promise of the MCP edge, over stdio and streamable HTTP, in both protocol
//! versions. Each run prints its rows of the interop matrix.

use serde_json::{json, Value};
use tower_toolcall_mcp::{ERROR_META, FROM_CACHE_META};

use super::kit::{stdio_transport, HttpServer, Sdk};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Stdio,
    Http,
}

/// The steps of the plan, and what each case checks in the report.
fn plan(transport: Value, version: &str, client: &str, over_new_connection: bool) -> Value {
    let search = |query: Value| json!({"op": "call", "name": "search", "arguments": query});
    let looped = search(json!({"query": format!("loop-{client}")}));
    let put = json!({"id": format!("n-{client}"), "text": "buy milk"});
    let key = format!("key-{client}");
    json!({
        "transport": transport,
        "protocolVersion": version,
        "clientName": client,
        "steps": [
            {"op": "listTools"},
            // 1: an error of a tool that has an output schema (its arguments miss `query`).
            search(json!({})),
            // 2..=5: the same call four times: the fourth is a loop.
            looped, looped, looped, looped,
            // 6, 7: a destructive tool without, then with, the user's confirmation.
            {"op": "call", "name": "delete", "arguments": {"id": "n1"}},
            {"op": "call", "name": "delete", "arguments": {"id": "n1"}, "meta": {"confirmationId": "approval-1"}},
            // 8: a key that is not a string.
            {"op": "call", "name": "put", "arguments": put, "meta": {"idempotencyKey": 42}},
            // 9..=11: a key sent again (over a new connection where the server outlives it).
            {"op": "call", "name": "put", "arguments": put, "meta": {"idempotencyKey": key}},
            if over_new_connection { json!({"op": "reconnect"}) } else { json!({"op": "sleepMs", "ms": 0}) },
            {"op": "call", "name": "put", "arguments": put, "meta": {"idempotencyKey": key}},
            // 12: the key under the member Claude Code sends.
            {"op": "call", "name": "put", "arguments": put, "meta": {"claudecode/toolUseId": key}},
        ]
    })
}

/// The result of a `call` step, or why there is none.
fn result(step: &Value) -> Result<&Value, String> {
    step.get("ok")
        .ok_or_else(|| format!("the SDK gave no result: {step}"))
}

/// The code and text of an `isError` result, checked for the shape every SDK accepts.
fn error_result(step: &Value) -> Result<(String, String), String> {
    let result = result(step)?;
    if result["isError"] != true {
        return Err(format!("not an error result: {result}"));
    }
    if result.get("structuredContent").is_some() {
        return Err(format!("an error result with structured content: {result}"));
    }
    let code = result["_meta"][ERROR_META]["code"]
        .as_str()
        .ok_or_else(|| format!("no {ERROR_META} in _meta: {result}"))?;
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    for rust in ["::", "payload.", "control.", "Error {", "Some("] {
        let named = text.replace("notes::", "");
        if named.contains(rust) {
            return Err(format!("the model reads `{rust}`: {text}"));
        }
    }
    Ok((code.to_owned(), text.to_owned()))
}

fn expect_error(step: &Value, code: &str, says: &str) -> Result<(), String> {
    let (got, text) = error_result(step)?;
    if got != code || !text.contains(says) {
        return Err(format!(
            "expected {code} saying {says:?}, got {got}: {text}"
        ));
    }
    Ok(())
}

fn expect_success(step: &Value) -> Result<&Value, String> {
    let result = result(step)?;
    if result["isError"] == true {
        return Err(format!("an error: {result}"));
    }
    Ok(result)
}

fn from_cache(result: &Value) -> bool {
    result["_meta"][FROM_CACHE_META] == true
}

/// The cases of the matrix, checked in `report`.
fn cases(report: &Value, version: &str) -> Vec<(&'static str, Result<(), String>)> {
    let steps = report["steps"].as_array().cloned().unwrap_or_default();
    let step = |i: usize| steps.get(i).unwrap_or(&Value::Null);
    let listed = || -> Result<(), String> {
        let tools = result(step(0))?["tools"]
            .as_array()
            .ok_or("no tools")?
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect::<Vec<_>>();
        if tools != ["search", "put", "delete"] {
            return Err(format!("tools: {tools:?}"));
        }
        if report["negotiatedProtocolVersion"] != version {
            return Err(format!(
                "negotiated {}",
                report["negotiatedProtocolVersion"]
            ));
        }
        Ok(())
    };
    let looped = || -> Result<(), String> {
        for i in 2..5 {
            expect_success(step(i))?;
        }
        expect_error(step(5), "LOOP_DETECTED", "change")
    };
    let confirmation = || -> Result<(), String> {
        expect_error(step(6), "POLICY_DENIED", "`_meta.confirmationId`")?;
        expect_success(step(7)).map(drop)
    };
    let duplicate = || -> Result<(), String> {
        let first = expect_success(step(9))?;
        let again = expect_success(step(11))?;
        let claude = expect_success(step(12))?;
        match (from_cache(first), from_cache(again), from_cache(claude)) {
            (false, true, true) if again["structuredContent"] == first["structuredContent"] => {
                Ok(())
            }
            flags => Err(format!("fromCache {flags:?}: {first} then {again}")),
        }
    };
    vec![
        ("tools/list", listed()),
        (
            "error on a tool with an output schema",
            expect_error(step(1), "VALIDATION_ERROR", "`arguments`"),
        ),
        ("loop stopped", looped()),
        (
            "destructive tool needs _meta.confirmationId",
            confirmation(),
        ),
        (
            "non-string key refused",
            expect_error(
                step(8),
                "VALIDATION_ERROR",
                "`_meta.idempotencyKey` must be a string",
            ),
        ),
        ("duplicate key answered from the cache", duplicate()),
    ]
}

async fn matrix(sdk: Sdk, transport: Transport, version: &str) {
    let client = format!(
        "interop-{}-{}-{}",
        sdk.name(),
        format!("{transport:?}").to_lowercase(),
        version
    );
    let server = match transport {
        Transport::Http => Some(HttpServer::start().await),
        Transport::Stdio => None,
    };
    let (target, over_new_connection) = match &server {
        Some(server) => (json!({"kind": "http", "url": server.url}), true),
        // A new stdio connection is a new server process, with a store of its own.
        None => (stdio_transport(), false),
    };
    let report = sdk
        .run(&plan(target, version, &client, over_new_connection))
        .await;
    if let Some(reason) = report.get("unsupported") {
        // The SDK cannot speak this version at all (the TypeScript SDK 1.32 speaks
        // 2025-11-25 and older only).
        assert_eq!((sdk, version), (Sdk::TypeScript, "2026-07-28"), "{reason}");
        eprintln!(
            "| {} | {transport:?} | {version} | all | n/a: {reason} |",
            sdk.name()
        );
        return;
    }
    let mut failed = Vec::new();
    for (case, outcome) in cases(&report, version) {
        let verdict = match &outcome {
            Ok(()) => "pass".to_owned(),
            Err(why) => format!("FAIL: {why}"),
        };
        eprintln!(
            "| {} | {transport:?} | {version} | {case} | {verdict} |",
            sdk.name()
        );
        if outcome.is_err() {
            failed.push(case);
        }
    }
    assert!(
        failed.is_empty(),
        "failed cases: {failed:?}; report: {report}"
    );
}

#[tokio::test]
async fn python_over_stdio_2025_11_25() {
    matrix(Sdk::Python, Transport::Stdio, "2025-11-25").await;
}

#[tokio::test]
async fn python_over_stdio_2026_07_28() {
    matrix(Sdk::Python, Transport::Stdio, "2026-07-28").await;
}

#[tokio::test]
async fn python_over_http_2025_11_25() {
    matrix(Sdk::Python, Transport::Http, "2025-11-25").await;
}

#[tokio::test]
async fn python_over_stateless_http_2026_07_28() {
    matrix(Sdk::Python, Transport::Http, "2026-07-28").await;
}

#[tokio::test]
async fn typescript_over_stdio_2025_11_25() {
    matrix(Sdk::TypeScript, Transport::Stdio, "2025-11-25").await;
}

#[tokio::test]
async fn typescript_over_stdio_2026_07_28() {
    matrix(Sdk::TypeScript, Transport::Stdio, "2026-07-28").await;
}

#[tokio::test]
async fn typescript_over_http_2025_11_25() {
    matrix(Sdk::TypeScript, Transport::Http, "2025-11-25").await;
}

#[tokio::test]
async fn typescript_over_http_2026_07_28() {
    matrix(Sdk::TypeScript, Transport::Http, "2026-07-28").await;
}
