//! Canonical JSON, params digests and derived keys: the shared vectors, and properties.

#[path = "../support/mod.rs"]
mod support;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tower_toolcall::canonical::{
    canonical_json, check_limits, cmp_utf16, derive_key, params_digest, CanonicalOptions,
};
use tower_toolcall::ErrorCode;

fn vectors() -> (Value, Vec<Value>) {
    let path = support::fixtures_dir().join("canonical-vectors.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut file: Value = serde_json::from_str(&text).unwrap();
    let vectors = file["vectors"].as_array().unwrap().clone();
    (file["options"].take(), vectors)
}

fn options_of(spec: &Value) -> CanonicalOptions {
    CanonicalOptions::default()
        .with_drop_null_members(spec["dropNullMembers"].as_bool().unwrap())
        .with_trim_strings(spec["trimStrings"].as_bool().unwrap())
        .with_volatile_members(
            spec["volatile"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned()),
        )
        .with_max_depth(spec["maxDepth"].as_u64().unwrap() as usize)
}

#[test]
fn every_vector_is_reproduced_byte_for_byte() {
    let (spec, vectors) = vectors();
    let opts = options_of(&spec);
    assert_eq!(
        opts,
        CanonicalOptions::default(),
        "the vectors use the defaults"
    );
    assert!(vectors.len() >= 12);
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        let result = canonical_json(&v["params"], &opts);
        if let Some(code) = v.get("error") {
            let err = result.expect_err(name);
            assert_eq!(err.code().as_str(), code.as_str().unwrap(), "{name}");
            assert!(err.message().contains("`payload.params`"), "{name}");
            continue;
        }
        let canonical = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            canonical,
            v["canonical"].as_str().unwrap(),
            "{name}: canonical"
        );
        assert_eq!(
            params_digest(&canonical),
            v["paramsDigest"].as_str().unwrap(),
            "{name}: digest"
        );
        let key = derive_key(
            v["toolNamespace"].as_str().unwrap(),
            v["toolName"].as_str().unwrap(),
            &canonical,
            v["sessionKey"].as_str().unwrap(),
            v["actorId"].as_str().unwrap(),
        );
        assert_eq!(
            key,
            v["derivedKey"].as_str().unwrap(),
            "{name}: derived key"
        );
    }
}

#[test]
fn limits_check_agrees_with_the_writer() {
    let (_, vectors) = vectors();
    let opts = CanonicalOptions::default();
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        match canonical_json(&v["params"], &opts) {
            Ok(canonical) => {
                let len = canonical.len();
                assert!(check_limits(&v["params"], &opts, len).is_ok(), "{name}");
                let err = check_limits(&v["params"], &opts, len - 1).unwrap_err();
                assert_eq!(err.code(), ErrorCode::PayloadTooLarge, "{name}");
                assert_eq!(err.details().unwrap()["bytes"], len, "{name}");
            }
            Err(_) => {
                let err = check_limits(&v["params"], &opts, usize::MAX).unwrap_err();
                assert_eq!(err.code(), ErrorCode::ValidationError, "{name}");
            }
        }
    }
}

#[test]
fn the_size_bound_covers_the_longest_numbers() {
    let opts = CanonicalOptions::default();
    for n in [
        -2.0670472422389555e-6,
        -2.2250738585072014e-308,
        -1.2345678901234567e20,
    ] {
        let value = json!([n]);
        let len = canonical_json(&value, &opts).unwrap().len();
        assert!(check_limits(&value, &opts, len).is_ok(), "{n}");
        assert!(check_limits(&value, &opts, len - 1).is_err(), "{n}");
    }
    assert_eq!(
        canonical_json(&json!([-2.0670472422389555e-6]), &opts).unwrap(),
        "[-0.0000020670472422389555]"
    );
}

#[test]
fn normalizations_can_be_switched_off() {
    let value = json!({"a": null, "s": " x ", "clientTs": 1});
    let raw = CanonicalOptions::default()
        .with_drop_null_members(false)
        .with_trim_strings(false)
        .with_volatile_members(Vec::<String>::new());
    assert_eq!(
        canonical_json(&value, &raw).unwrap(),
        r#"{"a":null,"clientTs":1,"s":" x "}"#
    );
    assert_eq!(
        canonical_json(&value, &CanonicalOptions::default()).unwrap(),
        r#"{"s":"x"}"#
    );
}

#[test]
fn volatile_members_of_any_length_are_removed_and_only_they() {
    let long = "x".repeat(70);
    let longer = "x".repeat(71);
    let opts = CanonicalOptions::default().with_volatile_members(["nonce", long.as_str()]);
    let value = json!({
        "nonce": 1,
        "nonces": 2,
        "other": 3,
        long.clone(): 4,
        longer.clone(): 5,
        "inner": [{"nonce": 6, "kept": 7}],
    });
    assert_eq!(
        canonical_json(&value, &opts).unwrap(),
        format!(r#"{{"inner":[{{"kept":7}}],"nonces":2,"other":3,"{longer}":5}}"#)
    );
    // Options compare by their names, whether or not they share them.
    assert_eq!(
        opts,
        CanonicalOptions::default().with_volatile_members(["nonce", long.as_str()])
    );
    assert_ne!(
        opts,
        CanonicalOptions::default().with_volatile_members(["nonce", longer.as_str()])
    );
    assert_ne!(opts, CanonicalOptions::default());
}

#[test]
fn utf16_order_differs_from_code_point_order_where_it_must() {
    // U+FF21 (fullwidth A) sorts after U+1F600 by code point but before it in UTF-16.
    assert_eq!(cmp_utf16("\u{1F600}", "\u{FF21}"), std::cmp::Ordering::Less);
    assert_eq!(cmp_utf16("a", "b"), std::cmp::Ordering::Less);
    let value = json!({"\u{FF21}": 1, "\u{1F600}": 2, "a": 3});
    assert_eq!(
        canonical_json(&value, &CanonicalOptions::default()).unwrap(),
        "{\"a\":3,\"\u{1F600}\":2,\"\u{FF21}\":1}"
    );
}

#[test]
fn names_that_need_escapes_or_sort_by_utf16_are_written_right_at_any_depth() {
    // A name with a quote, a backslash and a control character is escaped as a string is; a
    // supplementary name deep inside sorts the inner object only, and the outer one keeps
    // its order.
    let value = json!({
        "z": {"\u{FF21}": [1, {"\u{1F600}": true, "b\"q": null, "a\\\n": "v"}], "a": 0},
        "a\u{1}": "x"
    });
    assert_eq!(
        canonical_json(&value, &CanonicalOptions::default().with_drop_null_members(false)).unwrap(),
        "{\"a\\u0001\":\"x\",\"z\":{\"a\":0,\"\u{FF21}\":[1,{\"a\\\\\\n\":\"v\",\"b\\\"q\":null,\"\u{1F600}\":true}]}}"
    );
}

#[test]
fn depth_100_000_is_a_validation_error_without_overflowing_the_stack() {
    let depth = 100_000;
    let mut value = json!(1);
    for i in 0..depth {
        value = if i % 2 == 0 {
            Value::Array(vec![value])
        } else {
            let mut map = Map::new();
            map.insert("n".into(), value);
            Value::Object(map)
        };
    }
    let opts = CanonicalOptions::default();
    let err = canonical_json(&value, &opts).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    assert!(err.message().contains("deeper than 64 levels"));
    let err = check_limits(&value, &opts, 1 << 20).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ValidationError);
    // Even the largest supported limit stops long before the end.
    let deep = opts.clone().with_max_depth(usize::MAX);
    assert_eq!(deep.max_depth(), 1024);
    assert!(canonical_json(&value, &deep).is_err());
    dismantle(value);
}

/// Drops a deep value level by level: the recursive drop of serde_json would overflow.
fn dismantle(mut value: Value) {
    loop {
        value = match value {
            Value::Array(mut items) => match items.pop() {
                Some(next) => next,
                None => return,
            },
            Value::Object(mut map) => match map.remove("n") {
                Some(next) => next,
                None => return,
            },
            _ => return,
        }
    }
}

/// JSON values without floats, whose members may be shuffled and numbers respelled.
fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-1_000_000_i64..1_000_000).prop_map(|n| json!(n)),
        "[a-z \\t]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON text with members in reverse order, extra white space, and every
/// integer spelled `n.0` or `ne0` by `spelling`.
fn respell(value: &Value, spelling: u8, out: &mut String) {
    match value {
        Value::Number(n) => {
            let n = n.as_i64().unwrap();
            match spelling % 3 {
                0 => out.push_str(&n.to_string()),
                1 => out.push_str(&format!("{n}.0")),
                _ => out.push_str(&format!("{n}e0")),
            }
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                respell(item, spelling.wrapping_add(i as u8), out);
            }
            out.push_str(" ]");
        }
        Value::Object(map) => {
            out.push_str("{\n");
            for (i, (name, member)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(name).unwrap());
                out.push_str(" : ");
                respell(member, spelling.wrapping_add(i as u8), out);
            }
            out.push_str("\n}");
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn key_order_white_space_and_number_spelling_never_change_the_key(
        value in arb_value(),
        spelling in any::<u8>(),
    ) {
        let opts = CanonicalOptions::default();
        let params = json!({"p": value});
        let mut text = String::new();
        respell(&params, spelling, &mut text);
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        let a = canonical_json(&params, &opts).unwrap();
        let b = canonical_json(&reparsed, &opts).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(
            derive_key("ns", "tool", &a, "s", "u"),
            derive_key("ns", "tool", &b, "s", "u")
        );
    }

    #[test]
    fn without_normalizations_the_output_is_rfc_8785(value in json_of(integers_a_double_holds())) {
        // serde_json_canonicalizer implements RFC 8785 alone; with every normalization off,
        // both must agree byte for byte. Integers beyond 2^53 are the one departure (see
        // `integers_beyond_two_to_the_53_keep_their_exact_digits`), so none is generated here.
        let raw = CanonicalOptions::default()
            .with_drop_null_members(false)
            .with_trim_strings(false)
            .with_volatile_members(Vec::<String>::new());
        let ours = canonical_json(&value, &raw).unwrap();
        let reference = serde_json_canonicalizer::to_string(&value).unwrap();
        prop_assert_eq!(ours, reference);
    }

    #[test]
    fn canonical_output_is_json_that_canonicalizes_to_itself(value in any_json()) {
        let opts = CanonicalOptions::default();
        let once = canonical_json(&value, &opts).unwrap();
        let parsed: Value = serde_json::from_str(&once).unwrap();
        prop_assert_eq!(canonical_json(&parsed, &opts).unwrap(), once.clone());
        prop_assert!(check_limits(&value, &opts, once.len()).is_ok());
        if !once.is_empty() {
            prop_assert!(check_limits(&value, &opts, once.len() - 1).is_err());
        }
    }
}

/// Any JSON value, floats, unicode and integers of every size included.
fn any_json() -> impl Strategy<Value = Value> {
    json_of(prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
    ])
}

/// The integers within ±2^53, which a double holds exactly.
fn integers_a_double_holds() -> impl Strategy<Value = Value> {
    const EXACT: i64 = 1 << 53;
    (-EXACT..=EXACT).prop_map(|n| json!(n))
}

/// Any JSON value, floats and unicode included, with integers from `integers`.
fn json_of(integers: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        integers,
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn integers_within_two_to_the_53_are_written_as_rfc_8785_writes_them() {
    let exact = 1_i64 << 53;
    let values = [
        json!(0),
        json!(-1),
        json!(exact - 1),
        json!(exact),
        json!(-exact),
        json!(1.0e20),
        json!(-1.2345678901234567e18),
    ];
    let options = CanonicalOptions::default();
    for value in values {
        let reference = serde_json_canonicalizer::to_string(&value).unwrap();
        assert_eq!(
            canonical_json(&value, &options).unwrap(),
            reference,
            "{value}"
        );
    }
    assert_eq!(
        canonical_json(&json!(exact), &options).unwrap(),
        "9007199254740992"
    );
}

#[test]
fn integers_beyond_two_to_the_53_keep_their_exact_digits() {
    // Snowflake ids: RFC 8785 rounds both to the double 1234567890123456768 and writes
    // `1234567890123456800` for each; the canonical form keeps them apart.
    let options = CanonicalOptions::default();
    let first = canonical_json(&json!({"message_id": 1234567890123456789_u64}), &options).unwrap();
    let second = canonical_json(&json!({"message_id": 1234567890123456788_u64}), &options).unwrap();
    assert_eq!(first, r#"{"message_id":1234567890123456789}"#);
    assert_eq!(second, r#"{"message_id":1234567890123456788}"#);
    assert_eq!(
        serde_json_canonicalizer::to_string(&json!(1234567890123456789_u64)).unwrap(),
        "1234567890123456800",
        "the departure from RFC 8785"
    );

    let exact = 1_i64 << 53;
    for (value, digits) in [
        (json!(exact + 1), "9007199254740993"),
        (json!(-exact - 1), "-9007199254740993"),
        (json!(i64::MIN), "-9223372036854775808"),
        (json!(i64::MAX), "9223372036854775807"),
        (json!(u64::MAX), "18446744073709551615"),
        (json!(1_u64 << 60), "1152921504606846976"),
    ] {
        let canonical = canonical_json(&value, &options).unwrap();
        assert_eq!(canonical, digits);
        // The size check counts the same digits.
        assert!(
            check_limits(&value, &options, canonical.len()).is_ok(),
            "{value}"
        );
        assert!(
            check_limits(&value, &options, canonical.len() - 1).is_err(),
            "{value}"
        );
    }

    // Parsed from text, as envelopes are, the digits survive too; a number beyond 64 bits
    // is a double, written as RFC 8785 writes it.
    let parse = |text: &str| canonical_json(&serde_json::from_str(text).unwrap(), &options);
    assert_eq!(
        parse("[1234567890123456789]").unwrap(),
        "[1234567890123456789]"
    );
    assert_eq!(
        parse("[-1234567890123456789]").unwrap(),
        "[-1234567890123456789]"
    );
    assert_eq!(
        parse("[123456789012345678901]").unwrap(),
        "[123456789012345680000]"
    );
    let d1 = derive_key("ns", "tool", &first, "s", "u");
    assert_ne!(d1, derive_key("ns", "tool", &second, "s", "u"));
    assert_ne!(params_digest(&first), params_digest(&second));
}

proptest! {
    #[test]
    fn distinct_integers_have_distinct_canonical_forms(a in any::<i64>(), b in any::<u64>()) {
        let options = CanonicalOptions::default();
        let write = |value: Value| canonical_json(&value, &options).unwrap();
        prop_assert_eq!(write(json!(a)), a.to_string());
        prop_assert_eq!(write(json!(b)), b.to_string());
        prop_assert_eq!(write(json!(a)) == write(json!(b)), i128::from(a) == i128::from(b));
    }
}

#[test]
fn parts_that_join_alike_give_different_derived_keys() {
    let canonical = r#"{"q":1}"#;
    let key = |ns: &str, name: &str, session: &str, actor: &str| {
        derive_key(ns, name, canonical, session, actor)
    };
    // Each pair joins to the same text with `::` between the parts.
    let pairs = [
        (("x::y", "z", "s", "u"), ("x", "y::z", "s", "u")),
        (("x:", "y", "s", "u"), ("x", ":y", "s", "u")),
        (("ns", "tool", "a::b", "u"), ("ns", "tool", "a", "b::u")),
        (("ns", "tool", "s:", "u"), ("ns", "tool", "s", ":u")),
        // An escape written literally is not the character it escapes.
        (("x%3Ay", "z", "s", "u"), ("x:y", "z", "s", "u")),
    ];
    for (a, b) in pairs {
        assert_ne!(
            key(a.0, a.1, a.2, a.3),
            key(b.0, b.1, b.2, b.3),
            "{a:?} {b:?}"
        );
    }
    // Params that hold the separator cannot take the place of a part either.
    assert_ne!(
        derive_key("ns", "tool", r#"{"q":"a::s"}"#, "u", "v"),
        derive_key("ns", "tool", r#"{"q":"a"#, r#"s"}::u"#, "v"),
    );
    // A slash is no separator of the derived key: parts with one keep today's keys.
    let plain = |parts: [&str; 5]| {
        let joined = parts.join("::");
        tower_toolcall::canonical::params_digest(&joined)
    };
    assert_eq!(
        derive_key("agents/web", "search", canonical, "sess/42", "user-7"),
        plain(["agents/web", "search", canonical, "sess/42", "user-7"])
    );
}
