//! Mutated envelopes (bit flips, truncations, inserted tokens, type swaps, repeated member
//! names, members that are not I-JSON, deep nesting) through `ToolCall::from_json` and through
//! the whole stack over a tool that keeps what reaches it. Nothing panics, every refusal is a
//! `VALIDATION_ERROR`, and whatever reaches the tool is a call that parses and validates.
//!
//! Each property runs `PROPTEST_CASES` cases (256 unless set), so CI stays fast; raise it to
//! search longer.

#[path = "../support/mod.rs"]
mod support;

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};
use support::{envelope_fixtures, ScriptedTool, Step};
use tower::{Service, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{ErrorCode, ToolCall, ToolResult, ToolStack};

/// The objects of the contract, by path.
const OBJECTS: [&[&str]; 10] = [
    &[],
    &["target"],
    &["payload"],
    &["payload", "params"],
    &["payload", "callHints"],
    &["transport"],
    &["transport", "retryBudget"],
    &["control"],
    &["trace"],
    &["trace", "baggage"],
];

/// Members a mutation may replace, by path.
const MEMBERS: [&[&str]; 16] = [
    &["contractVersion"],
    &["requestId"],
    &["toolName"],
    &["target"],
    &["target", "sessionKey"],
    &["target", "tenantId"],
    &["payload"],
    &["payload", "params"],
    &["payload", "idempotencyKey"],
    &["payload", "callHints"],
    &["transport"],
    &["transport", "dedupeMode"],
    &["transport", "retryBudget"],
    &["control"],
    &["control", "deadlineAtMs"],
    &["trace"],
];

/// Member values that are JSON but not I-JSON, as raw bytes.
const NOT_I_JSON: [&[u8]; 6] = [
    b"1e400",
    b"-1e400",
    b"\"\\ud800\"",
    b"\"\\udc00 tail\"",
    b"\"\\ud800\\u0041\"",
    b"\"raw \xff byte\"",
];

/// Bytes inserted anywhere by a mutation.
const TOKENS: [&[u8]; 12] = [
    b",",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"null",
    b"1e400",
    b"\\ud800",
    b"\xff",
    b",\"path\":\"/etc/shadow\"",
    b"\"requestId\":\"r\",",
];

/// What a mutation does to a valid envelope.
#[derive(Clone, Debug)]
enum Mutation {
    /// Flips one bit of the text.
    FlipBit(Index, u8),
    /// Cuts the text short.
    Truncate(Index),
    /// Inserts a token into the text.
    Insert(Index, &'static [u8]),
    /// Replaces a member with a value, often of another type.
    Swap(&'static [&'static str], Value),
    /// Repeats a member name in an object of the contract.
    Repeat(&'static [&'static str], &'static str, Value, Value),
    /// Adds a member whose value is not I-JSON to an object of the contract.
    NotIJson(&'static [&'static str], &'static [u8]),
    /// Adds a member nested this deep, in arrays or in objects.
    Nest(&'static [&'static str], usize, bool),
}

impl Mutation {
    /// The field that the refusal of the mutated envelope must name, when the mutation alone
    /// makes it invalid.
    fn must_refuse_naming(&self) -> Option<String> {
        match self {
            Mutation::Swap(path, Value::Array(_)) if OBJECTS.contains(path) && !path.is_empty() => {
                Some(path.join("."))
            }
            Mutation::Repeat(path, name, _, _) => Some(member_path(path, name)),
            Mutation::NotIJson(path, _) => Some(member_path(path, "fuzz")),
            _ => None,
        }
    }
}

fn member_path(object: &[&str], name: &str) -> String {
    object
        .iter()
        .copied()
        .chain([name])
        .collect::<Vec<_>>()
        .join(".")
}

/// Any JSON value, small.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e300..1e300f64).prop_map(|f| json!(f)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    let object = prop::sample::select(&OBJECTS[..]);
    prop_oneof![
        (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), prop::sample::select(&TOKENS[..]))
            .prop_map(|(at, token)| Mutation::Insert(at, token)),
        (prop::sample::select(&MEMBERS[..]), arb_json())
            .prop_map(|(path, value)| Mutation::Swap(path, value)),
        (
            object.clone(),
            prop::sample::select(&["path", "requestId", "sessionKey", "maxAttempts", "x"][..]),
            arb_json(),
            arb_json()
        )
            .prop_map(|(path, name, first, second)| Mutation::Repeat(path, name, first, second)),
        (object.clone(), prop::sample::select(&NOT_I_JSON[..]))
            .prop_map(|(path, raw)| Mutation::NotIJson(path, raw)),
        (object, 1..300usize, any::<bool>())
            .prop_map(|(path, depth, arrays)| Mutation::Nest(path, depth, arrays)),
    ]
}

/// A valid envelope, as a JSON value.
fn arb_base() -> impl Strategy<Value = Value> {
    prop::sample::select(vec!["valid-full", "valid-minimal"]).prop_map(|name| {
        let (_, bytes) = envelope_fixtures(name).remove(0);
        serde_json::from_slice(&bytes).unwrap()
    })
}

/// Stands for raw text in a value until it is written out.
const PLACEHOLDER: &str = "\"fuzz-placeholder\"";

/// `envelope` written out with `mutation` applied.
fn mutate(mut envelope: Value, mutation: &Mutation) -> Vec<u8> {
    // Mutations of a value, and the raw text that replaces the placeholder in it.
    let raw: Option<(&str, Vec<u8>)> = match mutation {
        Mutation::Swap(path, value) => {
            *slot(&mut envelope, path) = value.clone();
            None
        }
        Mutation::Repeat(path, name, first, second) => {
            let object = slot(&mut envelope, path);
            object[*name] = first.clone();
            object["fuzz-repeated"] = second.clone();
            let name = serde_json::to_vec(name).unwrap();
            Some(("\"fuzz-repeated\"", name))
        }
        Mutation::NotIJson(path, raw) => {
            slot(&mut envelope, path)["fuzz"] = json!("fuzz-placeholder");
            Some((PLACEHOLDER, raw.to_vec()))
        }
        Mutation::Nest(path, depth, arrays) => {
            slot(&mut envelope, path)["fuzz"] = json!("fuzz-placeholder");
            let (open, close) = if *arrays {
                ("[", "]")
            } else {
                ("{\"a\":", "}")
            };
            let nested = format!("{}1{}", open.repeat(*depth), close.repeat(*depth));
            Some((PLACEHOLDER, nested.into_bytes()))
        }
        _ => None,
    };
    let mut bytes = serde_json::to_vec(&envelope).unwrap();
    if let Some((placeholder, raw)) = raw {
        let at = find(&bytes, placeholder.as_bytes()).expect("the placeholder is written once");
        bytes.splice(at..at + placeholder.len(), raw);
    }
    // Mutations of the text.
    match mutation {
        Mutation::FlipBit(at, bit) => {
            let at = at.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        Mutation::Truncate(at) => bytes.truncate(at.index(bytes.len())),
        Mutation::Insert(at, token) => {
            let at = at.index(bytes.len() + 1);
            bytes.splice(at..at, token.iter().copied());
        }
        _ => {}
    }
    bytes
}

/// The member at `path`, made an empty object first where it is absent.
fn slot<'a>(envelope: &'a mut Value, path: &[&str]) -> &'a mut Value {
    let mut slot = envelope;
    for key in path {
        slot = &mut slot[*key];
    }
    if slot.is_null() {
        *slot = json!({});
    }
    slot
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// A call that reached the tool, or that `from_json` returned, must be one the contract
/// allows: it validates, and its JSON parses back to the same call.
fn assert_valid(call: &ToolCall) -> Result<(), TestCaseError> {
    prop_assert!(call.check().is_ok(), "{:?}", call.check());
    let again = ToolCall::from_json(call.to_json().as_bytes());
    prop_assert_eq!(again.as_ref().ok(), Some(call), "{:?}", again);
    Ok(())
}

/// Parses `bytes`; checks what comes out against what `mutation` must give.
fn parse(bytes: &[u8], mutation: &Mutation) -> Result<Option<ToolCall>, TestCaseError> {
    match ToolCall::from_json(bytes) {
        Ok(call) => {
            prop_assert_eq!(mutation.must_refuse_naming(), None, "accepted");
            assert_valid(&call)?;
            Ok(Some(call))
        }
        Err(err) => {
            prop_assert_eq!(err.code(), ErrorCode::ValidationError);
            prop_assert!(
                err.message().starts_with("invalid tool call"),
                "{}",
                err.message()
            );
            prop_assert!(err.is_rejected());
            if let Some(field) = mutation.must_refuse_naming() {
                prop_assert_eq!(
                    err.details().and_then(|d| d["field"].as_str()),
                    Some(field.as_str()),
                    "{}",
                    err.message()
                );
            }
            Ok(None)
        }
    }
}

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("agents.tools.web", "search", RiskLevel::ReadOnly)
                .with_idempotent(true),
        )
        .tool(ToolDescriptor::new(
            "vault",
            "createFile",
            RiskLevel::Writes,
        ))
        .build()
        .unwrap()
}

/// Sends each call through the whole stack, in the recommended order, over a tool that keeps
/// what reaches it; returns the results and what the tool received.
fn through_the_stack(calls: Vec<ToolCall>) -> (Vec<ToolResult>, Vec<ToolCall>) {
    let tool = ScriptedTool::always(Step::Ok);
    let stack = ToolStack::builder(registry())
        .retry(|retry| retry.seed(7))
        .build()
        .unwrap();
    let mut stack = support::enveloped(&stack, tool.service());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let results = runtime.block_on(async {
        let mut results = Vec::new();
        for call in calls {
            let svc = stack.ready().await.unwrap();
            results.push(svc.call(call).await.unwrap());
        }
        results
    });
    (results, tool.received())
}

/// A change made to a valid call in code, past `from_json`: only the validation layer
/// stands between it and the tool.
fn arb_change() -> impl Strategy<Value = (&'static str, String)> {
    let text = prop_oneof![
        Just(String::new()),
        Just(" \t".to_owned()),
        "[a-z]{1,8}",
        (250..300usize).prop_map(|n| "k".repeat(n)),
    ];
    (
        prop::sample::select(vec![
            "contractVersion",
            "requestId",
            "toolName",
            "target.sessionKey",
            "target.actorId",
            "target.tenantId",
            "payload.idempotencyKey",
        ]),
        text,
    )
}

fn change(call: &mut ToolCall, field: &str, text: String) {
    let envelope = call.envelope_mut();
    match field {
        "contractVersion" => envelope.contract_version = text,
        "requestId" => envelope.request_id = text,
        "toolName" => envelope.tool_name = text,
        "target.sessionKey" => envelope.target.session_key = text,
        "target.actorId" => envelope.target.actor_id = text,
        "target.tenantId" => envelope.target.tenant_id = Some(text),
        "payload.idempotencyKey" => envelope.payload.idempotency_key = Some(text),
        other => unreachable!("no change for {other}"),
    }
}

proptest! {
    #[test]
    fn a_mutated_envelope_is_refused_or_parses_to_a_valid_call(
        base in arb_base(),
        mutation in arb_mutation(),
    ) {
        let bytes = mutate(base, &mutation);
        parse(&bytes, &mutation)?;
        // serde's entry point agrees with `from_json`.
        prop_assert_eq!(
            serde_json::from_slice::<ToolCall>(&bytes).is_ok(),
            ToolCall::from_json(&bytes).is_ok()
        );
    }

    #[test]
    fn only_valid_calls_reach_the_tool_through_the_stack(
        base in arb_base(),
        mutations in prop::collection::vec(arb_mutation(), 1..4),
        (field, text) in arb_change(),
    ) {
        let mut calls = Vec::new();
        for mutation in &mutations {
            if let Some(call) = parse(&mutate(base.clone(), mutation), mutation)? {
                calls.push(call);
            }
        }
        // One valid call changed in code.
        let mut changed = ToolCall::from_value(base).unwrap();
        change(&mut changed, field, text);
        let changed_is_valid = changed.check().is_ok();
        calls.push(changed.clone());

        let sent = calls.len();
        let (results, received) = through_the_stack(calls);
        prop_assert_eq!(results.len(), sent);
        for call in &received {
            assert_valid(call)?;
        }
        if !changed_is_valid {
            prop_assert!(!received.contains(&changed));
            let refused = results.last().unwrap();
            prop_assert_eq!(
                refused.error.as_ref().map(|e| e.code.as_str()),
                Some("VALIDATION_ERROR")
            );
            prop_assert_eq!(refused.attempts, 0);
        }
    }
}
