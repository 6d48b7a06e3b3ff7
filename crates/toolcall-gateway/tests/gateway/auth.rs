//! Who calls the gateway, as an outsider would find it: two users of one client program who
//! share nothing, the official SDK clients with a bearer token and without one, a role that
//! sees and calls only its tools, DNS-rebinding requests, a gateway told to listen beyond the
//! machine without authentication, and an untrusted upstream looking for the gateway's
//! secrets; and a caller that says its call is urgent, believed only as far as its role
//! allows.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{
    audited, call, error_code, everything_upstream, http, kit, lively, python, time_upstream,
    typescript, written, HttpGateway, GATEWAY,
};

const ALICE: &str = "k-alice-0123456789abcdef";
const BOB: &str = "k-bob-0123456789abcdef00";
const CAROL: &str = "k-carol-0123456789abcdef";

/// The keys of alice (every tool), bob (the same client program, the time tools and echo)
/// and carol (the time tools), in the gateway's environment.
const KEYS: [(&str, &str); 3] = [
    ("TEST_ALICE_KEY", ALICE),
    ("TEST_BOB_KEY", BOB),
    ("TEST_CAROL_KEY", CAROL),
];

/// `[auth]` with the three keys and their roles, and a quota of `everything__echo` per
/// principal.
const AUTH: &str = r#"
[auth]
mode = "api-keys"
[[auth.keys]]
id = "alice"
tenant = "acme"
roles = ["all"]
key_env = "TEST_ALICE_KEY"
[[auth.keys]]
id = "bob"
tenant = "acme"
roles = ["echo", "time"]
key_env = "TEST_BOB_KEY"
[[auth.keys]]
id = "carol"
roles = ["time"]
key_env = "TEST_CAROL_KEY"
[[auth.roles]]
name = "all"
allow = ["*"]
[[auth.roles]]
name = "echo"
allow = ["everything__echo"]
[[auth.roles]]
name = "time"
allow = ["time__*"]

[policy]
[[policy.tools]]
namespace = "everything"
name = "echo"
risk = "read-only"
idempotent = true
[policy.tools.policy]
rate_limit = { per_second = 1, burst = 3, key = "tool_actor" }
"#;

async fn gateway(name: &str) -> HttpGateway {
    let config = written(
        name,
        &format!("{}\n{}\n{AUTH}", time_upstream(), everything_upstream()),
    );
    HttpGateway::start_in(&[config.as_os_str()], &KEYS).await
}

/// Sends `request` (its head without the final blank line) with `body`: the status, the
/// headers and the body.
async fn exchange(address: &str, head: &str, body: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{head}\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status, head.to_owned(), body.to_owned())
}

/// `POST /v1/tools/call` of `envelope` with `key`'s bearer token: the status and the result.
async fn call_as(gateway: &HttpGateway, key: &str, envelope: &Value) -> (u16, Value) {
    call_at(&gateway.address, key, envelope).await
}

/// [`call_as`] to the gateway at `address`.
async fn call_at(address: &str, key: &str, envelope: &Value) -> (u16, Value) {
    let head = format!(
        "POST /v1/tools/call HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         content-type: application/json"
    );
    let (status, _, body) = exchange(address, &head, &envelope.to_string()).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// An envelope of `everything__echo` saying it comes from `actor` in `session`.
fn echo(message: &str, actor: &str, session: &str, key: Option<&str>) -> Value {
    let mut envelope = json!({
        "contractVersion": "1.1", "requestId": ulid(), "toolNamespace": "everything",
        "toolName": "echo", "target": {"sessionKey": session, "actorId": actor, "tenantId": "acme"},
        "payload": {"version": "1.0", "params": {"message": message}}
    });
    if let Some(key) = key {
        envelope["payload"]["idempotencyKey"] = json!(key);
    }
    envelope
}

fn ulid() -> String {
    format!(
        "r-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[tokio::test]
async fn two_users_of_one_client_share_no_key_loop_or_quota() {
    let gateway = gateway("isolation").await;
    // The quota is per principal: bob's calls at once use up his burst of 3 (six calls: a
    // slow machine may refill one), not alice's.
    let mut statuses = Vec::new();
    for i in 0..6 {
        let (status, _) = call_as(&gateway, BOB, &echo(&format!("b{i}"), "x", "s", None)).await;
        statuses.push(status);
    }
    assert_eq!(&statuses[..3], [200, 200, 200], "{statuses:?}");
    assert!(statuses.contains(&429), "bob is limited: {statuses:?}");
    let (status, body) = call_as(&gateway, ALICE, &echo("a0", "x", "s", None)).await;
    assert_eq!(status, 200, "bob's quota is not alice's: {body}");

    // Alice's key, then bob with her key and her arguments: his own run, not her result.
    let paris = |key: &str| {
        json!({
            "contractVersion": "1.1", "requestId": ulid(), "toolNamespace": "time",
            "toolName": "get_current_time",
            "target": {"sessionKey": "s", "actorId": "claude-code", "tenantId": "acme"},
            "payload": {"version": "1.0", "params": {"timezone": "Europe/Paris"}, "idempotencyKey": key}
        })
    };
    let (status, first) = call_as(&gateway, ALICE, &paris("k-1")).await;
    assert_eq!(
        (status, &first["fromCache"]),
        (200, &json!(false)),
        "{first}"
    );
    let (status, probe) = call_as(&gateway, BOB, &paris("k-1")).await;
    assert_eq!(status, 200, "{probe}");
    assert_eq!(probe["fromCache"], false, "not alice's result: {probe}");
    // With other arguments the key is not "reused": it is bob's own.
    let mut rome = paris("k-1");
    rome["payload"]["params"]["timezone"] = json!("Europe/Rome");
    let (_, other) = call_as(&gateway, CAROL, &rome).await;
    assert_eq!(other["status"], "success", "{other}");
    // Alice's own key is still hers: her first result.
    let (_, again) = call_as(&gateway, ALICE, &paris("k-1")).await;
    assert_eq!(again["fromCache"], true, "{again}");
    assert_eq!(again["output"], first["output"], "{again}");

    // A loop is per principal and session, whatever the session is called: carol's three
    // identical reads leave alice's session alone. (A read whose answer does not change
    // with the clock: a poller whose result changes is never a loop.)
    let tokyo = || {
        json!({
            "contractVersion": "1.1", "requestId": ulid(), "toolNamespace": "time",
            "toolName": "convert_time", "target": {"sessionKey": "shared-name", "actorId": "alice"},
            "payload": {"version": "1.0", "params": {
                "source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"
            }}
        })
    };
    for _ in 0..3 {
        let (status, body) = call_as(&gateway, CAROL, &tokyo()).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = call_as(&gateway, ALICE, &tokyo()).await;
    assert_eq!(status, 200, "carol's calls are not alice's: {body}");
    let (status, body) = call_as(&gateway, CAROL, &tokyo()).await;
    assert_eq!(status, 409, "carol's own 4th is her loop: {body}");
}

#[tokio::test]
async fn the_sdk_clients_call_with_a_bearer_token_and_are_refused_without() {
    let gateway = gateway("sdk-bearer").await;
    let url = format!("http://{}/mcp", gateway.address);
    let plan = |version: &str, headers: Value| {
        json!({
            "transport": {"kind": "http", "url": url, "headers": headers},
            "protocolVersion": version,
            "clientName": "claude-code",
            "steps": [
                {"op": "listTools"},
                call("time__get_current_time", json!({"timezone": "Europe/Paris"}), json!({})),
                call("everything__echo", json!({"message": "hi"}), json!({})),
            ],
        })
    };
    let bearer = |key: &str| json!({"Authorization": format!("Bearer {key}")});
    for version in ["2025-11-25", "2026-07-28"] {
        let report = python(plan(version, bearer(CAROL))).await;
        let steps = report["steps"].as_array().expect("steps");
        let names: Vec<&str> = steps[0]["ok"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{report}"))
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(!names.is_empty(), "{report}");
        assert!(names.iter().all(|n| n.starts_with("time__")), "{names:?}");
        assert_eq!(steps[1]["ok"]["isError"], false, "{}", steps[1]);
        // A tool carol may not see: refused in the words of one that is not there.
        assert_eq!(error_code(&steps[2]), Some("POLICY_DENIED"), "{}", steps[2]);
    }
    let report = typescript(plan("2025-11-25", bearer(BOB))).await;
    let steps = report["steps"].as_array().expect("steps");
    assert_eq!(steps[2]["ok"]["isError"], false, "{report}");

    // Without a token, or with a wrong one: nothing the SDKs send gets through.
    for headers in [json!({}), bearer("k-nobody-0123456789abcd")] {
        refused_throughout(&python(plan("2025-11-25", headers.clone())).await);
        refused_throughout(&python(plan("2026-07-28", headers)).await);
    }
    refused_throughout(&typescript(plan("2025-11-25", json!({}))).await);
    // The raw answer names the scheme.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream",
        gateway.address
    );
    let (status, head, _) = exchange(&gateway.address, &head, "{}").await;
    assert_eq!(status, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
}

/// A report of a client whose every step failed: no tool listed, none called.
fn refused_throughout(report: &Value) {
    let steps = report["steps"].as_array().expect("steps");
    assert!(!steps.is_empty(), "{report}");
    for step in steps {
        assert!(step.get("ok").is_none(), "{report}");
        assert!(step.get("error").is_some(), "{report}");
    }
}

#[tokio::test]
async fn a_rebinding_host_or_origin_is_refused_on_every_route() {
    let config = written("rebinding", &time_upstream());
    let gateway = HttpGateway::start(&config).await;
    let envelope = json!({
        "contractVersion": "1.1", "requestId": "r-rebind", "toolNamespace": "time",
        "toolName": "get_current_time", "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"timezone": "Europe/Paris"}}
    })
    .to_string();
    for (method, path, body) in [
        ("POST", "/v1/tools/call", envelope.as_str()),
        ("GET", "/v1/tools", ""),
        ("GET", "/metrics", ""),
        ("POST", "/mcp", "{}"),
    ] {
        for (host, origin) in [
            ("evil.example:8080", None),
            ("127.0.0.1", Some("http://evil.example")),
        ] {
            let mut head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n\
                 accept: application/json, text/event-stream"
            );
            if let Some(origin) = origin {
                head.push_str(&format!("\r\nOrigin: {origin}"));
            }
            let (status, _, body) = exchange(&gateway.address, &head, body).await;
            assert_eq!(
                status, 403,
                "{method} {path} from {host} {origin:?}: {body}"
            );
        }
    }
    let (status, _) = gateway.get("/metrics").await;
    assert_eq!(status, 200, "the gateway's own name passes");
}

#[tokio::test]
async fn listening_beyond_loopback_without_auth_is_refused_unless_told() {
    let config = written("exposed", &time_upstream());
    let run = |more: &[&str]| {
        let mut command = Command::new(GATEWAY);
        command
            .arg("--config")
            .arg(&config)
            .args(["--listen", "0.0.0.0:0"])
            .args(more)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        command
    };
    let refused = tokio::time::timeout(Duration::from_secs(60), run(&[]).output())
        .await
        .unwrap()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--allow-unauthenticated"), "{said}");
    assert!(said.contains("[auth]"), "{said}");

    // Told: it starts, and warns of what is exposed (it still needs the names it answers to).
    let names = written(
        "exposed-named",
        &format!("{}\n[http]\nallowed_hosts = [\"*\"]\n", time_upstream()),
    );
    let mut child = Command::new(GATEWAY)
        .arg("--config")
        .arg(&names)
        .args(["--listen", "0.0.0.0:0", "--allow-unauthenticated"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(line.starts_with("listening on 0.0.0.0:"), "{line}");
    child.kill().await.unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    assert!(stderr.contains("without authentication"), "{stderr}");
}

#[tokio::test]
async fn an_untrusted_stdio_upstream_sees_none_of_the_gateways_secrets() {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let seen = dir.join("env.txt");
    let config = written(
        "env",
        &format!(
            "[[upstreams]]\nname = \"nosy\"\ncommand = \"sh\"\nargs = [\"-c\", \"env > {} && exec {}\"]\nenv = {{ NOSY_SETTING = \"given\" }}\n",
            seen.display(),
            kit(".venv/bin/mcp-server-time").display()
        ),
    );
    let gateway = HttpGateway::start_in(
        &[config.as_os_str()],
        &[
            ("TOOLCALL_ADMIN_TOKEN", "admin-token-SECRET-0123456789"),
            ("AWS_SECRET_ACCESS_KEY", "aws-SECRET"),
            ("TEST_ALICE_KEY", ALICE),
        ],
    )
    .await;
    let env = std::fs::read_to_string(&seen).unwrap();
    assert!(!env.contains("SECRET"), "{env}");
    assert!(!env.contains("TOOLCALL_"), "{env}");
    assert!(
        env.contains("NOSY_SETTING=given"),
        "its own env is given: {env}"
    );
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    drop(gateway);
}

/// The public key of RFC 7517's appendix A.1, as the JWKS of a gateway whose tokens are not
/// the test's business.
const JWKS: &str = r#"{"keys": [{"kty": "EC", "crv": "P-256", "kid": "1", "use": "sig",
  "x": "MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4",
  "y": "4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"}]}"#;

#[tokio::test]
async fn as_a_resource_server_it_serves_its_metadata_and_audits_refusals() {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-oauth-{}", std::process::id()));
    let audit = dir.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, JWKS).unwrap();
    let config = written(
        "oauth",
        &format!(
            "{}\n[audit]\npath = \"{}\"\n[auth]\nmode = \"oauth\"\nissuer = \"https://auth.example.com/\"\n\
             jwks_file = \"{}\"\nauthorization_servers = [\"https://auth.example.com/\"]\n\
             scopes_supported = [\"mcp:tools\"]\n",
            time_upstream(),
            audit.display(),
            jwks.display()
        ),
    );
    let gateway = HttpGateway::start(&config).await;
    let address = gateway.address.clone();
    let (status, document) = gateway
        .get("/.well-known/oauth-protected-resource/mcp")
        .await;
    assert_eq!(status, 200, "{document}");
    let document: Value = serde_json::from_str(&document).unwrap();
    // RFC 9728 §2: `resource` is required; MCP asks for the authorization servers.
    assert_eq!(document["resource"], format!("http://{address}/mcp"));
    assert_eq!(
        document["authorization_servers"],
        json!(["https://auth.example.com/"])
    );
    assert_eq!(document["bearer_methods_supported"], json!(["header"]));
    assert_eq!(document["scopes_supported"], json!(["mcp:tools"]));
    assert_eq!(
        gateway.get("/.well-known/oauth-protected-resource").await.0,
        200
    );

    // Each SDK client without a token is refused; the answer names the metadata.
    let plan = json!({
        "transport": {"kind": "http", "url": format!("http://{address}/mcp")},
        "protocolVersion": "2025-11-25",
        "clientName": "claude-code",
        "steps": [{"op": "listTools"}],
    });
    refused_throughout(&python(plan).await);
    let head = format!(
        "POST /v1/tools/call HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer not.a.jwt\r\n\
         content-type: application/json"
    );
    let (status, head, body) = exchange(&address, &head, "{}").await;
    assert_eq!(status, 401, "{body}");
    let challenge = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("www-authenticate:"))
        .expect("WWW-Authenticate");
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"http://{address}/.well-known/oauth-protected-resource/mcp\""
        )),
        "{challenge}"
    );
    let lines = audited(gateway, &audit).await;
    assert!(lines.contains("auth.refused"), "{lines}");
    assert!(
        !lines.contains("not.a.jwt"),
        "the token is never written: {lines}"
    );
}

#[tokio::test]
async fn a_call_of_a_tool_its_caller_may_not_see_is_audited() {
    let dir = std::env::temp_dir().join(format!("toolcall-gateway-denied-{}", std::process::id()));
    let audit = dir.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    let config = written(
        "denied",
        &format!(
            "{}\n{}\n[audit]\npath = \"{}\"\n{AUTH}",
            time_upstream(),
            everything_upstream(),
            audit.display()
        ),
    );
    let gateway = HttpGateway::start_in(&[config.as_os_str()], &KEYS).await;
    let (status, body) = call_as(&gateway, CAROL, &echo("hi", "carol", "s", None)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "POLICY_DENIED");
    let (status, _) = call_as(&gateway, ALICE, &echo("hi", "alice", "s", None)).await;
    assert_eq!(status, 200);
    let lines = audited(gateway, &audit).await;
    let denied: Vec<Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["type"] == "auth.denied")
        .collect();
    assert_eq!(denied.len(), 1, "{lines}");
    assert_eq!(denied[0]["tool"], "everything__echo", "{}", denied[0]);
    assert_eq!(denied[0]["payload"]["actorId"], "carol", "{}", denied[0]);
    // The call that ran names its principal and tenant.
    assert!(
        lines.contains("\"actorId\":\"alice\"") && lines.contains("\"tenantId\":\"acme\""),
        "{lines}"
    );
}

#[tokio::test]
async fn metrics_can_have_an_address_of_their_own() {
    let config = written(
        "metrics-apart",
        &format!(
            "{}\n[http]\nmetrics_listen = \"127.0.0.1:0\"\n",
            time_upstream()
        ),
    );
    let mut child = Command::new(GATEWAY)
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let mut printed = Vec::new();
    for _ in 0..2 {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        printed.push(line);
    }
    let main = printed[0].strip_prefix("listening on ").unwrap().to_owned();
    let metrics = printed[1].strip_prefix("metrics on ").unwrap().to_owned();
    let get = |address: String, path: &'static str| async move {
        let head = format!("GET {path} HTTP/1.1\r\nHost: {address}");
        exchange(&address, &head, "").await
    };
    assert_eq!(get(metrics.clone(), "/metrics").await.0, 200);
    assert_eq!(
        get(main.clone(), "/metrics").await.0,
        404,
        "not beside the calls"
    );
    assert_eq!(get(main, "/healthz").await.0, 200);
    let _ = child.kill().await;
}

#[tokio::test]
async fn a_fresh_session_id_per_request_escapes_no_loop() {
    // Single-user: every stateless request of the user counts in one session, whatever
    // Mcp-Session-Id it names.
    let config = written(
        "fresh-session",
        &format!("{}\n{}", time_upstream(), everything_upstream()),
    );
    let gateway = HttpGateway::start(&config).await;
    let mut codes = Vec::new();
    for i in 0..4 {
        let report = python(json!({
            "transport": {
                "kind": "http", "url": format!("http://{}/mcp", gateway.address),
                "headers": {"Mcp-Session-Id": format!("made-up-{i}")}
            },
            "protocolVersion": "2026-07-28",
            "clientName": format!("client-{i}"),
            "steps": [call("everything__echo", json!({"message": "again"}), json!({}))],
        }))
        .await;
        codes.push(error_code(&report["steps"][0]).map(str::to_owned));
    }
    assert_eq!(
        codes,
        [None, None, None, Some("LOOP_DETECTED".to_owned())],
        "the 4th identical call is a loop"
    );
}

/// Opens a 2025-11-25 session on `/mcp` with `key`'s bearer token: the status, and the
/// session's id when one opened.
async fn initialize_as(address: &str, key: &str) -> (u16, Option<String>) {
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}
    });
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream"
    );
    let (status, head, _) = exchange(address, &head, &initialize.to_string()).await;
    let id = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_owned())
    });
    (status, id)
}

/// `method` on `/mcp` in the session `id` with `key`'s bearer token: the status.
async fn in_session(address: &str, key: &str, id: &str, method: &str) -> u16 {
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string();
    let (body, kind) = match method {
        "DELETE" => ("", ""),
        _ => (ping.as_str(), "\r\ncontent-type: application/json"),
    };
    let head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         accept: application/json, text/event-stream\r\nmcp-session-id: {id}\r\n\
         mcp-protocol-version: 2025-11-25{kind}"
    );
    exchange(address, &head, body).await.0
}

#[tokio::test]
async fn a_principal_holds_a_bounded_number_of_sessions_and_only_its_own() {
    let config = written(
        "principal-sessions",
        &format!(
            "[http]\nmax_sessions_per_principal = 2\n{}\n{AUTH}",
            everything_upstream()
        ),
    );
    let gateway = HttpGateway::start_in(&[config.as_os_str()], &KEYS).await;
    let address = gateway.address.as_str();
    let (_, first) = initialize_as(address, ALICE).await;
    let first = first.expect("alice's first session");
    let (_, second) = initialize_as(address, ALICE).await;
    second.expect("alice's second session");
    // Her third is refused, with a time to come back; bob, of her tenant, still opens his.
    let (status, refused) = initialize_as(address, ALICE).await;
    assert_eq!((status, refused), (429, None));
    let (status, bobs) = initialize_as(address, BOB).await;
    assert_eq!(status, 200);
    let bobs = bobs.expect("bob's session");
    // Her session id reaches nothing of hers in bob's hands: not a ping, not its end.
    assert_eq!(in_session(address, BOB, &first, "POST").await, 404);
    assert_eq!(in_session(address, BOB, &first, "DELETE").await, 404);
    assert_eq!(in_session(address, ALICE, &bobs, "POST").await, 404);
    assert_eq!(in_session(address, ALICE, &first, "POST").await, 200);
    // Ending one of hers makes room for another.
    assert_eq!(in_session(address, ALICE, &first, "DELETE").await, 200);
    let (status, third) = initialize_as(address, ALICE).await;
    assert_eq!(status, 200);
    assert!(third.is_some());
}

/// A call of `lively::name` holding the upstream `hold_ms`, with `priority`.
fn held(name: &str, hold_ms: u64, priority: &str) -> Value {
    json!({
        "contractVersion": "1.1", "requestId": ulid(), "toolNamespace": "lively",
        "toolName": name, "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"holdMs": hold_ms},
                    "callHints": {"priority": priority}}
    })
}

/// Which tool of `upstream` starts a call next: `scan` or `send`.
async fn starts_next(upstream: &lively::Lively) -> &'static str {
    let (scans, sends) = (upstream.scan.counts().0, upstream.send.counts().0);
    for _ in 0..250 {
        if upstream.scan.counts().0 > scans {
            return "scan";
        }
        if upstream.send.counts().0 > sends {
            return "send";
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no queued call started");
}

/// Waits until `upstream`'s `send` has started `n` calls.
async fn sends_started(upstream: &lively::Lively, n: u64) {
    for _ in 0..100 {
        if upstream.send.counts().0 == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{n} sends never started: {:?}", upstream.send.counts());
}

#[tokio::test]
async fn a_caller_goes_ahead_in_a_queue_only_as_far_as_its_role_allows() {
    let upstream = lively::Lively::default();
    let url = http::serve(upstream.clone()).await;
    let text = format!(
        "[servers.lively]\nmax_concurrent = 1\nmax_queued = 4\n\n\
         [auth]\nmode = \"api-keys\"\n\
         [[auth.keys]]\nid = \"alice\"\nroles = [\"oncall\"]\nkey_env = \"TEST_ALICE_KEY\"\n\
         [[auth.keys]]\nid = \"bob\"\nroles = [\"dev\"]\nkey_env = \"TEST_BOB_KEY\"\n\
         [[auth.roles]]\nname = \"oncall\"\nallow = [\"*\"]\nmax_priority = \"high\"\n\
         [[auth.roles]]\nname = \"dev\"\nallow = [\"*\"]\n\n\
         [[upstreams]]\nname = \"lively\"\nurl = \"{url}\"\ntrust = \"trusted\"\n"
    );
    let config = written("priority-cap", &text);
    let gateway = HttpGateway::start_in(&[config.as_os_str()], &KEYS[..2]).await;
    let send = |key: &'static str, envelope: Value| {
        let address = gateway.address.clone();
        tokio::spawn(async move { call_at(&address, key, &envelope).await })
    };

    // A send holds the server's only place while alice's normal scan, then bob's send that
    // says it is urgent, wait: bob's role grants no priority, so his send waits behind her
    // scan, which came first.
    let holder = send(ALICE, held("send", 1500, "normal"));
    sends_started(&upstream, 1).await;
    let first = send(ALICE, held("scan", 500, "normal"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = send(BOB, held("send", 500, "high"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(upstream.scan.counts().0, 0, "both wait");
    assert_eq!(starts_next(&upstream).await, "scan", "bob's high is capped");
    for answer in [holder, first, second] {
        assert_eq!(answer.await.unwrap().0, 200);
    }

    // The other way round: alice's role grants `high`, and her urgent scan goes ahead of
    // bob's send, which came first.
    let holder = send(BOB, held("send", 1500, "normal"));
    sends_started(&upstream, 3).await;
    let first = send(BOB, held("send", 500, "normal"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = send(ALICE, held("scan", 500, "high"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        starts_next(&upstream).await,
        "scan",
        "alice's high is granted"
    );
    for answer in [holder, first, second] {
        assert_eq!(answer.await.unwrap().0, 200);
    }
}
