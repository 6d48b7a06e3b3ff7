//! A `redis-server` of a test's own, on a free loopback port, killed when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--dir",
                &std::env::temp_dir().to_string_lossy(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(e) => panic!("cannot run redis-server ({e}); {INSTALL_HINT}"),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if ping(self.port) {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
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
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let feed = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                feed.lock().unwrap().push(line);
            }
        });
        Monitor {
            port: self.port,
            lines,
            marks: 0,
        }
    }
}

/// The commands clients send a server, as `MONITOR` reports them.
#[derive(Debug)]
pub struct Monitor {
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
    marks: u32,
}

impl Monitor {
    /// The names of the commands clients sent since the last call (`SET`, `EVALSHA`, …), in
    /// the order the server ran them; not the commands scripts ran.
    pub fn take_commands(&mut self) -> Vec<String> {
        // A command sent now is reported after every command the server ran before it.
        self.marks += 1;
        let mark = format!("monitor-mark-{}", self.marks);
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .write_all(format!("ECHO {mark}\r\n").as_bytes())
            .expect("send ECHO");
        let mut reply = [0u8; 64];
        let _ = stream.read(&mut reply);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let taken: Vec<String> = {
                let mut lines = self.lines.lock().unwrap();
                match lines.iter().position(|line| line.contains(&mark)) {
                    Some(at) => lines.drain(..=at).collect(),
                    None => Vec::new(),
                }
            };
            if !taken.is_empty() {
                return taken[..taken.len() - 1]
                    .iter()
                    .filter_map(|line| client_command(line))
                    .collect();
            }
            assert!(Instant::now() < deadline, "MONITOR did not report {mark}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The name of the command in a `MONITOR` line (`<time> [<db> <client>] "<NAME>" …`), unless
/// a script ran it.
fn client_command(line: &str) -> Option<String> {
    let (client, command) = line.split_once(" [")?.1.split_once("] ")?;
    if client.ends_with(" lua") {
        return None;
    }
    let name = command.split(' ').next()?.trim_matches('"');
    Some(name.to_ascii_uppercase())
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
