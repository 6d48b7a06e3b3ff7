//! The CPU a hop costs, without wall-clock noise: the instructions the front's process
//! executes per call, counted by valgrind's callgrind, for `mcp-proxy` 0.6 and the gateway in
//! front of the same echo MCP server, and for the gateway in front of it over HTTPS.
//!
//! ```text
//! crates/toolcall-gateway/benches/mcp-proxy.sh              # mcp-proxy 0.6.0 into .tools/
//! cargo bench -p toolcall-gateway --bench instructions      # CALLS=2000 by default
//! PROFILE=20 cargo bench -p toolcall-gateway --bench instructions   # and the top 20 functions
//! ```
//!
//! Each front runs under `valgrind --tool=callgrind` as a child process, with the
//! configuration of the `overhead` bench (the gateway's whole default stack; `mcp-proxy` with
//! the resilience of its own overhead example). One MCP session (rmcp's streamable HTTP
//! client) opens and warms up with 100 calls; the counters are then zeroed
//! (`callgrind_control --zero`), `CALLS` calls run one after another, each with distinct
//! arguments, and the counters are dumped: the instructions of those calls alone, over every
//! thread of the process, divided by `CALLS`. With `PROFILE=n`, the `n` functions with the
//! most instructions, their callees' included, follow each figure (`callgrind_annotate`).

#[path = "../tests/support/http.rs"]
mod http;
mod peers;
#[path = "../tests/support/tls.rs"]
mod tls;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

/// Calls of the session before the counters are zeroed.
const WARM_UP: usize = 100;

/// Where callgrind writes the counts of the process it runs.
fn callgrind(out: &Path) -> Vec<String> {
    vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--quiet".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ]
}

/// Runs `calls` calls of `tool` at `url`, after the warm-up, with the counters of the
/// process `pid` zeroed in between; the file of the counts of those calls.
async fn count(url: &str, tool: &str, pid: u32, calls: usize, out: &Path) -> PathBuf {
    let client = peers::session(url, "instructions").await;
    let peer = client.peer().clone();
    for i in 0..WARM_UP {
        peers::call(&peer, tool, json!({"text": format!("warm-{i}")}))
            .await
            .unwrap_or_else(|err| panic!("a warm-up call to {url} fails: {err}"));
    }
    control(&["--zero", &pid.to_string()]);
    for i in 0..calls {
        peers::call(&peer, tool, json!({"text": format!("call-{i}")}))
            .await
            .unwrap_or_else(|err| panic!("call {i} to {url} fails: {err}"));
    }
    control(&["--dump=calls", &pid.to_string()]);
    let _ = client.cancel().await;
    // The dump is the numbered file beside `out`: `out.1` (callgrind numbers its dumps).
    let dump = PathBuf::from(format!("{}.1", out.display()));
    for _ in 0..600 {
        if std::fs::metadata(&dump).is_ok_and(|m| m.len() > 0) && totals(&dump).is_some() {
            return dump;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!(
        "callgrind wrote no counts to {} within 60 s",
        dump.display()
    );
}

fn control(args: &[&str]) {
    let status = Command::new("callgrind_control")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("callgrind_control runs (apt-get install valgrind)");
    assert!(status.success(), "callgrind_control {args:?} failed");
}

/// The instructions a callgrind dump counts (its `summary:` or `totals:` line).
fn totals(dump: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dump).ok()?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("summary:")
                .or_else(|| line.strip_prefix("totals:"))
        })
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The `n` functions of `dump` with the most instructions, their callees' included, past
/// the frames every task shares (the runtime's, the threads').
fn profile(dump: &Path, n: usize) -> String {
    const SHARED: [&str; 9] = [
        "tokio::runtime",
        "clone.S",
        "start_thread",
        "thread_start",
        "call_once",
        "__rust_begin_short_backtrace",
        "(below main)",
        "libc_start",
        "PollFn<F>",
    ];
    let annotated = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(dump)
        .output()
        .expect("callgrind_annotate runs (apt-get install valgrind)");
    let text = String::from_utf8_lossy(&annotated.stdout);
    text.lines()
        .skip_while(|line| !line.contains("file:function"))
        .skip(2)
        .filter(|line| !SHARED.iter().any(|frame| line.contains(frame)))
        .take(n)
        .map(|line| format!("    {line}\n"))
        .collect()
}

struct Counted {
    name: &'static str,
    per_call: f64,
    dump: PathBuf,
}

#[tokio::main]
async fn main() {
    let calls = peers::env_or("CALLS", 2000usize);
    let top = peers::env_or("PROFILE", 0usize);
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|out| out.status.success()),
        "valgrind is missing: apt-get install valgrind"
    );
    peers::mcp_proxy_binary();
    let dir = std::env::temp_dir().join(format!("toolcall-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let echo = peers::echo_server().await;
    let (ca, cert, key) = tls::test_ca();
    let (echo_tls, _) = tls::serve_tls(peers::Echo, &cert, &key).await;
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();

    let mut counted = Vec::new();
    {
        let out = dir.join("mcp-proxy.out");
        let backends = peers::MCP_PROXY_LOADED
            .replace("{name}", "b")
            .replace("{url}", &echo);
        let proxy = peers::mcp_proxy_under(
            &callgrind(&out),
            &backends,
            "[performance]\ncoalesce_requests = true\n",
        )
        .await;
        let dump = count(&proxy.url, "b/echo", proxy.pid(), calls, &out).await;
        counted.push(Counted {
            name: "mcp-proxy 0.6, http upstream",
            per_call: totals(&dump).unwrap() as f64 / calls as f64,
            dump,
        });
    }
    let binary = Path::new(env!("CARGO_BIN_EXE_toolcall-gateway"));
    for (name, upstream, extra) in [
        ("toolcall-gateway, http upstream", &echo, String::new()),
        (
            "toolcall-gateway, https upstream",
            &echo_tls,
            format!("tls_ca_file = \"{}\"\n", ca_file.display()),
        ),
    ] {
        let out = dir.join(format!("gateway-{}.out", counted.len()));
        let config = format!(
            "[[upstreams]]\nname = \"echo\"\nurl = \"{upstream}\"\ntrust = \"trusted\"\n{extra}"
        );
        let gateway = peers::gateway_under(&callgrind(&out), binary, &config).await;
        let dump = count(&gateway.url, "echo__echo", gateway.pid(), calls, &out).await;
        counted.push(Counted {
            name,
            per_call: totals(&dump).unwrap() as f64 / calls as f64,
            dump,
        });
    }

    println!("instructions: {calls} calls over one session, after {WARM_UP} to warm up");
    println!();
    println!("| front | instructions per call | × mcp-proxy |");
    println!("|---|---|---|");
    let peer = counted[0].per_call;
    for c in &counted {
        println!(
            "| {} | {:.0} | {:.2} |",
            c.name,
            c.per_call,
            c.per_call / peer
        );
    }
    if top > 0 {
        for c in &counted {
            println!();
            println!(
                "{} (instructions of the {calls} calls, by function):",
                c.name
            );
            print!("{}", profile(&c.dump, top));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
