//! A `redis-server` of a test's own, on a free loopback port, killed when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Monitor;

const INSTALL_HINT: &str = "these tests run a real redis-server: install it with \
     `apt-get install redis-server` (or put `redis-server` on PATH)";

/// A `redis-server` process that belongs to one test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        for _ in 0..10 {
            let port = free_port();
            let mut server = RedisServer { port, child: None };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Starts the process; `false` when it did not come up (the port was taken).
    fn spawn(&mut self) -> bool {
        self.child = spawn_redis(self.port, &[], &std::env::temp_dir(), INSTALL_HINT);
        self.child.is_some()
    }
}

/// Starts `redis-server` on the loopback `port`, with `extra` arguments, nothing saved and
/// its files in `dir`, and waits until it answers `PING`; `None` when it did not come up (the
/// port was taken). A missing `redis-server` panics with `install_hint`.
pub(crate) fn spawn_redis(
    port: u16,
    extra: &[&str],
    dir: &Path,
    install_hint: &str,
) -> Option<Child> {
    let port_arg = port.to_string();
    let dir = dir.to_string_lossy();
    let child = Command::new("redis-server")
        .args(["--port", &port_arg, "--bind", "127.0.0.1"])
        .args(extra)
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .args(["--dir", &dir])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{install_hint}"),
        Err(e) => panic!("cannot run redis-server ({e}); {install_hint}"),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if ping(port) {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl RedisServer {
    /// Stops the server (SIGSTOP): it keeps its connections but reads and answers nothing
    /// until [`resume`](Self::resume), as a server that hangs.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT): it reads what was sent meanwhile, in order.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("the server runs").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed: {status}");
    }

    /// Watches the commands clients send the server, on a `MONITOR` connection of its own.
    pub fn monitor(&self) -> Monitor {
        Monitor::start(self.port, &[])
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    assert_ne!(port, 6379, "never the machine's own redis");
    port
}

/// `true` when the server on `port` answers `PING`.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    matches!(stream.read(&mut reply), Ok(n) if reply[..n].starts_with(b"+PONG"))
}
