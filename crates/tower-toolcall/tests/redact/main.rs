//! Redaction: secret member names and credential-shaped values, at any depth.

use serde_json::{json, Value};
use tower_toolcall::trace::{Redactor, REDACTED};

#[path = "../support/mod.rs"]
mod support;

use support::{deep_value, on_a_large_stack};

/// Ten credential shapes, each as it would sit in a string.
const CREDENTIALS: [&str; 10] = [
    "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
    "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\n-----END RSA PRIVATE KEY-----",
    "Basic dXNlcjpwYXNzd29yZA==",
];

#[test]
fn every_credential_shape_is_cut_out_of_strings() {
    let redactor = Redactor::default();
    for credential in CREDENTIALS {
        let text = format!("calling with {credential} now");
        let redacted = redactor.redact_str(&text);
        assert_eq!(
            redacted,
            format!("calling with {REDACTED} now"),
            "{credential}"
        );
    }
    assert_eq!(
        redactor.redact_str("postgres://app:hunter2@db.internal:5432/prod"),
        "postgres://[REDACTED]@db.internal:5432/prod"
    );
    // A password without a user name, as Redis URLs have it.
    assert_eq!(
        redactor.redact_str("redis://:s3cret@127.0.0.1:6379/0"),
        "redis://[REDACTED]@127.0.0.1:6379/0"
    );
}

#[test]
fn values_of_secret_names_are_cut_out_of_text() {
    let redactor = Redactor::default();
    for (text, expected) in [
        (
            "GET /v1/login?user=ana&client_secret=cs-123&api_key=k-9 refused",
            "GET /v1/login?user=ana&client_secret=[REDACTED]&api_key=[REDACTED] refused",
        ),
        (
            "password=hunter2, retry later",
            "password=[REDACTED], retry later",
        ),
        (
            "X-Api-Key: k-9\nAccept: */*",
            "X-Api-Key: [REDACTED]\nAccept: */*",
        ),
        (
            r#"upstream said {"error": "bad", "password": "hunter 2", "n": 1}"#,
            r#"upstream said {"error": "bad", "password": "[REDACTED]", "n": 1}"#,
        ),
        (
            r#"{"token":"a\"b","ok":true}"#,
            r#"{"token":"[REDACTED]","ok":true}"#,
        ),
        ("session_token = 'abc def'", "session_token = '[REDACTED]'"),
        (
            "Authorization: Basic dXNlcg== sent",
            "Authorization: [REDACTED] sent",
        ),
        (
            "cookie: sid=abc; theme=dark",
            "cookie: [REDACTED]; theme=dark",
        ),
        // A credential shape under a secret name is redacted once.
        (
            "Authorization: Bearer abcdefghijklmnop0123",
            "Authorization: [REDACTED]",
        ),
        ("pwd=", "pwd="),
    ] {
        assert_eq!(redactor.redact_str(text), expected, "{text}");
    }
    let custom = Redactor::builder().secret_name("pin").build().unwrap();
    assert_eq!(custom.redact_str("card pin: 1234"), "card pin: [REDACTED]");
}

#[test]
fn plain_text_is_left_alone_and_borrowed() {
    let redactor = Redactor::default();
    for text in [
        "search the web for tower middleware",
        "skip-this-step",
        "ask-me later",
        "the key is in the drawer",
        "akia is a name",
        "basic income, bearer bonds",
        "basic authentication",
        "a skeleton key, sk-short",
        "eyJ alone",
        "max_tokens=256, status: ok; retry=3 for vault::login",
        "see https://docs.rs/tower?version=0.5#retry",
        "password: [REDACTED]",
    ] {
        assert!(
            matches!(redactor.redact_str(text), std::borrow::Cow::Borrowed(_)),
            "{text}"
        );
    }
}

#[test]
fn secret_names_are_recognized_in_any_spelling() {
    let redactor = Redactor::default();
    for name in [
        "token",
        "access_token",
        "sessionToken",
        "session_token",
        "client_secret",
        "password",
        "passwd",
        "Authorization",
        "api_key",
        "apiKey",
        "api-key",
        "X-Api-Key",
        "cookie",
        "Set-Cookie",
        "private_key",
        "aws_secret_access_key",
        "credentials",
        "auth",
    ] {
        assert!(redactor.is_secret_name(name), "{name} is secret");
    }
    for name in [
        "max_tokens",
        "tokens",
        "query",
        "author",
        "path",
        "key_id",
        "passenger",
    ] {
        assert!(!redactor.is_secret_name(name), "{name} is not secret");
    }
}

#[test]
fn values_are_redacted_at_any_depth_and_in_arrays() {
    let redactor = Redactor::default();
    let value = json!({
        "query": "weather in Paris",
        "max_tokens": 256,
        "auth": {"user": "ana", "password": "hunter2"},
        "headers": [
            {"name": "Authorization", "Authorization": "Bearer abcdefgh12345678"},
            {"Cookie": ["a=1", "b=2"]}
        ],
        "nested": {"deeper": {"list": ["ok", CREDENTIALS[2], {"apiKey": 12345}]}},
        "token": null
    });
    let redacted = redactor.redact_value(&value);
    assert_eq!(
        redacted,
        json!({
            "query": "weather in Paris",
            "max_tokens": 256,
            "auth": REDACTED,
            "headers": [
                {"name": "Authorization", "Authorization": REDACTED},
                {"Cookie": REDACTED}
            ],
            "nested": {"deeper": {"list": ["ok", REDACTED, {"apiKey": REDACTED}]}},
            "token": null
        })
    );
    let text = redacted.to_string();
    for secret in ["hunter2", "abcdefgh", "a=1", "12345", "sk-proj"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

#[test]
fn needs_redaction_agrees_with_redact_value() {
    let redactor = Redactor::default();
    for value in [
        json!({"query": "rust tower"}),
        json!({"api_key": "abc"}),
        json!({"accessToken": null}),
        json!({"cmd": "curl -H 'Authorization: Bearer 0123456789abcdef.ghi'"}),
        json!({"q": "key=sk-abcdefghijklmnop1234"}),
        json!({"items": ["ghp_0123456789abcdefABCDEFGH"]}),
        json!({"query": "basic income, bearer bonds"}),
        json!([1, {"nested": {"password": 0}}]),
        json!({"X-Api-Key": "abc"}),
        json!({"headers": {"Authorization": "x"}}),
        json!({"header": "Basic dXNlcjpwYXNzd29yZDEyMw=="}),
        json!({"id": "AKIAIOSFODNN7EXAMPLE"}),
        json!({"t": "eyJhbGciOi.eyJzdWIiOi.sig_nature"}),
        json!({"word": "skeleton", "n": "sk-short"}),
        json!({"error": "POST /x?api_key=abc failed"}),
        json!({"error": "password: [REDACTED]"}),
        json!({"error": "max_tokens=5"}),
    ] {
        assert_eq!(
            redactor.needs_redaction(&value),
            redactor.redact_value(&value) != value,
            "{value}"
        );
    }
}

#[test]
fn secrets_are_found_by_name_and_by_shape() {
    let redactor = Redactor::default();
    let cases = [
        (json!({"query": "rust tower"}), false),
        (json!({"api_key": "abc"}), true),
        (json!({"X-Api-Key": "abc"}), true),
        (json!({"headers": {"Authorization": "x"}}), true),
        (json!({"accessToken": null}), false),
        (
            json!({"cmd": "curl -H 'Authorization: Bearer 0123456789abcdef.ghi'"}),
            true,
        ),
        (json!({"header": "Basic dXNlcjpwYXNzd29yZDEyMw=="}), true),
        (json!({"query": "basic income, bearer bonds"}), false),
        (json!({"q": "key=sk-abcdefghijklmnop1234"}), true),
        (json!({"items": ["ghp_0123456789abcdefABCDEF"]}), true),
        (json!({"id": "AKIAIOSFODNN7EXAMPLE"}), true),
        (json!({"t": "eyJhbGciOi.eyJzdWIiOi.sig_nature"}), true),
        (json!({"word": "skeleton", "n": "sk-short"}), false),
    ];
    for (value, secret) in cases {
        assert_eq!(redactor.needs_redaction(&value), secret, "{value}");
    }
}

#[test]
fn hostile_depth_is_truncated_not_a_crash() {
    let mut value = json!("leaf");
    for _ in 0..500 {
        value = Value::Array(vec![value]);
    }
    let redacted = Redactor::default().redact_value(&value);
    assert!(redacted.to_string().contains("[TRUNCATED]"));
}

#[test]
fn extra_rules_extend_the_built_in_ones() {
    let redactor = Redactor::builder()
        .secret_name("pin")
        .secret_name_ending("_sig")
        .credential_pattern(r"\bacme-[0-9]{6}\b")
        .build()
        .unwrap();
    assert!(redactor.is_secret_name("PIN"));
    assert!(redactor.is_secret_name("request-sig"));
    assert!(redactor.is_secret_name("password"), "built-in rules stay");
    assert_eq!(redactor.redact_str("code acme-123456"), "code [REDACTED]");

    let err = Redactor::builder()
        .credential_pattern("(unclosed")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "redact.credential_patterns[0]");
}

#[test]
fn eight_thousand_levels_built_in_code_are_cut_short_without_a_crash() {
    on_a_large_stack(|| {
        let value = Value::Array(vec![json!({"api_key": "abc123"}), deep_value(8_000)]);
        let deep_only = Value::Array(vec![json!("plain"), deep_value(8_000)]);
        // The redactor walks them on a thread of the default size.
        let text = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let redactor = Redactor::default();
                    assert!(redactor.needs_redaction(&value));
                    assert!(redactor.needs_redaction(&deep_only), "it is cut");
                    let redacted = redactor.redact_value(&value);
                    assert_eq!(redacted[0], json!({"api_key": REDACTED}));
                    redacted.to_string()
                })
                .join()
                .unwrap()
        });
        assert!(text.contains("[TRUNCATED]"));
        // What the redactor returns is read back by a parser limited to 128 levels.
        serde_json::from_str::<Value>(&text).unwrap();
    });
}

#[test]
fn stripe_secret_restricted_and_webhook_keys_are_cut_out_and_publishable_keys_kept() {
    let redactor = Redactor::default();
    for key in [
        "sk_live_51H8sTr1peS3cretKey0123456789abcdefABCDEF",
        "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
        "rk_live_51H8sTr1peRestr1ctedKey0123456789",
        "rk_test_51H8sTr1peRestr1ctedKey0123456789",
        "whsec_5tr1peWebh00kS3cret0123456789abcd",
    ] {
        assert_eq!(
            redactor.redact_str(&format!("stripe said no to {key}.")),
            format!("stripe said no to {REDACTED}."),
            "{key}"
        );
        assert!(redactor.needs_redaction(&json!({"note": key})), "{key}");
    }
    let publishable = "pk_live_51H8sTr1pePubl1shableKey0123456789";
    assert_eq!(redactor.redact_str(publishable), publishable);
    assert_eq!(
        redactor.redact_str("sk_live_ is a prefix"),
        "sk_live_ is a prefix"
    );
}
