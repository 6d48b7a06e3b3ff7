//! The gateway in front of a host's servers, as its README's host recipe sets it up
//! (`--stdio --mcp-json servers.json`, the servers untrusted): the reference servers
//! `mcp-server-time`, `server-everything`, `server-filesystem` and `server-memory`, driven by
//! the official SDK clients with an elicitation handler.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::{audited, call, error_code, kit, python, typescript, written, HttpGateway, GATEWAY};

/// A directory of its own for `name`, made anew.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolcall-host-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Claude Desktop's file for the four reference servers; the filesystem server serves
/// `dir/files`, the memory server keeps its graph in `dir`.
fn servers_json(dir: &Path) -> PathBuf {
    let files = dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let module = |name: &str| {
        kit(&format!(
            "node_modules/@modelcontextprotocol/{name}/dist/index.js"
        ))
        .display()
        .to_string()
    };
    let file = dir.join("servers.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {
            "time": {"command": kit(".venv/bin/mcp-server-time")},
            "everything": {"command": "node", "args": [module("server-everything"), "stdio"]},
            "filesystem": {"command": "node", "args": [module("server-filesystem"), files]},
            "memory": {
                "command": "node", "args": [module("server-memory")],
                "env": {"MEMORY_FILE_PATH": dir.join("memory.jsonl")}
            }
        }})
        .to_string(),
    )
    .unwrap();
    file
}

/// The text of a successful step's first content block.
fn text(step: &Value) -> &str {
    assert_eq!(step["ok"]["isError"], false, "{step}");
    step["ok"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

fn from_cache(step: &Value) -> bool {
    step["ok"]["_meta"]["rs.tower-toolcall/fromCache"] == true
}

/// The steps of a session in front of the four servers, writing under `files`.
fn recipe_steps(files: &Path, who: &str) -> Vec<Value> {
    let note = files.join(format!("{who}.txt"));
    let paris = json!({"timezone": "Europe/Paris"});
    let person =
        json!({"entities": [{"name": who, "entityType": "person", "observations": ["x"]}]});
    vec![
        json!({"op": "listTools"}),
        // Reads: no confirmation.
        call(
            "time__get_current_time",
            json!({"timezone": "UTC"}),
            json!({}),
        ),
        call("memory__read_graph", json!({}), json!({})),
        call("filesystem__list_allowed_directories", json!({}), json!({})),
        call("everything__get-sum", json!({"a": 2, "b": 3}), json!({})),
        // A write asks; a read after it sees it; another write, another read.
        call(
            "filesystem__write_file",
            json!({"path": note, "content": "one"}),
            json!({}),
        ),
        call(
            "filesystem__read_text_file",
            json!({"path": note}),
            json!({}),
        ),
        call(
            "filesystem__write_file",
            json!({"path": note, "content": "two"}),
            json!({}),
        ),
        call(
            "filesystem__read_text_file",
            json!({"path": note}),
            json!({}),
        ),
        // The same write sent twice: it runs once.
        call("memory__create_entities", person.clone(), json!({})),
        call("memory__create_entities", person, json!({})),
        call("memory__read_graph", json!({}), json!({})),
        // A loop: the 4th identical read is stopped.
        call("time__get_current_time", paris.clone(), json!({})),
        call("time__get_current_time", paris.clone(), json!({})),
        call("time__get_current_time", paris.clone(), json!({})),
        call("time__get_current_time", paris, json!({})),
    ]
}

/// What `recipe_steps` gives a client that accepts every confirmation.
fn check_the_recipe(report: &Value, who: &str) {
    let steps = report["steps"].as_array().expect("steps");
    let tools = steps[0]["ok"]["tools"].as_array().expect("a tool list");
    assert_eq!(tools.len(), 38, "{}", steps[0]);
    let reads = tools
        .iter()
        .filter(|tool| tool["annotations"]["readOnlyHint"] == true)
        .count();
    assert_eq!(reads, 24, "the tools that run at once");
    // Every read ran, and none asked.
    for step in &steps[1..5] {
        assert!(error_code(step).is_none(), "{step}");
        text(step);
    }
    assert!(text(&steps[4]).contains('5'), "{}", steps[4]);
    // Each write asked once and ran; each read after a write saw it, from the server.
    assert!(error_code(&steps[5]).is_none(), "{}", steps[5]);
    assert_eq!(text(&steps[6]), "one", "{}", steps[6]);
    assert!(!from_cache(&steps[6]), "{}", steps[6]);
    assert!(error_code(&steps[7]).is_none(), "{}", steps[7]);
    assert_eq!(text(&steps[8]), "two", "a stale read: {}", steps[8]);
    assert!(!from_cache(&steps[8]), "{}", steps[8]);
    // The write sent again is answered from the first one's record: one entity.
    assert!(!from_cache(&steps[9]), "{}", steps[9]);
    assert!(from_cache(&steps[10]), "{}", steps[10]);
    let graph: Value = serde_json::from_str(text(&steps[11])).unwrap();
    let named: Vec<&Value> = graph["entities"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == who)
        .collect();
    assert_eq!(named.len(), 1, "{graph}");
    // The loop: three reads, then the 4th is stopped, with words a model can act on.
    for step in &steps[12..15] {
        assert!(error_code(step).is_none(), "{step}");
    }
    assert_eq!(
        error_code(&steps[15]),
        Some("LOOP_DETECTED"),
        "{}",
        steps[15]
    );
    let refusal = steps[15]["ok"]["content"][0]["text"].as_str().unwrap();
    assert!(
        refusal.contains("neither is any repeat of it") && !refusal.contains("Session stopped"),
        "{refusal}"
    );
    // Four confirmations asked: two file writes, and the entity written and sent again.
    let elicited: Vec<&str> = report["elicited"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(elicited.len(), 4, "{elicited:?}");
    assert!(
        elicited[0].contains("filesystem__write_file")
            && elicited[0].contains("server filesystem")
            && elicited[0].contains("\"one\""),
        "{}",
        elicited[0]
    );
}

#[tokio::test]
async fn the_host_recipe_reads_at_once_and_asks_before_a_write() {
    let dir = fresh_dir("recipe");
    let servers = servers_json(&dir);
    let gateway = |who: &str, elicitation: &str| {
        json!({
            "transport": {
                "kind": "stdio", "command": GATEWAY,
                "args": ["--stdio", "--mcp-json", servers],
                "env": {"RUST_LOG": "warn"}
            },
            "protocolVersion": "2025-11-25",
            "clientName": format!("host-{who}"),
            "elicitation": elicitation,
            "steps": recipe_steps(&dir.join("files"), who),
        })
    };
    let report = python(gateway("ada", "accept")).await;
    check_the_recipe(&report, "ada");
    let report = typescript(gateway("bob", "accept")).await;
    check_the_recipe(&report, "bob");

    // Declined: the write does not run, and the model is told the user said no.
    let note = dir.join("files").join("carol.txt");
    let report = python(json!({
        "transport": {
            "kind": "stdio", "command": GATEWAY,
            "args": ["--stdio", "--mcp-json", servers],
            "env": {"RUST_LOG": "warn"}
        },
        "protocolVersion": "2025-11-25",
        "elicitation": "decline",
        "steps": [call("filesystem__write_file", json!({"path": note, "content": "no"}), json!({}))],
    }))
    .await;
    let step = &report["steps"][0];
    assert_eq!(error_code(step), Some("POLICY_DENIED"), "{step}");
    assert!(
        step["ok"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("the user declined the call of filesystem__write_file"),
        "{step}"
    );
    assert!(!note.exists());
}

/// The gateway over HTTP in front of the host's servers, with `config` and an audit log in
/// `dir/audit`.
async fn http_gateway(dir: &Path, config: &str) -> HttpGateway {
    let servers = servers_json(dir);
    let audit = dir.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    let config = written(
        &format!("host-{}", dir.file_name().unwrap().to_string_lossy()),
        &format!("[audit]\npath = \"{}\"\n{config}", audit.display()),
    );
    HttpGateway::start_with(&[
        config.as_os_str(),
        "--mcp-json".as_ref(),
        servers.as_os_str(),
    ])
    .await
}

#[tokio::test]
async fn confirmation_under_each_protocol_version_and_without_elicitation() {
    let dir = fresh_dir("confirm");
    let gateway = http_gateway(&dir, "").await;
    let url = format!("http://{}/mcp", gateway.address);
    let note = |name: &str| dir.join("files").join(name);
    let write = |name: &str| {
        call(
            "filesystem__write_file",
            json!({"path": note(name), "content": name}),
            json!({}),
        )
    };

    // 2026-07-28: the confirmation travels in an input_required result, answered by the SDK.
    let report = python(json!({
        "transport": {"kind": "http", "url": url},
        "protocolVersion": "2026-07-28",
        "elicitation": "accept",
        "steps": [write("stateless.txt")],
    }))
    .await;
    assert!(error_code(&report["steps"][0]).is_none(), "{report}");
    assert_eq!(report["elicited"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(
        std::fs::read_to_string(note("stateless.txt")).unwrap(),
        "stateless.txt"
    );
    let report = python(json!({
        "transport": {"kind": "http", "url": url},
        "protocolVersion": "2026-07-28",
        "elicitation": "cancel",
        "steps": [write("cancelled.txt")],
    }))
    .await;
    assert_eq!(
        error_code(&report["steps"][0]),
        Some("POLICY_DENIED"),
        "{report}"
    );
    assert!(!note("cancelled.txt").exists());

    // 2025-11-25 over HTTP: elicitation/create on the session.
    let report = python(json!({
        "transport": {"kind": "http", "url": url},
        "protocolVersion": "2025-11-25",
        "elicitation": "accept",
        "steps": [write("session.txt")],
    }))
    .await;
    assert!(error_code(&report["steps"][0]).is_none(), "{report}");
    assert!(note("session.txt").exists());

    // A client that cannot ask its user: refused, naming the setting that lets it through;
    // a confirmation id it makes up changes nothing.
    for version in ["2025-11-25", "2026-07-28"] {
        let mut step = write("unasked.txt");
        step["meta"] = json!({"confirmationId": "made-up"});
        let report = python(json!({
            "transport": {"kind": "http", "url": url},
            "protocolVersion": version,
            "steps": [step],
        }))
        .await;
        let step = &report["steps"][0];
        assert_eq!(error_code(step), Some("POLICY_DENIED"), "{step}");
        let said = step["ok"]["content"][0]["text"].as_str().unwrap();
        assert!(
            said.contains("elicitation capability") && said.contains("confirm = \"host\""),
            "{said}"
        );
        assert!(!note("unasked.txt").exists());
    }

    // DELETE of a session: 200, as the SDKs expect.
    let (status, _) = delete_a_session(&gateway.address).await;
    assert_eq!(status, 200);

    // The confirmation is in the audit: the call's confirmation id says who gave it.
    let audit = audited(gateway, &dir.join("audit")).await;
    assert!(audit.contains("elicitation:"), "{audit}");
}

/// Opens a 2025-11-25 session on the gateway's `/mcp` and ends it with `DELETE`: its status.
async fn delete_a_session(address: &str) -> (u16, String) {
    let session = super::operate::open_session(address)
        .await
        .unwrap_or_else(|answer| panic!("a session id: {answer}"));
    let answer = super::operate::raw(
        address,
        &format!(
            "DELETE /mcp HTTP/1.1\r\nHost: {address}\r\nmcp-session-id: {session}\r\n\
             mcp-protocol-version: 2025-11-25\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    (answer[9..12].parse().unwrap(), answer)
}

#[tokio::test]
async fn with_confirm_host_a_client_without_elicitation_passes() {
    let dir = fresh_dir("host-confirms");
    let gateway = http_gateway(&dir, "[servers.filesystem]\nconfirm = \"host\"\n").await;
    let path = dir.join("files").join("by-host.txt");
    let report = python(json!({
        "transport": {"kind": "http", "url": format!("http://{}/mcp", gateway.address)},
        "protocolVersion": "2025-11-25",
        "steps": [
            call("filesystem__write_file", json!({"path": path, "content": "ok"}), json!({})),
            // Another server keeps the default: it asks, and this client cannot.
            call("memory__create_entities",
                 json!({"entities": [{"name": "x", "entityType": "t", "observations": []}]}),
                 json!({})),
        ],
    }))
    .await;
    assert!(error_code(&report["steps"][0]).is_none(), "{report}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "ok");
    assert_eq!(
        error_code(&report["steps"][1]),
        Some("POLICY_DENIED"),
        "{report}"
    );
    let audit = audited(gateway, &dir.join("audit")).await;
    assert!(audit.contains("\"confirmationId\":\"host\""), "{audit}");
}

#[tokio::test]
async fn over_v1_only_a_confirmation_id_the_gateway_issued_for_that_call_works_once() {
    let dir = fresh_dir("v1-confirm");
    let gateway = http_gateway(&dir, "").await;
    let path = |name: &str| dir.join("files").join(name).display().to_string();
    let write = |name: &str, id: Option<&str>| {
        let mut envelope = json!({
            "contractVersion": "1.1", "requestId": format!("r-{name}"),
            "toolNamespace": "filesystem", "toolName": "write_file",
            "target": {"sessionKey": "s", "actorId": "a"},
            "payload": {"version": "1.0", "params": {"path": path(name), "content": name}}
        });
        if let Some(id) = id {
            envelope["control"] = json!({"confirmationId": id});
        }
        envelope
    };
    // Made up: refused before the stack.
    let (status, body) = gateway.call(&write("a.txt", Some("approved-1"))).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not one this gateway issued"), "{body}");
    // Without one: refused, with an id for this very call.
    let (status, body) = gateway.call(&write("a.txt", None)).await;
    assert_eq!(status, 403, "{body}");
    let refusal: Value = serde_json::from_str(&body).unwrap();
    let id = refusal["error"]["details"]["confirmationId"]
        .as_str()
        .unwrap_or_else(|| panic!("an issued id: {body}"))
        .to_owned();
    assert!(refusal["error"]["message"].as_str().unwrap().contains(&id));
    // For another call (other arguments) it does not work.
    let (status, body) = gateway.call(&write("b.txt", Some(&id))).await;
    assert_eq!(status, 403, "{body}");
    assert!(!std::path::Path::new(&path("b.txt")).exists());
    // For that call it does, once.
    let (status, body) = gateway.call(&write("a.txt", Some(&id))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(path("a.txt")).unwrap(), "a.txt");
    let (status, body) = gateway.call(&write("a.txt", Some(&id))).await;
    assert_eq!(status, 403, "used: {body}");
    drop(gateway);
}

#[tokio::test]
async fn one_broken_server_never_stops_the_rest() {
    let dir = fresh_dir("broken");
    let later = dir.join("later.sh");
    let servers = dir.join("servers.json");
    std::fs::write(
        &servers,
        json!({"mcpServers": {
            "time": {"command": kit(".venv/bin/mcp-server-time")},
            "later": {"command": later},
            "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"}
        }})
        .to_string(),
    )
    .unwrap();

    // --check names the command it cannot find.
    let checked = tokio::process::Command::new(GATEWAY)
        .args(["--check", "--mcp-json"])
        .arg(&servers)
        .output()
        .await
        .unwrap();
    assert!(!checked.status.success());
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(
        said.contains("upstream later") && said.contains("is not found"),
        "{said}"
    );
    let printed = String::from_utf8_lossy(&checked.stdout);
    assert!(printed.contains("mcpServers.old"), "{printed}");

    // The gateway serves the others, and /readyz names the broken one.
    let config = written("broken", "");
    let gateway = HttpGateway::start_with(&[
        config.as_os_str(),
        "--mcp-json".as_ref(),
        servers.as_os_str(),
    ])
    .await;
    let (status, body) = gateway.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["waitingFor"], json!(["later"]), "{body}");
    assert_eq!(ready["down"], json!(["later"]), "{body}");
    let now = json!({
        "contractVersion": "1.1", "requestId": "r-now", "toolNamespace": "time",
        "toolName": "get_current_time", "target": {"sessionKey": "s", "actorId": "a"},
        "payload": {"version": "1.0", "params": {"timezone": "UTC"}}
    });
    let (status, body) = gateway.call(&now).await;
    assert_eq!(status, 200, "{body}");

    // It comes back: picked up in the background.
    std::fs::write(
        &later,
        format!(
            "#!/bin/sh\nexec {} \"$@\"\n",
            kit(".venv/bin/mcp-server-time").display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x"])
        .arg(&later)
        .status()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let (status, body) = gateway.get("/readyz").await;
        if status == 200 {
            assert!(!body.contains("down"), "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "never picked up: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, tools) = gateway.get("/v1/tools").await;
    assert!(tools.contains("\"later\""), "{tools}");
    let mut later_now = now.clone();
    later_now["toolNamespace"] = json!("later");
    let (status, body) = gateway.call(&later_now).await;
    assert_eq!(status, 200, "{body}");
}
