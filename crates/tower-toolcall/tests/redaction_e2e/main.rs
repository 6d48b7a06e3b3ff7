//! TR-15 end to end: credentials in params and in tool errors go through the whole stack,
//! with retries, a loop detection, an idempotency hit and a breaker transition on the way, and
//! none of them reaches a log line, an audit file or a metric; `[REDACTED]` stands where they
//! were.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[path = "../support/mod.rs"]
mod support;

use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::{AuditLog, REDACTED};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolResult, ToolStack};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::fmt::MakeWriter;

const BEARER: &str = "Bearer b3arerT0kenValue0123456789";
const JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTcifQ.s1gnatureS3cretJwtPart";
const OPENAI_KEY: &str = "sk-proj-0penAiKey0123456789abcdef";
const GITHUB_TOKEN: &str = "ghp_G1tHubT0kenAbcdefghijklmnopqrstuv12";
const GITHUB_PAT: &str = "github_pat_11AAAAAAA0FineGrainedPat_0123456789abcdefghijklmnopqrs";
const AWS_KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
const SLACK_TOKEN: &str = "xoxb-123456789012-1234567890123-Sl4ckB0tT0kenValue";
const PEM_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\n\
                       MIIEowIBAAKCAQEApr1vateKeyMater1al0123456789\n\
                       -----END RSA PRIVATE KEY-----";
const PASSWORD: &str = "hunter2-correct-horse";
const API_KEY: &str = "k3y-live-a1b2c3d4e5";
const AUTHORIZATION: &str = "Token plain-authz-s3cret";
const COOKIE: &str = "sid=c00kie-s3cret-value";
const CLIENT_SECRET: &str = "cs-0auth-client-s3cret";
const STRIPE_SECRET_KEY: &str = "sk_live_51H8sTr1peS3cretKey0123456789abcdef";
const STRIPE_RESTRICTED_KEY: &str = "rk_live_51H8sTr1peRestr1ctedKey0123456789";
const STRIPE_WEBHOOK_SECRET: &str = "whsec_5tr1peWebh00kS3cret0123456789abcd";

/// What must never be seen: each secret, or for those with a plain prefix, its secret part.
const NEVER_SEEN: [&str; 13] = [
    "b3arerT0kenValue0123456789",
    JWT,
    "s1gnatureS3cretJwtPart",
    OPENAI_KEY,
    GITHUB_TOKEN,
    GITHUB_PAT,
    AWS_KEY_ID,
    SLACK_TOKEN,
    "MIIEowIBAAKCAQEApr1vateKeyMater1al0123456789",
    PASSWORD,
    API_KEY,
    "plain-authz-s3cret",
    "c00kie-s3cret-value",
];

fn never_seen() -> impl Iterator<Item = &'static str> {
    NEVER_SEEN.into_iter().chain([
        CLIENT_SECRET,
        STRIPE_SECRET_KEY,
        STRIPE_RESTRICTED_KEY,
        STRIPE_WEBHOOK_SECRET,
    ])
}

/// Params holding every secret: by shape under innocent names, in text, in arrays, and by
/// name in nested objects.
fn secret_params(mode: &str) -> Value {
    json!({
        "mode": mode,
        "query": "weather in Paris",
        "note": format!("use {OPENAI_KEY} for the upstream"),
        "headers": [
            {"name": "X-Upstream-Auth", "value": BEARER},
            {"Authorization": AUTHORIZATION},
            {"Cookie": COOKIE}
        ],
        "connection": {
            "user": "ana",
            "password": PASSWORD,
            "options": {"api_key": API_KEY, "client_secret": CLIENT_SECRET}
        },
        "seen": [GITHUB_TOKEN, GITHUB_PAT, {"aws": AWS_KEY_ID, "slack": SLACK_TOKEN}],
        "claims": JWT,
        "material": PEM_KEY,
        "billing": [STRIPE_SECRET_KEY, format!("webhook {STRIPE_WEBHOOK_SECRET}")]
    })
}

/// [`secret_params`] as every log and audit line must show them.
fn redacted_params(mode: &str) -> Value {
    json!({
        "mode": mode,
        "query": "weather in Paris",
        "note": "use [REDACTED] for the upstream",
        "headers": [
            {"name": "X-Upstream-Auth", "value": REDACTED},
            {"Authorization": REDACTED},
            {"Cookie": REDACTED}
        ],
        "connection": {
            "user": "ana",
            "password": REDACTED,
            "options": {"api_key": REDACTED, "client_secret": REDACTED}
        },
        "seen": [REDACTED, REDACTED, {"aws": REDACTED, "slack": REDACTED}],
        "claims": REDACTED,
        "material": REDACTED,
        "billing": [REDACTED, "webhook [REDACTED]"]
    })
}

/// The message of the refused login: credentials by shape, in a URL, and by name in the
/// text, as upstream errors echo them.
fn denied_message() -> String {
    format!(
        "login to https://ana:{PASSWORD}@api.example.com/v1/token?client_secret={CLIENT_SECRET}\
         &api_key={API_KEY}&scope=read refused ({BEARER}): token {GITHUB_PAT} revoked; \
         slack {SLACK_TOKEN}; session {JWT}; upstream said {{\"error\": \"invalid_client\", \
         \"password\": \"{PASSWORD}\"}}; cookie: {COOKIE}; key {PEM_KEY}"
    )
}

fn denied_message_redacted() -> &'static str {
    "login to https://[REDACTED]@api.example.com/v1/token?client_secret=[REDACTED]\
     &api_key=[REDACTED]&scope=read refused ([REDACTED]): token [REDACTED] revoked; \
     slack [REDACTED]; session [REDACTED]; upstream said {\"error\": \"invalid_client\", \
     \"password\": \"[REDACTED]\"}; cookie: [REDACTED]; key [REDACTED]"
}

fn secret_details() -> Value {
    json!({
        "request": {
            "headers": {"Authorization": BEARER, "Cookie": COOKIE, "X-Request-Id": "r-1"},
            "body": {"client_secret": CLIENT_SECRET, "password": PASSWORD}
        },
        "seen": [GITHUB_TOKEN, {"aws": AWS_KEY_ID, "note": format!("with {OPENAI_KEY}")}]
    })
}

fn redacted_details() -> Value {
    json!({
        "request": {
            "headers": {"Authorization": REDACTED, "Cookie": REDACTED, "X-Request-Id": "r-1"},
            "body": {"client_secret": REDACTED, "password": REDACTED}
        },
        "seen": [REDACTED, {"aws": REDACTED, "note": "with [REDACTED]"}]
    })
}

/// A tool that answers by `params.mode`: `ok` echoes the params, `flaky` fails its first run
/// with 503, `denied` answers 401, `down` always 503; every failure carries secrets in its
/// message and details.
fn tool(
) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError, Future: Send> + Clone + Send {
    let flaky_failed = Arc::new(AtomicBool::new(false));
    tool_fn(move |call: ToolCall| {
        let flaky_failed = flaky_failed.clone();
        async move {
            let params = call.params().as_value().clone();
            let unavailable = || {
                ToolError::from_http_status(
                    503,
                    format!(
                        "upstream unavailable; it was sent password={PASSWORD}, \
                         authorization: {AUTHORIZATION}, {AWS_KEY_ID} and {STRIPE_SECRET_KEY}"
                    ),
                )
                .with_details(secret_details())
            };
            match params["mode"].as_str() {
                Some("ok") => Ok(ToolOutput::new(json!({"echo": params}))),
                Some("flaky") if !flaky_failed.swap(true, Ordering::SeqCst) => Err(unavailable()),
                Some("flaky") => Ok(ToolOutput::new(json!({"hits": 1}))),
                Some("denied") => Err(ToolError::from_http_status(401, denied_message())
                    .with_details(secret_details())),
                _ => Err(unavailable()),
            }
        }
    })
}

fn registry() -> ToolRegistry {
    ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "agents.tools.web", "name": "search", "risk": "read-only",
             "idempotent": true, "policy": {"idempotency": {"read_cache_ttl_ms": 60000}}},
            {"namespace": "vault", "name": "login", "risk": "writes",
             "policy": {"retry": "off", "idempotency": "off",
                        "breaker": {"consecutive_failures": 2}}}
        ]}"#,
    )
    .unwrap()
}

fn call(namespace: &str, name: &str, session: &str, params: Value) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session(session)
        .actor("user-7")
        .params(params)
        .build()
        .unwrap()
}

/// Log lines written by the JSON formatter, kept in memory.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

impl LogBuffer {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tower-toolcall-redaction-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// What each call of the run answered: its status or error code, whether the cache
/// answered, and its attempts.
type Answers = Vec<(String, bool, u32)>;

/// Sends every scenario through the whole stack as the crate's builder assembles it, inside
/// the result envelope.
fn run_scenarios(audit: &AuditLog) -> Answers {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let registry = registry();
        let stack = ToolStack::builder(registry.clone())
            .trace(|trace| trace.audit(audit.clone()))
            .retry(|retry| retry.seed(7));
        #[cfg(feature = "metrics")]
        let stack = stack.on_event(tower_toolcall::trace::ToolMetrics::new(&registry));
        let mut stack = support::enveloped(&stack.build().unwrap(), tool());

        let search = |session: &str, mode: &str| {
            call("agents.tools.web", "search", session, secret_params(mode))
        };
        let mut calls = Vec::new();
        // A result, two idempotency hits, then the repeat is a loop.
        // The session key is shaped like a credential: no log line or audit file shows it.
        calls.extend((0..4).map(|_| search(STRIPE_RESTRICTED_KEY, "ok")));
        // One retried failure.
        calls.push(search("sess-flaky", "flaky"));
        // A terminal failure.
        calls.push(search("sess-denied", "denied"));
        // Every attempt fails.
        calls.push(search("sess-down", "down"));
        // Two failures open the breaker; the third call is refused.
        for n in 0..3 {
            let mut params = secret_params("down");
            params["n"] = json!(n);
            calls.push(call("vault", "login", "sess-vault", params));
        }
        let mut answers = Answers::new();
        for call in calls {
            let result: ToolResult = stack.ready().await.unwrap().call(call).await.unwrap();
            let status = match &result.error {
                Some(error) => error.code.as_str().to_owned(),
                None => result.status.as_str().to_owned(),
            };
            answers.push((status, result.from_cache, result.attempts));
        }
        answers
    })
}

#[test]
fn no_credential_reaches_a_log_line_an_audit_file_or_a_metric() {
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE)
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(logs.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let dir = temp_dir();
    let audit = AuditLog::builder(&dir).build().unwrap();

    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let answers = metrics::with_local_recorder(&recorder, || run_scenarios(&audit));
    #[cfg(not(feature = "metrics"))]
    let answers = run_scenarios(&audit);
    let stats = audit.shutdown();
    assert_eq!((stats.dropped, stats.failed), (0, 0));

    // Every path the run was meant to take, it took.
    let expected: Answers = [
        ("success", false, 1),
        ("success", true, 1),
        ("success", true, 1),
        ("LOOP_DETECTED", false, 0),
        ("success", false, 2),
        ("POLICY_DENIED", false, 1),
        ("RETRY_EXHAUSTED", false, 4),
        ("UPSTREAM_UNAVAILABLE", false, 1),
        ("UPSTREAM_UNAVAILABLE", false, 1),
        ("CIRCUIT_OPEN", false, 0),
    ]
    .into_iter()
    .map(|(status, cached, attempts)| (status.to_owned(), cached, attempts))
    .collect();
    assert_eq!(answers, expected);

    check_logs(&logs.lines());
    check_audit(&dir);
    #[cfg(feature = "metrics")]
    check_metrics(&recorder);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn assert_no_secret(text: &str, place: &str) {
    for secret in never_seen() {
        assert!(
            !text.contains(secret),
            "{secret} leaked into {place}: {text}"
        );
    }
}

fn check_logs(lines: &[String]) {
    let events: Vec<Value> = lines
        .iter()
        .map(|line| {
            assert_no_secret(line, "a log line");
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
        })
        .collect();
    let field = |event: &Value, name: &str| event["fields"][name].as_str().map(str::to_owned);
    let with_event = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| field(e, "event").as_deref() == Some(name))
            .collect()
    };

    // The paths were logged: retries, the loop, the cache hits, the breaker opening.
    assert_eq!(with_event("tool_call_retry").len(), 1 + 3);
    let opened = with_event("tool_call_circuit_state");
    assert_eq!(opened.len(), 1);
    assert_eq!(field(opened[0], "state").as_deref(), Some("open"));
    let ends = with_event("tool_call_end");
    assert_eq!(
        ends.iter()
            .filter(|e| e["fields"]["fromCache"] == json!(true))
            .count(),
        2
    );
    let loop_warning = events
        .iter()
        .find(|e| field(e, "message").is_some_and(|m| m.starts_with("Tool call loop detected")))
        .expect("the loop detection is logged");
    assert!(field(loop_warning, "signature").unwrap().contains(REDACTED));
    assert_eq!(field(loop_warning, "session_id").as_deref(), Some(REDACTED));
    assert!(field(loop_warning, "message")
        .unwrap()
        .starts_with("Tool call loop detected in session [REDACTED]: tool=search"));
    let loop_params = events
        .iter()
        .find(|e| field(e, "message").as_deref() == Some("loop detection signature"))
        .expect("the loop signature is logged at DEBUG");
    let params: Value = serde_json::from_str(&field(loop_params, "params").unwrap()).unwrap();
    assert_eq!(params, redacted_params("ok"));

    // The errors are logged redacted, where the secrets were.
    let error_of = |code: &str| -> String {
        let end = ends
            .iter()
            .find(|e| field(e, "errorCode").as_deref() == Some(code))
            .unwrap_or_else(|| panic!("no tool_call_end with {code}"));
        field(end, "error").unwrap()
    };
    assert_eq!(error_of("POLICY_DENIED"), denied_message_redacted());
    let unavailable = "upstream unavailable; it was sent password=[REDACTED], \
                       authorization: [REDACTED], [REDACTED] and [REDACTED]";
    assert_eq!(error_of("UPSTREAM_UNAVAILABLE"), unavailable);
    assert_eq!(
        error_of("RETRY_EXHAUSTED"),
        format!("search failed 4 times: {unavailable}")
    );
}

fn check_audit(dir: &Path) {
    for stream in ["calls.jsonl", "results.jsonl", "events.jsonl"] {
        let text = std::fs::read_to_string(dir.join(stream)).unwrap();
        assert_no_secret(&text, stream);
    }
    let calls = read_lines(&dir.join("calls.jsonl"));
    assert_eq!(calls.len(), 10);
    for line in &calls {
        let params = &line["call"]["payload"]["params"];
        let mut expected = redacted_params(params["mode"].as_str().unwrap());
        if let Some(n) = params.get("n") {
            expected["n"] = n.clone();
        }
        assert_eq!(params, &expected);
    }

    let results: Vec<Value> = read_lines(&dir.join("results.jsonl"))
        .into_iter()
        .map(|line| line["result"].clone())
        .collect();
    assert_eq!(results.len(), 10);
    assert_eq!(
        results[0]["output"]["content"]["echo"],
        redacted_params("ok")
    );
    let error_of = |code: &str| {
        results
            .iter()
            .find(|r| r["error"]["code"] == code)
            .unwrap_or_else(|| panic!("no result with {code}"))["error"]
            .clone()
    };
    let denied = error_of("POLICY_DENIED");
    assert_eq!(denied["message"], denied_message_redacted());
    assert_eq!(denied["details"], redacted_details());
    let unavailable = error_of("UPSTREAM_UNAVAILABLE");
    assert_eq!(unavailable["details"], redacted_details());
    let exhausted = error_of("RETRY_EXHAUSTED");
    assert_eq!(
        exhausted["details"]["lastError"]["message"],
        "upstream unavailable; it was sent password=[REDACTED], authorization: [REDACTED], \
         [REDACTED] and [REDACTED]"
    );

    let events = read_lines(&dir.join("events.jsonl"));
    // A retried attempt: a failed one that another attempt of the same run follows.
    let started = |run: &Value, attempt: u64| {
        events
            .iter()
            .any(|e| e["type"] == "step.started" && e["runId"] == *run && e["attempt"] == attempt)
    };
    let retried = events
        .iter()
        .filter(|e| {
            e["type"] == "step.failed" && started(&e["runId"], e["attempt"].as_u64().unwrap() + 1)
        })
        .count();
    assert_eq!(retried, 1 + 3);
}

#[cfg(feature = "metrics")]
fn check_metrics(recorder: &metrics_util::debugging::DebuggingRecorder) {
    let mut series = Vec::new();
    for (key, _, _, _) in recorder.snapshotter().snapshot().into_vec() {
        let key = key.key();
        let mut text = key.name().to_owned();
        for label in key.labels() {
            text.push_str(&format!(" {}={}", label.key(), label.value()));
        }
        assert_no_secret(&text, "a metric");
        series.push(text);
    }
    for expected in [
        "toolcall_tool_retry_attempts_total tool=agents.tools.web::search reason=UPSTREAM_UNAVAILABLE",
        "toolcall_tool_idempotency_hits_total tool=agents.tools.web::search state=completed",
        "toolcall_tool_loop_detections_total tool=agents.tools.web::search action=break",
        "toolcall_tool_circuit_breaker_transitions_total tool=vault::login from_state=closed to_state=open",
    ] {
        assert!(series.iter().any(|s| s == expected), "no {expected} in {series:#?}");
    }
}
