//! The README's first-screen shell block, run as written against the gateway example: every
//! status and code it claims.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;

const README: &str = include_str!("../../README.md");

/// The block that starts with the `call` helper.
fn shell_block() -> &'static str {
    let start = README
        .find("```sh\ncall() {")
        .expect("the README has the gateway's shell block")
        + "```sh\n".len();
    let len = README[start..].find("\n```").expect("the block ends");
    &README[start..start + len]
}

/// The gateway example, built by `cargo test` beside this test.
fn example_binary() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let path = deps
        .parent()
        .and_then(|deps| deps.parent())
        .map(|debug| debug.join("examples").join("gateway"))
        .unwrap();
    assert!(
        path.exists(),
        "{} is missing: cargo build --example gateway --features axum,metrics",
        path.display()
    );
    path
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_gateway() -> (Gateway, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(example_binary())
        .env("PORT", port.to_string())
        .env("TOOLCALL_ADMIN_TOKEN", "demo-admin-token-0123456789")
        .env_remove("TOOLCALL_REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the gateway example starts");
    let gateway = Gateway(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the gateway never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    (gateway, port)
}

#[test]
fn the_first_screens_curl_block_gets_what_it_claims() {
    assert!(
        Command::new("curl").arg("--version").output().is_ok(),
        "the README's block needs curl: apt-get install curl"
    );
    let (_gateway, port) = start_gateway();
    let script = shell_block().replace("localhost:8080", &format!("localhost:{port}"));
    let output = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("bash runs the block");
    let text = String::from_utf8(output.stdout).unwrap();
    let answers: Vec<(String, u16)> = Regex::new(r"(?s)(.*?) -> (\d{3})\n")
        .unwrap()
        .captures_iter(&text)
        .map(|c| (c[1].trim().to_owned(), c[2].parse().unwrap()))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|(_, status)| *status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 409, 200, 503, 200, 200],
        "{text}"
    );
    let body = |i: usize| -> serde_json::Value {
        let answer = &answers[i].0;
        let json = &answer[answer.find('{').unwrap()..];
        serde_json::from_str(json).unwrap()
    };
    // The same Idempotency-Key twice: the second from the cache.
    assert_eq!(body(0)["fromCache"], false);
    assert_eq!(body(1)["fromCache"], true);
    assert_eq!(body(1)["output"], body(0)["output"]);
    // The 4th identical search is stopped.
    assert_eq!(body(5)["error"]["code"], "LOOP_DETECTED");
    // Forced open: 503 CIRCUIT_OPEN with a Retry-After header; after the reset it runs.
    let forced = &answers[7].0;
    assert!(
        forced.to_ascii_lowercase().contains("\nretry-after: "),
        "{forced}"
    );
    assert_eq!(body(7)["error"]["code"], "CIRCUIT_OPEN");
    assert_eq!(body(9)["status"], "success");
    // The metrics line names the breaker's state.
    let rest = &text[text.rfind(" -> ").unwrap()..];
    assert!(
        rest.contains("toolcall_tool_circuit_breaker_state{"),
        "the metrics grep prints the breaker's state: {rest}"
    );
}
