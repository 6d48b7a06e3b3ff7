//! The interop kit from Rust: the SDK drivers, the SDKs' reference servers, and the example
//! server as a child process.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// How long a driver may take for one plan.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(120);

/// The directory of the kit.
pub(crate) fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop")
}

/// `path` inside the kit, which must exist: else the test fails with the command that
/// installs the kit.
pub(crate) fn installed(path: &str) -> PathBuf {
    let full = dir().join(path);
    assert!(
        full.exists(),
        "{} is missing: install the MCP SDKs with `examples/tests/interop/setup.sh` \
         (python3 >= 3.10 with venv, node >= 20 and npm: `apt-get install -y python3-venv nodejs npm`)",
        full.display()
    );
    full
}

/// An official SDK's client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sdk {
    Python,
    TypeScript,
}

impl Sdk {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sdk::Python => "python",
            Sdk::TypeScript => "typescript",
        }
    }

    fn command(self) -> Command {
        match self {
            Sdk::Python => {
                let mut command = Command::new(installed(".venv/bin/python"));
                command.arg(dir().join("clients/client.py"));
                command
            }
            Sdk::TypeScript => {
                installed("node_modules/@modelcontextprotocol/sdk/package.json");
                let mut command = Command::new("node");
                command.arg(dir().join("clients/client.mjs"));
                command
            }
        }
    }

    /// Runs `plan` with this SDK's driver; its report.
    pub(crate) async fn run(self, plan: &Value) -> Value {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {} driver: {e}", self.name()));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(plan.to_string().as_bytes()).await.unwrap();
        drop(stdin);
        let output = tokio::time::timeout(DRIVER_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("the {} driver ran over {DRIVER_TIMEOUT:?}", self.name()))
            .unwrap();
        assert!(
            output.status.success(),
            "the {} driver failed: {}",
            self.name(),
            output.status
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "the {} driver's report is not JSON ({e}): {}",
                self.name(),
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

/// The example server (the notes tools behind the whole stack) over streamable HTTP on a
/// free loopback port; stopped when dropped.
pub(crate) struct HttpServer {
    child: Child,
    pub(crate) url: String,
}

impl HttpServer {
    pub(crate) async fn start() -> HttpServer {
        HttpServer::start_on("127.0.0.1:0").await
    }

    /// The server on `address` (a port of `0`: a free one).
    pub(crate) async fn start_on(address: &str) -> HttpServer {
        let binary = env!("CARGO_BIN_EXE_mcp-example-server");
        let mut child = Command::new(binary)
            .args(["--http", address])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the server says where it listens")
            .unwrap()
            .expect("a line on stdout");
        let address = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        HttpServer {
            child,
            url: format!("http://{address}/mcp"),
        }
    }

    /// Kills the server and waits until it is gone.
    #[cfg_attr(not(feature = "mcp-http"), allow(dead_code))]
    pub(crate) async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The example server over stdio, for a driver to start.
pub(crate) fn stdio_transport() -> Value {
    serde_json::json!({"kind": "stdio", "command": env!("CARGO_BIN_EXE_mcp-example-server")})
}

/// The `mcp-server-time` command of the kit.
pub(crate) fn time_server() -> Command {
    Command::new(installed(".venv/bin/mcp-server-time"))
}

/// The `server-everything` command of the kit, over stdio.
pub(crate) fn everything_server() -> Command {
    let script = installed("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let mut command = Command::new("node");
    command.arg(script).arg("stdio");
    command
}
