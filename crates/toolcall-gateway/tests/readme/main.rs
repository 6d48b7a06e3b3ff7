//! The README's first-screen shell block, run as written against the gateway's demo: every
//! status and code it claims.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;
use tower_toolcall_test::redis_server::RedisServer;

const README: &str = include_str!("../../../../README.md");

/// The block that starts with the `call` helper.
fn shell_block() -> &'static str {
    let start = README
        .find("```sh\ncall() {")
        .expect("the README has the gateway's shell block")
        + "```sh\n".len();
    let len = README[start..].find("\n```").expect("the block ends");
    &README[start..start + len]
}

/// The gateway, built by `cargo test` beside this test.
fn example_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toolcall-gateway"))
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
        .expect("the gateway starts");
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
        [403, 200, 200, 200, 200, 200, 409, 200, 503, 200, 200],
        "{text}"
    );
    let body = |i: usize| -> serde_json::Value {
        let answer = &answers[i].0;
        let json = &answer[answer.find('{').unwrap()..];
        serde_json::from_str(json).unwrap()
    };
    // Unconfirmed: refused with an id for this very call.
    assert_eq!(body(0)["error"]["code"], "POLICY_DENIED");
    assert!(body(0)["error"]["details"]["confirmationId"].is_string());
    // Confirmed, then the same Idempotency-Key again: the second from the cache.
    assert_eq!(body(1)["fromCache"], false);
    assert_eq!(body(2)["fromCache"], true);
    assert_eq!(body(2)["output"], body(1)["output"]);
    // The 4th identical search is stopped.
    assert_eq!(body(6)["error"]["code"], "LOOP_DETECTED");
    // Forced open: 503 CIRCUIT_OPEN with a Retry-After header; after the reset it runs.
    let forced = &answers[8].0;
    assert!(
        forced.to_ascii_lowercase().contains("\nretry-after: "),
        "{forced}"
    );
    assert_eq!(body(8)["error"]["code"], "CIRCUIT_OPEN");
    assert_eq!(body(10)["status"], "success");
    // The metrics line names the breaker's state.
    let rest = &text[text.rfind(" -> ").unwrap()..];
    assert!(
        rest.contains("toolcall_tool_circuit_breaker_state{"),
        "the metrics grep prints the breaker's state: {rest}"
    );
}

/// The example's exit on bad input: the error's message, naming what to fix, no debug dump.
#[test]
fn a_bad_admin_token_stops_the_example_with_a_message() {
    let output = Command::new(example_binary())
        .env("PORT", "0")
        .env("TOOLCALL_ADMIN_TOKEN", "short")
        .env_remove("TOOLCALL_REDIS_URL")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: "), "{stderr}");
    assert!(stderr.contains("admin.token"), "names the field: {stderr}");
    assert!(!stderr.contains("ConfigError"), "no debug dump: {stderr}");
}

/// A Redis URL's password never reaches the example's output, whether Redis answers or not.
#[test]
fn the_redis_password_never_reaches_a_log_line() {
    use std::io::{Read, Write};

    let server = RedisServer::start();
    let address = server.url();
    let address = address
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let mut raw = std::net::TcpStream::connect(&address).unwrap();
    raw.write_all(b"*4\r\n$6\r\nCONFIG\r\n$3\r\nSET\r\n$11\r\nrequirepass\r\n$6\r\ns3cret\r\n")
        .unwrap();
    let mut reply = [0u8; 5];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");

    // Redis answers: the URL is logged, its password redacted.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(example_binary())
        .env("PORT", port.to_string())
        .env("TOOLCALL_REDIS_URL", format!("redis://:s3cret@{address}/"))
        .env_remove("TOOLCALL_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the gateway never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(logs.contains("in Redis at redis://"), "{logs}");
    assert!(!logs.contains("s3cret"), "{logs}");

    // Redis refuses the password: the error names the problem, not the password.
    let output = Command::new(example_binary())
        .env("PORT", "0")
        .env(
            "TOOLCALL_REDIS_URL",
            format!("redis://:wr0ng-s3cret@{address}/"),
        )
        .env_remove("TOOLCALL_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(logs.contains("error: "), "{logs}");
    assert!(!logs.contains("wr0ng-s3cret"), "{logs}");
}
